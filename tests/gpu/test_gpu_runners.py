"""The runners on the GPU: the same configurations of a recorded kernel through the local
runner (compile pool + the GPU's replay worker) and through the Dask runner (a cluster of
processes on this machine, the GPU worker holding the bundle resident), every one compiled,
replayed to the recorded epilogue and timed; the finalists' re-timing runs on one GPU."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("kind", ["local", "dask"])
def test_a_runner_replays_and_verifies_every_configuration(axpy_bundle: Path, kind: str) -> None:
    if kind == "dask":
        pytest.importorskip("distributed", reason="the Dask runner needs the dask extra")
    from r3tui.domain import Dim3, MeasurementStatus, TrialConfig
    from r3tui.engine.gpu import RunnerSettings, open_runner
    from r3tui.engine.inner import ReplayEvaluator, seed_source
    from r3tui.record.bundle import Bundle

    source = seed_source(Bundle.open(axpy_bundle))
    configs = [TrialConfig(), TrialConfig(options=("--use_fast_math",)),
               TrialConfig(block=Dim3(128)), TrialConfig(options=("--maxrregcount=32",),
                                                         block=Dim3(512))]
    with open_runner(axpy_bundle, 60.0, RunnerSettings(runner=kind, workers=2)) as runner:
        assert runner.info.arch.startswith("sm_")
        evaluator = ReplayEvaluator(source, runner)
        measured = evaluator.evaluate(configs)
        for config, m in zip(configs, measured, strict=True):
            assert m.status is MeasurementStatus.OK, (config, m.error_text)
            assert m.verified is True and m.time is not None and m.time.median_s > 0
            assert m.compile_time_s is not None
        samples = evaluator.retime(configs[:2], rounds=3)
        assert len(samples) == 3 and all(len(r) == 2 and min(r) > 0 for r in samples)
        load = runner.load()
        assert any(w.kind == "gpu" for w in load.workers)
        stats = runner.stats()
    assert stats.lost == 0 and stats.replays == len(configs)
