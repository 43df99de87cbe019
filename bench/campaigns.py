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
source, the time per evaluated variant, and the `key: value` lines of issues #5 and #19:
R³ over BO alone per example with its interval over the seeds, and, against ceilings measured
in the same run (bench/ceilings.py: copy bandwidth, FMA rate, cuBLAS SGEMM on sgemm's own
matrices), each tuned kernel's fraction of its ceiling.

    python bench/campaigns.py --db OUT/campaigns.sqlite [--seeds 3] [--variants 4] [--inner 5]
        [--seed-trials 12] [--examples a,b] [--time-limit 420] [--example-cap S]
        [--ablate-transfer] [--no-ceilings] [--seconds S] [--no-remix]

``--seconds S`` gives every search S seconds of wall time instead of the trial budget (issue
#19 compares the arms at equal wall time): r3 makes variants, each tuned with ``--inner``
trials, until its time is up; BO alone asks trials until then.  ``--no-remix`` leaves remix
alone out (issue #19 compares r3 with BO alone): a seed is complete once those two finished.

Seed 0 of every example runs first, then seed 1, and so on; a search that would end past
``--time-limit`` is not started, and the summary (bench/campaign_summary.py, read back from
the database) names whatever was cut short.  An example and seed whose three searches the
database (``--db``, carried back from an earlier call) already holds finished is skipped, so
6 seeds of every example can take two device commands.
    python bench/campaigns.py --evaluate-db OUT/llm.sqlite --bundles DIR   # LLM proposals
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

from campaign_summary import (  # noqa: E402
    ABLATION,
    COMPARED,
    KINDS,
    Ceilings,
    Work,
    ceilings_path,
    climb_lines,
    complete_seeds,
    read_results,
    summary_lines,
    yield_lines,
)
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


def example_work(names: list[str], scale: float | None) -> tuple[dict[str, Work], Any]:
    """Each example's work per launch at the scale it is recorded at (seed 1, as
    :func:`record`), and sgemm's inputs (the matrices cuBLAS is timed on) or None."""
    from catalog import load_example

    from r3tui.record.kernel_recorder import load_inputs

    work, sgemm = {}, None
    for name in names:
        example = load_example(name)
        inputs = load_inputs(Path(example.path) / "inputs.py", seed=1,
                             scale=scale or DEFAULT_SCALES.get(name, 1.0))
        amount = (example.bytes_moved(inputs) if example.bound == "memory"
                  else example.flops(inputs))
        work[name] = Work(example.bound, amount)
        if name == "sgemm":
            sgemm = inputs
    return work, sgemm


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


@dataclass(frozen=True)
class Budgets:
    variants: int
    inner: int
    seed_trials: int
    # issue #19's comparison: every search gets this much wall time instead of a number of
    # trials (r3's inner budgets per variant still hold; it makes variants until time is up)
    seconds: float | None = None

    @property
    def trials(self) -> int:
        """What every search may compile and replay: the r3 campaign's budget."""
        return self.seed_trials + self.variants * self.inner

    def describe(self) -> str:
        return (f"{self.seconds:g} s of wall time per search" if self.seconds is not None
                else f"{self.trials} trials per search")


def run_seed(
    name: str, bundle: Path, db: Path, seed: int, budgets: Budgets, ablate: bool = False,
    remix_arm: bool = True,
) -> bool:
    """The three searches of one example and seed (two without ``remix_arm``; four with
    ``ablate``: r3 without transfer of ancestors' trials and with the old warm start of 3);
    ``False`` if one was stopped."""
    from r3tui.engine import InnerCampaign, InnerSettings, run_inner_campaign
    from r3tui.engine.campaign import CampaignSettings
    from r3tui.engine.tune import CampaignJob, run_campaign
    from r3tui.record.bundle import Bundle

    baseline = Bundle.open(bundle).manifest.launch.baseline
    assert baseline is not None, "the recorder timed no baseline"
    budget = budgets.trials
    started = time.monotonic()

    timed = budgets.seconds is not None
    # a wall-time budget: each search makes variants (or trials) until its time is up
    outer: dict[str, Any] = ({"variants": None, "seconds": budgets.seconds} if timed
                             else {"variants": budgets.variants})

    def remix_and_bo(kind: str, **changes: int) -> Any:
        """The r3 search (rule mutations, each variant tuned by the inner loop)."""
        settings = CampaignSettings(
            **outer,
            inner_trials=budgets.inner,
            seed_trials=budgets.seed_trials,
            seed=seed,
            llm_share=0.0,
            inner=InnerSettings(seed=seed),
        )
        return run_campaign(
            CampaignJob(
                bundle, db, replace(settings, **changes), None, name=f"{name}-{kind}-s{seed}"
            )
        )

    r3 = remix_and_bo("r3")
    r3_s = time.monotonic() - started
    if r3.status == "stopped":  # SIGTERM during the campaign: its control stopped it
        return False
    bo = run_inner_campaign(
        InnerCampaign(
            bundle,
            db,
            budget_trials=None if timed else budget,
            budget_seconds=budgets.seconds,
            settings=InnerSettings(seed=seed),
            name=f"{name}-bo-s{seed}",
        )
    )
    searched = [("r3", r3)]
    if remix_arm:
        searched.append(("remix", run_campaign(CampaignJob(
            bundle,
            db,
            CampaignSettings(
                **({"variants": None, "seconds": budgets.seconds} if timed
                   else {"variants": budget - 1}),
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
        ))))
    if ablate:
        searched.append((ABLATION, remix_and_bo(ABLATION, warm_start=3, transfer=0)))
    speedups = {}
    for key, cid in ((k, job.campaign_id) for k, job in searched):
        best, n = best_trial_s(db, cid)
        assert timed or n <= budget, f"{key} used {n} trials > {budget}"
        speedups[key] = baseline.median_s / best if best else 0.0
    speedups["bo"] = baseline.median_s / bo.best_s if bo.best_s else 0.0
    print(
        f"   seed {seed}: r3 {speedups['r3']:.3f}x  bo {speedups['bo']:.3f}x"
        + (f"  remix {speedups['remix']:.3f}x" if remix_arm else "")
        + (f"  {ABLATION} {speedups[ABLATION]:.3f}x" if ablate else "")
        + f"  ({r3_s:.0f} s for r3, {time.monotonic() - started:.0f} s for all)",
        flush=True,
    )
    return all(job.status != "stopped" for _, job in searched)


def evaluate_llm(db: Path, bundles: Path) -> int:
    """Evaluate the pending (LLM-generated) variants of every campaign in ``db``."""
    from db import repository as repo
    from db.session import open_database
    from r3tui.engine.campaign import CampaignSettings
    from r3tui.engine.report import build_report, render
    from r3tui.engine.tune import CampaignJob, run_campaign

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
    print("\n".join(yield_lines(db)))
    return 0


class _Terminated(Exception):
    """SIGTERM (``timeout``) outside a campaign: stop, then still print the summary."""


def _on_term(signum: int, frame: object) -> None:
    raise _Terminated


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", type=Path)
    parser.add_argument("--examples", default=",".join(DEFAULT_EXAMPLES))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--variants", type=int, default=4)
    parser.add_argument("--inner", type=int, default=5)
    parser.add_argument("--seed-trials", type=int, default=12)
    parser.add_argument("--seconds", type=float,
                        help="every search gets this much wall time instead of the trial "
                             "budget (issue #19's comparison)")
    parser.add_argument("--bundles", type=Path, help="record into / read bundles from here")
    parser.add_argument("--scale", type=float, help="problem size for every example")
    parser.add_argument(
        "--time-limit",
        type=float,
        default=420.0,
        help="seconds: start no search of an example and seed that would end past it (0: none)",
    )
    parser.add_argument(
        "--example-cap",
        type=float,
        default=0.0,
        help="seconds per example over its seeds (0: none)",
    )
    parser.add_argument("--no-remix", action="store_true",
                        help="run r3 and BO alone only (issue #19's comparison), not remix "
                             "alone: a third less GPU time")
    parser.add_argument("--no-ceilings", action="store_true",
                        help="do not measure copy bandwidth, FMA rate and cuBLAS first")
    parser.add_argument("--evaluate-db", type=Path, help="evaluate pending LLM variants in it")
    parser.add_argument(
        "--ablate-transfer",
        action="store_true",
        help=f"also run r3 as before transfer ({ABLATION}: no ancestors' trials, warm start 3)",
    )
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
    examples = [e for e in args.examples.split(",") if e]
    budgets = Budgets(args.variants, args.inner, args.seed_trials, args.seconds)
    work, sgemm_inputs = example_work(examples, args.scale)
    if not args.no_ceilings:  # the same GPU, the same run: kept beside the database
        from ceilings import measure

        measured = measure(sgemm_inputs)
        measured.save(ceilings_path(args.db))
        print(f"ceilings measured: copy {measured.copy_bytes_per_s / 1e12:.2f} TB/s, fp32 FMA "
              f"{measured.fma_flops_per_s / 1e12:.1f} TFLOP/s, cuBLAS SGEMM "
              + (f"{measured.cublas_sgemm_s * 1e6:.1f} us" if measured.cublas_sgemm_s else "-")
              + f" ({measured.cublas_how})", flush=True)
    notes = run_all(args, examples, budgets)
    print()
    for note in notes:
        print(f"# {note}")
    print("\n".join(summary_lines(read_results(args.db), examples, args.seeds, budgets.describe(),
                                  Ceilings.load(ceilings_path(args.db)), work,
                                  kinds=COMPARED if args.no_remix else KINDS)))
    print("\n".join(yield_lines(args.db)))
    print("\n".join(climb_lines(args.db)))
    return 0


def run_all(
    args: argparse.Namespace,
    examples: list[str],
    budgets: Budgets,
    clock: Callable[[], float] = time.monotonic,
) -> list[str]:
    """Record every example, then run seed 0 of every example, then seed 1, ...: a run cut
    short by its time limit still has every example at least once.  Returns what was cut."""
    started = clock()
    deadline = started + args.time_limit if args.time_limit > 0 else None
    notes: list[str] = []
    spent: dict[str, list[float]] = {name: [] for name in examples}
    # seeds a call before this one finished in the same database: a run of more seeds than
    # one device command holds goes on in the next (the database carried back)
    kinds = COMPARED if args.no_remix else KINDS
    done = ({(e, seed) for e, seeds in complete_seeds(read_results(args.db), kinds).items()
             for seed in seeds} if args.db is not None and Path(args.db).is_file() else set())
    previous = signal.signal(signal.SIGTERM, _on_term)
    try:
        with tempfile.TemporaryDirectory(prefix="r3-campaigns-") as tmp:
            where = args.bundles or Path(tmp)
            where.mkdir(parents=True, exist_ok=True)
            bundles = {}
            for name in examples:
                t0 = clock()
                bundles[name] = record(name, where, args.scale or DEFAULT_SCALES.get(name, 1.0))
                print(f"recorded {name} in {clock() - t0:.1f} s", flush=True)
            for seed in range(args.seeds):
                for name in examples:
                    if (name, seed) in done:
                        print(f"== {name} seed {seed}: in the database already", flush=True)
                        continue
                    # the next seed of an example is expected to take as long as its last ones
                    expected = statistics.mean(spent[name]) if spent[name] else 0.0
                    if deadline is not None and clock() + expected > deadline:
                        notes.append(f"{name} seed {seed} not run: time limit {args.time_limit} s")
                        continue
                    if args.example_cap > 0 and sum(spent[name]) + expected > args.example_cap:
                        notes.append(
                            f"{name} seed {seed} not run: example cap {args.example_cap} s"
                        )
                        continue
                    print(f"== {name} seed {seed}", flush=True)
                    t0 = clock()
                    complete = run_seed(
                        name, bundles[name], args.db, seed, budgets, args.ablate_transfer,
                        remix_arm=not args.no_remix,
                    )
                    spent[name].append(clock() - t0)
                    if not complete:
                        notes.append(f"stopped by a signal during {name} seed {seed}")
                        return notes
    except _Terminated:
        notes.append("terminated (SIGTERM) between searches")
    finally:
        signal.signal(signal.SIGTERM, previous)
        notes.append(f"wall time {clock() - started:.0f} s")
    return notes


if __name__ == "__main__":
    raise SystemExit(main())
