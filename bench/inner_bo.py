"""Inner-loop search quality on real H200 measurements: BO vs random search vs the optimum.

Every configuration of each example's reduced space was compiled and replayed once on an
H200 (``bench/record_spaces.py`` → ``tests/data/spaces/*.json``); here each strategy searches
those tables (Kernel Tuner's simulation mode), so the comparison is exact, reproducible and
cheap: for budgets of 20 / 50 / 100 evaluations and 10 seeds, the best time found, as a
fraction of the true optimum (exhaustive search), median over seeds.

The hard spaces (``bench/record_spaces.py --space hard`` → ``tests/data/spaces/hard/``: 1500-2000
configurations with narrow good regions) are used when they exist; the summary lines are given
over every table and, where there are hard tables, over those alone (``..._hard:``).

    python bench/inner_bo.py [--seeds 10] [--data tests/data/spaces]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from r3tui.search.simulation import (  # noqa: E402
    SimulatedEvaluator,
    beats,
    parse_space_file,
    score,
)

BUDGETS = (20, 50, 100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=ROOT / "tests" / "data" / "spaces")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--batch", type=int, default=1, help="configs asked at once")
    args = parser.parse_args(argv)

    files = sorted(args.data.glob("*.json")) + sorted(args.data.glob("hard/*.json"))
    hard_files = [f for f in files if f.parent.name == "hard"]
    if not files:
        print(f"no recorded spaces in {args.data}: run bench/record_spaces.py on a GPU first")
        return 2
    seeds = range(args.seeds)
    lines = [
        f"date: {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        "command: python bench/inner_bo.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "",
        f"{'example':<11} {'configs':>7} {'optimum us':>10}  "
        + "  ".join(f"{'bo@' + str(n):>7} {'rand@' + str(n):>7}" for n in BUDGETS)
        + "   (median fraction of the optimum over seeds)",
    ]
    worst_frac50: dict[str, tuple[float, str]] = {}
    worst_bo_over_random20: dict[str, tuple[float, str]] = {}
    bo_beats_random_everywhere = True
    losses: list[str] = []
    gpu = ""
    for path in files:
        recorded = parse_space_file(json.loads(path.read_text()))
        kind = "hard" if path in hard_files else "reduced"
        label = recorded.example + ("*" if kind == "hard" else "")
        gpu = recorded.gpu
        evaluator = SimulatedEvaluator(recorded.table)
        size = len(recorded.table)
        budgets = [n for n in BUDGETS if n <= size] or [size]
        started = time.perf_counter()
        bo = score("bayes", recorded.space, evaluator, budgets, seeds, args.batch)
        rnd = score("random", recorded.space, evaluator, budgets, seeds, args.batch)
        elapsed = time.perf_counter() - started
        cells = []
        for n in BUDGETS:
            if n in bo:
                cells.append(f"{bo[n].median_fraction:>7.3f} {rnd[n].median_fraction:>7.3f}")
                if n < size and not (
                    beats(bo[n], rnd[n]) or bo[n].median_best_s == rnd[n].median_best_s
                ):
                    bo_beats_random_everywhere = False
                    losses.append(
                        f"{recorded.example}@{n}: BO {bo[n].median_best_s * 1e6:.3f} us vs "
                        f"random {rnd[n].median_best_s * 1e6:.3f} us"
                    )
            else:
                cells.append(f"{'-':>7} {'-':>7}")
        lines.append(
            f"{label:<11} {size:>7} {evaluator.optimum() * 1e6:>10.2f}  "
            + "  ".join(cells)
            + f"   ({elapsed:.0f} s)"
        )
        n50 = 50 if 50 in bo else max(bo)
        for group in ("all", kind):
            frac = (bo[n50].median_fraction, label)
            worst_frac50[group] = min(worst_frac50.get(group, frac), frac)
            if size > 20:  # smaller spaces are searched exhaustively within 20 evaluations
                ratio = (rnd[20].median_best_s / bo[20].median_best_s, label)  # > 1: BO faster
                worst_bo_over_random20[group] = min(worst_bo_over_random20.get(group, ratio),
                                                    ratio)
    lines.insert(1, f"gpu (measurements): {gpu}; strategies run in simulation on this machine")
    lines += [""]
    for group, suffix in (("all", ""), ("hard", "_hard")):
        if group not in worst_frac50:
            continue
        frac, frac_at = worst_frac50[group]
        lines.append(f"fraction_of_optimum_at_50{suffix}: {frac:.3f} ({frac_at}, worst example, "
                     "median over seeds)")
        if group in worst_bo_over_random20:
            ratio, ratio_at = worst_bo_over_random20[group]
            lines.append(f"bo_over_random_at_20{suffix}: {ratio:.3f} ({ratio_at}, worst example; "
                         "random's median best time / BO's)")
    if not hard_files:
        lines.append(f"(no hard spaces in {args.data / 'hard'}: run "
                     "bench/record_spaces.py --space hard on a GPU)")
    lines += [
        f"bo_beats_or_ties_random_at_every_budget: {bo_beats_random_everywhere}",
        *(f"  BO behind random: {loss}" for loss in losses),
        "(* = hard space)",
    ]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
