"""The evaluation resources of one campaign run on this machine: the replay worker holding
the bundle resident on the GPU, and the compile pool on the cores, started and torn down
together.  Every kind of run takes them from here (r3 tune, --inner-only, --replay-llm, the
checks of tune-app's winners), so a replay is set up, and timed, the same way everywhere."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from r3tui.compile.pool import CompilePool
    from r3tui.replay.worker import ReplayWorker, WorkerInfo


class LocalGpu(NamedTuple):
    worker: ReplayWorker
    pool: CompilePool
    info: WorkerInfo


@contextmanager
def local_gpu(bundle_path: Path, timeout_s: float) -> Iterator[LocalGpu]:
    """The replay worker (timing set against the application's own time where the bundle is
    an application's) and the compile pool, for ``bundle_path``."""
    from r3tui.compile.cache import CompileCache, default_cache_dir
    from r3tui.compile.pool import CompilePool
    from r3tui.engine.application import in_app_reference
    from r3tui.replay.timing import TimingPolicy
    from r3tui.replay.worker import ReplayWorker

    policy = TimingPolicy(reference_s=in_app_reference(bundle_path))
    with ReplayWorker(bundle_path, timeout_s=timeout_s, policy=policy) as worker:
        info = worker.start()
        with CompilePool(cache=CompileCache(default_cache_dir())) as pool:
            yield LocalGpu(worker, pool, info)
