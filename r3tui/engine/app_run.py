"""Build an application tree and time it end to end, original and patched interleaved.

The application prints its own time as ``key: value`` (the example prints ``solve_time_s``
from CUDA events around the solve and ``wall_time_s`` for the process); the process's wall
time is measured here as well.  Runs alternate original/patched (starting side swapped each
round) so drift in clocks or temperature lands on both.
"""

from __future__ import annotations

import re
import shlex
import statistics
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from r3tui.errors import R3Error


@dataclass(frozen=True)
class AppRun:
    exit_code: int
    wall_s: float  # measured here, around the process
    reported: dict[str, float]  # the app's own `key: value` numbers


@dataclass
class Comparison:
    key: str
    original: list[AppRun] = field(default_factory=list)
    patched: list[AppRun] = field(default_factory=list)

    def times(self, runs: list[AppRun]) -> list[float]:
        return [r.reported.get(self.key, r.wall_s) for r in runs]

    @property
    def speedup(self) -> float | None:
        a, b = self.times(self.original), self.times(self.patched)
        if not a or not b or statistics.median(b) <= 0:
            return None
        return statistics.median(a) / statistics.median(b)

    @property
    def wall_speedup(self) -> float | None:
        a = [r.wall_s for r in self.original]
        b = [r.wall_s for r in self.patched]
        return statistics.median(a) / statistics.median(b) if a and b else None


_LINE = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*:\s*([-+0-9.eE]+)\s*$", re.MULTILINE)


def parse_output(stdout: str) -> dict[str, float]:
    """Every ``key: number`` line of the application's output."""
    values: dict[str, float] = {}
    for key, value in _LINE.findall(stdout):
        try:
            values[key] = float(value)
        except ValueError:
            continue
    return values


def build(tree: Path, command: str, timeout_s: float = 600.0) -> None:
    """Run the build in ``tree``; a failure is one R3Error with the build's last line."""
    try:
        run = subprocess.run(
            shlex.split(command),
            cwd=tree,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise R3Error(f"`{command}` in {tree} failed: {exc}") from exc
    if run.returncode != 0:
        from r3tui.compile.base import first_error_line

        raise R3Error(f"`{command}` in {tree} failed: {first_error_line(run.stdout + run.stderr)}")


def run_app(tree: Path, command: Sequence[str], timeout_s: float = 600.0) -> AppRun:
    started = time.perf_counter()
    try:
        run = subprocess.run(
            list(command), cwd=tree, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise R3Error(f"running {' '.join(command)} in {tree} failed: {exc}") from exc
    wall = time.perf_counter() - started
    return AppRun(run.returncode, wall, parse_output(run.stdout))


def compare(
    original: Path, patched: Path, command: Sequence[str], runs: int, key: str
) -> Comparison:
    """``runs`` runs of each tree, interleaved, the first side alternating per round."""
    result = Comparison(key)
    for round_index in range(runs):
        order = [(original, result.original), (patched, result.patched)]
        if round_index % 2:
            order.reverse()
        for tree, sink in order:
            sink.append(run_app(tree, command))
    return result
