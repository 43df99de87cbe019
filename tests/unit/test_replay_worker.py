"""Replay pieces that run without a GPU: candidates, the timing rule, the worker protocol."""

from __future__ import annotations

from pathlib import Path

import pytest

from r3tui.domain import Dim3, ResourceUsage
from r3tui.errors import GpuUnavailable, RecordingError
from r3tui.replay import Candidate, ReplayWorker
from r3tui.replay.timing import TimingPolicy, settled
from tests.unit.test_bundle import write_bundle


def test_candidate_defaults_to_the_recorded_launch(tmp_path: Path) -> None:
    m = write_bundle(tmp_path / "b", n=4096).manifest
    c = Candidate(b"cubin", "axpy")
    grid, block, shm, args = c.resolve(m)
    assert (grid, block, shm, args) == (Dim3(16), Dim3(256), 0, m.arg_bytes())
    # A new block derives the grid from the recorded work size.
    grid, block, _, _ = Candidate(b"cubin", "axpy", block=Dim3(128)).resolve(m)
    assert (grid, block) == (Dim3(32), Dim3(128))
    assert Candidate(b"cubin", "axpy", grid=Dim3(3), block=Dim3(128)).resolve(m)[0] == Dim3(3)


def test_elements_per_thread_divide_the_grid_of_the_launch_and_its_checks(
        tmp_path: Path) -> None:
    bundle = write_bundle(tmp_path / "b", n=4096, check=True)
    m = bundle.manifest
    assert m.checks
    four = Candidate(b"cubin", "axpy", work_divisor=4)
    assert four.resolve(m)[:2] == (Dim3(4), Dim3(256))  # 4096 elements / (256 x 4)
    assert Candidate(b"cubin", "axpy", block=Dim3(128), work_divisor=3).resolve(m)[0] == \
        Dim3(11)  # ceil(ceil(4096 / 3) / 128)
    assert four.launch_key(m) != Candidate(b"cubin", "axpy").launch_key(m)
    for check in m.checks:  # a check launch's grid follows its own work size
        assert check.launch.work is not None
        expected = -(-check.launch.work.x // (256 * 4))
        resolved = four.resolve_check(check)
        assert resolved is not None and resolved[0] == Dim3(expected)


def test_identical_code_has_one_launch_key(tmp_path: Path) -> None:
    m = write_bundle(tmp_path / "b").manifest
    a = Candidate(b"cubin-with-note-1", "axpy", code_sha256="ab" * 32)
    b = Candidate(b"cubin-with-note-2", "axpy", code_sha256="ab" * 32,
                  resources=ResourceUsage(registers=30))
    assert a.launch_key(m) == b.launch_key(m)
    assert a.launch_key(m) != Candidate(b"x", "axpy", block=Dim3(128)).launch_key(m)
    assert Candidate(b"x", "axpy").binary_sha256 != Candidate(b"y", "axpy").binary_sha256


def test_timing_stops_when_the_median_settles() -> None:
    policy = TimingPolicy(min_samples=5, settle_window=5, settle_rtol=0.01)
    assert not settled([1.0] * 7, policy)  # too few
    assert settled([1.0] * 8, policy)
    assert not settled([1.0] * 4 + [2.0] * 4, policy)


def test_worker_reports_a_missing_gpu_as_one_error(tmp_path: Path) -> None:
    bundle = write_bundle(tmp_path / "b")
    worker = ReplayWorker(bundle.path, startup_timeout_s=120)
    try:
        from r3tui.cuda.driver import init_device

        init_device(0)
    except GpuUnavailable:
        with pytest.raises(GpuUnavailable, match="no usable CUDA device"):
            worker.start()
    else:
        pytest.skip("a GPU is present; the GPU tests cover the worker")
    finally:
        worker.close()


def test_worker_reports_a_bad_bundle(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(RecordingError, match="not a recording bundle"):
        ReplayWorker(tmp_path / "empty", startup_timeout_s=120).start()
    # begun first (the child spawned while the caller works), the error comes from start
    worker = ReplayWorker(tmp_path / "empty", startup_timeout_s=120)
    worker.begin()
    assert worker._proc is not None
    with pytest.raises(RecordingError, match="not a recording bundle"):
        worker.start()
    worker.close()


def test_a_child_whose_driver_took_the_arena_range_is_replaced(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the driver's own allocations met the fixed range in two of three H200 runs of
    # test_gpu_app_search; a new process places them elsewhere.  The child start is a fake
    # here (no GPU): it fails like the driver did, then succeeds; any other arena problem,
    # or a third failure, is the caller's.
    from r3tui.errors import ArenaUnavailable
    from r3tui.replay.worker import WorkerInfo

    placed = ArenaUnavailable("replay worker: the driver placed the recording arena at "
                              "0x15463e000000, not 0x153940000000: another allocation holds "
                              "that range in this process")
    info = WorkerInfo(1, "fake", "sm_90", 13000, 0.1, True)
    outcomes: list[object] = [placed, placed, info]

    def fake_start(self: ReplayWorker) -> WorkerInfo:
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        assert isinstance(outcome, WorkerInfo)
        return outcome

    monkeypatch.setattr(ReplayWorker, "_start_once", fake_start)
    worker = ReplayWorker(write_bundle(tmp_path / "b").path)
    assert worker.start() is info and not outcomes
    outcomes[:] = [placed, placed, placed]
    with pytest.raises(ArenaUnavailable, match="placed the recording arena"):
        worker.start()
    full = ArenaUnavailable("the recording arena is full: 9 MiB needed, 8 MiB reserved")
    outcomes[:] = [full, info]
    with pytest.raises(ArenaUnavailable, match="is full"):
        worker.start()
    assert outcomes == [info]
