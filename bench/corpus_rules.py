"""Which rule operators apply to each kernel of the corpus sources (issue #18), on the CPU.

    python bench/corpus_rules.py [--rules coarsen,grid_stride] [--out FILE]

Reads every ``__global__`` definition in the .cu/.h/.cuh/.hpp files of the programs under
bench/work/corpus (``python bench/corpus.py prepare`` puts them there), runs each rule on the
file that defines the kernel (as a campaign does on the unit it searches) and prints one row a
kernel with the rules that apply, then each rule's count and its most frequent reasons to
decline.  Prints ``corpus_rules_apply[RULE]: N/M`` lines.  Nothing is compiled.
"""

from __future__ import annotations

import argparse
import collections
import random
import sys
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from r3tui.analysis.cuda import parse_translation_unit  # noqa: E402
from r3tui.analysis.facts import ExecutionSpace  # noqa: E402
from r3tui.remix.rules import RULES, apply_rule  # noqa: E402

CORPUS = REPO / "bench" / "work" / "corpus"
SUFFIXES = (".cu", ".h", ".cuh", ".hpp")


def kernels(root: Path) -> list[tuple[str, Path, str]]:
    """(program, file, kernel) for every kernel defined in the corpus sources."""
    found = []
    for program in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("_")):
        for path in sorted(f for f in program.rglob("*") if f.suffix in SUFFIXES):
            text = path.read_text(errors="replace")
            if "__global__" not in text:
                continue
            for item in parse_translation_unit(text).functions:
                if item.space is ExecutionSpace.GLOBAL and not item.prototype and item.name:
                    found.append((program.name, path, item.name))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rules", default=",".join(RULES), help="comma-separated (all)")
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    parser.add_argument("--out", type=Path, help="also write the report to this file")
    args = parser.parse_args(argv)
    rules = [r for r in args.rules.split(",") if r]
    unknown = [r for r in rules if r not in RULES]
    if unknown or not args.corpus.is_dir():
        why = (f"unknown rules {', '.join(unknown)}" if unknown else
               f"no corpus at {args.corpus} (python bench/corpus.py prepare)")
        print(f"corpus_rules.py: error: {why}", file=sys.stderr)
        return 2
    found = kernels(args.corpus)
    applies: collections.Counter[str] = collections.Counter()
    reasons: collections.Counter[tuple[str, str]] = collections.Counter()
    lines = [f"# bench/corpus_rules.py, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC: "
             f"{len(found)} kernels of {args.corpus}", ""]
    for program, path, kernel in found:
        text = path.read_text(errors="replace")
        made = []
        for rule in rules:
            result = apply_rule(rule, text, kernel, random.Random(1))
            if result.ok:
                applies[rule] += 1
                made.append(rule)
            else:
                reasons[(rule, (result.reason or "")[:100])] += 1
        lines.append(f"{program:15} {path.name:24} {kernel:44} {' '.join(made) or '-'}")
    lines.append("")
    lines += [f"corpus_rules_apply[{r}]: {applies[r]}/{len(found)}" for r in rules]
    lines += ["", "# most frequent reasons to decline"]
    lines += [f"{n:4} {rule:22} {why}" for (rule, why), n in reasons.most_common(30)]
    report = "\n".join(lines)
    print(report)
    if args.out:
        args.out.write_text(report + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
