"""Verification that no candidate can game (docs/verification.md), on real GPU replays.

Each adversarial kernel of ``bench/verification.py``'s catalogue is caught with the expected
status and reason while the honest kernel passes with its timing unchanged; for the attacks
that a defence neutralises, the same kernel with that defence off shows the fake result the
defence prevents, so none of these checks could pass without the defence in place.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from r3tui.domain import MeasurementStatus

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
import verification as bench  # noqa: E402

# stencil7 at half the full size (8.4 M points, 134 MB): a launch takes tens of microseconds,
# so a kernel that skips its work times clearly faster than one that does it.
STENCIL_SCALE = 0.5
SUM_SCALE = 0.05


def _record(catalog: ModuleType, name: str, out: Path, scale: float) -> Path:
    from r3tui.record.kernel_recorder import RecordKernelRequest, record_kernel

    example = catalog.load_example(name)
    record_kernel(RecordKernelRequest(
        Path(example.path) / "kernel.cu", example.kernel_name,
        Path(example.path) / "inputs.py", out, seed=0, scale=scale))
    return out


@pytest.fixture(scope="module")
def stencil(catalog: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _record(catalog, "stencil7", tmp_path_factory.mktemp("v") / "stencil7",
                   STENCIL_SCALE)


@pytest.fixture(scope="module")
def summed(catalog: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _record(catalog, "reduce_sum", tmp_path_factory.mktemp("v") / "reduce_sum",
                   SUM_SCALE)


class Replay:
    """One bundle replayed under several check policies, one worker each, started lazily."""

    def __init__(self, path: Path) -> None:
        from r3tui.record.bundle import Bundle

        self.path = path
        self.bundle = Bundle.open(path)
        self.workers: dict[str, Any] = {}
        self._honest: Any = None
        self._honest_s: float | None = None

    def worker(self, policy: str = "on") -> Any:
        from r3tui.replay import ReplayWorker
        from r3tui.replay.verify import CheckPolicy

        if policy not in self.workers:
            checks = {"on": CheckPolicy(), "off": CheckPolicy.off(),
                      # the timed-launch verifications alone (a check launch after the
                      # first launch would catch these kernels first)
                      "no_reset": CheckPolicy(reset_module_state=False,
                                              check_launches=False),
                      "no_checks": CheckPolicy(check_launches=False)}[policy]
            w = ReplayWorker(self.path, timeout_s=60, checks=checks)
            w.start()
            self.workers[policy] = w
        return self.workers[policy]

    @property
    def arch(self) -> str:
        return str(self.worker().info.arch)

    def compile(self, source: str, label: str) -> Any:
        return bench.compile_candidate(source, self.bundle.manifest.kernel.name, self.arch,
                                       label=label)

    def attack(self, file: str) -> tuple[str, Any]:
        attack = next(a for a in bench.CATALOG if a.file == file)
        source = bench.adversarial_source(attack, self.bundle)
        return source, self.compile(source, file)

    def honest_s(self) -> float:
        if self._honest_s is None:
            self._honest = self.compile(self.bundle.source() or "", "honest")
            m = self.worker().evaluate(self._honest)
            assert m.status is MeasurementStatus.OK and m.time is not None, m.error_text
            self._honest_s = m.time.median_s
        return self._honest_s

    def close(self) -> None:
        for w in self.workers.values():
            w.close()


@pytest.fixture(scope="module")
def st(stencil: Path) -> Iterator[Replay]:
    replay = Replay(stencil)
    yield replay
    replay.close()


@pytest.fixture(scope="module")
def rs(summed: Path) -> Iterator[Replay]:
    replay = Replay(summed)
    yield replay
    replay.close()


def test_the_recording_holds_a_check_launch_of_another_size(st: Replay) -> None:
    m = st.bundle.manifest
    (check,) = m.checks
    assert check.label == "seed 1, scale 0.0625"
    sizes = {p.name: p.value for p in check.params if p.name in ("nx", "ny", "nz")}
    recorded = {p.name: p.value for p in m.params if p.name in ("nx", "ny", "nz")}
    assert sizes == {"nx": 102, "ny": 102, "nz": 102} and recorded["nx"] == 203


def test_honest_kernel_passes_every_check_with_its_timing_unchanged(st: Replay) -> None:
    on = st.worker("on").evaluate(st.compile(st.bundle.source() or "", "honest-again"))
    off = st.worker("off").evaluate(st.compile(st.bundle.source() or "", "honest-off"))
    assert on.status is MeasurementStatus.OK and on.verified, on.error_text
    assert off.status is MeasurementStatus.OK and on.time is not None and off.time is not None
    # the defences run outside the timed region: the kernel's time may not move
    assert 0.9 < on.time.median_s / off.time.median_s < 1.1


@pytest.mark.parametrize("file", ["skip_after_first.cu", "every_other.cu",
                                  "static_counter.cu"])
def test_state_kept_in_the_module_gains_nothing(st: Replay, file: str) -> None:
    honest_s = st.honest_s()
    _source, candidate = st.attack(file)
    on = st.worker("on").evaluate(candidate)
    # reset before every launch, the kernel does all its work every time: correct and honest
    assert on.status is MeasurementStatus.OK and on.verified and on.time is not None, \
        on.error_text
    assert on.time.median_s > (1 - bench.NO_GAIN_MARGIN) * honest_s
    # without the reset, verifying the timed launches catches it instead
    no_reset = st.worker("no_reset").evaluate(candidate)
    assert no_reset.status is MeasurementStatus.WRONG_RESULT, no_reset
    assert "the last timed launch" in (no_reset.error_text or "") \
        or "did not settle" in (no_reset.error_text or "")


def test_skipping_after_the_first_launch_fooled_the_old_verification(st: Replay) -> None:
    """The issue's case: with only the first launch verified, a fake 1.5x+ speedup passed."""
    _source, candidate = st.attack("skip_after_first.cu")
    off = st.worker("off").evaluate(candidate)
    assert off.status is MeasurementStatus.OK and off.time is not None
    assert st.honest_s() / off.time.median_s > 1.3


@pytest.mark.parametrize("attack", [a for a in bench.CATALOG if a.example == "stencil7"
                                    and a.expect in ("wrong_result", "crashed")],
                         ids=lambda a: a.file)
def test_wrong_or_escaping_kernels_are_caught(st: Replay, attack: Any) -> None:
    _source, candidate = st.attack(attack.file)
    m = st.worker("on").evaluate(candidate)
    assert m.status.value in attack.expect.split("|"), (m.status, m.error_text)
    assert attack.mentions in (m.error_text or ""), m.error_text
    assert not m.verified


def test_fitting_the_recorded_size_passes_only_without_the_check_launch(st: Replay) -> None:
    _source, candidate = st.attack("hardcoded_size.cu")
    unchecked = st.worker("no_checks").evaluate(candidate)
    assert unchecked.status is MeasurementStatus.OK and unchecked.verified


def test_fitting_the_recorded_data_is_caught_by_the_check_launch(rs: Replay) -> None:
    _source, candidate = rs.attack("hardcoded_sum.cu")
    m = rs.worker("on").evaluate(candidate)
    assert m.status is MeasurementStatus.WRONG_RESULT
    assert "check launch (seed 1, scale 0.00625): out:" in (m.error_text or ""), m.error_text
    unchecked = rs.worker("no_checks").evaluate(candidate)
    assert unchecked.status is MeasurementStatus.OK and unchecked.verified


@pytest.mark.parametrize("attack", [a for a in bench.CATALOG if a.expect == "unsafe"],
                         ids=lambda a: a.file)
def test_unsafe_kernels_are_refused_before_compiling(st: Replay, attack: Any,
                                                     tmp_path: Path) -> None:
    source = bench.adversarial_source(attack, st.bundle)
    path = tmp_path / attack.file
    path.write_text(source)
    run = subprocess.run(
        [sys.executable, "-m", "r3tui", "replay", str(st.path), "--source", str(path),
         "--db", str(tmp_path / "r3.sqlite")],
        capture_output=True, text=True, timeout=120, cwd=REPO)
    assert run.returncode == 1, run.stderr
    assert "unsafe" in run.stdout and attack.mentions in run.stdout, run.stdout
    assert "compiling" not in run.stderr  # refused before the compile step


def test_timed_launches_start_with_a_cold_l2(catalog: ModuleType, tmp_path: Path) -> None:
    """A kernel cannot profit from what an earlier launch (or the restore) left in L2: with a
    27 MB working set, timed launches after the flush run measurably slower than without it."""
    from r3tui.replay import ReplayWorker
    from r3tui.replay.timing import TimingPolicy

    path = _record(catalog, "stencil7", tmp_path / "small", 0.1)
    replay = Replay(path)
    try:
        candidate = replay.compile(replay.bundle.source() or "", "honest")
        cold = replay.worker().evaluate(candidate)
        with ReplayWorker(path, timeout_s=60, policy=TimingPolicy(l2_flush=False)) as warm_w:
            assert warm_w.start().l2_flush is False
            warm = warm_w.evaluate(candidate)
        assert replay.worker().info.l2_flush is True
    finally:
        replay.close()
    assert cold.time is not None and warm.time is not None
    assert cold.time.median_s > 1.03 * warm.time.median_s, (cold.time, warm.time)
