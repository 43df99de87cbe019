"""Inner-loop search quality on real H200 measurements: BO vs random search vs the optimum.

Every configuration of each example's reduced space was compiled and replayed once on an
H200 (``bench/record_spaces.py`` → ``tests/data/spaces/*.json``); here each strategy searches
those tables (Kernel Tuner's simulation mode), so the comparison is exact, reproducible and
cheap: for budgets of 20 / 50 / 100 evaluations and 10 seeds, the best time found, as a
fraction of the true optimum (exhaustive search), median over seeds.

The hard spaces (``bench/record_spaces.py --space hard`` → ``tests/data/spaces/hard/``: 1500-2000
configurations with narrow good regions) are used when they exist; the summary lines are given
over every table and, where there are hard tables, over those alone (``..._hard:``).

    python bench/inner_bo.py [--seeds 10] [--data tests/data/spaces] [--set acq_func=LCB ...]

``--sweep SPEC ...`` compares settings instead: each SPEC is ``defaults`` or
``name=value,name=value`` (fields of ``BayesSettings``), run on every table against the same
random-search baseline, and ranked by the mean over every (table, budget, seed) run of
log(best / optimum); ``--first-seed`` picks a fresh range of seeds to confirm a choice on.

    python bench/inner_bo.py --budgets 20 50 --jobs 2 --sweep defaults acq_func=LCB ...

``--from-raw FILE ...`` prints the sweep report of runs saved with ``--raw`` (several files
join, paired by seed), over the seeds ``--first-seed`` .. ``--first-seed + --seeds - 1``, without
running anything: one long run, reported per range of seeds.  Only rows of the ``--batch``
given are read (rows written before it was recorded asked one config at a time).

    python bench/inner_bo.py --from-raw a.json b.json --first-seed 10 --seeds 10
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from r3tui.errors import ConfigError  # noqa: E402
from r3tui.search.bayes import BayesSettings  # noqa: E402
from r3tui.search.simulation import (  # noqa: E402
    SimulatedEvaluator,
    StrategyScore,
    beats,
    parse_space_file,
    score,
)

BUDGETS = (20, 50, 100)


def table_files(data: Path) -> list[Path]:
    return sorted(data.glob("*.json")) + sorted(data.glob("hard/*.json"))


def label_of(path: Path, example: str) -> str:
    return example + ("*" if path.parent.name == "hard" else "")


def run_table(path: Path, strategy: str, spec: str, budgets: Sequence[int],
              seeds: Sequence[int], batch: int) -> tuple[dict[int, StrategyScore], float]:
    """One strategy on one table (a process-pool job): its scores and the seconds it took."""
    recorded = parse_space_file(json.loads(path.read_text()))
    evaluator = SimulatedEvaluator(recorded.table)
    size = len(recorded.table)
    usable = [n for n in budgets if n <= size] or [size]
    settings = BayesSettings.parse(spec) if strategy == "bayes" else None
    started = time.perf_counter()
    result = score(strategy, recorded.space, evaluator, usable, seeds, batch, settings)
    return result, time.perf_counter() - started


def at_least_random(bo: StrategyScore, rnd: StrategyScore) -> bool:
    return beats(bo, rnd) or bo.median_best_s == rnd.median_best_s


def header(args: argparse.Namespace, argv: list[str] | None, gpu: str) -> list[str]:
    return [
        f"date: {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        f"gpu (measurements): {gpu}; strategies run in simulation on this machine",
        "command: python bench/inner_bo.py " + " ".join(sys.argv[1:] if argv is None else argv),
        f"seeds: {args.first_seed}..{args.first_seed + args.seeds - 1}",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=ROOT / "tests" / "data" / "spaces")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--batch", type=int, default=1, help="configs asked at once")
    parser.add_argument("--budgets", type=int, nargs="+", default=list(BUDGETS))
    parser.add_argument("--set", dest="settings", default="defaults",
                        help="BayesSettings for the BO runs: NAME=VALUE,NAME=VALUE")
    parser.add_argument("--sweep", nargs="+", metavar="SPEC",
                        help="compare these BayesSettings (each 'defaults' or NAME=VALUE,...)")
    parser.add_argument("--jobs", type=int, default=1, help="tables run in parallel")
    parser.add_argument("--raw", type=Path, help="also write every run's best time (JSON)")
    parser.add_argument("--designs", nargs="+", metavar="SPEC",
                        help="only score the initial designs of these BayesSettings (no model)")
    parser.add_argument("--from-raw", nargs="+", type=Path, metavar="FILE",
                        help="report these --raw files as a sweep (no runs)")
    args = parser.parse_args(argv)

    files = table_files(args.data)
    if not files:
        print(f"no recorded spaces in {args.data}: run bench/record_spaces.py on a GPU first")
        return 2
    if args.from_raw:
        return raw_report(files, args, argv)
    try:
        specs = [BayesSettings.parse(s).changed() for s in (args.sweep or [args.settings])]
    except ConfigError as exc:
        print(f"error: {exc}")
        return 2
    budgets = sorted(set(args.budgets))
    if args.designs:
        try:
            design_specs = [BayesSettings.parse(spec) for spec in args.designs]
        except ConfigError as exc:
            print(f"error: {exc}")
            return 2
        gpu = parse_space_file(json.loads(files[0].read_text())).gpu
        lines = header(args, argv, gpu) + design_report(files, design_specs, args)
        print("\n".join(lines))
        return 0
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    jobs = [(path, "random", "defaults") for path in files]
    jobs += [(path, "bayes", spec) for spec in specs for path in files]
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {key: pool.submit(run_table, *key, budgets, seeds, args.batch)
                   for key in jobs}
        for done, future in enumerate(as_completed(futures.values()), 1):
            print(f"{done}/{len(futures)} runs done ({future.result()[1]:.0f} s)",
                  file=sys.stderr)
        results = {key: future.result() for key, future in futures.items()}
    recorded = {path: parse_space_file(json.loads(path.read_text())) for path in files}
    if args.raw:
        args.raw.write_text(json.dumps([
            {"table": label_of(path, recorded[path].example), "strategy": strategy,
             "settings": spec, "budget": n, "optimum_s": s.optimum_s, "best_s": list(s.best_s),
             "seeds": seeds, "batch": args.batch,
             **({"bayes": dataclasses.asdict(BayesSettings.parse(spec))}
                if strategy == "bayes" else {})}
            for (path, strategy, spec), (scores, _) in results.items()
            for n, s in scores.items()], indent=0))
    gpu = next(iter(recorded.values())).gpu
    lines = header(args, argv, gpu)
    if args.sweep:
        lines += sweep_report(files, recorded, specs, budgets, results)
    else:
        lines += table_report(files, recorded, specs[0], budgets, results, args.data)
    print("\n".join(lines))
    return 0


RawRuns = dict[tuple[str, str, str, int], tuple[dict[int, float], float]]


# BayesSettings defaults when --raw rows named their settings only by the spec as given
# (through 2026-12-03 session 15, except at 270e2a9): a "defaults" there is EI on log time.
# Rows written since carry every field ("bayes").
LEGACY_DEFAULTS = {"acq_func": "EI", "transform": "log", "local_candidates": 0}
# BayesSettings fields added since rows were written, and what those rows ran (through
# 2026-12-04 every Bayesian ask went through skopt's Optimizer).  Rows without "batch" asked
# one config at a time (the --batch default).
ADDED_FIELDS = {"fit_per": "point"}


def settings_label(row: dict[str, Any]) -> str:
    """A raw row's settings as a spec relative to today's defaults (random search: its own)."""
    if row["strategy"] != "bayes":
        return str(row["settings"])
    if "bayes" in row:
        return BayesSettings(**{**ADDED_FIELDS, **row["bayes"]}).changed()
    return BayesSettings.parse(row["settings"], **LEGACY_DEFAULTS, **ADDED_FIELDS).changed()


def join_raw(rows: Iterable[dict[str, Any]], seeds: range) -> RawRuns:
    """``--raw`` rows joined by (table label, strategy, settings, budget): each seed's best
    time within ``seeds``, and the optimum; ValueError when two rows disagree on a seed.
    Settings are named relative to today's defaults (:func:`settings_label`), so files
    written under other defaults join correctly."""
    joined: RawRuns = {}
    for row in rows:
        key = (row["table"], row["strategy"], settings_label(row), row["budget"])
        best, _optimum = joined.setdefault(key, ({}, row["optimum_s"]))
        for seed, time_s in zip(row["seeds"], row["best_s"], strict=True):
            if seed in seeds and best.setdefault(seed, time_s) != time_s:
                raise ValueError(f"{' '.join(map(str, key))} seed {seed}: two different results")
    return joined


def raw_report(files: list[Path], args: argparse.Namespace, argv: list[str] | None) -> int:
    """The sweep report of ``--raw`` files, over the seeds asked for.

    Rows of one (table, strategy, settings, budget) are joined over the files by seed, so runs
    split by seed range or by table can be reported together; rows of tables not in ``--data``
    are left out, and so is a setting that lacks a seed or a table the others have (each said
    in a line at the end)."""
    recorded = {path: parse_space_file(json.loads(path.read_text())) for path in files}
    by_label = {label_of(path, recorded[path].example): path for path in files}
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    try:
        rows = [row for raw in args.from_raw for row in json.loads(raw.read_text())]
    except (OSError, ValueError) as exc:
        print(f"error: cannot read the raw runs: {exc}")
        return 2
    try:
        joined = join_raw((row for row in rows if row["table"] in by_label
                           and row.get("batch", 1) == args.batch), seeds)
    except ValueError as exc:
        print(f"error: {exc}")
        return 2
    used = sorted({by_label[table] for table, *_ in joined}, key=files.index)
    budgets = sorted({n for (table, _, _, n) in joined
                      if n < len(recorded[by_label[table]].table)})
    cells = [(by_label[t], n) for t in by_label for n in budgets
             if by_label[t] in used and n < len(recorded[by_label[t]].table)]
    used = [path for path in used if any(p == path for p, _ in cells)]
    notes: list[str] = []
    results: Results = {}
    specs: list[str] = []
    settings = [("random", "defaults")] + [("bayes", s) for s in dict.fromkeys(
        k[2] for k in joined if k[1] == "bayes")]
    for strategy, spec in settings:
        complete = all(len(joined.get((label_of(p, recorded[p].example), strategy, spec, n),
                                      ({}, 0.0))[0]) == len(seeds) for p, n in cells)
        if not complete and strategy == "random":
            print(f"error: random search lacks a table, budget or seed of "
                  f"{seeds.start}..{seeds.stop - 1} in the raw runs")
            return 2
        if not complete:
            notes.append(f"left out: {strategy} {spec} (not every table, budget and seed of "
                         f"{seeds.start}..{seeds.stop - 1})")
            continue
        if strategy == "bayes":
            specs.append(spec)
        for (table, strat, spec_of, n), (best, optimum) in joined.items():
            if (strat, spec_of) == (strategy, spec) and (by_label[table], n) in cells:
                scores = results.setdefault((by_label[table], strategy, spec), ({}, 0.0))[0]
                scores[n] = StrategyScore(strategy, n, tuple(best[s] for s in seeds), optimum)
    if not specs:
        print(f"error: no setting has every table, budget and seed of "
              f"{seeds.start}..{seeds.stop - 1} in the raw runs")
        return 2
    gpu = next(iter(recorded.values())).gpu
    lines = header(args, argv, gpu) + sweep_report(used, recorded, specs, budgets, results)
    print("\n".join(lines + notes))
    return 0


def design_report(files: list[Path], specs: list[BayesSettings],
                  args: argparse.Namespace) -> list[str]:
    """How good each setting's initial design is on its own: the best of the first
    ``n_initial_points`` asks of a fresh search, per table, over seeds, and how many different
    designs the seeds give (a generator that ignores the seed gives one)."""
    from r3tui.search.bayes import BayesSearch
    from r3tui.search.space import config_key

    seeds = range(args.first_seed, args.first_seed + args.seeds)
    labels, columns = [], []
    for path in files:
        recorded = parse_space_file(json.loads(path.read_text()))
        if len(recorded.table) <= 50:
            continue
        evaluator = SimulatedEvaluator(recorded.table)
        optimum = evaluator.optimum()
        labels.append(label_of(path, recorded.example))
        column = []
        for settings in specs:
            losses, designs = [], set()
            for seed in seeds:
                asked = BayesSearch(recorded.space, seed, settings).ask(settings.n_initial_points)
                designs.add(tuple(sorted(config_key(c) for c in asked)))
                times = [m.time.median_s for m in map(evaluator.evaluate, asked)
                         if m.ok and m.time is not None]
                losses.append(100 * math.log(min(times) / optimum) if times else math.inf)
            column.append(f"{statistics.fmean(losses):.2f}/{statistics.median(losses):.2f}"
                          f"/{len(designs)}")
        columns.append(column)
    width = max(len(s.changed()) for s in specs) + 2
    lines = ["", "initial designs alone (tables over 50 configs): mean/median over seeds of "
             "100*log(best in the design / optimum) / distinct designs over the seeds",
             f"{'settings':<{width}}" + "".join(f"{label:>18}" for label in labels)]
    for i, settings in enumerate(specs):
        lines.append(f"{settings.changed():<{width}}"
                     + "".join(f"{column[i]:>18}" for column in columns))
    return lines


Results = dict[tuple[Path, str, str], tuple[dict[int, StrategyScore], float]]


def table_report(files: list[Path], recorded: dict, spec: str, budgets: Sequence[int],
                 results: Results, data: Path) -> list[str]:
    """The benchmark table: BO (with ``spec``) vs random per example and budget."""
    lines = [
        f"bo settings: {spec}",
        "",
        f"{'example':<11} {'configs':>7} {'optimum us':>10}  "
        + "  ".join(f"{'bo@' + str(n):>7} {'rand@' + str(n):>7}" for n in budgets)
        + "   (median fraction of the optimum over seeds)",
    ]
    worst_frac50: dict[str, tuple[float, str]] = {}
    worst_bo_over_random20: dict[str, tuple[float, str]] = {}
    losses: list[str] = []
    hard = False
    for path in files:
        table = recorded[path]
        kind = "hard" if path.parent.name == "hard" else "reduced"
        hard = hard or kind == "hard"
        label = label_of(path, table.example)
        size = len(table.table)
        bo, bo_s = results[(path, "bayes", spec)]
        rnd, rnd_s = results[(path, "random", "defaults")]
        cells = []
        for n in budgets:
            if n not in bo:
                cells.append(f"{'-':>7} {'-':>7}")
                continue
            cells.append(f"{bo[n].median_fraction:>7.3f} {rnd[n].median_fraction:>7.3f}")
            if n < size and not at_least_random(bo[n], rnd[n]):
                losses.append(f"{label}@{n}: BO {bo[n].median_best_s * 1e6:.3f} us vs "
                              f"random {rnd[n].median_best_s * 1e6:.3f} us")
        optimum = next(iter(bo.values())).optimum_s
        lines.append(f"{label:<11} {size:>7} {optimum * 1e6:>10.2f}  " + "  ".join(cells)
                     + f"   ({bo_s + rnd_s:.0f} s)")
        n50 = 50 if 50 in bo else max(bo)
        for group in ("all", kind):
            frac = (bo[n50].median_fraction, label)
            worst_frac50[group] = min(worst_frac50.get(group, frac), frac)
            if size > 20 and 20 in bo:  # smaller spaces are searched exhaustively within 20
                ratio = (rnd[20].median_best_s / bo[20].median_best_s, label)  # > 1: BO faster
                worst_bo_over_random20[group] = min(worst_bo_over_random20.get(group, ratio),
                                                    ratio)
    lines += [""]
    for group, suffix in (("all", ""), ("hard", "_hard")):
        if group not in worst_frac50:
            continue
        worst_frac, frac_at = worst_frac50[group]
        lines.append(f"fraction_of_optimum_at_50{suffix}: {worst_frac:.3f} ({frac_at}, worst "
                     "example, median over seeds)")
        if group in worst_bo_over_random20:
            worst_ratio, ratio_at = worst_bo_over_random20[group]
            lines.append(f"bo_over_random_at_20{suffix}: {worst_ratio:.3f} ({ratio_at}, worst "
                         "example; random's median best time / BO's)")
    if not hard:
        lines.append(f"(no hard spaces in {data / 'hard'}: run "
                     "bench/record_spaces.py --space hard on a GPU)")
    lines += [
        f"bo_beats_or_ties_random_at_every_budget: {not losses}",
        *(f"  BO behind random: {loss}" for loss in losses),
        "(* = hard space)",
    ]
    return lines


def sweep_report(files: list[Path], recorded: dict, specs: list[str], budgets: Sequence[int],
                 results: Results) -> list[str]:
    """Per-budget tables of median fractions (variants x examples), then the aggregates."""
    cells = [(path, n) for path in files for n in budgets if n < len(recorded[path].table)]
    labels = {path: label_of(path, recorded[path].example) for path in files}
    used = [path for path in files if any(p == path for p, _ in cells)]
    width = max(len(s) for s in [*specs, "random"]) + 2
    lines = ["", "cells: every (table, budget) with budget < table size "
             f"({len(cells)}); fraction = optimum / best time"]
    for n in budgets:
        row_paths = [p for p in used if (p, n) in cells]
        if not row_paths:
            continue
        lines += ["", f"median fraction of the optimum at {n} evaluations:",
                  f"{'settings':<{width}}" + "".join(f"{labels[p]:>11}" for p in row_paths)]
        for spec, strategy in [("random", "random"), *((s, "bayes") for s in specs)]:
            key_spec = "defaults" if strategy == "random" else spec
            lines.append(f"{spec:<{width}}" + "".join(
                f"{results[(p, strategy, key_spec)][0][n].median_fraction:>11.4f}"
                for p in row_paths))
    lines += ["", "mean over seeds and budgets of 100*log(best/optimum), per table (loss%):",
              f"{'settings':<{width}}" + "".join(f"{labels[p]:>11}" for p in used)]
    for spec, strategy in [("random", "random"), *((s, "bayes") for s in specs)]:
        key_spec = "defaults" if strategy == "random" else spec
        per_table = []
        for path in used:
            ours = [results[(path, strategy, key_spec)][0][n] for p, n in cells if p == path]
            per_table.append(100 * statistics.fmean(
                math.log(b / s.optimum_s) for s in ours for b in s.best_s))
        lines.append(f"{spec:<{width}}" + "".join(f"{v:>11.3f}" for v in per_table))
    lines += ["", "aggregates over the cells (ranked by the first column):",
              f"{'settings':<{width}}{'loss%':>7}{'se':>6}{'-first':>14}{'se':>6}"
              f"{'medloss%':>9}" + "".join(f"{'worst@' + str(n):>10}" for n in budgets)
              + f"{'>=random':>10}{'worst rand/bo':>24}{'cpu s':>7}",
              "  loss%: mean over every run (cell x seed) of 100*log(best/optimum), se: its "
              "standard error over seeds (a seed's loss: its mean over the cells); "
              f"-first: the paired difference to the first setting ({specs[0]}), per seed; "
              "medloss%: the "
              "loss over the cells' median runs; >=random: cells where BO's median best is at "
              "or below random's"]

    def per_seed(strategy: str, key_spec: str) -> list[float]:
        scores = [results[(p, strategy, key_spec)][0][n] for p, n in cells]
        return [100 * statistics.fmean(math.log(s.best_s[i] / s.optimum_s) for s in scores)
                for i in range(len(scores[0].best_s))]

    def mean_se(values: list[float]) -> tuple[float, float]:
        spread = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0
        return statistics.fmean(values), spread

    first = per_seed("bayes", specs[0])
    rows: list[tuple[float, str]] = []
    for spec, strategy in [("random", "random"), *((s, "bayes") for s in specs)]:
        key_spec = "defaults" if strategy == "random" else spec
        scores = {(p, n): results[(p, strategy, key_spec)][0][n] for p, n in cells}
        loss, loss_se = mean_se(per_seed(strategy, key_spec))
        diff, diff_se = mean_se([a - b for a, b in zip(per_seed(strategy, key_spec), first,
                                                         strict=True)])
        medians = [math.log(s.median_best_s / s.optimum_s) for s in scores.values()]
        worst = [min((s.median_fraction for (p, m), s in scores.items() if m == n),
                     default=math.nan) for n in budgets]
        vs = [(results[(p, "random", "defaults")][0][n], s) for (p, n), s in scores.items()]
        wins = sum(at_least_random(bo, rnd) for rnd, bo in vs)
        ratio, at = min((rnd.median_best_s / bo.median_best_s, f"{labels[p]}@{n}")
                        for (rnd, bo), (p, n) in zip(vs, scores, strict=True))
        seconds = sum(results[(p, strategy, key_spec)][1] for p in files)
        rows.append((loss if strategy == "bayes" else math.inf, (
            f"{spec:<{width}}{loss:>7.3f}{loss_se:>6.3f}{diff:>+14.3f}{diff_se:>6.3f}"
            f"{100 * statistics.fmean(medians):>9.3f}"
            + "".join(f"{w:>10.4f}" for w in worst)
            + f"{f'{wins}/{len(vs)}':>10}{f'{ratio:.4f} {at}':>24}{seconds:>7.0f}")))
    lines += [text for _, text in sorted(rows)]
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
