"""R³ (remix + inner BO) vs BO alone vs remix alone, at the same trial budget, on the GPU.

For each example: record the naive kernel once, then per seed run three searches that may
each compile and replay at most the same number of candidates:

- ``r3``: the outer MAP-Elites loop with rule mutations (no LLM on the GPU node; LLM variants
  are produced on the CPU machine in generational mode and evaluated with ``--evaluate-db``),
  each child tuned by the inner loop, warm-started from its parent;
- ``bo``: the inner loop alone on the original source (``r3 tune --inner-only``);
- ``remix``: the outer loop with no inner loop (every variant at the recorded configuration,
  OpenEvolve-style).

Speedups are over the recorder's own timing of the original launch (the same denominator for
all three).  Prints per-example medians over seeds, the yield of valid variants per mutation
source, the time per evaluated variant, and the `key: value` lines of issue #5.

    python bench/campaigns.py --db OUT/campaigns.sqlite [--seeds 2] [--variants 8]
    python bench/campaigns.py --evaluate-db OUT/llm.sqlite --bundles DIR   # LLM proposals
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

from eval_cost import DEFAULT_EXAMPLES, DEFAULT_SCALES  # noqa: E402


def record(name: str, out: Path, scale: float) -> Path:
    from catalog import load_example  # type: ignore[import-not-found]

    from r3tui.record.kernel_recorder import RecordKernelRequest, record_kernel

    example = load_example(name)
    bundle = out / f"{name}.r3b"
    if not bundle.exists():
        record_kernel(
            RecordKernelRequest(
                Path(example.path) / "kernel.cu",
                example.kernel_name,
                Path(example.path) / "inputs.py",
                bundle,
                seed=1,
                scale=scale,
            )
        )
    return bundle


def best_trial_s(db: Path, campaign_id: int) -> tuple[float | None, int]:
    from db import repository as repo
    from db.session import open_database
    from r3tui.domain import MeasurementStatus

    with open_database(db, readonly=True) as database, database.session_scope() as s:
        trials = repo.finished_trials(s, campaign_id)
    times = [
        t.measurement.time.median_s
        for t in trials
        if t.measurement.status is MeasurementStatus.OK and t.measurement.time
    ]
    return (min(times) if times else None), len(trials)


def run_example(
    name: str, bundle: Path, db: Path, seeds: int, variants: int, inner: int, seed_trials: int
) -> dict[str, list[float]]:
    from r3tui.engine import InnerCampaign, InnerSettings, run_inner_campaign
    from r3tui.engine.campaign import CampaignSettings
    from r3tui.engine.tune import CampaignJob, run_campaign
    from r3tui.record.bundle import Bundle

    baseline = Bundle.open(bundle).manifest.launch.baseline
    assert baseline is not None, "the recorder timed no baseline"
    budget = seed_trials + variants * inner
    out: dict[str, list[float]] = {"r3": [], "bo": [], "remix": [], "s_per_variant": []}
    for seed in range(seeds):
        started = time.monotonic()
        r3 = run_campaign(
            CampaignJob(
                bundle,
                db,
                CampaignSettings(
                    variants=variants,
                    inner_trials=inner,
                    seed_trials=seed_trials,
                    seed=seed,
                    llm_share=0.0,
                    inner=InnerSettings(seed=seed),
                ),
                None,
                name=f"{name}-r3-s{seed}",
            )
        )
        elapsed = time.monotonic() - started
        bo = run_inner_campaign(
            InnerCampaign(
                bundle,
                db,
                budget_trials=budget,
                settings=InnerSettings(seed=seed),
                name=f"{name}-bo-s{seed}",
            )
        )
        remix = run_campaign(
            CampaignJob(
                bundle,
                db,
                CampaignSettings(
                    variants=budget - 1,
                    inner_trials=1,
                    seed_trials=1,
                    warm_start=0,
                    give_up_after=1,
                    seed=seed,
                    llm_share=0.0,
                    inner=InnerSettings(seed=seed, finalists=1, rounds=3),
                ),
                None,
                name=f"{name}-remix-s{seed}",
            )
        )
        for key, cid in (("r3", r3.campaign_id), ("remix", remix.campaign_id)):
            best, n = best_trial_s(db, cid)
            assert n <= budget, f"{key} used {n} trials > {budget}"
            out[key].append(baseline.median_s / best if best else 0.0)
        out["bo"].append(baseline.median_s / bo.best_s if bo.best_s else 0.0)
        out["s_per_variant"].append(elapsed / (r3.proposals + 1))
        print(
            f"   seed {seed}: r3 {out['r3'][-1]:.3f}x  bo {out['bo'][-1]:.3f}x  "
            f"remix {out['remix'][-1]:.3f}x  ({elapsed:.0f} s for r3)",
            flush=True,
        )
    return out


def yields(db: Path) -> dict[str, tuple[int, int, int]]:
    """(proposals, verified, improved) per mutation source over every campaign in ``db``."""
    from db import repository as repo
    from db.session import open_database
    from r3tui.domain import VariantOrigin, VariantStatus

    counts: dict[str, list[int]] = {}
    with open_database(db, readonly=True) as database, database.session_scope() as s:
        for c in repo.list_campaign_summaries(s):
            for v in repo.campaign_variants(s, c.id):
                if v.origin is VariantOrigin.SEED or v.status is VariantStatus.PENDING:
                    continue
                row = counts.setdefault(v.origin.value, [0, 0, 0])
                row[0] += 1
                row[1] += v.status in (VariantStatus.VERIFIED, VariantStatus.IMPROVED)
                row[2] += v.status is VariantStatus.IMPROVED
    return {k: (a, b, c) for k, (a, b, c) in counts.items()}


def evaluate_llm(db: Path, bundles: Path) -> int:
    """Evaluate the pending (LLM-generated) variants of every campaign in ``db``."""
    from db import repository as repo
    from db.session import open_database
    from r3tui.engine.campaign import CampaignSettings
    from r3tui.engine.tune import CampaignJob, run_campaign
    from r3tui.report import build_report, render

    with open_database(db, readonly=True) as database, database.session_scope() as s:
        campaigns = [(c.id, c.kernel_name, c.name) for c in repo.list_campaign_summaries(s)]
    for cid, kernel, cname in campaigns:
        example = cname.split("-")[0]
        bundle = bundles / f"{example}.r3b"
        print(f"== {cname} (campaign {cid}, {kernel}) with {bundle}", flush=True)
        run_campaign(
            CampaignJob(bundle, db, CampaignSettings(), None, resume_campaign=cid),
            evaluate_only=True,
        )
        with open_database(db, readonly=True) as database, database.session_scope() as s:
            print("\n".join("   " + line for line in render(build_report(s, cid))))
    for origin, (n, ok, better) in sorted(yields(db).items()):
        print(
            f"valid_variant_yield_{origin}: {ok / n if n else 0:.3f}  ({ok}/{n} verified, "
            f"{better} improved)"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", type=Path)
    parser.add_argument("--examples", default=",".join(DEFAULT_EXAMPLES))
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--variants", type=int, default=8)
    parser.add_argument("--inner", type=int, default=8)
    parser.add_argument("--seed-trials", type=int, default=24)
    parser.add_argument("--bundles", type=Path, help="record into / read bundles from here")
    parser.add_argument("--scale", type=float, help="problem size for every example")
    parser.add_argument("--evaluate-db", type=Path, help="evaluate pending LLM variants in it")
    args = parser.parse_args(argv)
    print(
        f"# bench/campaigns.py on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC: {' '.join(sys.argv[1:])}"
    )
    if args.evaluate_db:
        if args.bundles is None:
            parser.error("--evaluate-db needs --bundles")
        return evaluate_llm(args.evaluate_db, args.bundles)
    if args.db is None:
        parser.error("--db is required")
    with tempfile.TemporaryDirectory(prefix="r3-campaigns-") as tmp:
        where = args.bundles or Path(tmp)
        where.mkdir(parents=True, exist_ok=True)
        results = {}
        for name in args.examples.split(","):
            print(f"== {name}", flush=True)
            scale = args.scale or DEFAULT_SCALES.get(name, 1.0)
            bundle = record(name, where, scale)
            results[name] = run_example(
                name, bundle, args.db, args.seeds, args.variants, args.inner, args.seed_trials
            )
    budget = args.seed_trials + args.variants * args.inner
    print()
    print(
        f"budget: {budget} trials per search; {args.seeds} seeds; speedup over the recorded "
        "launch, median over seeds"
    )
    print(
        f"{'example':11} {'r3':>7} {'bo':>7} {'remix':>7} {'r3/bo':>7} {'r3/remix':>8} "
        f"{'s/variant':>9}"
    )
    over_bo, over_remix = [], []
    for name, r in results.items():
        m = {k: statistics.median(v) for k, v in r.items()}
        over_bo.append(m["r3"] / m["bo"] if m["bo"] else float("nan"))
        over_remix.append(m["r3"] / m["remix"] if m["remix"] else float("nan"))
        print(
            f"{name:11} {m['r3']:7.3f} {m['bo']:7.3f} {m['remix']:7.3f} {over_bo[-1]:7.3f} "
            f"{over_remix[-1]:8.3f} {m['s_per_variant']:9.2f}"
        )
    print(f"r3_over_bo_only: {min(over_bo):.3f}")
    print(f"r3_over_remix_only: {min(over_remix):.3f}")
    for origin, (n, ok, better) in sorted(yields(args.db).items()):
        print(
            f"valid_variant_yield_{origin}: {ok / n if n else 0:.3f}  ({ok}/{n} verified, "
            f"{better} improved)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
