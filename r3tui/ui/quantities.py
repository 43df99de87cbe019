"""How the UI writes times, speedups, rates and moments, in one place."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, tzinfo

from db.figures import duration_text, speedup_text

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


# A campaign's figures and how they are written are defined once, in db.figures (shared
# with r3 runs and r3 report); the UI writes every speedup and duration the same way.
speedup = speedup_text


def ratio(reference_s: float | None, time_s: float | None) -> float | None:
    return reference_s / time_s if reference_s and time_s else None


def duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``2h07m``: elapsed times in a status line."""
    return duration_text(seconds)


def moment(at: datetime | None, zone: tzinfo | None) -> str:
    """A stored UTC time in the viewer's zone (``zone`` None: the system's)."""
    if at is None:
        return "-"
    return at.astimezone(zone).strftime("%Y-%m-%d %H:%M")


def clock_time(at: datetime, zone: tzinfo | None) -> str:
    return at.astimezone(zone).strftime("%H:%M:%S")
