"""Timing one kernel launch on the device, the way every candidate is timed.

Each sample: restore the prologue (and flush L2 where the working set would stay in it),
then CUDA events around the launch alone, so neither the restore nor the flush is timed.
Sampling stops when the running median settles, bounded by a count and a time budget.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from r3tui.domain import TimeStats
from r3tui.record import cuda_driver as cu


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
    # recording's in-app mean).  With it, the replay keeps flushing L2 only when a cold
    # replay of the original comes nearer to it than a warm one (choose_l2); hotspot3D on the
    # H200 runs back to back over 24 MB that stay in the 50 MB L2, and a cold replay
    # predicted 1.269x where the application measured 1.082x.
    reference_s: float | None = None


def choose_l2(reference_s: float, cold_s: float, warm_s: float) -> tuple[bool, str]:
    """Whether to flush L2 (the replay nearer the application's time) and one line why."""
    flush = abs(cold_s - reference_s) <= abs(warm_s - reference_s)
    return flush, (
        f"L2 {'flushed' if flush else 'left warm'} before every timed launch: the application "
        f"ran this configuration in {reference_s * 1e6:.2f} µs a launch, a cold replay of the "
        f"original in {cold_s * 1e6:.2f} µs, a warm one in {warm_s * 1e6:.2f} µs")


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


class EventTimer:
    """A pair of CUDA events on one stream."""

    def __init__(self, stream: Any) -> None:
        drv = cu.driver()
        flags = drv.CUevent_flags.CU_EVENT_DEFAULT
        self.start = cu.check(drv.cuEventCreate(flags), "cuEventCreate")
        self.end = cu.check(drv.cuEventCreate(flags), "cuEventCreate")
        self.stream = stream

    def time(self, launch: Callable[[], None]) -> float:
        """Seconds between the events around ``launch`` (synchronizes on the end event)."""
        drv = cu.driver()
        cu.check(drv.cuEventRecord(self.start, self.stream), "cuEventRecord")
        launch()
        cu.check(drv.cuEventRecord(self.end, self.stream), "cuEventRecord")
        cu.check(drv.cuEventSynchronize(self.end), "cuEventSynchronize")
        ms = cu.check(drv.cuEventElapsedTime(self.start, self.end), "cuEventElapsedTime")
        return float(ms) * 1e-3

    def close(self) -> None:
        drv = cu.driver()
        drv.cuEventDestroy(self.start)
        drv.cuEventDestroy(self.end)


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
