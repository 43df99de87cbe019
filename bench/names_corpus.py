"""The names check (r3tui/remix/names.py) on the corpus's real kernels, on the CPU: each kernel's
own body, given as the REPLACE text of an edit, must pass it, with the program's files at the
pinned commit as the unit.  A refusal here would be a name real code uses that the check does
not know (a false refusal, which would push a model away from correct code).

    python bench/names_corpus.py     (needs the suites' mirrors: bench/corpus.py prepare's fetch)

Kernels: those bench/corpus_rules.py lists (bench/results/2026-12-05-corpus-rules-s30-cpu.txt)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from corpus_recipes import RECIPES, Recipe  # noqa: E402

from r3tui.remix.edits import find_kernel  # noqa: E402
from r3tui.remix.names import IdentifierCheck  # noqa: E402

KERNELS = REPO / "bench" / "results" / "2026-12-05-corpus-rules-s30-cpu.txt"
SOURCES = (".cu", ".cuh", ".h", ".hpp", ".c", ".cpp")
OPEN = "<<<<<<< SEARCH\nx;\n=======\n"


def files(recipe: Recipe) -> dict[str, str]:
    """The recipe's source files at the pinned commit, by path within its folder."""
    suite = recipe.suite
    out = {}
    for name in recipe.files:
        if name.endswith(SOURCES):
            shown = subprocess.run(
                ["git", f"--git-dir={suite.mirror}", "show",
                 f"{suite.commit}:{recipe.folder}/{name}"],
                capture_output=True, text=True, errors="replace", check=True)
            out[name] = shown.stdout
    return out


def refused_lines(check: IdentifierCheck, body: str) -> list[str]:
    """The body's lines that each add a refusal."""
    answer, bad = OPEN, []
    for line in body.splitlines(keepends=True):
        if check.violations(answer + line) > check.violations(answer):
            bad.append(line.strip()[:80])
        answer += line
    return bad


def main() -> int:
    listed = [line.split()[:3] for line in KERNELS.read_text().splitlines()
              if re.match(r"^[A-Za-z][\w-]+\s+\S+\.cu\s+\S+", line)]
    recipes = {r.name: r for r in RECIPES}
    passed = total = 0
    for program, file_name, kernel in listed:
        texts = files(recipes[program])
        unit = "\n".join(texts.values())
        path = next((p for p in texts if Path(p).name == file_name), None)
        span = find_kernel(texts[path], kernel) if path else None
        if path is None or span is None:
            print(f"{program:15} {kernel:44} not found in {file_name}")
            continue
        body = texts[path][span.body_open + 1:span.body_end - 1].strip("\n") + "\n"
        bad = refused_lines(IdentifierCheck.for_unit(unit), body)
        total += 1
        passed += not bad
        print(f"{program:15} {kernel:44} " + ("passes" if not bad else f"refused: {bad[:3]}"))
    print(f"names_check_corpus_kernels_passing: {passed}/{total}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
