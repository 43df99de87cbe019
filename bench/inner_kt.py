"""Inner-loop search quality against Kernel Tuner's Bayesian optimization, on the same tables.

Both searches run in simulation on the real H200 measurements of ``tests/data/spaces/*.json``
(every configuration of each example's reduced space, compiled and replayed once): our
``BayesSearch`` exactly as ``bench/inner_bo.py`` runs it, and Kernel Tuner's ``bayes_opt``
strategy (its defaults) through ``tune_kernel(..., simulation_mode=True)`` on a cache file made
from the same table (``bench/kt_cache.py``).  Budgets of 20 / 50 / 100 evaluations
(``strategy_options={"max_fevals": N}``: in simulation Kernel Tuner counts each distinct
configuration once), 10 seeds each; both best times are read from our table.

Seeding Kernel Tuner: its ``bayes_opt`` draws from Python's ``random`` and numpy's global
state, which are seeded per run, and its initial Latin hypercube from
``scipy.stats.qmc.LatinHypercube`` without a seed (fresh OS entropy on scipy >= 1.15); this
script passes that sampler a generator seeded the same way.  Nothing else of Kernel Tuner is
touched.  Runs are still not fully reproducible: runs on the same tables picked differently in
two places when two of them ran at once (``bench/results/2026-12-03-inner-bo-s15.txt``, the
end), likely because its ``multi-ultrafast`` method decides when to refit from wall-clock
timings; run one at a time.  Our side reads fixed ``--ours-raw`` runs.

    python bench/inner_kt.py [--seeds 10] [--data tests/data/spaces]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import random
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from inner_bo import join_raw, label_of  # noqa: E402
from kt_cache import KTSpace, best_time_s, restriction, to_kt, unique_evaluations  # noqa: E402

from r3tui.domain import MeasurementStatus  # noqa: E402
from r3tui.search.simulation import (  # noqa: E402
    SimulatedEvaluator,
    SpaceFile,
    StrategyScore,
    parse_space_file,
    score,
)

BUDGETS = (20, 50, 100)


@dataclass(frozen=True)
class KTRun:
    best_s: float  # inf: no successful configuration
    evaluations: int  # distinct configurations Kernel Tuner evaluated
    warnings: tuple[str, ...]


def kt_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("kernel_tuner")
    except Exception:  # not installed, or installed without metadata
        return None


@contextlib.contextmanager
def seeded_kernel_tuner(seed: int) -> Iterator[None]:
    """Seed every random source Kernel Tuner's bayes_opt draws from (see the docstring)."""
    import numpy as np
    from kernel_tuner.strategies import bayes_opt  # type: ignore[import-untyped,import-not-found,unused-ignore]

    random.seed(seed)
    np.random.seed(seed)
    original = bayes_opt.LatinHypercube
    bayes_opt.LatinHypercube = functools.partial(original, rng=np.random.default_rng(seed))
    try:
        yield
    finally:
        bayes_opt.LatinHypercube = original


def run_kernel_tuner(
    kt: KTSpace,
    cache: Path,
    recorded: SpaceFile,
    n_evals: int,
    seed: int,
    strategy_options: dict[str, Any],
) -> KTRun:
    from kernel_tuner import tune_kernel  # type: ignore[import-untyped,import-not-found,unused-ignore]

    options = {"max_fevals": n_evals, **strategy_options}
    chatter = io.StringIO()  # Kernel Tuner prints even when quiet; keep the table readable
    with (
        warnings.catch_warnings(record=True) as caught,
        seeded_kernel_tuner(seed),
        contextlib.redirect_stdout(chatter),
    ):
        warnings.simplefilter("always")
        results, _env = tune_kernel(
            kt.kernel_name,
            "",
            kt.problem_size,
            [],
            kt.tune_params,
            restrictions=[restriction(kt)],
            cache=str(cache),
            simulation_mode=True,
            strategy="bayes_opt",
            strategy_options=options,
            quiet=True,
            verbose=False,
        )
    notes = tuple(sorted({str(w.message).splitlines()[0] for w in caught}))
    return KTRun(best_time_s(kt, recorded.table, results), unique_evaluations(kt, results), notes)


def reading(failed_tables: Sequence[str]) -> list[str]:
    """What Kernel Tuner's bayes_opt does with its defaults (read from kernel_tuner 1.5.0's
    strategies/bayes_opt.py and strategies/common.py), to read the notes above."""
    lines = [
        "  Kernel Tuner bayes_opt defaults: popsize 20 initial samples (Latin hypercube, random "
        "fill) before its GP proposes anything, so at 20 evaluations it has only sampled; method "
        "multi-ultrafast (EI, PI, LCB in turn), which refits the GP only every few rounds when "
        "evaluations are much faster than its predictions, as in simulation; Matern 3/2 kernel "
        "with a fixed length scale 1.5 on index-scaled parameters",
    ]
    if failed_tables:
        lines.append(
            "  failed configs in " + ", ".join(failed_tables) + ": Kernel Tuner's CostFunc "
            "scores an error as sys.float_info.max while bayes_opt treats only 1e20 as invalid, "
            "so they enter its GP as observations (the numpy overflow warnings); ours tells "
            "them as 2x the worst time seen"
        )
    return lines


def display_path(path: Path) -> str:
    """``path`` relative to the repository when it lies inside it (given relative or not)."""
    resolved = path.resolve()
    return str(resolved.relative_to(ROOT)) if resolved.is_relative_to(ROOT) else str(path)


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def us(seconds: float) -> str:
    return f"{seconds * 1e6:.2f}" if seconds != float("inf") else "inf"


def stored_runs(raw: Path, label: str, budgets: Sequence[int],
                seeds: range) -> dict[int, StrategyScore]:
    """Our best times per budget from an ``inner_bo.py --raw`` file (BayesSettings defaults)."""
    joined = join_raw(json.loads(raw.read_text()), seeds)
    out: dict[int, StrategyScore] = {}
    for n in budgets:
        best, optimum = joined.get((label, "bayes", "defaults", n), ({}, 0.0))
        if len(best) == len(seeds):
            out[n] = StrategyScore("bayes", n, tuple(best[seed] for seed in seeds), optimum)
    missing = [n for n in budgets if n not in out]
    if missing:
        raise SystemExit(f"error: {raw} has no defaults run of {label} at {missing} for seeds "
                         f"{seeds[0]}..{seeds[-1]}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=ROOT / "tests" / "data" / "spaces")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--examples", nargs="*", help="only these examples")
    parser.add_argument(
        "--kt-method",
        default=None,
        help="Kernel Tuner bayes_opt 'method' (default: Kernel Tuner's own)",
    )
    parser.add_argument(
        "--ours-raw",
        type=Path,
        help="take our runs (BayesSettings defaults) from this bench/inner_bo.py --raw file "
        "instead of running them again: the same searches, seeds and budgets",
    )
    args = parser.parse_args(argv)

    command = "python bench/inner_kt.py " + " ".join(sys.argv[1:] if argv is None else argv)
    version = kt_version()
    files = sorted(args.data.glob("*.json"))
    if args.examples:
        files = [f for f in files if f.stem in args.examples]
    if not files:
        print(f"no recorded spaces in {args.data}: run bench/record_spaces.py on a GPU first")
        return 2
    recorded_files = [parse_space_file(json.loads(f.read_text())) for f in files]
    dates = sorted({r.recorded_at[:10] for r in recorded_files})
    lines = [
        f"date: {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        "simulation on recorded H200 tables: both strategies run on this machine, every "
        "evaluation answered from the recorded measurements",
        f"gpu (measurements): {recorded_files[0].gpu}",
        f"data: H200 tables recorded {', '.join(dates)} ({display_path(args.data)})",
        f"command: {command}",
        f"kernel_tuner: {version or 'not installed'}; strategy bayes_opt, strategy_options "
        f"max_fevals=N{', method=' + args.kt_method if args.kt_method else ' (its defaults)'}",
        f"ours: BayesSearch with BayesSettings() defaults, as bench/inner_bo.py; "
        f"seeds 0..{args.seeds - 1}"
        + (f"; read from {display_path(args.ours_raw)}" if args.ours_raw else ""),
    ]
    if version is None:
        lines += ["", "Kernel Tuner is not installed (pip install kernel_tuner): nothing compared"]
        print("\n".join(lines))
        return 2
    kt_options = {"method": args.kt_method} if args.kt_method else {}
    seeds = list(range(args.seeds))

    head = "  ".join(f"{'ours@' + str(n):>9} {'kt@' + str(n):>9} {'kt/ours':>7}" for n in BUDGETS)
    table = [
        f"{'example':<11} {'configs':>7} {'optimum':>9}  {head}",
        "(median over seeds of the best time found, us; kt/ours > 1: ours found faster)",
    ]
    raw: list[str] = []
    failed_tables: list[str] = []
    notes: list[str] = []
    worst50: tuple[float, str] | None = None
    ratios: dict[int, list[tuple[float, str]]] = {n: [] for n in BUDGETS}
    with tempfile.TemporaryDirectory(prefix="r3-kt-") as tmp:
        for path, recorded in zip(files, recorded_files, strict=True):
            evaluator = SimulatedEvaluator(recorded.table)
            size = len(recorded.table)
            budgets = [n for n in BUDGETS if n <= size] or [size]
            kt = to_kt(recorded)
            cache = Path(tmp) / f"{recorded.example}.json"
            cache.write_text(json.dumps(kt.document))
            started = time.perf_counter()
            label = label_of(path, recorded.example)
            ours = (stored_runs(args.ours_raw, label, budgets, range(args.seeds)) if args.ours_raw
                    else score("bayes", recorded.space, evaluator, budgets, seeds))
            ours_s = time.perf_counter() - started
            cells: list[str] = []
            started = time.perf_counter()
            failure: str | None = None
            failed = sum(r.status is not MeasurementStatus.OK for r in recorded.table.values())
            if failed:
                failed_tables.append(f"{recorded.example} ({failed} of {size})")
            kt_best: dict[int, list[float]] = {}
            for n in budgets:
                runs: list[KTRun] = []
                for seed in seeds:
                    try:
                        runs.append(run_kernel_tuner(kt, cache, recorded, n, seed, kt_options))
                    except Exception as exc:  # reported below, never hidden
                        failure = f"{type(exc).__name__}: {exc}"
                        break
                if failure is not None:
                    notes.append(
                        f"{recorded.example}@{n}: Kernel Tuner bayes_opt cannot run: {failure} "
                        f"(the space has {size} configs; bayes_opt's initial sample, popsize, "
                        "is 20 by default)"
                    )
                    break
                kt_best[n] = [r.best_s for r in runs]
                counts = sorted({r.evaluations for r in runs})
                if counts != [n]:
                    notes.append(
                        f"{recorded.example}@{n}: Kernel Tuner evaluated "
                        f"{'/'.join(map(str, counts))} distinct configurations"
                    )
                for text in sorted({w for r in runs for w in r.warnings}):
                    notes.append(f"{recorded.example}@{n}: Kernel Tuner warned: {text}")
            kt_s = time.perf_counter() - started
            for n in BUDGETS:
                if n not in budgets:
                    cells.append(f"{'-':>9} {'-':>9} {'-':>7}")
                    continue
                mine = ours[n].median_best_s
                if n not in kt_best:
                    cells.append(f"{us(mine):>9} {'n/a':>9} {'-':>7}")
                    continue
                theirs = median(kt_best[n])
                ratio = theirs / mine
                cells.append(f"{us(mine):>9} {us(theirs):>9} {ratio:>7.3f}")
                ratios[n].append((ratio, recorded.example))
                raw.append(
                    f"  {recorded.example}@{n} ours: " + " ".join(us(b) for b in ours[n].best_s)
                )
                raw.append(f"  {recorded.example}@{n} kt:   " + " ".join(us(b) for b in kt_best[n]))
            table.append(
                f"{recorded.example:<11} {size:>7} {us(evaluator.optimum()):>9}  "
                + "  ".join(cells)
                + f"   (ours {ours_s:.0f} s, kt {kt_s:.0f} s)"
            )
            n50 = 50 if 50 in budgets else max(budgets)
            if n50 in kt_best and n50 < size:  # a budget that covers the space ties by force
                ratio = median(kt_best[n50]) / ours[n50].median_best_s
                worst50 = min(worst50 or (ratio, recorded.example), (ratio, recorded.example))
            elif n50 >= size:
                notes.append(
                    f"{recorded.example}: budget {n50} covers its {size} configs; "
                    "left out of bo_over_kernel_tuner_at_50"
                )

    lines += ["", *table, "", "per-budget medians over examples of kt/ours (median best times):"]
    for n in BUDGETS:
        if ratios[n]:
            values = [r for r, _ in ratios[n]]
            lines.append(
                f"  @{n}: median {median(values):.3f}, worst {min(ratios[n])[0]:.3f} "
                f"({min(ratios[n])[1]}), examples {len(values)}"
            )
    lines += [
        "",
        "notes:",
        *(f"  {note}" for note in notes or ["none"]),
        *reading(failed_tables),
        "",
        "per-seed best times (us):",
        *raw,
        "",
    ]
    if worst50 is None:
        lines.append("bo_over_kernel_tuner_at_50: n/a (Kernel Tuner ran on no example at 50)")
    else:
        lines.append(
            f"bo_over_kernel_tuner_at_50: {worst50[0]:.3f} ({worst50[1]}, worst example; "
            "Kernel Tuner's median best time / ours; >= 1: ours reached at least "
            "Kernel Tuner's best)"
        )
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
