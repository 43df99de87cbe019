"""The predicted speedups that ``r3 tune-app`` and ``r3 apply`` print: Amdahl's law over the
tuned kernels' shares of the recorded run,

    kernel_time_speedup = 1 / (1 - Σ share_i + Σ share_i / speedup_i)
    app_wall_speedup    = 1 / (1 - f Σ share_i + f Σ share_i / speedup_i),  f = K / W

where ``share_i`` is a fraction of the total kernel device time ``K`` the recording measured,
and ``W`` the application's wall time under ``r3 record`` (its overhead included, which makes
``f`` understated and the wall figure conservative: :data:`WALL_BASIS`).
"""

from __future__ import annotations

from collections.abc import Sequence

WALL_BASIS = ("the recorded run's wall time, recording overhead included: the host share is "
              "overstated, so the wall prediction is conservative")


def kernel_fraction_of_wall(kernel_time_s: float, wall_s: float) -> float | None:
    """The kernels' share of the application's wall time (None without a usable wall time;
    at most 1: kernels overlapping each other can add up past the wall)."""
    if wall_s <= 0 or kernel_time_s < 0:
        return None
    return min(1.0, kernel_time_s / wall_s)


def app_wall_amdahl(parts: Sequence[tuple[float, float]], fraction: float | None) -> float | None:
    """Amdahl over the wall time: ``parts`` are shares of kernel time, ``fraction`` the
    kernels' share of the wall time (None: unknown, and so is the speedup)."""
    if fraction is None:
        return None
    return amdahl([(share * fraction, speedup) for share, speedup in parts])


def amdahl(parts: Sequence[tuple[float, float]]) -> float:
    """Application speedup from ``(share, speedup)`` pairs: shares of the total kernel device
    time that run ``speedup`` times faster; the rest unchanged."""
    covered = sum(share for share, _ in parts)
    if covered > 1.0 + 1e-9 or any(share < 0 or speedup <= 0 for share, speedup in parts):
        raise ValueError("shares must be non-negative and sum to at most 1; speedups positive")
    return 1.0 / (1.0 - covered + sum(share / speedup for share, speedup in parts))


def prediction_lines(kernel_speedup: float, wall_speedup: float | None, kernel_time_s: float,
                     wall_s: float, other_work: Sequence[str] = ()) -> list[str]:
    """The two predicted figures, each with what it is over (tune-app and apply print them),
    and, for each kernel in ``other_work``, why the figure may be far off
    (:meth:`~r3tui.engine.app_recording.RecordedConfig.other_work`)."""
    lines = [f"kernel_time_speedup_predicted: {kernel_speedup:.4f}",
             "  (Amdahl over shares of all kernels' device time in the recorded run)"]
    lines += [f"  uncertain: {why}" for why in other_work]
    if wall_speedup is None:
        lines += ["app_wall_speedup_predicted: -",
                  "  (the recording has no wall time to set the kernels' time against)"]
    else:
        fraction = kernel_fraction_of_wall(kernel_time_s, wall_s) or 0.0
        lines += [f"app_wall_speedup_predicted: {wall_speedup:.4f}",
                  f"  (kernels were {kernel_time_s * 1e3:.3f} ms of {wall_s:.3f} s recorded "
                  f"wall, {fraction:.1%}; that wall includes recording overhead, so the host "
                  "share is overstated and this figure conservative)"]
    return lines
