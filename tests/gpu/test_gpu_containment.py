"""Bad candidates are contained: a wrong result is caught, an illegal address and a hang cost
one worker restart each, and the next good candidate measures as if nothing happened."""

from __future__ import annotations

from pathlib import Path

import pytest

from r3tui.domain import MeasurementStatus

pytestmark = pytest.mark.gpu

KERNELS = Path(__file__).resolve().parent / "kernels"


def _candidate(source: str, arch: str):  # type: ignore[no-untyped-def]
    from r3tui.compile.base import CompileRequest, get_toolchain
    from r3tui.replay import Candidate

    compiled = get_toolchain("nvrtc").compile(CompileRequest(
        source=(KERNELS / source).read_text(), kernel_name="axpy", arch=arch,
        source_name=source,
    ))
    assert compiled.ok, compiled.log
    return Candidate.from_compiled(compiled, label=source)


def test_bad_candidates_are_contained_and_the_worker_recovers(axpy_bundle: Path) -> None:
    from r3tui.replay import ReplayWorker

    with ReplayWorker(axpy_bundle, timeout_s=15) as worker:
        arch = worker.start().arch
        good = _candidate("axpy.cu", arch)
        first = worker.evaluate(good)
        assert first.status is MeasurementStatus.OK, first.error_text

        wrong = worker.evaluate(_candidate("axpy_wrong.cu", arch))
        assert wrong.status is MeasurementStatus.WRONG_RESULT
        assert wrong.verified is False and wrong.max_error == pytest.approx(1.0)
        assert "element 7" in (wrong.error_text or "")
        assert worker.restarts == 0

        oob = worker.evaluate(_candidate("axpy_oob.cu", arch))
        assert oob.status in (MeasurementStatus.CRASHED, MeasurementStatus.LAUNCH_ERROR)
        assert "ILLEGAL_ADDRESS" in (oob.error_text or "") or "died" in (oob.error_text or "")
        after_oob = worker.evaluate(good)
        assert after_oob.status is MeasurementStatus.OK, after_oob.error_text
        assert worker.restarts == 1

        hang = worker.evaluate(_candidate("axpy_hang.cu", arch))
        assert hang.status is MeasurementStatus.TIMEOUT, hang.error_text
        after_hang = worker.evaluate(good)
        assert after_hang.status is MeasurementStatus.OK, after_hang.error_text
        assert worker.restarts == 2


def test_identical_binaries_are_measured_once(axpy_bundle: Path) -> None:
    from dataclasses import replace

    from r3tui.replay import ReplayWorker

    with ReplayWorker(axpy_bundle, timeout_s=60) as worker:
        arch = worker.start().arch
        first = worker.evaluate(_candidate("axpy.cu", arch))
        launches = worker.stats()["launches"]
        again = worker.evaluate(_candidate("axpy.cu", arch))  # a second compile, same code
        stats = worker.stats()
    assert first.status is MeasurementStatus.OK
    # the same measurement comes back, without a launch; only the wall time differs (the lookup)
    assert replace(again, replay_wall_s=first.replay_wall_s) == first
    assert again.replay_wall_s < first.replay_wall_s
    assert stats["launches"] == launches and stats["measured"] == 1


def test_interleaved_retiming_launches_every_candidate_every_round(axpy_bundle: Path) -> None:
    from dataclasses import replace

    from r3tui.domain import Dim3
    from r3tui.replay import ReplayWorker

    with ReplayWorker(axpy_bundle, timeout_s=60) as worker:
        arch = worker.start().arch
        base = _candidate("axpy.cu", arch)
        other = replace(base, block=Dim3(64))
        for c in (base, other):
            assert worker.evaluate(c).status is MeasurementStatus.OK
        before = worker.stats()["launches"]
        samples = worker.interleaved([base, other], rounds=7)
        after = worker.stats()["launches"]
    assert [len(s) for s in samples] == [7, 7]
    assert all(0 < t < 1.0 for s in samples for t in s)
    assert after - before == 2 * (7 + 1)  # one untimed warm-up round
