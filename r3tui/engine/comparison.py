"""The campaign's last word: its best variant re-timed against the original, interleaved.

Per-trial medians come from separate replays; a speedup claimed over the original is only
worth its interval when both kernels are timed round by round on the same GPU, so after the
budget the archive's best (at its best configuration) and the original (at the recorded
configuration) are launched alternately and the per-round ratios summarized with a bootstrap
interval (event ``final``, shown by ``r3 report``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from r3tui.engine.inner import build_space
from r3tui.engine.lineage import fitness_of

if TYPE_CHECKING:
    from r3tui.engine.campaign import CampaignRun


def compare_with_original(run: CampaignRun, rounds: int = 15) -> dict[str, Any] | None:
    """Re-time the archive's best against the original at its recorded configuration,
    interleaved on the GPU, and store the speedup with its interval (event ``final``)."""
    from db import repository as repo
    from r3tui.search.winner import summarize

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
        hasattr(original, "interleave_with")
        and original.evaluate([space.baseline_config()])[0].ok
        and tuned.evaluate([fit.config])[0].ok
    ):
        return None
    base, times = original.interleave_with(tuned, space.baseline_config(), fit.config, rounds)
    f = summarize(fit.config, base, times)
    data = {
        "variant_id": variant.id,
        "seed_variant_id": seed.id,
        "speedup": f.speedup,
        "ci": [f.low, f.high],
        "rounds": rounds,
        "median_s": f.median_s,
        "config": fit.config.to_json(),
    }
    with run.database.session_scope() as s:
        repo.add_event(
            s,
            run.campaign_id,
            "final",
            f"best variant #{variant.id}: {f.speedup:.3f}x "
            f"[{f.low:.3f}, {f.high:.3f}] over the original, {rounds} "
            "interleaved rounds",
            data,
        )
    return data
