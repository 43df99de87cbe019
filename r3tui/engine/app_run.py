"""Build an application tree and time it, original and patched interleaved.

Two kinds of run, each in interleaved pairs (original/patched, the first side swapped each
round, so drift in clocks or temperature lands on both):

- a plain run (:func:`run_app`): the application's own time, a ``key: value`` line it prints
  (the example prints ``solve_time_s`` from CUDA events around the solve), and the process's
  wall time measured here;
- a timed run (:func:`time_kernels`): the application under ``r3 record --`` with a kernel
  filter that matches no kernel, so nothing is snapshotted while the interposer still counts
  every launch and times it on the device; ``recording.json`` gives each kernel's device
  time in that run (summed over its launches).  Its wall time includes the interposer's
  events, so it is not used for the application's time.

:func:`measure` runs pairs until the 95% interval of every ratio it is asked for is narrower
than a target, or a bound is hit (see :class:`MeasureOptions`).  A ratio is
``original / patched`` per pair (above 1: the patched tree is faster); its figure is the
median of the per-pair ratios and its interval the distribution-free (order-statistic)
interval of that median, which holds for the handful of pairs an application allows; a
percentile bootstrap of 10 pairs covers about 89% where it claims 95%, and called two
identical builds "faster" on the H200.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from r3tui.errors import R3Error

if TYPE_CHECKING:
    from r3tui.engine.app_recording import RecordingContext
    from r3tui.engine.apply import ApplyResult
    from r3tui.engine.campaign_winner import _Best


@dataclass(frozen=True)
class AppRun:
    exit_code: int
    wall_s: float  # measured here, around the process
    reported: dict[str, float]  # the app's own `key: value` numbers


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




# -- device time of every kernel, under the interposer without snapshots --------------------
# R3_RECORD_KERNELS (`r3 record --kernel`) selects the kernels to snapshot by name; no C++
# name holds a '-', so this one selects none and every launch is only counted and timed.
NO_KERNEL = "r3-count-and-time-only"


@dataclass(frozen=True)
class KernelTimes:
    """One timed run: device seconds per kernel entry point, summed over its launches."""

    by_kernel: dict[str, float]
    launches: dict[str, int]
    graph_s: float = 0.0  # kernels launched through CUDA graphs, timed per graph launch

    @property
    def total_s(self) -> float:
        return sum(self.by_kernel.values()) + self.graph_s

    @classmethod
    def from_recording(cls, data: dict[str, Any]) -> KernelTimes:
        """From a ``recording.json`` object; a faulted or failed run is an R3Error."""
        if data.get("fault"):
            fault = data["fault"]
            raise R3Error(f"the application faulted under the interposer: {fault}")
        if data.get("exit_code", 0) != 0:
            raise R3Error(f"the application exited with {data['exit_code']} under the interposer")
        by_kernel: dict[str, float] = {}
        launches: dict[str, int] = {}
        for kernel in data.get("kernels", ()):
            entry = str(kernel["entry_point"])
            by_kernel[entry] = by_kernel.get(entry, 0.0) + float(kernel["device_time_s"])
            launches[entry] = launches.get(entry, 0) + int(kernel.get("launches", 0))
        graphs = data.get("graphs") or {}
        return cls(by_kernel, launches, float(graphs.get("device_time_s", 0.0)))


# time_kernels(tree, command) -> KernelTimes; replaceable where no GPU can run it
KernelTimer = Callable[[Path, Sequence[str]], KernelTimes]


def time_kernels(tree: Path, command: Sequence[str], timeout_s: float = 600.0) -> KernelTimes:
    """Run ``command`` in ``tree`` under ``r3 record --`` selecting no kernel to snapshot."""
    root = Path(__file__).resolve().parents[2]  # r3tui/ and db/ live here
    env = {k: v for k, v in os.environ.items() if k != "R3_RECORD_KERNELS"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH")) if p)
    with tempfile.TemporaryDirectory(prefix="r3-kernel-times-") as tmp:
        out = Path(tmp) / "rec"
        argv = [sys.executable, "-m", "r3tui", "record", "--out", str(out),
                "--db", str(Path(tmp) / "r3.sqlite"), "--no-checks", "--kernel", NO_KERNEL,
                "--timeout", f"{timeout_s:g}", "--", *command]
        try:  # the recorder kills the application at timeout_s; this bounds the recorder
            run = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True,
                                 timeout=timeout_s + 60, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise R3Error(f"timing the kernels of {' '.join(command)} in {tree} failed: "
                          f"{exc}") from exc
        recording = out / "recording.json"
        if run.returncode != 0 or not recording.is_file():
            lines = (run.stderr or run.stdout).strip().splitlines()
            raise R3Error(f"timing the kernels of {' '.join(command)} in {tree} under the "
                          f"interposer failed: {lines[-1] if lines else run.returncode}")
        return KernelTimes.from_recording(json.loads(recording.read_text()))


# -- ratios with intervals ------------------------------------------------------------------
@dataclass(frozen=True)
class Ratio:
    """``original / patched`` over interleaved pairs: the median per-pair ratio and the
    order-statistic interval of that median."""

    value: float
    low: float
    high: float
    runs: int
    confidence: float = 0.95  # what the interval was asked to cover
    coverage: float = 0.95  # what it covers: less where there are too few pairs

    @property
    def too_few(self) -> bool:
        """Fewer pairs than an interval at ``confidence`` needs: its range covers less, so
        it says neither faster nor slower (4 pairs all one way happen 1 time in 8 by chance)."""
        return self.coverage < self.confidence

    @property
    def verdict(self) -> str:
        from r3tui.search.winner import beyond_noise

        if self.too_few:
            return "within noise"
        if beyond_noise((self.low, self.high)):
            return "faster"
        return "slower" if self.high < 1.0 else "within noise"

    @property
    def width(self) -> float:
        """The interval's width relative to the figure."""
        return (self.high - self.low) / self.value

    def render(self) -> str:
        from r3tui.search.winner import pairs_for

        noise = " within noise" if self.verdict == "within noise" else ""
        if self.too_few:
            noise += (f" ({self.runs} pairs: a {self.coverage:.1%} interval; "
                      f"{self.confidence:.0%} needs {pairs_for(self.confidence)})")
        return f"{self.value:.4f} [{self.low:.4f}, {self.high:.4f}]{noise}"

    def to_json(self) -> dict[str, Any]:
        return {"ratio": self.value, "ci": [self.low, self.high], "runs": self.runs,
                "coverage": self.coverage, "verdict": self.verdict}


def ratio(original: Sequence[float], patched: Sequence[float],
          confidence: float = 0.95) -> Ratio | None:
    """Pair ``i`` gives ``original[i] / patched[i]``; pairs where either is not a positive
    time are dropped; None without a usable pair."""
    from r3tui.search.winner import median_ci_coverage, order_statistic_median_ci

    pairs = [a / b for a, b in zip(original, patched, strict=True)
             if math.isfinite(a) and math.isfinite(b) and a > 0 and b > 0]
    if not pairs:
        return None
    low, high = order_statistic_median_ci(pairs, confidence)
    return Ratio(statistics.median(pairs), low, high, len(pairs), confidence,
                 median_ci_coverage(len(pairs), confidence))


# -- the measurement ------------------------------------------------------------------------
WALL_BASIS = "wall_s"  # the app figure's label when it is the process's wall time


@dataclass(frozen=True)
class MeasureOptions:
    """How ``r3 apply`` measures the original and patched trees."""

    # the `key: seconds` line the app prints; None (or "wall_s"): the process's wall time
    time_key: str | None = None
    min_runs: int = 5  # pairs of each kind before the intervals are first looked at
    max_runs: int = 30  # pairs of each kind at most
    ci_width: float = 0.02  # enough pairs once every interval is this narrow, relative
    confidence: float = 0.95
    app: bool = True  # plain runs: the app's time and wall time
    kernels: bool = True  # timed runs: kernel device time under the interposer

    @property
    def first_look(self) -> int:
        """The pairs of each kind before the intervals are looked at: ``min_runs``, or the
        pairs an interval at ``confidence`` needs if more (6 at 95%)."""
        from r3tui.search.winner import pairs_for

        return max(self.min_runs, pairs_for(self.confidence))

    @property
    def keyed(self) -> str | None:
        """The key to read from the app's output; None: time the process (wall_s)."""
        return None if self.time_key in (None, WALL_BASIS) else self.time_key

    def check(self) -> None:
        if self.min_runs < 2:
            raise R3Error("--runs must be at least 2 (an interval needs pairs)")
        if self.max_runs < self.min_runs:
            raise R3Error(f"--max-runs ({self.max_runs}) is below --runs ({self.min_runs})")
        from r3tui.search.winner import pairs_for

        needed = pairs_for(self.confidence)
        if self.max_runs < needed:
            raise R3Error(f"--max-runs ({self.max_runs}) is below the {needed} pairs a "
                          f"{self.confidence:.0%} interval needs: nothing could ship")
        if not 0 < self.ci_width < 1:
            raise R3Error(f"--ci-width must be between 0 and 1, not {self.ci_width}")


@dataclass
class TreeComparison:
    """Interleaved pairs of the original and patched trees and their ratios."""

    options: MeasureOptions
    kernels_wanted: tuple[str, ...] = ()  # entry points whose own device time is wanted
    original: list[AppRun] = field(default_factory=list)
    patched: list[AppRun] = field(default_factory=list)
    original_times: list[KernelTimes] = field(default_factory=list)
    patched_times: list[KernelTimes] = field(default_factory=list)

    @property
    def key_reported(self) -> bool:
        """Whether every plain run printed the time key (else wall time stands in for it)."""
        key = self.options.keyed
        runs = self.original + self.patched
        return key is not None and bool(runs) and all(key in r.reported for r in runs)

    @property
    def key_missing(self) -> bool:
        """A time key was asked for and some plain run did not print it."""
        return self.options.keyed is not None and bool(self.original + self.patched) and (
            not self.key_reported)

    @property
    def app_basis(self) -> str:
        """What the app figure is over: the time key, else ``wall_s`` (the wall time)."""
        key = self.options.keyed
        return key if key is not None and self.key_reported else WALL_BASIS

    def _app_values(self, runs: list[AppRun]) -> list[float]:
        key = self.options.keyed if self.key_reported else None
        return [r.reported[key] if key else r.wall_s for r in runs]

    def _ratio(self, a: Sequence[float], b: Sequence[float]) -> Ratio | None:
        return ratio(a, b, self.options.confidence)

    def app(self) -> Ratio | None:
        return self._ratio(self._app_values(self.original), self._app_values(self.patched))

    def wall(self) -> Ratio | None:
        return self._ratio([r.wall_s for r in self.original],
                           [r.wall_s for r in self.patched])

    def kernel_total(self) -> Ratio | None:
        """All kernels' device time: what a change of whole-unit flags does to the others
        shows here, and what the kernel-time prediction (shares of it) is set against."""
        return self._ratio([t.total_s for t in self.original_times],
                           [t.total_s for t in self.patched_times])

    def kernel(self, entry_point: str) -> Ratio | None:
        """One kernel's own device time (None when it never ran in these runs)."""
        return self._ratio([t.by_kernel.get(entry_point, math.nan) for t in self.original_times],
                           [t.by_kernel.get(entry_point, math.nan) for t in self.patched_times])

    def _narrow(self, ratios: Sequence[Ratio | None]) -> bool:
        return all(r is None or r.width <= self.options.ci_width for r in ratios)

    def app_done(self) -> bool:
        return self._narrow([self.app()])

    def kernels_done(self) -> bool:
        return self._narrow([self.kernel_total(), *map(self.kernel, self.kernels_wanted)])

    def launch_changes(self) -> list[str]:
        """Kernels the patched build launched a different number of times than the original
        (median over the timed runs), where the original's own runs agree: its behaviour
        changed (a launch that fails, a loop that stops early), whatever its times say."""
        changes = []
        for entry in sorted({e for t in self.original_times for e in t.launches}
                            | {e for t in self.patched_times for e in t.launches}):
            before = [t.launches.get(entry, 0) for t in self.original_times]
            after = [t.launches.get(entry, 0) for t in self.patched_times]
            if not before or not after or len(set(before)) != 1:
                continue  # no runs, or the original itself varies from run to run
            if statistics.median(after) != before[0]:
                changes.append(f"{entry} {before[0]} -> {statistics.median(after):g}")
        return changes

    def _pairs(self, n: int, done: bool) -> str:
        bound = (f"; stopped at --max-runs, the interval is wider than "
                 f"{self.options.ci_width:.1%}" if n >= self.options.max_runs and not done
                 else "")
        return f"{n} interleaved pairs{bound}"

    def lines(self) -> list[str]:
        """The measured figures, each with what it is over."""
        def fig(r: Ratio | None) -> str:
            return r.render() if r is not None else "-"

        lines = []
        if self.options.kernels:
            lines += [f"kernel_time_speedup_measured: {fig(self.kernel_total())}",
                      "  (all kernels' device time under the interposer, no snapshots; "
                      f"{self._pairs(len(self.original_times), self.kernels_done())})"]
        if self.options.app:
            if self.key_missing:
                lines.append(f"{self.options.time_key} was not printed by every run: "
                             f"app_speedup_measured is of the wall time ({WALL_BASIS})")
            lines += [f"app_speedup_measured: {fig(self.app())}",
                      f"  ({self.app_basis}; {self._pairs(len(self.original), self.app_done())})",
                      f"wall_speedup_measured: {fig(self.wall())}",
                      "  (the process's wall time, same runs)"]
        return lines

    def flat(self) -> dict[str, Any]:
        """The three figures as ``<name>_speedup`` and ``<name>_speedup_ci`` keys."""
        out: dict[str, Any] = {}
        for name, r in (("kernel", self.kernel_total()), ("app", self.app()),
                        ("wall", self.wall())):
            out[f"{name}_speedup"] = None if r is None else r.value
            out[f"{name}_speedup_ci"] = None if r is None else [r.low, r.high]
        return out

    def to_json(self) -> dict[str, Any]:
        def fig(r: Ratio | None) -> dict[str, Any] | None:
            return None if r is None else r.to_json()

        return {
            "time_key": self.options.time_key,
            "app_basis": self.app_basis,
            "stopping": {"min_runs": self.options.min_runs, "max_runs": self.options.max_runs,
                         "ci_width": self.options.ci_width,
                         "confidence": self.options.confidence},
            "app": fig(self.app()),
            "wall": fig(self.wall()),
            "kernel_time": fig(self.kernel_total()),
            "kernels": {e: fig(self.kernel(e)) for e in self.kernels_wanted},
            "original": self._app_values(self.original),
            "patched": self._app_values(self.patched),
            "original_wall_s": [r.wall_s for r in self.original],
            "patched_wall_s": [r.wall_s for r in self.patched],
            "original_kernel_s": [t.total_s for t in self.original_times],
            "patched_kernel_s": [t.total_s for t in self.patched_times],
        }


def measure(
    original: Path,
    patched: Path,
    command: Sequence[str],
    options: MeasureOptions,
    kernels: Sequence[str] = (),
    runner: Callable[[Path, Sequence[str]], AppRun] = run_app,
    timer: KernelTimer = time_kernels,
) -> TreeComparison:
    """Interleaved pairs until every wanted interval is narrow enough or ``max_runs``.

    Plain pairs and timed pairs are counted apart: each kind stops on its own once
    ``min_runs`` pairs are in and its intervals (the app's time; all kernels' and each
    wanted kernel's device time) are at most ``ci_width`` of their figure wide.  The width
    alone decides, never which side of 1 an interval is on, so stopping does not favour an
    answer.
    """
    result = TreeComparison(options, tuple(kernels))
    for index in range(options.max_runs):
        looked = index >= options.first_look
        want_app = options.app and not (looked and result.app_done())
        want_kernels = options.kernels and not (looked and result.kernels_done())
        if not want_app and not want_kernels:
            break
        order = [(original, True), (patched, False)]
        if index % 2:
            order.reverse()
        if want_app:
            for tree, is_original in order:
                run = runner(tree, command)
                if run.exit_code != 0:
                    raise R3Error(f"the application exited with {run.exit_code} in {tree}")
                (result.original if is_original else result.patched).append(run)
        if want_kernels:
            for tree, is_original in order:
                times = timer(tree, command)
                (result.original_times if is_original else result.patched_times).append(times)
    return result


# -- measuring, and shipping only what measured faster --------------------------------------
def measure_and_ship(
    bests: list[_Best],
    source_tree: Path,
    into: Path,
    command: tuple[str, ...],
    result: ApplyResult,
    context: RecordingContext,
    build_command: str,
    options: MeasureOptions,
    include_noise: bool = False,
    say: Callable[[str], None] = print,
    runner: Callable[[Path, Sequence[str]], AppRun] = run_app,
    timer: KernelTimer = time_kernels,
) -> ApplyResult:
    """Build both trees, measure them, revert the campaigns whose own kernel is not faster
    beyond the noise, and measure what ships again (once: the figures printed and stored are
    of that tree).  Returns the result as shipped; ``r3-apply.json`` is written again.

    Where kernels are timed, their timed pairs come first and decide what ships; the plain
    runs (the app's time, its wall time) follow only for a tree that ships something: a
    program whose kernels gained nothing is not run for its wall time (in the corpus that
    was ~165 s of device time for four programs that shipped nothing)."""
    from r3tui.engine.apply import ORIGINAL_SUFFIX, tree_ignore, write_summary, write_tree

    original = into.with_name(into.name + ORIGINAL_SUFFIX)
    if original.exists():
        shutil.rmtree(original)
    shutil.copytree(source_tree, original, ignore=tree_ignore(into, original))
    for tree in (original, into):
        build(tree, build_command)
    if not result.patch:  # r3 apply does not measure then; a caller that does is told
        say("the patch is empty: the original is measured against an identical build")
    say(f"measuring: {options.first_look} to "
        f"{options.max_runs} interleaved pairs of each kind, "
        f"until each {options.confidence:.0%} interval is at most {options.ci_width:.1%} wide")
    candidates = [o for o in result.campaigns if o.applied]
    kernels = sorted({o.entry_point for o in candidates if o.entry_point})
    kernels_first = options.kernels and options.app
    first = measure(original, into, command, replace(options, app=False) if kernels_first
                    else options, kernels, runner, timer)
    withheld: dict[int, str] = {}
    verdicts: dict[int, tuple[dict[str, Any] | None, bool]] = {}
    changed = first.launch_changes()
    if changed:
        say("the patched application launched kernels a different number of times than the "
            f"original ({'; '.join(changed)}): its behaviour changed, nothing ships")
    for o in candidates:
        measured = first.kernel(o.entry_point) if o.entry_point else None
        shipped = measured is not None and measured.verdict == "faster" and not changed
        verdicts[o.campaign_id] = (measured.to_json() if measured else None, shipped)
        if changed:
            verdict = ("not shipped: the patched application launched kernels a different "
                       f"number of times ({'; '.join(changed)})")
        elif measured is None:
            why = ("no entry point is known for its kernel" if o.entry_point is None
                   else f"{o.entry_point} did not run in the timed runs")
            verdict = f"not shipped: its kernel's device time was not measured ({why})"
        elif shipped:
            verdict = f"kernel time {measured.render()}: shipped"
        else:
            slower = " (slower beyond the noise)" if measured.verdict == "slower" else ""
            verdict = f"not shipped: kernel time {measured.render()}{slower}"
        say(f"campaign {o.campaign_id} ({o.kernel}): {verdict}")
        if not shipped:
            withheld[o.campaign_id] = f"{verdict}; its changes were reverted"
    final, basis, before = first, "the shipped tree", None
    if withheld:
        # what applied nothing in the measured tree stays out too (a flag that clashed with a
        # reverted campaign's would apply now, unmeasured); its outcome says why as it was
        unchanged = {o.campaign_id: o for o in result.campaigns if not o.applied}
        _clear_tree(into)
        result = write_tree(bests, source_tree, into, context, include_noise,
                            {**withheld, **{i: "" for i in unchanged}})
        result.campaigns = [unchanged.get(o.campaign_id, o) for o in result.campaigns]
        build(into, build_command)  # the tree as shipped is built, as the first one was
        if any(o.applied for o in result.campaigns):
            say(f"reverted {len(withheld)} campaign(s); measuring the shipped tree again")
            before = first
            shipped_kernels = [e for e in kernels if any(
                o.entry_point == e and o.applied for o in result.campaigns)]
            final = measure(original, into, command, options, shipped_kernels, runner, timer)
            basis = "the shipped tree, measured again after reverting"
        else:
            basis = "the tree before reverting (nothing ships: the patched tree is the original)"
            say(f"nothing ships; the figures below are of {basis}"
                + ("; the application's own time was not measured" if kernels_first else ""))
    elif kernels_first:
        say("nothing was reverted; measuring the application's own time")
        plain = measure(original, into, command, replace(options, kernels=False), kernels,
                        runner, timer)
        final = TreeComparison(options, first.kernels_wanted, plain.original, plain.patched,
                               first.original_times, first.patched_times)
    for o in result.campaigns:
        if o.campaign_id in verdicts:
            o.measured, o.shipped = verdicts[o.campaign_id]
    for line in final.lines():
        say(line)
    total = final.kernel_total()
    if total is not None and total.verdict == "slower":
        say("warning: all kernels' device time is slower beyond the noise: a flag that affects "
            "every kernel of a unit may slow kernels that were not tuned")
    if result.predicted_kernel_speedup is not None:
        from r3tui.engine.prediction import prediction_lines

        for line in prediction_lines(result.predicted_kernel_speedup,
                                     result.predicted_wall_speedup, context.kernel_time_s,
                                     context.wall_s, result.prediction_other_work):
            say(line)
    extra: dict[str, Any] = {"measured": {**final.to_json(), **final.flat(), "tree": basis}}
    if before is not None:
        extra["measured_before_revert"] = {**before.to_json(), **before.flat()}
    write_summary(into, result, **extra)
    return result


def _clear_tree(into: Path) -> None:
    """Everything in ``into`` but the exports, so the tree can be written again."""
    from r3tui.engine.splice import EXPORTS_DIR

    for child in into.iterdir():
        if child.name == EXPORTS_DIR:
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
