"""What a model's proposals came to before any GPU: ``r3 tune --generate-only`` databases read
back, per model, as compile yields (changes that applied and compiled with NVRTC on this
machine, pending evaluation on a GPU), first answers and repair turns apart, and the classes
of their failures.

    python bench/llm_generate.py DB.sqlite [DB.sqlite ...] [--list]

Prints ``llm_compile_yield_<model>: compiled/proposed (first answers a/b, repairs c/d)``, the
upper bound of ``valid_variant_yield_<model>`` until ``r3 evaluate`` has run, and, where
variants were evaluated, ``valid_variant_yield_<model>``.  ``--list``: one line per proposal
(its source, transformation, status and reason).  Databases are opened read-only.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

# compile errors by their commonest causes in small models' answers (the first error counts)
FAILURE_CLASSES = (
    ("undefined identifier", re.compile(r"is undefined|undeclared|not declared")),
    ("declared twice", re.compile(r"already been declared|redefinition")),
    ("braces", re.compile(r"expected a declaration|expected a \"\}\"")),
)


def failure_class(reason: str) -> str:
    for name, pattern in FAILURE_CLASSES:
        if pattern.search(reason):
            return name
    return "other"


def summarize(dbs: list[Path], listing: bool) -> list[str]:
    from campaign_summary import model_tag

    from db import repository as repo
    from db.session import open_database
    from r3tui.domain import VariantOrigin, VariantStatus

    # compiled and not refused (a change outside the kernel, host code: `unsafe`, a failure)
    past_compile = {VariantStatus.PENDING, VariantStatus.WRONG_RESULT, VariantStatus.CRASHED,
                    VariantStatus.VERIFIED, VariantStatus.IMPROVED}
    good = {VariantStatus.VERIFIED, VariantStatus.IMPROVED}
    # model -> origin -> [proposed, compiled, evaluated, verified]
    counts: dict[str, dict[str, list[int]]] = {}
    failures: dict[str, Counter[str]] = {}
    asks: dict[str, Counter[str]] = {}
    lines: list[str] = []
    for db in dbs:
        with open_database(db, readonly=True) as database, database.session_scope() as s:
            for c in repo.list_campaign_summaries(s):
                calls = dict(repo.campaign_llm_calls(s, c.id))
                for v in repo.campaign_variants(s, c.id):
                    if v.origin not in (VariantOrigin.LLM, VariantOrigin.REPAIR):
                        continue
                    call = calls.get(v.llm_call_id) if v.llm_call_id is not None else None
                    model = model_tag(call.model_path) if call is not None else "llm"
                    row = counts.setdefault(model, {}).setdefault(v.origin.value, [0, 0, 0, 0])
                    row[0] += 1
                    row[1] += v.status in past_compile
                    row[2] += v.status in past_compile and v.status is not VariantStatus.PENDING
                    row[3] += v.status in good
                    if v.origin is VariantOrigin.LLM:
                        asks.setdefault(model, Counter())[v.operator or "?"] += 1
                    reason = (v.status_reason or "").replace("\n", " ")
                    if v.status is VariantStatus.COMPILE_FAILED:
                        failures.setdefault(model, Counter())[failure_class(reason)] += 1
                    elif v.status is VariantStatus.APPLY_FAILED:
                        failures.setdefault(model, Counter())["did not apply"] += 1
                    elif v.status is VariantStatus.UNSAFE:
                        failures.setdefault(model, Counter())["refused as unsafe"] += 1
                    if listing:
                        lines.append(f"  {db.name} #{v.id:<3} {v.origin.value:6} "
                                     f"{(v.operator or '?'):26} {v.status.value:15} {reason[:100]}")
    for model, by_origin in sorted(counts.items()):
        first = by_origin.get("llm", [0, 0, 0, 0])
        repair = by_origin.get("repair", [0, 0, 0, 0])
        total = [a + b for a, b in zip(first, repair, strict=True)]
        lines.append(f"llm_compile_yield_{model}: {total[1]}/{total[0]} (first answers "
                     f"{first[1]}/{first[0]}, repairs {repair[1]}/{repair[0]})")
        if total[2]:
            lines.append(f"valid_variant_yield_{model}: {total[3]}/{total[0]} "
                         f"({total[2]} of {total[1]} compiled evaluated)")
        lines.append("  failures: " + (", ".join(
            f"{name} {n}" for name, n in failures.get(model, Counter()).most_common()) or "none"))
        lines.append("  first answers asked: " + ", ".join(
            f"{name} {n}" for name, n in asks.get(model, Counter()).most_common()))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dbs", nargs="+", type=Path)
    parser.add_argument("--list", action="store_true", help="one line per proposal")
    args = parser.parse_args(argv)
    missing = [str(p) for p in args.dbs if not p.is_file()]
    if missing:
        print(f"llm_generate.py: error: no such database: {', '.join(missing)}", file=sys.stderr)
        return 2
    print("\n".join(summarize(args.dbs, args.list)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
