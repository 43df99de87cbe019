"""bench/record_spaces.py's record mode, checked on the CPU: it runs once on the GPU and cannot be
debugged there, so its enumeration and serialization are exercised here with a named fake in
place of the compile pool and replay worker."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace

import pytest

from r3tui.domain import Dim3, Measurement, MeasurementStatus, TimeStats, TrialConfig
from r3tui.search import config_key
from r3tui.search.simulation import SimulatedEvaluator, make_search, parse_space_file, run_search

ROOT = Path(__file__).resolve().parents[2]
SPACES = ROOT / "tests" / "data" / "spaces"
sys.path.insert(0, str(ROOT / "bench"))

import record_spaces  # noqa: E402


def recorded_launch(example: str) -> SimpleNamespace:
    """The launch of the example as recorded on the H200 for the reduced table (same scale)."""
    launch = json.loads((SPACES / f"{example}.json").read_text())["space"]["launch"]
    return SimpleNamespace(block=Dim3.of(launch["block"]),
                           work=Dim3.of(launch["work"]) if launch["work"] else None,
                           block_tunable=launch["block_tunable"],
                           shared_mem_bytes=launch["shared_mem_bytes"])


class FakeEvaluator:
    """FAKE, not a GPU: a made-up time per config, every 17th config a compile error, so that
    the table holds both kinds of rows.  Stands in for ReplayEvaluator.evaluate."""

    def __init__(self) -> None:
        self.batches = 0

    def evaluate(self, configs: Sequence[TrialConfig]) -> list[Measurement]:
        self.batches += 1
        out = []
        for i, config in enumerate(configs):
            if i % 17 == 5:
                out.append(Measurement(MeasurementStatus.COMPILE_ERROR, error_text="fake"))
                continue
            t = 1e-4 * (1 + len(config.options) / 10 + (config.block or Dim3(1)).volume / 4096)
            out.append(Measurement(MeasurementStatus.OK, time=TimeStats(t, t, 0.0, 12)))
        return out


@pytest.mark.parametrize("example", sorted(record_spaces.HARD))
def test_hard_space_is_recorded_completely_and_reloads(example: str, tmp_path: Path) -> None:
    kind = record_spaces.space_kind("hard", example)
    space = record_spaces.build_space(kind, recorded_launch(example))
    # thousands of configurations, but few enough to measure in one short GPU call
    assert 1000 <= space.size() <= record_spaces.MAX_CONFIGS
    assert len(space.dims) >= 4
    fake = FakeEvaluator()
    rows = record_spaces.measure(space, fake.evaluate, record_spaces.MAX_CONFIGS)
    assert fake.batches == 1 and len(rows) == space.size()
    data = record_spaces.table(example, "FAKE GPU", "python bench/record_spaces.py --space hard",
                               space, rows, 0.25, "hard")
    path = record_spaces.write(tmp_path, "hard", example, data)
    assert path == tmp_path / "hard" / f"{example}.json"
    assert not list(tmp_path.rglob("*.tmp"))

    parsed = parse_space_file(json.loads(path.read_text()))
    # the space rebuilt from the file is the same space, and the table covers all of it
    keys = [config_key(c) for c in parsed.space.enumerate()]
    assert keys == [config_key(c) for c, _ in rows]
    assert set(keys) == set(parsed.table)
    failed = [k for k, r in parsed.table.items() if r.status is MeasurementStatus.COMPILE_ERROR]
    assert len(failed) == sum(1 for _, m in rows if not m.ok) > 0
    # and a search runs on it in simulation mode
    search = make_search("random", parsed.space, 0)
    trace = run_search(search, SimulatedEvaluator(parsed.table).evaluate, 12)
    assert len(trace) == 12 and trace[-1] < float("inf")


def test_reduced_space_is_the_recorded_one() -> None:
    """The reduced kind still builds exactly the spaces of the tables in tests/data/spaces."""
    for path in sorted(SPACES.glob("*.json")):
        recorded = json.loads(path.read_text())
        space = record_spaces.build_space(record_spaces.REDUCED, recorded_launch(path.stem))
        assert space.describe() == {**recorded["space"], "shared": None}, path.stem


def test_too_large_a_space_is_refused_before_measuring() -> None:
    space = record_spaces.build_space(record_spaces.HARD["nbody"], recorded_launch("nbody"))
    fake = FakeEvaluator()
    with pytest.raises(Exception, match="more than 100 to list"):
        record_spaces.measure(space, fake.evaluate, 100)
    assert fake.batches == 0
    with pytest.raises(SystemExit, match="no hard space for 'softmax'"):
        record_spaces.space_kind("hard", "softmax")
