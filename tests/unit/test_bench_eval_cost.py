"""bench/eval_cost.py's campaign rate: several runs, the median reported with every run's."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from eval_cost import CampaignRun, rate_line  # noqa: E402


def test_the_campaign_rate_is_the_median_run_with_every_run_shown() -> None:
    # session 35's two H100 runs of one command, 41.7 and 66.3, and a third between them
    runs = [CampaignRun(41.7, 200, 4.8, 10.1, {"seconds": {"ask": 3.96, "wait": 0.52}}),
            CampaignRun(66.3, 200, 3.0, 8.1, {"seconds": {"ask": 2.24, "wait": 0.55}}),
            CampaignRun(52.0, 200, 3.8, 9.0, {"seconds": {"wait": 0.5, "ask": 2.9}})]
    rate, phases = rate_line("stencil7", 200, "", runs)
    assert rate.startswith("campaign_evals_per_s: 52.0 (the median of 3 runs: 41.7, 66.3, 52.0;")
    assert "`r3 tune --inner-only --budget 200`" in rate and "3.8 s" in rate
    assert phases == "campaign_seconds_by_phase: ask 2.90, wait 0.50  (that run)"
    # an even count: the lower middle run, so the figure is a run that happened
    rate, _ = rate_line("stencil7", 200, "--workers 8", runs[:2])
    assert rate.startswith("campaign_evals_per_s: 41.7 (the lower middle of 2 runs: 41.7, 66.3;")
    assert "`r3 tune --inner-only --budget 200 --workers 8`" in rate


def test_the_dask_lines_give_the_overhead_and_where_the_gpu_waited() -> None:
    from eval_cost import ExampleResult, Flow, dask_lines

    def example(name: str, pairs: list[tuple[Flow, Flow]]) -> ExampleResult:
        flow = pairs[0][0] if pairs else Flow(100, 100, 1.0, 0.5)
        return ExampleResult(name, 1.0, [1.0], [1.0], [1.0], 50.0, 50.0, flow, pairs, 0)

    # stencil7's shape on the H100: the local flow 0.26 s with its GPU 84% busy, Dask's a
    # third longer on the same replay time, in 12 replay tasks
    local, slow = Flow(100, 100, 0.26, 0.2184), Flow(100, 100, 0.35, 0.2184, tasks=12)
    even = Flow(100, 100, 0.26, 0.2184, tasks=9)
    assert dask_lines([example("softmax", [(local, local)])]) != []
    lines = dask_lines([example("stencil7", [(local, slow), (local, slow), (local, even)])])
    assert lines[0].startswith("dask_overhead_pct: 34.6 [0.0, 34.6] (median of 3 paired rounds")
    assert "per example: stencil7 +34.6;" in lines[0]
    assert lines[1] == ("dask_flows: stencil7 GPU busy 0.84 local / 0.62 dask, 12 replay tasks "
                        "a flow of 100 (medians over the rounds)")
    assert dask_lines([example("nbody", [])]) == []
