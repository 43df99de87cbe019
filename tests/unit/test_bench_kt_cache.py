"""bench/kt_cache.py: our recorded spaces as Kernel Tuner cache files (needs kernel_tuner)."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest

kernel_tuner = pytest.importorskip("kernel_tuner")

ROOT = Path(__file__).resolve().parents[2]
SPACES = ROOT / "tests" / "data" / "spaces"
sys.path.insert(0, str(ROOT / "bench"))

from kernel_tuner.searchspace import (  # type: ignore[import-untyped,import-not-found,unused-ignore]  # noqa: E402
    Searchspace,
)
from kernel_tuner.util import (  # type: ignore[import-untyped,import-not-found,unused-ignore]  # noqa: E402
    RuntimeFailedConfig,
    read_cache,
)
from kt_cache import best_time_s, restriction, to_kt, unique_evaluations, write_cache  # noqa: E402

from r3tui.domain import MeasurementStatus  # noqa: E402
from r3tui.search.simulation import SpaceFile, parse_space_file  # noqa: E402


def recorded(example: str) -> SpaceFile:
    path = SPACES / f"{example}.json"
    if not path.exists():
        pytest.skip(f"no recorded space {path}")
    return parse_space_file(json.loads(path.read_text()))


def test_every_recorded_config_is_one_cache_entry_with_its_time_or_error(tmp_path: Path) -> None:
    space = recorded("spmv_csr")  # 56 ok and 4 launch errors, block.x x options
    kt = to_kt(space)
    assert kt.keys == ["use_fast_math", "maxrregcount", "block_size_x"]
    assert kt.tune_params["block_size_x"] == [4, 8, 16, 32, 64, 128, 256, 512, 1024]
    assert kt.tune_params["use_fast_math"] == ["default", "on"]
    cache = read_cache(str(write_cache(kt, tmp_path / "spmv.json")), open_cache=False)
    entries = cache["cache"]
    assert len(entries) == len(space.table) == 60
    failed = 0
    for key, entry in entries.items():
        assert key == ",".join(str(entry[name]) for name in kt.keys)  # Kernel Tuner's key
        result = space.table[kt.config_key_of(entry)]
        if result.status is MeasurementStatus.OK:
            assert result.median_s is not None
            assert entry["time"] == pytest.approx(result.median_s * 1e3, rel=1e-12)
            assert "__error__" not in entry
        else:
            assert result.status is MeasurementStatus.LAUNCH_ERROR
            assert isinstance(entry["__error__"], RuntimeFailedConfig)
            failed += 1
    assert failed == 4


def test_kernel_tuner_space_is_exactly_our_valid_points() -> None:
    space = recorded("stencil7")  # block volume <= 1024 cuts the product of the axes
    kt = to_kt(space)
    product = 1
    for values in kt.tune_params.values():
        product *= len(values)
    assert len(kt.points) == space.space.size() == 1470 < product
    theirs = Searchspace(kt.tune_params, [restriction(kt)], 1024)
    assert theirs.size == 1470
    assert set(theirs.list) == set(kt.points)
    assert ("default", "default", 256, 256, 64) not in set(theirs.list)  # 4M threads


def test_kernel_tuner_searches_the_table_and_scores_with_our_numbers(tmp_path: Path) -> None:
    space = recorded("spmv_csr")
    kt = to_kt(space)
    cache = write_cache(kt, tmp_path / "spmv.json")
    random.seed(0)
    results, _ = kernel_tuner.tune_kernel(
        kt.kernel_name,
        "",
        kt.problem_size,
        [],
        kt.tune_params,
        restrictions=[restriction(kt)],
        cache=str(cache),
        simulation_mode=True,
        strategy="random_sample",
        strategy_options={"max_fevals": 12},
        quiet=True,
    )
    assert unique_evaluations(kt, results) == 12  # max_fevals counts distinct configs
    best = best_time_s(kt, space.table, results)
    times = [space.table[kt.config_key_of(r)].median_s for r in results if "__error__" not in r]
    assert best == min(t for t in times if t is not None)
    kt_times = [r["time"] / 1e3 for r in results if "__error__" not in r]
    assert best == pytest.approx(min(kt_times), rel=1e-12)
