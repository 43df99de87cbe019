"""bench/multi_gpu.py's figures from its campaigns' rates and winners (issue #22); the
campaigns themselves need GPUs (the device machine)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from multi_gpu import Arm, efficiency, report  # noqa: E402

WIN = '{"block": [256, 1, 1]}'


def test_the_efficiency_is_the_rate_on_n_gpus_over_n_times_one() -> None:
    one = Arm("local", 1, 10.0, 160, 16.0, WIN, 3.1)
    assert efficiency(one, Arm("local", 8, 72.0, 160, 2.2, WIN, 3.1)) == 0.9
    assert efficiency(Arm("local", 1, 0.0, 0, 0.0, None, None), one) == 0.0


def test_the_report_gives_each_runner_and_the_worst_and_says_when_winners_differ() -> None:
    arms = [Arm("local", 1, 10.0, 160, 16.0, WIN, 3.1), Arm("local", 8, 72.0, 160, 2.2, WIN, 3.1),
            Arm("dask", 1, 9.0, 160, 17.8, WIN, 3.1),
            Arm("dask", 8, 60.0, 160, 2.7, '{"block": [128, 1, 1]}', 3.0)]
    lines = report(arms, 8)
    assert "multi_gpu_candidates_per_s[local,8]: 72.00" in lines
    assert any(line.startswith("multi_gpu_scaling_efficiency[local]: 0.900") for line in lines)
    assert any(line.startswith("multi_gpu_scaling_efficiency[dask]: 0.833") for line in lines)
    assert lines[-1].startswith("multi_gpu_scaling_efficiency: 0.833 (the worst runner")
    same = {line.split(":")[0]: line for line in lines if line.startswith("multi_gpu_same")}
    assert same["multi_gpu_same_winner[local]"].startswith("multi_gpu_same_winner[local]: yes")
    assert ": no (" in same["multi_gpu_same_winner[dask]"]
    assert "GPUs of one model differ" in same["multi_gpu_same_winner[dask]"]


def test_with_one_gpu_the_efficiency_is_not_claimed() -> None:
    lines = report([Arm("local", 1, 10.0, 160, 16.0, WIN, 3.1)], 1)
    assert "multi_gpu_candidates_per_s[local,1]: 10.00" in lines
    assert lines[-1].startswith("multi_gpu_scaling_efficiency: n/a (1 GPU visible")
    assert not any("scaling_efficiency[" in line for line in lines)
