import math

import pytest

from r3tui.domain import Dim3, Measurement, MeasurementStatus, TimeStats, Tolerance, TrialConfig


def test_dim3_parse_and_grid_cover_work_exactly_once() -> None:
    block = Dim3.parse("32,8")
    assert block == Dim3(32, 8, 1)
    work = Dim3(256, 250, 3)
    grid = block.grid_for(work)
    assert grid == Dim3(8, 32, 3)
    # every work item is covered and no whole block is wasted
    assert grid.x * block.x >= work.x and (grid.x - 1) * block.x < work.x
    assert grid.y * block.y >= work.y and (grid.y - 1) * block.y < work.y


@pytest.mark.parametrize("text", ["0", "-1,2", "a,b", "1,2,3,4", ""])
def test_dim3_rejects_bad_text(text: str) -> None:
    with pytest.raises(ValueError):
        Dim3.parse(text)


def test_time_stats_quantiles_match_definition() -> None:
    stats = TimeStats.from_samples([5.0, 1.0, 3.0, 2.0, 4.0])
    assert stats.median_s == 3.0
    assert stats.min_s == 1.0
    assert math.isclose(stats.iqr_s, 4.0 - 2.0)
    assert stats.n == 5
    with pytest.raises(ValueError):
        TimeStats.from_samples([])


def test_trial_config_json_round_trip() -> None:
    config = TrialConfig(
        toolchain="nvcc",
        options=("-O3", "-maxrregcount=64"),
        block=Dim3(64, 4),
        tunables={"TILE": 16},
        launch_bounds=(256, 2),
    )
    assert TrialConfig.from_json(config.to_json()) == config


def test_tolerance_rejects_negative_and_nan() -> None:
    with pytest.raises(ValueError):
        Tolerance(rtol=-1.0)
    with pytest.raises(ValueError):
        Tolerance(atol=float("nan"))


def test_measurement_ok_only_for_ok_status() -> None:
    assert Measurement(MeasurementStatus.OK).ok
    assert not Measurement(MeasurementStatus.WRONG_RESULT).ok
