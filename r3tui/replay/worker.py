"""The replay worker: one process per GPU with the recording resident, behind a pipe.

The parent (:class:`ReplayWorker`) sends candidates and waits for each result under a
deadline.  A sticky CUDA error (illegal address, launch failure) ends the child after it has
reported the candidate as crashed; a candidate that hangs is killed by the parent's
watchdog.  Either way the caller gets a :class:`~r3tui.domain.Measurement` and the next
candidate gets a fresh worker: a bad candidate costs one restart, never the caller.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from r3tui.domain import Measurement, MeasurementStatus
from r3tui.errors import ArenaUnavailable, GpuUnavailable, RecordingError, RetimeFailed
from r3tui.replay.candidate import Candidate
from r3tui.replay.timing import TimingPolicy
from r3tui.replay.verify import CheckPolicy

_ERRORS: dict[str, type[Exception]] = {
    "ArenaUnavailable": ArenaUnavailable,
    "GpuUnavailable": GpuUnavailable,
    "RecordingError": RecordingError,
    "ManifestError": RecordingError,
    "ChecksumMismatch": RecordingError,
}


@dataclass(frozen=True)
class WorkerInfo:
    """What the child reports once the bundle is resident."""

    pid: int
    gpu: str
    arch: str
    driver_version: int
    startup_s: float
    l2_flush: bool
    limits: dict[str, Any] = field(default_factory=dict)  # DeviceInfo.limits
    l2_note: str = ""  # how the L2 policy was chosen against the application's time
    l2_regime: str = "cold"  # what L2 holds when a timed launch starts (timing.L2Regime)


def _child_main(conn: Any, bundle_path: str, device: int, policy: TimingPolicy,
                checks: CheckPolicy = CheckPolicy()) -> None:
    began = time.perf_counter()
    try:
        from r3tui.record.bundle import Bundle
        from r3tui.replay.resident import ResidentBundle

        resident = ResidentBundle(Bundle.open(bundle_path), device, policy, checks)
    except BaseException as exc:
        conn.send(("init_error", type(exc).__name__, str(exc)))
        conn.close()
        return
    conn.send(("ready", WorkerInfo(os.getpid(), resident.info.name, resident.info.arch,
                                   resident.info.driver_version, time.perf_counter() - began,
                                   resident.flush is not None, resident.info.limits,
                                   resident.l2_note, resident.l2_regime.value)))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            break
        if message[0] == "close":
            break
        if message[0] == "stats":
            conn.send(("stats", {"launches": resident.launches,
                                 "measured": resident.measured, "pid": os.getpid(),
                                 "defence_s": resident.defence_s}))
            continue
        if message[0] == "interleave":
            try:
                conn.send(("samples", resident.interleaved(message[1], message[2]), None))
            except Exception as exc:
                conn.send(("samples", None, f"{type(exc).__name__}: {exc}"))
                if resident.poisoned:
                    conn.close()
                    os._exit(0)
            continue
        if message[0] != "eval":
            continue
        candidate, timed = message[1], message[2]
        try:
            result = resident.evaluate(candidate, timed=timed)
        except Exception as exc:  # a bug or a malformed candidate: report, keep serving
            tail = traceback.format_exc(limit=3)
            result = Measurement(MeasurementStatus.LAUNCH_ERROR, error_text=f"{exc}\n{tail}",
                                 binary_sha256=candidate.binary_sha256)
        conn.send(("result", result, resident.poisoned))
        if resident.poisoned:
            conn.close()
            # The context is unusable: skip every CUDA teardown call and let the driver clean up.
            os._exit(0)
    resident.close()
    conn.close()


class ReplayWorker:
    """Parent-side handle: ``evaluate(candidate) -> Measurement``, restarting the child as needed.

    ``timeout_s`` bounds one candidate (load, verify, timing); ``startup_timeout_s`` bounds
    mapping the bundle in a fresh child.
    """

    def __init__(self, bundle_path: str | os.PathLike[str], device: int = 0, *,
                 timeout_s: float = 60.0, startup_timeout_s: float = 180.0,
                 policy: TimingPolicy = TimingPolicy(),
                 checks: CheckPolicy = CheckPolicy()) -> None:
        self.bundle_path = str(Path(bundle_path).absolute())
        self.device = device
        self.timeout_s = timeout_s
        self.startup_timeout_s = startup_timeout_s
        self.policy = policy
        self.checks = checks
        self.restarts = 0  # children replaced after a crash or a timeout
        self.info: WorkerInfo | None = None
        self._proc: Any = None
        self._conn: Any = None
        self._started = False
        self._greeted = False  # the child alive has said it mapped the bundle
        self._ctx = mp.get_context("spawn")

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.is_alive()

    def start(self) -> WorkerInfo:
        """Start the child (done lazily by :meth:`evaluate`); raises if the bundle cannot map.

        A child whose driver had already put something of its own where the recording's
        fixed range lies is replaced by another, twice at most: the driver places its
        allocations differently in a new process (seen on the H200 in two of three runs of
        tests/gpu/test_gpu_app_search.py, with a 64 GiB reservation)."""
        for attempt in range(3):
            try:
                return self._start_once()
            except ArenaUnavailable as exc:
                if attempt == 2 or "placed the recording arena" not in str(exc):
                    raise
        raise AssertionError("unreachable")

    def begin(self) -> None:
        """Spawn the child without waiting for it to map the bundle (:meth:`start` waits):
        the caller can work meanwhile.  Nothing is done while a child is alive."""
        if self.alive:
            return
        self._reap()
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=_child_main, name="r3-replay-worker",
                                 args=(child, self.bundle_path, self.device, self.policy,
                                       self.checks),
                                 daemon=True)
        proc.start()
        self._started = True
        self._greeted = False
        child.close()
        self._proc, self._conn = proc, parent

    def _start_once(self) -> WorkerInfo:
        if self.alive and self._greeted:
            assert self.info is not None
            return self.info
        self.begin()
        proc, parent = self._proc, self._conn
        if not parent.poll(self.startup_timeout_s):
            self._kill()
            raise GpuUnavailable(
                f"the replay worker did not map {self.bundle_path} within "
                f"{self.startup_timeout_s:.0f} s")
        try:
            message = parent.recv()
        except EOFError:
            code = proc.exitcode
            self._reap()
            raise GpuUnavailable(f"the replay worker died while starting (exit code {code})"
                                 ) from None
        if message[0] == "init_error":
            self._reap()
            cls = _ERRORS.get(message[1], RecordingError)
            raise cls(f"replay worker: {message[2]}")
        self.info = message[1]
        self._greeted = True
        return message[1]

    def evaluate(self, candidate: Candidate, *, timed: bool = True) -> Measurement:
        """Measure one candidate; never raises for anything the candidate does."""
        if not self.alive:
            if self._started:
                self.restarts += 1
            self.start()
        began = time.perf_counter()
        try:
            self._conn.send(("eval", candidate, timed))
        except (BrokenPipeError, OSError):
            return self._lost(candidate, "the replay worker was gone before the candidate ran",
                              began)
        if not self._conn.poll(self.timeout_s):
            self._kill()
            return Measurement(
                MeasurementStatus.TIMEOUT, binary_sha256=candidate.binary_sha256,
                resources=candidate.resources, compile_time_s=candidate.compile_time_s,
                compile_log=candidate.compile_log, replay_wall_s=time.perf_counter() - began,
                error_text=f"no result within {self.timeout_s:g} s: the worker was killed and "
                "will be restarted",
            )
        try:
            _, result, poisoned = self._conn.recv()
        except (EOFError, OSError):
            return self._lost(candidate, "the replay worker died while running the candidate",
                              began)
        if poisoned:
            self._proc.join(10)
            self._reap()
        return result

    def interleaved(self, candidates: list[Candidate], rounds: int) -> list[list[float]]:
        """Seconds per candidate over ``rounds`` interleaved rounds (candidates verified first).

        Raises :class:`GpuUnavailable` when the worker fails or overruns: re-timing is only
        asked of candidates that already measured OK, so a failure here is not theirs.
        """
        if not self.alive:
            if self._started:
                self.restarts += 1
            self.start()
        self._conn.send(("interleave", candidates, rounds))
        if not self._conn.poll(self.timeout_s * max(1, len(candidates))):
            self._kill()
            raise GpuUnavailable("the replay worker did not finish re-timing in time")
        try:
            _, samples, error = self._conn.recv()
        except (EOFError, OSError):
            self._reap()
            raise GpuUnavailable("the replay worker died while re-timing") from None
        if error is not None:
            raise RetimeFailed(f"re-timing failed in the replay worker: {error}")
        return list(samples)

    def stats(self) -> dict[str, int]:
        """Launches and distinct measurements so far in the current child (for tests, logs)."""
        if not self.alive:
            self.start()
        self._conn.send(("stats",))
        if not self._conn.poll(self.timeout_s):
            raise GpuUnavailable("the replay worker does not answer")
        return dict(self._conn.recv()[1])

    def _lost(self, candidate: Candidate, what: str, began: float) -> Measurement:
        proc = self._proc
        if proc is not None:
            proc.join(5)
        code = proc.exitcode if proc is not None else None
        self._reap()
        detail = f" (signal {-code})" if code is not None and code < 0 else f" (exit {code})"
        return Measurement(MeasurementStatus.CRASHED, binary_sha256=candidate.binary_sha256,
                           resources=candidate.resources, compile_time_s=candidate.compile_time_s,
                           replay_wall_s=time.perf_counter() - began, error_text=what + detail)

    def _kill(self) -> None:
        if self._proc is not None and self._proc.is_alive():
            self._proc.kill()
            self._proc.join(30)
        self._reap()

    def _reap(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._proc is not None:
            self._proc.join(1)
            if not self._proc.is_alive():
                self._proc.close()
                self._proc = None

    def close(self) -> None:
        if self.alive:
            try:
                self._conn.send(("close",))
                self._proc.join(30)
            except (BrokenPipeError, OSError):
                pass
        self._kill()

    def __enter__(self) -> ReplayWorker:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
