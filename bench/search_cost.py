"""CPU cost of the inner Bayesian search per evaluation, in simulation mode.

A live campaign evaluates a candidate in a few milliseconds of GPU time, so the search's own
asks must cost little more than that: at 50 evaluations/s the search has 20 ms of one core per
evaluation, shared with the compile pool.  Here :class:`~r3tui.search.bayes.BayesSearch` runs on
the recorded H200 tables (``tests/data/spaces/*.json`` and ``hard/``, the tables
``bench/inner_bo.py`` uses) for ``--evals`` evaluations in batches of ``--batch``, as the engine
drives it (ask a batch, tell each result), and ``time.process_time`` is read around every ask
and every tell (the table look-ups are not counted).  A table smaller than ``--evals`` is
searched to its end.

Per (table, seed): the search's CPU milliseconds per evaluation (asks + tells, over the
evaluations made), the ask / tell split, the model's hyperparameter searches per model batch
(a batch asked once the initial design is told) and the best time found as a fraction of the
optimum.  ``search_cpu_ms_per_eval`` is the median over tables and seeds, with min and max;
the baseline settings (``--baseline``, ``none`` to skip) run in the same process on the same
tables and seeds and the ratio is printed.  ``--split`` adds one profiled run per table (the
first seed, cProfile: its overhead inflates the times, so only the shares are printed) that
splits the asks into model fit, candidate sampling, acquisition and the rest.

    python bench/search_cost.py [--evals 200] [--batch 8] [--seeds 3] [--set SPEC]
                                [--baseline SPEC|none] [--split] [--tables nbody* sgemm ...]

SPEC is ``defaults`` or ``NAME=VALUE,...`` over ``BayesSettings`` (as ``bench/inner_bo.py``).
The machine is shared: run nothing else heavy meanwhile (process time is counted, not wall
time, but two processes on two cores still slow each other's caches and BLAS).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import platform
import pstats
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from r3tui.errors import ConfigError  # noqa: E402
from r3tui.search.bayes import BayesSearch, BayesSettings  # noqa: E402
from r3tui.search.simulation import SimulatedEvaluator, SpaceFile, parse_space_file  # noqa: E402
from r3tui.search.strategy import Budget  # noqa: E402

# What the profiled pass counts as each part of an ask (cumulative time of these functions,
# outermost calls only).  skopt's Optimizer fits and samples inside its tell; the direct path
# of BayesSearch calls the same scikit-learn fits and its own sampler.
PARTS = {
    "fit": ("sklearn/gaussian_process/_gpr.py:fit", "sklearn/ensemble/_forest.py:fit",
            "r3tui/search/surrogate.py:fit_gp"),
    "candidates": ("skopt/space/space.py:rvs", "r3tui/search/surrogate.py:sample",
                   "r3tui/search/local_candidates.py:neighbours"),
    "acquisition": ("skopt/acquisition.py:_gaussian_acquisition",
                    "skopt/acquisition.py:gaussian_ei", "skopt/acquisition.py:gaussian_pi",
                    "skopt/acquisition.py:gaussian_lcb", "r3tui/search/surrogate.py:acquisition",
                    "r3tui/search/local_candidates.py:acquisition"),
}


@dataclass(frozen=True)
class RunCost:
    table: str
    seed: int
    evals: int
    ask_s: float
    tell_s: float
    fits_per_batch: float | None  # hyperparameter searches per batch asked from the model
    fraction: float  # optimum / best found

    @property
    def ms_per_eval(self) -> float:
        return 1000 * (self.ask_s + self.tell_s) / max(self.evals, 1)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def label_of(path: Path, example: str) -> str:
    return example + ("*" if path.parent.name == "hard" else "")


def run_once(recorded: SpaceFile, label: str, seed: int, settings: BayesSettings, evals: int,
             batch: int) -> RunCost:
    """One search of ``evals`` evaluations in batches of ``batch``; process time of its asks
    and tells only."""
    evaluator = SimulatedEvaluator(recorded.table)
    search = BayesSearch(recorded.space, seed=seed, settings=settings)
    budget = Budget(max_trials=evals)
    ask_s = tell_s = 0.0
    best = float("inf")
    model_batches = 0
    while not search.done(budget):
        model_batches += search.n_evaluated >= settings.n_initial_points
        started = time.process_time()
        configs = search.ask(min(batch, search.remaining(budget) or batch))
        ask_s += time.process_time() - started
        if not configs:
            break
        for config in configs:
            measurement = evaluator.evaluate(config)
            started = time.process_time()
            record = search.tell(config, measurement)
            tell_s += time.process_time() - started
            if record.ok and record.time_s is not None:
                best = min(best, record.time_s)
    fits = search.model_fits / model_batches if model_batches else None
    return RunCost(label, seed, search.n_evaluated, ask_s, tell_s, fits,
                   evaluator.optimum() / best)


def profiled_shares(recorded: SpaceFile, seed: int, settings: BayesSettings, evals: int,
                    batch: int) -> dict[str, float]:
    """One run under cProfile: each part's share of the run's profiled time."""
    profile = cProfile.Profile()
    profile.enable()
    run_once(recorded, "", seed, settings, evals, batch)
    profile.disable()
    stats = pstats.Stats(profile)
    entries = stats.stats  # type: ignore[attr-defined]
    total = sum(tt for (_, _, tt, _, _) in entries.values())
    shares: dict[str, float] = {}
    for part, names in PARTS.items():
        seconds = 0.0
        for (filename, _, function), (_, _, _, cumulative, callers) in entries.items():
            name = f"{filename}:{function}"
            if not any(name.endswith(n) for n in names):
                continue
            # outermost calls only: a caller that is itself counted already holds this time
            inner = sum(c[3] for (cf, _, cfun), c in callers.items()
                        if any(f"{cf}:{cfun}".endswith(n) for ns in PARTS.values() for n in ns))
            seconds += cumulative - inner
        shares[part] = seconds / total if total else 0.0
    shares["other"] = max(0.0, 1.0 - sum(shares.values()))
    return shares


def summary(costs: Sequence[RunCost]) -> tuple[float, float, float]:
    values = [c.ms_per_eval for c in costs]
    return statistics.median(values), min(values), max(values)


def table_lines(name: str, costs: Sequence[RunCost]) -> list[str]:
    lines = [f"{name}:",
             f"  {'table':<11}{'seed':>5}{'evals':>6}{'ms/eval':>9}{'ask':>8}{'tell':>7}"
             f"{'fits/batch':>11}{'fraction':>9}"]
    for c in costs:
        fits = "-" if c.fits_per_batch is None else f"{c.fits_per_batch:.1f}"
        lines.append(f"  {c.table:<11}{c.seed:>5}{c.evals:>6}{c.ms_per_eval:>9.1f}"
                     f"{1000 * c.ask_s / max(c.evals, 1):>8.1f}"
                     f"{1000 * c.tell_s / max(c.evals, 1):>7.2f}{fits:>11}{c.fraction:>9.4f}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=ROOT / "tests" / "data" / "spaces")
    parser.add_argument("--evals", type=int, default=200)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--set", dest="settings", default="defaults",
                        help="BayesSettings under test: 'defaults' or NAME=VALUE,...")
    parser.add_argument("--baseline", default="none",
                        help="BayesSettings measured in the same run to compare with, or none")
    parser.add_argument("--tables", nargs="+", help="only these tables (labels, * = hard)")
    parser.add_argument("--split", action="store_true",
                        help="also profile one run per table and split the asks' time")
    args = parser.parse_args(argv)

    files = sorted(args.data.glob("*.json")) + sorted(args.data.glob("hard/*.json"))
    recorded = {}
    for path in files:
        table = parse_space_file(json.loads(path.read_text()))
        label = label_of(path, table.example)
        if not args.tables or label in args.tables:
            recorded[label] = table
    if not recorded:
        print(f"no recorded spaces in {args.data} (or none of {args.tables})")
        return 2
    try:
        arms = [("settings", BayesSettings.parse(args.settings))]
        if args.baseline != "none":
            arms.append(("baseline", BayesSettings.parse(args.baseline)))
    except ConfigError as exc:
        print(f"error: {exc}")
        return 2
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    # Imported once per process in a campaign too: not part of any ask's cost.
    import scipy.stats  # noqa: F401
    import sklearn.gaussian_process
    import sklearn.preprocessing  # noqa: F401
    import skopt.acquisition  # noqa: F401

    gpu = next(iter(recorded.values())).gpu
    lines = [
        f"date: {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        f"machine: {platform.node()} ({os.cpu_count()} CPUs, {cpu_model()}); "
        f"tables measured on {gpu}",
        "command: python bench/search_cost.py " + " ".join(
            sys.argv[1:] if argv is None else argv),
        f"evals: {args.evals}; batch: {args.batch}; seeds: {seeds.start}..{seeds.stop - 1}; "
        f"tables: {' '.join(recorded)}",
    ]
    results: dict[str, list[RunCost]] = {}
    for arm, settings in arms:
        lines.append(f"{arm}: {settings.changed()}")
        costs = []
        for label, table in recorded.items():
            for seed in seeds:
                costs.append(run_once(table, label, seed, settings, args.evals, args.batch))
                print(f"{arm} {label} seed {seed}: {costs[-1].ms_per_eval:.1f} ms/eval",
                      file=sys.stderr)
        results[arm] = costs
    lines.append("")
    for arm, costs in results.items():
        lines += table_lines(arm, costs)
    lines.append("")
    for arm, costs in results.items():
        suffix = "" if arm == "settings" else "_baseline"
        median, low, high = summary(costs)
        asks = statistics.median(1000 * c.ask_s / max(c.evals, 1) for c in costs)
        tells = statistics.median(1000 * c.tell_s / max(c.evals, 1) for c in costs)
        fits = [c.fits_per_batch for c in costs if c.fits_per_batch is not None]
        lines += [
            f"search_cpu_ms_per_eval{suffix}: {median:.2f} (min {low:.2f}, max {high:.2f}; "
            f"median over {len(costs)} runs: tables x seeds)",
            f"ask_cpu_ms_per_eval{suffix}: {asks:.2f}",
            f"tell_cpu_ms_per_eval{suffix}: {tells:.3f}",
            f"hyperparameter_searches_per_model_batch{suffix}: "
            + (f"{statistics.median(fits):.1f} (max {max(fits):.1f})" if fits else "-"),
            f"fraction_of_optimum{suffix}: {statistics.median(c.fraction for c in costs):.4f} "
            f"(median; min {min(c.fraction for c in costs):.4f})",
        ]
    if "baseline" in results:
        new, old = summary(results["settings"]), summary(results["baseline"])
        lines.append(f"cost_ratio: {new[0] / old[0]:.3f} (settings / baseline, medians; "
                     f"max {new[2] / old[2]:.3f})")
    if args.split:
        lines += ["", "split of one profiled run per table (first seed; shares of the "
                  "profiled search time):"]
        for arm, settings in arms:
            for label, table in recorded.items():
                shares = profiled_shares(table, seeds.start, settings, args.evals, args.batch)
                lines.append(f"split[{arm},{label}]: " + ", ".join(
                    f"{part} {100 * share:.0f}%" for part, share in shares.items()))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
