"""Timing one kernel launch on the device, the way every candidate is timed.

Each sample: restore the prologue (and flush L2 where the working set would stay in it),
then CUDA events around the launch alone, so neither the restore nor the flush is timed.
Sampling stops when the running median settles, bounded by a count and a time budget.
"""

from __future__ import annotations

import ctypes
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from r3tui.cuda import driver as cu
from r3tui.domain import TimeStats


@dataclass(frozen=True)
class TimingPolicy:
    """How long to time a candidate."""

    warmup: int = 2  # launches before sampling (module load, first-touch, clocks)
    min_samples: int = 5
    max_samples: int = 100
    max_seconds: float = 2.0  # wall-clock budget for sampling, once min_samples are in
    settle_window: int = 5  # the median over all samples vs. without the last this many
    settle_rtol: float = 0.01  # ... must agree within this fraction to stop early
    # Flush L2 after restoring the prologue (METHOD.md: cold, repeatable timing).  False times
    # the kernel with whatever of its data the restore left in L2, as an application's kernel
    # finds the data its predecessor touched: bench/app_tune.py reports both.
    l2_flush: bool = True
    # The application's own device time per launch of the recorded configuration (an app
    # recording's in-app mean).  With it, the replay times the original cold, warm, hot and primed
    # (L2Regime) and keeps the regime nearest it (choose_l2); hotspot3D on the H200 runs back
    # to back over 24 MB that stay in the 50 MB L2, and a cold replay predicted 1.269x where
    # the application measured 1.082x (on an H100, warm: 1.221x against 1.128x).
    reference_s: float | None = None


class L2Regime(StrEnum):
    """What L2 holds when a timed launch starts (after the prologue is restored)."""

    COLD = "cold"  # flushed: none of the working set (METHOD.md's repeatable default)
    WARM = "warm"  # whatever the restore's copy left there (part of the working set)
    # the launch's whole span read once after the restore, untimed and without writing it
    # (on the H100, hotspot3D: 14.30 µs where warm took 13.28 and the application 10.41)
    HOT = "hot"
    # the recorded binary launched once, untimed, after the restore, then the buffers it
    # wrote restored: L2 holds what the kernel's own launch leaves there, as in an
    # application's loop that runs it back to back, and the timed launch still starts from
    # the prologue; offered only where that preparation leaves the arena as the restore does
    PRIMED = "primed"


_REGIME_WORDS = {L2Regime.COLD: "flushed", L2Regime.WARM: "left warm",
                 L2Regime.HOT: "filled with the launch's data",
                 L2Regime.PRIMED: "holding what an untimed launch of the original left"}


def choose_l2(reference_s: float, cold_s: float, warm_s: float, hot_s: float | None = None,
              primed_s: float | None = None) -> tuple[L2Regime, str]:
    """The L2 regime whose replay of the original is nearest the application's time, and
    one line why (ties go to the colder: cold, then warm, then hot, then primed)."""
    times = {L2Regime.COLD: cold_s, L2Regime.WARM: warm_s}
    if hot_s is not None:
        times[L2Regime.HOT] = hot_s
    if primed_s is not None:
        times[L2Regime.PRIMED] = primed_s
    regime = min(times, key=lambda r: abs(times[r] - reference_s))  # first of equals: colder
    told = ", ".join(f"a {r.value} one in {s * 1e6:.2f} µs" for r, s in times.items())
    return regime, (
        f"L2 {_REGIME_WORDS[regime]} before every timed launch: the application ran this "
        f"configuration in {reference_s * 1e6:.2f} µs a launch; a replay of the original: "
        f"{told}")


def settled(samples: list[float], policy: TimingPolicy) -> bool:
    """True when more samples would hardly move the median."""
    if len(samples) < max(policy.min_samples, policy.settle_window + 3):
        return False
    now = statistics.median(samples)
    before = statistics.median(samples[: -policy.settle_window])
    return abs(now - before) <= policy.settle_rtol * max(now, 1e-12)


class L2Flush:
    """A scratch buffer of at least twice the L2 size; writing it evicts the working set."""

    def __init__(self, l2_bytes: int, stream: Any) -> None:
        drv = cu.driver()
        self.size = max(2 * l2_bytes, 1 << 20)
        self.address = int(cu.check(drv.cuMemAlloc(self.size), "cuMemAlloc"))
        self.stream = stream
        self._value = 0

    def __call__(self) -> None:
        drv = cu.driver()
        # Change the value written each time so the writes are never elided.
        self._value = (self._value + 1) & 0xFF
        cu.check(drv.cuMemsetD8Async(self.address, self._value, self.size, self.stream),
                 "cuMemsetD8Async")

    def close(self) -> None:
        cu.driver().cuMemFree(self.address)


class LaunchGate:
    """Holds a stream until the host has submitted what is queued behind it.

    On an idle stream a start event is processed at once and the kernel only once the host
    has finished submitting it, so the host's launch latency would count as kernel time.  The
    stream waits on a word of mapped host memory (cuStreamWaitValue32, GEQ); the events and
    the launch queue behind the wait; :meth:`open` writes the word.  The recording
    interposer times the application's launches the same way (r3rec.c), so a replay is set
    against an in-app time measured alike.  ``enabled`` is False where the device has no
    stream memory operations or mapped host memory: timing is then ungated.
    """

    def __init__(self) -> None:
        drv = cu.driver()
        self.enabled = False
        self._seq = 0
        self._host = 0
        err, host = drv.cuMemHostAlloc(4, drv.CU_MEMHOSTALLOC_PORTABLE
                                       | drv.CU_MEMHOSTALLOC_DEVICEMAP)
        if err != drv.CUresult.CUDA_SUCCESS:
            return
        self._host = int(host)
        self._word = ctypes.c_uint32.from_address(self._host)
        self._word.value = 0
        err, device = drv.cuMemHostGetDevicePointer(self._host, 0)
        if err == drv.CUresult.CUDA_SUCCESS:
            self._device = device
            self.enabled = True

    def close_on(self, stream: Any) -> bool:
        """Queue the wait on ``stream``; True when the caller must :meth:`open` it."""
        if not self.enabled:
            return False
        drv = cu.driver()
        err, = drv.cuStreamWaitValue32(stream, self._device, self._seq + 1,
                                       drv.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ)
        if err != drv.CUresult.CUDA_SUCCESS:
            self.enabled = False  # e.g. no stream memory operations: time without the gate
            return False
        self._seq += 1
        return True

    def open(self) -> None:
        self._word.value = self._seq

    def release(self) -> None:
        if self._host:
            cu.driver().cuMemFreeHost(self._host)
            self._host = 0
            self.enabled = False


class EventTimer:
    """A pair of CUDA events on one stream, behind a :class:`LaunchGate` where one works."""

    def __init__(self, stream: Any, *, gated: bool = True) -> None:
        drv = cu.driver()
        flags = drv.CUevent_flags.CU_EVENT_DEFAULT
        self.start = cu.check(drv.cuEventCreate(flags), "cuEventCreate")
        self.end = cu.check(drv.cuEventCreate(flags), "cuEventCreate")
        self.stream = stream
        self.gate = LaunchGate() if gated else None

    @property
    def gated(self) -> bool:
        return self.gate is not None and self.gate.enabled

    def time(self, launch: Callable[[], None]) -> float:
        """Seconds between the events around ``launch`` (synchronizes on the end event)."""
        drv = cu.driver()
        held = self.gate is not None and self.gate.close_on(self.stream)
        try:
            cu.check(drv.cuEventRecord(self.start, self.stream), "cuEventRecord")
            launch()
            cu.check(drv.cuEventRecord(self.end, self.stream), "cuEventRecord")
        finally:
            if held:
                assert self.gate is not None
                self.gate.open()  # never leave the stream waiting, whatever failed
        cu.check(drv.cuEventSynchronize(self.end), "cuEventSynchronize")
        ms = cu.check(drv.cuEventElapsedTime(self.start, self.end), "cuEventElapsedTime")
        return float(ms) * 1e-3

    def close(self) -> None:
        drv = cu.driver()
        drv.cuEventDestroy(self.start)
        drv.cuEventDestroy(self.end)
        if self.gate is not None:
            self.gate.release()


def time_launches(
    launch: Callable[[], None],
    prepare: Callable[[], None],
    timer: EventTimer,
    policy: TimingPolicy = TimingPolicy(),
) -> TimeStats:
    """Time ``launch`` after ``prepare`` (restore + flush) for every sample."""
    for _ in range(policy.warmup):
        prepare()
        timer.time(launch)
    samples: list[float] = []
    began = time.perf_counter()
    while len(samples) < policy.max_samples:
        prepare()
        samples.append(timer.time(launch))
        if settled(samples, policy):
            break
        if len(samples) >= policy.min_samples and time.perf_counter() - began > policy.max_seconds:
            break
    return TimeStats.from_samples(samples)
