"""How the UI writes times, speedups, rates and moments, in one place."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, tzinfo

Clock = Callable[[], datetime]


def system_clock() -> datetime:
    return datetime.now(UTC)


def kernel_time(seconds: float | None) -> str:
    """A kernel time with a unit that keeps three or four significant digits."""
    if seconds is None:
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if seconds < 1.0:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def speedup(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}×"


def ratio(reference_s: float | None, time_s: float | None) -> float | None:
    return reference_s / time_s if reference_s and time_s else None


def duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``2h07m``: elapsed times in a status line."""
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def moment(at: datetime | None, zone: tzinfo | None) -> str:
    """A stored UTC time in the viewer's zone (``zone`` None: the system's)."""
    if at is None:
        return "-"
    return at.astimezone(zone).strftime("%Y-%m-%d %H:%M")


def clock_time(at: datetime, zone: tzinfo | None) -> str:
    return at.astimezone(zone).strftime("%H:%M:%S")
