"""The campaign's last word: its best variant re-timed against the original, interleaved.

Per-trial medians come from separate replays; a speedup claimed over the original is only
worth its interval when both kernels are timed round by round on the same GPU, so after the
budget the archive's best (at its best configuration) and the original (at the recorded
configuration) are launched alternately and the per-round ratios summarized with an order-statistic
interval (event ``final``, shown by ``r3 report``).

The same rounds also time the steps between the two (:func:`ladder`): the best variant's source
with its tunables at the recorded options and launch, then with the winner's options, then
the winner itself.  Each level's factor is the per-round ratio of one step to the one before,
with its interval, so ``r3 report`` says what the source, the options and the launch each
gained as measured, not as read off whichever trials the search happened to make.

What ships is the fastest of those steps (:func:`fastest_rung`), not always the last: a launch
setting that won a noisy search trial but is slower than the recorded one when re-timed
interleaved is dropped (listed under ``dropped`` with its factor), and the winner is the step
before it.

The speedup the campaign reports for what ships is then measured again in fresh rounds, the
original and the shipped step alone (:func:`confirm`): the ladder's rounds chose the step, and
the lowest of several noisy medians is lower than its own time (the choice's bias); and a short
kernel's per-round ratios spread, so rounds are added until the interval is narrow or a bound is
reached.  That figure is what ``tune-app`` predicts an application gains (hotspot3D: a 10 µs
kernel whose ladder said 1.172x [1.116, 1.240] where the application measured 1.112x).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from r3tui.domain import TrialConfig
from r3tui.engine.inner import build_space
from r3tui.engine.lineage import fitness_of
from r3tui.search.winner import Finalist, summarize

if TYPE_CHECKING:
    from r3tui.engine.campaign import CampaignRun


class Checks(Protocol):
    """What :func:`measurable` asks of a search space: why a config cannot be sent."""

    def check(self, config: TrialConfig) -> list[str]: ...


def ladder(best: TrialConfig, base: TrialConfig) -> list[tuple[str, TrialConfig]]:
    """The steps from the recorded configuration ``base`` (of the best variant's space) to
    ``best``: its tunables (what the variant's source exposes, shared memory with them), then
    its toolchain, options and pipeline, then its block and launch bounds.  A step that
    changes nothing is left out (its level gained exactly 1)."""
    source = replace(base, tunables=dict(best.tunables),
                     shared_mem_bytes=best.shared_mem_bytes)
    options = replace(source, toolchain=best.toolchain, options=best.options,
                      pipeline=best.pipeline)
    steps = [("source", source), ("options", options), ("launch", best)]
    out: list[tuple[str, TrialConfig]] = []
    previous = base
    for level, config in steps:
        if config != previous:
            out.append((level, config))
            previous = config
    # the winner at the variant's recorded configuration: all its gain is the source's
    return out or [("source", best)]


def measurable(steps: Sequence[tuple[str, TrialConfig]], space: Checks,
               ok: Callable[[TrialConfig], bool]) -> list[tuple[str, TrialConfig]]:
    """``steps`` less those the variant's space refuses or that do not measure OK (``ok``);
    a level whose step is dropped is merged into the next one's name ("source+options").
    The last step (the winner) is always kept."""
    kept: list[tuple[str, TrialConfig]] = []
    carried = ""
    for i, (level, config) in enumerate(steps):
        name = f"{carried}+{level}" if carried else level
        last = i == len(steps) - 1
        if last or (not space.check(config) and ok(config)):
            kept.append((name, config))
            carried = ""
        else:
            carried = name
    return kept


CONFIRM_ROUNDS = 15  # fresh rounds a batch, the original and what ships alone
CONFIRM_MAX_ROUNDS = 60
CONFIRM_WIDTH = 0.04  # stop once the interval's width is at most this fraction of the median
CONFIRM_SECONDS = 10.0  # no batch after the first once the rounds have taken this long


def confirm(config: TrialConfig, measure: Callable[[int], tuple[list[float], list[float]]],
            *, batch: int = CONFIRM_ROUNDS, max_rounds: int = CONFIRM_MAX_ROUNDS,
            width: float = CONFIRM_WIDTH, seconds: float = CONFIRM_SECONDS,
            clock: Callable[[], float] = time.perf_counter) -> Finalist:
    """The speedup of ``config`` over the original from fresh interleaved rounds:
    ``measure(n)`` times both ``n`` rounds (the original's times, then ``config``'s); batches
    of ``batch`` rounds are added until the median's interval is at most ``width`` of it wide,
    ``max_rounds`` are in, or the rounds have taken ``seconds`` (a slow replay: one batch)."""
    base: list[float] = []
    times: list[float] = []
    started = clock()
    while True:
        more_base, more_times = measure(min(batch, max_rounds - len(base)))
        base += more_base
        times += more_times
        f = summarize(config, base, times)
        narrow = math.isfinite(f.speedup) and f.high - f.low <= width * f.speedup
        if (narrow or len(base) >= max_rounds or not more_base
                or clock() - started >= seconds):
            return f


def compare_with_original(run: CampaignRun, rounds: int = 15) -> dict[str, Any] | None:
    """Re-time the archive's best against the original at its recorded configuration,
    interleaved on the GPU, and store the speedup with its interval (event ``final``)."""
    from db import repository as repo

    best = run.state.archive.best()
    if best is None or run.evaluator_for is None:
        return None
    with run.database.session_scope() as s:
        variant = repo.get_variant(s, best.variant_id)
        fit = fitness_of(s, variant, run.launch.block) if variant else None
    seed = run.seed_variant()
    if variant is None or fit is None:
        return None
    space = build_space(run.launch, run.seed_source, run.settings.inner, run.limits)
    original = run.evaluator_for(run.seed_source)
    tuned = run.evaluator_for(replace(run.seed_source, text=variant.source))
    if not (
        hasattr(original, "interleave_many") and hasattr(original, "interleave_with")
        and original.evaluate([space.baseline_config()])[0].ok
        and tuned.evaluate([fit.config])[0].ok
    ):
        return None
    own_space = build_space(run.launch, replace(run.seed_source, text=variant.source),
                            run.settings.inner, run.limits)
    steps = measurable(ladder(fit.config, own_space.baseline_config()), own_space,
                       lambda c: tuned.evaluate([c])[0].ok)
    base, per_step = original.interleave_many(tuned, space.baseline_config(),
                                              [c for _, c in steps], rounds)
    keep = fastest_rung(per_step)
    shipped = steps[keep][1]
    chosen = summarize(shipped, base, per_step[keep])
    f = confirm(shipped, lambda n: original.interleave_with(
        tuned, space.baseline_config(), shipped, n))
    levels: list[dict[str, Any]] = []
    previous = base
    for (level, config), step_times in zip(steps, per_step, strict=True):
        g = summarize(config, previous, step_times)
        levels.append({"level": level, "speedup": g.speedup, "ci": [g.low, g.high],
                       "config": config.to_json()})
        previous = step_times
    data = {
        "variant_id": variant.id,
        "seed_variant_id": seed.id,
        "speedup": f.speedup,
        "ci": [f.low, f.high],
        "rounds": len(f.ratios),
        # the ladder's own figure for the step it chose, from the rounds that chose it
        "ladder": {"speedup": chosen.speedup, "ci": [chosen.low, chosen.high],
                   "rounds": rounds},
        "median_s": f.median_s,
        "config": shipped.to_json(),
        # the steps from the original to what ships, each over the one before (ladder)
        "levels": levels[: keep + 1],
        # the steps after it, not shipped: each ends slower than what ships when re-timed
        "dropped": levels[keep + 1:],
    }
    dropped = "".join(f"; {lv['level']} step dropped ({lv['speedup']:.3f}x re-timed)"
                      for lv in levels[keep + 1:])
    with run.database.session_scope() as s:
        repo.add_event(
            s,
            run.campaign_id,
            "final",
            f"best variant #{variant.id}: {f.speedup:.3f}x "
            f"[{f.low:.3f}, {f.high:.3f}] over the original, {len(f.ratios)} "
            f"interleaved rounds after the {rounds} that chose it ({chosen.speedup:.3f}x "
            f"there){dropped}",
            data,
        )
    return data


def fastest_rung(per_step: Sequence[Sequence[float]]) -> int:
    """The step of the ladder that ships: the one of the lowest median time over the
    interleaved rounds (all steps were timed in the same rounds); on a tie the earlier step,
    which changes less."""
    medians = [statistics.median(times) for times in per_step]
    return min(range(len(medians)), key=lambda i: (medians[i], i))
