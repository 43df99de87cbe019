"""What every runner offers the engine: compile jobs on CPUs, replay jobs on GPUs that hold the
recording resident, each answered by a future; re-timing on one GPU; and the load of its workers.

A runner never raises for what a candidate does: a compile that fails, a replay that faults or
hangs, a worker that is lost with the job in flight all come back as values
(:class:`~r3tui.compile.base.CompiledKernel` with ``ok=False``, a
:class:`~r3tui.domain.Measurement` with its status).  What does raise is a runner that cannot
work at all (no GPU, a bundle that does not map, a scheduler that cannot be reached).
"""

from __future__ import annotations

import abc
from concurrent.futures import Future
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from r3tui.compile.base import CompiledKernel, CompileRequest
    from r3tui.domain import Measurement
    from r3tui.replay.candidate import Candidate
    from r3tui.replay.worker import WorkerInfo


@dataclass(frozen=True)
class ReplayJob:
    """One candidate to replay, with the key of the configuration it was compiled for (what a
    simulated replayer looks its answer up by; a GPU replays the binary and ignores it)."""

    candidate: Candidate
    key: str = ""


class Replayer(Protocol):
    """One GPU with the bundle resident (:class:`~r3tui.replay.worker.ReplayWorker` behind
    :class:`~r3tui.runners.local.GpuReplayer`), or the simulated stand-in CI uses."""

    def start(self) -> WorkerInfo: ...

    def evaluate(self, job: ReplayJob) -> Measurement: ...

    def interleaved(self, jobs: list[ReplayJob], rounds: int) -> list[list[float]]: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class WorkerLoad:
    """One worker as a status bar shows it."""

    name: str  # "gpu0", a Dask worker's address, "compile3"
    kind: str  # "gpu" (replays) or "cpu" (compiles)
    running: int  # jobs it is working on now
    done: int  # jobs it finished since the runner started (where the runner knows)


@dataclass(frozen=True)
class RunnerLoad:
    """Every worker's load, and the jobs waiting for a worker of each kind."""

    workers: tuple[WorkerLoad, ...]
    queued: dict[str, int]  # "gpu": replays waiting, "cpu": compiles waiting

    def to_json(self, runner: str, at: str) -> dict[str, Any]:
        """What ``campaigns.workers`` keeps (db.figures.workers_text reads it)."""
        return {"runner": runner, "at": at, "queued": dict(self.queued),
                "workers": [[w.name, w.kind, w.running, w.done] for w in self.workers]}


@dataclass(frozen=True)
class RunnerStats:
    """What a runner did, for the campaign's events and the benchmarks."""

    compiles: int = 0
    replays: int = 0
    resubmitted: int = 0  # jobs sent again after their worker was lost
    lost: int = 0  # jobs whose worker was lost twice: returned as failures
    replay_tasks: int = 0  # tasks the replays went out in (a runner that batches them)
    replay_calls: int = 0  # of those, direct calls of a worker's actor (the Dask runner)


class Runner(abc.ABC):
    """Where a campaign's candidates are compiled and replayed."""

    name: str = "runner"

    @property
    @abc.abstractmethod
    def info(self) -> WorkerInfo:
        """The GPU the replays run on (the first, where there are several of one kind)."""

    @abc.abstractmethod
    def compile(self, toolchain: str, request: CompileRequest) -> Future[CompiledKernel]:
        """Compile ``request``; the future's result is a value, failed or not."""

    @abc.abstractmethod
    def replay(self, job: ReplayJob) -> Future[Measurement]:
        """Replay ``job`` on a GPU worker; the future's result is a measurement, never an
        exception for what the candidate does."""

    @abc.abstractmethod
    def interleaved(self, jobs: list[ReplayJob], rounds: int) -> list[list[float]]:
        """Seconds per job's candidate over ``rounds`` interleaved rounds, all on one GPU (so that
        they compare); raises :class:`~r3tui.errors.GpuUnavailable` if that GPU fails."""

    @abc.abstractmethod
    def load(self) -> RunnerLoad:
        """Each worker's load now."""

    @abc.abstractmethod
    def stats(self) -> RunnerStats: ...

    @abc.abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
