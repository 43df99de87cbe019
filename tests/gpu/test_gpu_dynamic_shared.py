"""Dynamic shared memory as a search dimension, on the GPU: a kernel whose staged tile size is a
tunable (`// r3: shared TILE * 4`) replays correctly at three dynamic shared memory sizes, each
launched with the size its config says; the same binary launched with the recorded (too small)
size traps, so the size really reaches the launch.  A 64 KiB tile is outside the default 48 KiB
space and inside the space built from the worker's reported limits (the device's opt-in), and
replays there."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

KERNELS = Path(__file__).resolve().parent / "kernels"


def test_tile_sizes_replay_with_their_own_dynamic_shared_memory(tmp_path: Path) -> None:
    from r3tui.compile.cache import CompileCache
    from r3tui.compile.pool import CompilePool
    from r3tui.domain import MeasurementStatus, TrialConfig
    from r3tui.engine import InnerSettings, ReplayEvaluator, build_space
    from r3tui.engine.inner import device_limits, seed_source
    from r3tui.record.bundle import Bundle
    from r3tui.record.kernel_recorder import RecordKernelRequest, record_kernel
    from r3tui.replay.worker import ReplayWorker
    from r3tui.search import DeviceLimits

    bundle_dir = tmp_path / "tile_sum.r3b"
    record_kernel(RecordKernelRequest(
        source_path=KERNELS / "tile_sum.cu", kernel_name="tile_sum",
        inputs_path=KERNELS / "tile_sum_inputs.py", out=bundle_dir, seed=4,
    ))
    bundle = Bundle.open(bundle_dir)
    assert bundle.manifest.launch.shared_mem_bytes == 1024
    source = seed_source(bundle)
    space = build_space(bundle.manifest.launch, source, InnerSettings(launch_bounds=False),
                        DeviceLimits())
    assert "tune.TILE" in space.names
    baseline = space.baseline_config()
    mid = TrialConfig(tunables={"TILE": 1024}, shared_mem_bytes=4096)
    big = TrialConfig(tunables={"TILE": 4096}, shared_mem_bytes=16384)
    assert baseline.shared_mem_bytes is None  # the recorded 1024 bytes
    assert space.check(mid) == [] and space.check(big) == []
    # the size is not free: TILE=4096 at the recorded size is not a point of the space
    too_small = TrialConfig(tunables={"TILE": 4096})
    assert space.check(too_small) != []

    from r3tui.runners import GpuReplayer, LocalRunner

    with LocalRunner([GpuReplayer(ReplayWorker(bundle_dir, timeout_s=30))],
                     CompilePool(workers=2, cache=CompileCache(None))) as runner:
        info = runner.info
        huge = TrialConfig(tunables={"TILE": 16384}, shared_mem_bytes=65536)
        assert space.check(huge) != []  # over the 48 KiB default
        limits = device_limits(info)
        assert limits.max_shared_per_block > 65536, info.limits  # 227 KiB on sm_90
        opt_in = build_space(bundle.manifest.launch, source, InnerSettings(launch_bounds=False),
                             limits)
        assert opt_in.check(huge) == []
        evaluator = ReplayEvaluator(source, runner)
        results = evaluator.evaluate([baseline, mid, big, huge])
        for config, measured in zip([baseline, mid, big, huge], results, strict=True):
            assert measured.status is MeasurementStatus.OK, (config, measured.error_text)
            assert measured.verified is True
            assert measured.time is not None and measured.time.median_s > 0
        launched = {j.candidate.shared_mem_bytes for j in evaluator.jobs.values()}
        assert launched == {None, 4096, 16384, 65536}

        # the TILE=4096 binary at the recorded 1024 bytes: the kernel's own check traps
        (trapped,) = evaluator.evaluate([too_small])
        assert trapped.status in (MeasurementStatus.CRASHED, MeasurementStatus.LAUNCH_ERROR), (
            trapped.status, trapped.error_text)

        # one binary at two sizes above the default, re-timed together: the function's limit
        # is one attribute, which must be the larger size (session 44: the smaller one, set
        # last, failed the larger launch and stopped an sgemm campaign)
        import dataclasses

        (job,) = [j for j in evaluator.jobs.values() if j.candidate.shared_mem_bytes == 65536]
        larger = dataclasses.replace(job.candidate, shared_mem_bytes=98304)
    with ReplayWorker(bundle_dir, timeout_s=30) as worker:
        samples = worker.interleaved([larger, job.candidate], 3)
    assert [len(s) for s in samples] == [3, 3] and all(t > 0 for s in samples for t in s)
