"""The runner a campaign evaluates its candidates on (:mod:`r3tui.runners`), opened and closed
in one place for every kind of run (r3 tune, --inner-only, --replay-llm, the checks of
tune-app's winners), so that a replay is set up, and timed, the same way everywhere.

``--runner local`` (the default): this machine's cores compile, each visible GPU replays.
``--runner dask``: a ``dask.distributed`` cluster does both; ``--scheduler ADDR`` joins one,
``[runner] jobqueue`` in ``r3.toml`` submits workers to a batch system, and otherwise R³ starts
one on this machine.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from r3tui.engine.options import option

if TYPE_CHECKING:
    from db.session import Database
    from r3tui.runners import Runner


@dataclass(frozen=True)
class RunnerSettings:
    """Where candidates are evaluated (flags, and ``r3.toml``'s ``[runner]`` section)."""

    runner: str = option("local", "--runner", "where candidates are compiled and replayed",
                         choices=("local", "dask"))
    workers: int = option(0, "--workers", "compile workers: processes of the local runner, "
                          "or CPU workers of the Dask cluster R³ starts (0: one per core)")
    gpus: int = option(0, "--gpus", "GPUs to replay on, the first N visible (0: every visible "
                       "one)")
    scheduler: str = option("", "--scheduler", "address of a running Dask scheduler to use "
                            "(with --runner dask)", metavar="ADDR")
    # r3.toml's [runner] keys for dask-jobqueue (jobqueue = "slurm" | "pbs" | "lsf", and that
    # library's own: cores, memory, queue, account, walltime, ...); not flags
    jobqueue: dict[str, Any] = field(default_factory=dict)


def _gpu_ids(settings: RunnerSettings) -> list[int]:
    from r3tui.cuda.driver import device_count

    count = device_count()
    return list(range(min(settings.gpus, count) if settings.gpus > 0 else count))


def _local(bundle_path: Path, timeout_s: float, settings: RunnerSettings,
           while_starting: Callable[[], object] | None = None) -> Runner:
    from r3tui.compile.cache import CompileCache, default_cache_dir
    from r3tui.compile.pool import CompilePool
    from r3tui.engine.app_recording import in_app_reference
    from r3tui.replay.timing import TimingPolicy
    from r3tui.replay.worker import ReplayWorker
    from r3tui.runners import GpuReplayer, LocalRunner

    policy = TimingPolicy(reference_s=in_app_reference(bundle_path))
    replayers = [GpuReplayer(ReplayWorker(bundle_path, device, timeout_s=timeout_s,
                                          policy=policy))
                 for device in _gpu_ids(settings)]
    pool = CompilePool(settings.workers or None, cache=CompileCache(default_cache_dir()))
    try:
        return LocalRunner(replayers, pool, while_starting)
    except BaseException:
        pool.close(cancel_pending=True)
        raise


def _dask(bundle_path: Path, timeout_s: float, settings: RunnerSettings,
          while_starting: Callable[[], object] | None = None) -> Runner:
    import os

    from r3tui.compile.cache import CompileCache, default_cache_dir
    from r3tui.engine.app_recording import in_app_reference
    from r3tui.runners.dask_runner import (
        DaskRunner,
        GpuBackend,
        connect,
        jobqueue_cluster,
        local_cluster,
    )

    backend = GpuBackend(timeout_s, in_app_reference(bundle_path))
    cluster = None
    if settings.scheduler:
        client = connect(settings.scheduler)
    else:
        if settings.jobqueue:
            cluster = jobqueue_cluster(settings.jobqueue)
            cluster.scale(jobs=max(1, settings.gpus))
        else:
            cluster = local_cluster(settings.workers or os.cpu_count() or 1,
                                    [str(i) for i in _gpu_ids(settings)])
        client = connect(None, cluster)
    if while_starting is not None:  # the cluster's workers are up; it overlaps nothing here
        while_starting()
    try:
        return DaskRunner(client, bundle_path, backend,
                          cache=CompileCache(default_cache_dir()), owned=cluster)
    except BaseException:
        client.close()
        if cluster is not None:
            cluster.close()
        raise


class RunnerFactory(Protocol):
    """How a runner is opened: ``while_starting`` runs while its GPUs start, where it can."""

    def __call__(self, bundle_path: Path, timeout_s: float, settings: RunnerSettings,
                 while_starting: Callable[[], object] | None = None) -> Runner: ...


# name -> how to open it
RUNNERS: dict[str, RunnerFactory] = {
    "local": _local,
    "dask": _dask,
}


@contextmanager
def open_runner(bundle_path: Path, timeout_s: float,
                settings: RunnerSettings | None = None,
                while_starting: Callable[[], object] | None = None) -> Iterator[Runner]:
    """The runner for ``bundle_path`` (timing set against the application's own time where
    the bundle is an application's), its GPUs started with the bundle resident;
    ``while_starting`` (the campaign's slow imports) runs while the local runner's replay
    workers map the bundle."""
    settings = settings or RunnerSettings()
    runner = RUNNERS[settings.runner](bundle_path, timeout_s, settings, while_starting)
    with runner:
        yield runner


@contextmanager
def report_load(database: Database, campaign_id: int, runner: Runner | None,
                every_s: float = 2.0) -> Iterator[None]:
    """While the run inside goes on, the runner's load is written to the campaign's row
    every ``every_s`` (the TUI's status line shows it); cleared when the run ends, with a
    ``runner`` event saying what the runner did (jobs, and any resubmitted or lost with
    their worker).  ``runner`` None (a generate-only run): nothing is written."""
    import dataclasses
    import logging
    import threading
    from datetime import UTC, datetime

    from db import repository as repo

    if runner is None:
        yield
        return
    active = runner
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(every_s):
            try:
                data = active.load().to_json(active.name, datetime.now(UTC).isoformat())
                with database.session_scope() as s:
                    repo.set_campaign_workers(s, campaign_id, data)
            except Exception as exc:  # a busy database or a cluster going away: next time
                logging.getLogger(__name__).debug("workers' load not written: %s", exc)

    thread = threading.Thread(target=sample, name="r3-runner-load", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        done = active.stats()
        text = (f"{active.name} runner: {done.compiles} compiles, {done.replays} replays"
                + (f" in {done.replay_tasks} tasks" if done.replay_tasks else "")
                + (f", {done.resubmitted} resubmitted after their worker was lost"
                   if done.resubmitted else "")
                + (f", {done.lost} lost twice" if done.lost else ""))
        with database.session_scope() as s:
            repo.set_campaign_workers(s, campaign_id, None)
            repo.add_event(s, campaign_id, "runner", text, dataclasses.asdict(done))
