"""`r3 apply`'s measurement: ratios with intervals from interleaved pairs, the stopping rule,
and shipping only the campaigns whose own kernel measured faster (the others reverted).

The application runs for real (a Python script that prints its time key).  Kernel device
time needs the interposer on a GPU, so here a fake timer stands in for it: it reads the
tree's ``r3-flags.txt`` as the build would and returns per-kernel device times."""

from __future__ import annotations

import json
import random
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from db.session import open_database
from r3tui.engine.app_run import (
    AppRun,
    KernelTimes,
    MeasureOptions,
    measure,
    measure_and_ship,
    ratio,
)
from r3tui.engine.application import RecordingContext, prediction_lines, recording_context
from r3tui.engine.apply import ApplyResult, check_into, load_bests, write_tree
from r3tui.errors import R3Error
from r3tui.search.winner import median_ci_coverage, pairs_for
from tests.unit.test_app_tune import (
    CG,
    SPMV,
    XPAY,
    XPAY_BODY,
    XPAY_TUNED,
    _apply_db,
    r3,
    write_recording,
)


# -- ratios and their intervals --------------------------------------------------------------
def _jitter(rng: random.Random, base: float, spread: float, n: int) -> list[float]:
    return [base * (1 + rng.uniform(-spread, spread)) for _ in range(n)]


# per-pair kernel-time ratios of two identical builds of Rodinia backprop on the H200
# (bench/corpus.py, 2026-12-04): the bootstrap interval called them "faster", [1.0005, 1.19]
IDENTICAL_BUILDS = [1.069, 0.952, 1.078, 1.069, 1.309, 1.108, 0.942, 1.034, 1.090, 1.292]


def test_the_median_interval_covers_what_it_says_with_few_pairs() -> None:
    from r3tui.search.winner import order_statistic_median_ci

    assert order_statistic_median_ci(list(range(10, 0, -1)), 0.95) == (2, 9)  # x(2)..x(9)
    assert order_statistic_median_ci([3.0, 1.0, 2.0, 5.0, 4.0], 0.95) == (1.0, 5.0)
    assert order_statistic_median_ci([2.0], 0.95) == (2.0, 2.0)
    # coverage of a skewed distribution's true median, 10 pairs a time
    rng = random.Random(7)
    median = 2 ** 0.5  # of exp(U(0, ln 2) * 1): the median of 2**U, U uniform on [0, 1]
    hits = 0
    for _ in range(3000):
        low, high = order_statistic_median_ci([2 ** rng.random() for _ in range(10)], 0.95)
        hits += low <= median <= high
    assert hits / 3000 >= 0.95
    same = ratio(IDENTICAL_BUILDS, [1.0] * len(IDENTICAL_BUILDS))
    assert same is not None and same.verdict == "within noise", same


def test_a_ratio_beyond_the_noise_within_it_and_slower() -> None:
    rng = random.Random(1)
    original = _jitter(rng, 1.0, 0.01, 12)
    faster = ratio(original, _jitter(rng, 0.8, 0.01, 12))
    assert faster is not None and faster.verdict == "faster"
    assert faster.low > 1.2 and faster.value == pytest.approx(1.25, rel=0.03)
    assert "within noise" not in faster.render() and faster.runs == 12
    # the 1.00-1.31 s spread of the issue: three runs of each say nothing
    same = ratio([1.00, 1.31, 1.15], [1.31, 1.00, 1.2])
    assert same is not None and same.verdict == "within noise"
    assert same.render().endswith(" within noise (3 pairs: a 75.0% interval; 95% needs 6)")
    assert same.low <= 1 <= same.high
    slower = ratio(original, _jitter(rng, 1.1, 0.01, 12))
    assert slower is not None and slower.verdict == "slower" and slower.high < 1
    assert ratio([1.0, float("nan")], [0.0, 1.0]) is None  # no usable pair
    assert faster.to_json()["ci"] == [faster.low, faster.high]


# -- the stopping rule -----------------------------------------------------------------------
class FakeTimer:
    """Stands in for the interposer (no GPU here): per-kernel device seconds of a tree,
    with multiplicative jitter, a kernel faster where the tree's flags file sets its flag."""

    def __init__(self, kernels: dict[str, tuple[float, str | None, float]], spread: float,
                 seed: int = 0, fails: tuple[str, str] | None = None) -> None:
        self.kernels = kernels  # entry -> (seconds, flag that speeds it up, by how much)
        self.fails = fails  # (entry, flag): with that flag the kernel's launches all fail
        self.spread = spread
        self.rng = random.Random(seed)
        self.calls: list[Path] = []

    def __call__(self, tree: Path, command: Sequence[str]) -> KernelTimes:
        self.calls.append(tree)
        flags_file = tree / "r3-flags.txt"
        flags = flags_file.read_text().split() if flags_file.is_file() else []
        times = {}
        for entry, (seconds, flag, speedup) in self.kernels.items():
            t = seconds / speedup if flag in flags else seconds
            times[entry] = t * (1 + self.rng.uniform(-self.spread, self.spread))
        if self.fails is not None and self.fails[1] in flags:
            # as the interposer counts it: a failed launch is neither timed nor counted, and
            # an application that does not check stops iterating early
            times.pop(self.fails[0], None)
            return KernelTimes(times, {e: 1 for e in times})
        return KernelTimes(times, {e: 100 for e in times})


def _runner(spread: float, seed: int = 0
            ) -> tuple[Callable[[Path, Sequence[str]], AppRun], list[Path]]:
    rng = random.Random(seed)
    calls: list[Path] = []

    def run(tree: Path, command: Sequence[str]) -> AppRun:
        """Stands in for a process: the app's time with jitter, no process started."""
        calls.append(tree)
        t = 1.0 * (1 + rng.uniform(-spread, spread))
        return AppRun(0, t + 0.1, {"solve_time_s": t})

    return run, calls


def test_pairs_stop_once_intervals_are_narrow_and_each_kind_stops_on_its_own(
    tmp_path: Path,
) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    opts = MeasureOptions(time_key="solve_time_s", min_runs=5, max_runs=12, ci_width=0.05)
    # quiet kernels, a noisy application: timed pairs stop at 6 (the first look: --runs 5 is
    # below the 6 pairs a 95% interval needs), plain pairs run to 12
    timer = FakeTimer({SPMV: (1e-3, None, 1.0)}, spread=0.002)
    runner, calls = _runner(spread=0.3)
    result = measure(a, b, ("./app",), opts, [SPMV], runner, timer)
    assert len(result.original_times) == len(result.patched_times) == 6
    assert len(result.original) == len(result.patched) == 12
    assert result.kernels_done() and not result.app_done()
    # interleaved, the first side swapped every pair
    assert calls[:4] == [a, b, b, a] and timer.calls[:4] == [a, b, b, a]
    app = result.app()
    assert app is not None and app.runs == 12 and app.verdict == "within noise"
    lines = result.lines()
    assert lines[0].startswith("kernel_time_speedup_measured: ")  # the same kernel time
    assert lines[0].endswith("] within noise")
    assert "6 interleaved pairs)" in lines[1]
    assert lines[2].startswith("app_speedup_measured: ") and lines[2].endswith("within noise")
    assert "solve_time_s; 12 interleaved pairs; stopped at --max-runs" in lines[3]
    assert lines[4].startswith("wall_speedup_measured: ")
    flat = result.flat()
    assert flat["app_speedup_ci"] == [app.low, app.high] and flat["kernel_speedup"] > 0

    # quiet everywhere: both stop at the first look
    runner, _ = _runner(spread=0.001)
    quiet = measure(a, b, ("./app",), opts, [SPMV], runner,
                    FakeTimer({SPMV: (1e-3, None, 1.0)}, 0.002))
    assert len(quiet.original) == 6 and len(quiet.original_times) == 6


def test_measure_options_refuse_what_gives_no_interval() -> None:
    MeasureOptions().check()
    for bad, match in (
        (MeasureOptions(min_runs=1), "--runs must be at least 2"),
        (MeasureOptions(min_runs=10, max_runs=5), r"--max-runs \(5\) is below --runs \(10\)"),
        (MeasureOptions(ci_width=0), "--ci-width"),
        (MeasureOptions(min_runs=2, max_runs=5), r"--max-runs \(5\) is below the 6 pairs a 95%"),
    ):
        with pytest.raises(R3Error, match=match):
            bad.check()


def test_kernel_times_from_a_recording_without_snapshots() -> None:
    data = {
        "exit_code": 0,
        "kernels": [
            {"entry_point": SPMV, "launches": 100, "device_time_s": 0.5, "configs": []},
            {"entry_point": XPAY, "launches": 10, "device_time_s": 0.1, "configs": []},
        ],
        "graphs": {"launches": 3, "device_time_s": 0.25},
        "fault": None,
    }
    times = KernelTimes.from_recording(data)
    assert times.by_kernel == {SPMV: 0.5, XPAY: 0.1} and times.launches[SPMV] == 100
    assert times.total_s == pytest.approx(0.85)
    with pytest.raises(R3Error, match="faulted under the interposer"):
        KernelTimes.from_recording({**data, "fault": "an illegal address in spmv"})
    with pytest.raises(R3Error, match="exited with 3"):
        KernelTimes.from_recording({**data, "exit_code": 3})


# -- shipping only what measured faster ------------------------------------------------------
APP = """import sys, time
t0 = time.perf_counter()
time.sleep(0.002)
print("converged: 1")
print(f"solve_time_s: {time.perf_counter() - t0:.6f}")
"""


def _tree(tmp_path: Path) -> tuple[Path, Path]:
    tree = tmp_path / "app"
    shutil.copytree(CG, tree, ignore=shutil.ignore_patterns("cg", "cg-shared", "*.o", "*.json"))
    (tree / "app.py").write_text(APP)
    return tree, write_recording(tmp_path / "rec", tree)


def _applied(tmp_path: Path, tree: Path, rec: Path
             ) -> tuple[list[int], Path, RecordingContext, list[Any], ApplyResult]:
    db_path, ids = _apply_db(tmp_path, tree, rec)
    into = tmp_path / "patched"
    with (open_database(db_path, readonly=True, create=False) as database,
          database.session_scope() as s):
        context = recording_context(s, ids)
        check_into(tree, into)
        bests = load_bests(s, ids, into)
    return ids, into, context, bests, write_tree(bests, tree, into, context)


def test_a_campaign_whose_kernel_is_not_faster_is_reverted_and_the_rest_measured_again(
    tmp_path: Path,
) -> None:
    tree, rec = _tree(tmp_path)
    ids, into, context, bests, result = _applied(tmp_path, tree, rec)
    spmv, xpay, update = ids
    assert "--maxrregcount=32" in (into / "r3-flags.txt").read_text()  # xpay's, before
    # spmv's block size makes it 1.25x faster; xpay's register cap and source change nothing
    timer = FakeTimer({SPMV: (0.5, "-DCG_BLOCK_SPMV=256", 1.25), XPAY: (0.05, None, 1.0)},
                      spread=0.01)
    lines: list[str] = []
    shipped = measure_and_ship(
        bests, tree, into, (sys.executable, "app.py"), result, context, "true",
        MeasureOptions(time_key="solve_time_s", min_runs=4, max_runs=8, ci_width=0.02),
        say=lines.append, timer=timer)
    out = "\n".join(lines)
    assert f"campaign {spmv} (cg::spmv_csr): kernel time 1.2" in out and ": shipped" in out
    assert f"campaign {xpay} (cg::detail::xpay<double>): not shipped: kernel time " in out
    assert "within noise" in out.split(f"campaign {xpay}")[1].splitlines()[0]
    assert "reverted 1 campaign(s); measuring the shipped tree again" in out

    # the final tree holds only what shipped: spmv's flags, not xpay's (nor update's
    # --maxrregcount=64, which clashed with xpay's and was never measured)
    flags = (into / "r3-flags.txt").read_text().split()
    assert flags == ["-DCG_BLOCK_SPMV=256", "--ptxas-options=-dlcm=cg"]
    text = (into / "cg.cu").read_text()
    assert XPAY_BODY in text and XPAY_TUNED not in text
    patch = (into / "r3-apply.patch").read_text()
    assert "maxrregcount" not in patch and "CG_BLOCK_SPMV=256" in patch

    summary = json.loads((into / "r3-apply.json").read_text())
    by_id = {c["campaign_id"]: c for c in summary["campaigns"]}
    assert by_id[spmv]["shipped"] is True and by_id[spmv]["measured"]["verdict"] == "faster"
    assert by_id[xpay]["shipped"] is False and by_id[xpay]["applied"] == []
    assert "its changes were reverted" in by_id[xpay]["not_applied"][0]
    assert by_id[update]["shipped"] is None and by_id[update]["applied"] == []
    assert any("already set --maxrregcount=32" in n for n in by_id[update]["not_applied"])
    measured = summary["measured"]
    assert measured["tree"] == "the shipped tree, measured again after reverting"
    assert measured["app_basis"] == "solve_time_s"
    assert 4 <= measured["kernel_time"]["runs"] <= 8 and len(measured["original"]) >= 4
    assert measured["kernel_speedup"] == pytest.approx(0.55 / 0.45, rel=0.03)
    assert measured["kernel_speedup_ci"][0] > 1 and "wall_speedup_ci" in measured
    assert summary["measured_before_revert"]["kernels"][XPAY]["verdict"] == "within noise"
    # the prediction is of what ships: spmv alone, over both its configurations (0.6)
    assert summary["predicted_kernel_speedup"] == pytest.approx(1 / (0.4 + 0.6 / 1.25))
    assert shipped.predicted_kernel_speedup == summary["predicted_kernel_speedup"]
    assert out.count("kernel_time_speedup_measured: ") == 1
    assert "kernel_time_speedup_predicted: " in out and "app_wall_speedup_predicted: " in out


def test_when_nothing_is_faster_nothing_ships_and_the_figures_say_of_what(
    tmp_path: Path,
) -> None:
    tree, rec = _tree(tmp_path)
    _, into, context, bests, result = _applied(tmp_path, tree, rec)
    timer = FakeTimer({SPMV: (0.5, None, 1.0), XPAY: (0.05, None, 1.0)}, spread=0.01)
    runner, plain_runs = _runner(0.01)
    lines: list[str] = []
    measure_and_ship(bests, tree, into, (sys.executable, "app.py"), result, context, "true",
                     MeasureOptions(min_runs=3, max_runs=4), say=lines.append, timer=timer,
                     runner=runner)
    out = "\n".join(lines)
    assert "nothing ships; the figures below are of the tree before reverting" in out
    # the kernels' timed pairs decided it: the application was never run for its own time
    assert plain_runs == [] and len(timer.calls) >= 6
    assert "the application's own time was not measured" in out
    assert "app_speedup_measured" not in out and "kernel_time_speedup_measured: " in out
    assert not (into / "r3-flags.txt").exists()
    assert (into / "r3-apply.patch").read_text() == ""
    assert (into / "cg.cu").read_text() == (tree / "cg.cu").read_text()
    summary = json.loads((into / "r3-apply.json").read_text())
    assert summary["measured"]["tree"].startswith("the tree before reverting")
    assert all(not c["applied"] for c in summary["campaigns"])
    assert summary["predicted_kernel_speedup"] == pytest.approx(1.0)


def test_when_every_campaign_ships_the_app_is_timed_after_its_kernels(tmp_path: Path) -> None:
    tree, rec = _tree(tmp_path)
    _, into, context, bests, result = _applied(tmp_path, tree, rec)
    timer = FakeTimer({SPMV: (0.5, "-DCG_BLOCK_SPMV=256", 1.25),
                       XPAY: (0.05, "--maxrregcount=32", 1.25)}, spread=0.01)
    events: list[str] = []
    runner, plain_runs = _runner(0.01)

    def timed(tree: Path, command: Sequence[str]) -> KernelTimes:
        events.append("timed")
        return timer(tree, command)

    def plain(tree: Path, command: Sequence[str]) -> AppRun:
        events.append("plain")
        return runner(tree, command)

    lines: list[str] = []
    measure_and_ship(bests, tree, into, (sys.executable, "app.py"), result, context, "true",
                     MeasureOptions(time_key="solve_time_s", min_runs=3, max_runs=6),
                     say=lines.append, timer=timed, runner=plain)
    out = "\n".join(lines)
    assert "campaign(s)" not in out
    assert "nothing was reverted; measuring the application's own time" in out
    # every timed pair first, then the plain ones
    assert events == ["timed"] * events.count("timed") + ["plain"] * events.count("plain")
    assert events.count("plain") >= 12 and events.count("timed") >= 12
    summary = json.loads((into / "r3-apply.json").read_text())
    measured = summary["measured"]
    assert measured["tree"] == "the shipped tree" and measured["app_basis"] == "solve_time_s"
    assert len(measured["original"]) == len(plain_runs) // 2
    assert len(measured["original_kernel_s"]) == events.count("timed") // 2
    assert measured["kernel_speedup_ci"][0] > 1 and measured["app_speedup"] is not None
    assert all(c["shipped"] for c in summary["campaigns"] if c["applied"])
    assert "app_speedup_measured: " in out and "kernel_time_speedup_measured: " in out


def test_a_patched_build_that_launches_its_kernels_differently_ships_nothing(
    tmp_path: Path,
) -> None:
    """Rodinia bfs on the H200: its kernel's launches failed in the patched build and the
    application ran on; all kernel time looked 13.7x faster."""
    tree, rec = _tree(tmp_path)
    _, into, context, bests, result = _applied(tmp_path, tree, rec)
    timer = FakeTimer({SPMV: (0.5, "-DCG_BLOCK_SPMV=256", 1.25), XPAY: (0.05, None, 1.0)},
                      spread=0.01, fails=(XPAY, "--maxrregcount=32"))
    lines: list[str] = []
    measure_and_ship(bests, tree, into, (sys.executable, "app.py"), result, context, "true",
                     MeasureOptions(min_runs=3, max_runs=4), say=lines.append, timer=timer)
    out = "\n".join(lines)
    assert ("the patched application launched kernels a different number of times than the "
            f"original ({XPAY} 100 -> 0; {SPMV} 100 -> 1)") in out, out
    assert "nothing ships" in out and not (into / "r3-flags.txt").exists()
    summary = json.loads((into / "r3-apply.json").read_text())
    assert all(not c["applied"] and c["shipped"] is not True for c in summary["campaigns"])
    assert any("a different number of times" in n for c in summary["campaigns"]
               for n in c["not_applied"])


# -- printed predictions and bad input ------------------------------------------------------
def test_prediction_lines_name_both_figures_and_their_basis() -> None:
    lines = prediction_lines(1.137, 1.0074, 0.073, 1.3)
    assert lines[0] == "kernel_time_speedup_predicted: 1.1370"
    assert lines[2] == "app_wall_speedup_predicted: 1.0074"
    assert "73.000 ms of 1.300 s recorded wall, 5.6%" in lines[3]
    assert "recording overhead" in lines[3] and "conservative" in lines[3]
    assert prediction_lines(1.1, None, 0.0, 0.0)[2] == "app_wall_speedup_predicted: -"


def test_apply_refuses_measurement_settings_that_give_no_interval(tmp_path: Path) -> None:
    for bad in (("--runs", "1"), ("--runs", "10", "--max-runs", "5"), ("--ci-width", "0"),
                ("--runs", "3", "--max-runs", "4")):
        result = r3("apply", "1", "--into", str(tmp_path / "x"), *bad,
                    "--db", str(tmp_path / "r3.sqlite"), cwd=tmp_path)
        assert result.returncode == 2, (bad, result.stderr)
        assert result.stderr.startswith("r3: error:") and result.stderr.count("\n") == 1, bad


def test_an_interval_of_fewer_pairs_than_its_confidence_needs_says_neither_way() -> None:
    """gelu on the H200 (2026-12-05): 4 pairs, the patched build slower in each, were called
    a regression at 95%; the whole range of 4 pairs covers the median 87.5% of the time."""
    assert pairs_for(0.95) == 6 and pairs_for(0.99) == 8
    assert median_ci_coverage(4, 0.95) == pytest.approx(0.875)
    assert median_ci_coverage(6, 0.95) == pytest.approx(1 - 2 / 64)
    assert median_ci_coverage(10, 0.95) == pytest.approx(1 - 2 * 11 / 1024)
    slower4 = ratio([1.0, 1.0, 1.0, 1.0], [1.10, 1.05, 1.08, 1.12])
    assert slower4 is not None and slower4.high < 1 and slower4.too_few
    assert slower4.verdict == "within noise"
    assert slower4.render().endswith(
        "within noise (4 pairs: a 87.5% interval; 95% needs 6)")
    assert slower4.to_json()["coverage"] == pytest.approx(0.875)
    faster4 = ratio([1.1] * 4, [1.0] * 4)
    assert faster4 is not None and faster4.verdict == "within noise"  # nothing ships on it
    slower6 = ratio([1.0] * 6, [1.10, 1.05, 1.08, 1.12, 1.07, 1.09])
    assert slower6 is not None and not slower6.too_few and slower6.verdict == "slower"
    faster6 = ratio([1.1] * 6, [1.0] * 6)
    assert faster6 is not None and faster6.verdict == "faster"
