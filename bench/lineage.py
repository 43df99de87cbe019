"""A campaign lineage's search quality on a recorded H200 table, per Bayesian setting.

The lineage is :func:`r3tui.search.simulation.lineage_best`: the original source searched 12
trials, then four generations of 5-trial children, each told its ancestors' trials (``prior``)
or not.  For each ``ROOT/CHILD`` pair of BayesSettings specs (``defaults`` or
``NAME=VALUE,...``; ``ROOT`` alone drives both) it prints the mean and worst fraction of the
optimum over seeds, with and without the prior.  This is how the split between the cold
settings and the ``prior_*`` ones was measured (``bench/results/2026-12-03-inner-bo-s16.txt``).

    python bench/lineage.py [--table tests/data/spaces/hard/nbody.json] [--seeds 10] \\
        defaults "defaults/prior_acq_func=gp_hedge"
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

from r3tui.errors import ConfigError  # noqa: E402
from r3tui.search.bayes import BayesSettings  # noqa: E402
from r3tui.search.simulation import (  # noqa: E402
    SimulatedEvaluator,
    lineage_best,
    parse_space_file,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("pairs", nargs="+", metavar="ROOT[/CHILD]",
                        help="BayesSettings specs of the root search and of the children")
    parser.add_argument("--table", type=Path,
                        default=ROOT / "tests" / "data" / "spaces" / "hard" / "nbody.json")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--first-seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        pairs = []
        for pair in args.pairs:
            root, _, child = pair.partition("/")
            pairs.append((pair, BayesSettings.parse(root), BayesSettings.parse(child or root)))
        recorded = parse_space_file(json.loads(args.table.read_text()))
    except ConfigError as exc:
        print(f"error: {exc}")
        return 2
    except (OSError, ValueError) as exc:
        print(f"error: cannot read the table {args.table}: {exc}")
        return 2
    evaluator = SimulatedEvaluator(recorded.table)
    optimum = evaluator.optimum() * 0.9  # lineage_best reports on the children's scale
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    print(f"date: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC")
    print(f"gpu (measurements): {recorded.gpu}; lineages run in simulation on this machine")
    print("command: python bench/lineage.py " + " ".join(sys.argv[1:] if argv is None else argv))
    print(f"table: {args.table.name} ({recorded.example}, {len(recorded.table)} configs), "
          f"seeds {seeds.start}..{seeds.stop - 1}; fraction = optimum / lineage's best")
    print(f"{'root/child settings':<60}{'prior':>6}{'mean':>8}{'worst':>8}{'s':>6}")
    for label, root, child in pairs:
        for prior in (True, False):
            started = time.perf_counter()
            fractions = [optimum / lineage_best(recorded.space, evaluator, seed, prior,
                                                settings=root, child_settings=child)
                         for seed in seeds]
            print(f"{label:<60}{'yes' if prior else 'no':>6}"
                  f"{sum(fractions) / len(fractions):>8.4f}{min(fractions):>8.3f}"
                  f"{time.perf_counter() - started:>6.0f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
