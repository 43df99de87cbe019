"""The inner loop's bookkeeping on CPU: real skopt, a real SQLite file, and a named fake in
place of the GPU (the real evaluator runs in tests/gpu/test_gpu_tune.py on the device)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

from db import repository as repo
from db.session import Database, open_database
from r3tui.compile.options import accepted_options
from r3tui.domain import (
    Campaign,
    Dim3,
    KernelLaunch,
    Measurement,
    MeasurementStatus,
    Recording,
    TimeStats,
    TrialConfig,
    Variant,
    VariantOrigin,
)
from r3tui.engine import InnerSettings, make_strategy, run_inner
from r3tui.search import Budget, LaunchSpec, SearchSpace, config_key, option_dims


def synthetic_time(config: TrialConfig) -> float:
    """A made-up landscape: 256-thread blocks are best, fast math helps a little."""
    block = config.block.x if config.block else 128
    t = 100e-6 * (1 + abs(block - 256) / 256)
    if "--use_fast_math" in config.options:
        t *= 0.9
    return t


class FakeReplayEvaluator:
    """Stands in for ReplayEvaluator (compile pool + GPU worker) where no GPU exists."""

    def __init__(self) -> None:
        self.evaluated: list[str] = []
        self.rng = random.Random(0)

    def evaluate(self, configs: Sequence[TrialConfig]) -> list[Measurement]:
        out = []
        for c in configs:
            self.evaluated.append(config_key(c))
            if "--maxrregcount=32" in c.options:  # pretend these fail to verify
                out.append(Measurement(MeasurementStatus.WRONG_RESULT, error_text="mismatch"))
                continue
            t = synthetic_time(c)
            out.append(Measurement(MeasurementStatus.OK, time=TimeStats(t, t, 0.0, 10)))
        return out

    def retime(self, configs: Sequence[TrialConfig], rounds: int) -> list[list[float]]:
        return [
            [synthetic_time(c) * (1 + 0.01 * self.rng.random()) for c in configs]
            for _ in range(rounds)
        ]


def make_space() -> SearchSpace:
    specs = [s for s in accepted_options("nvrtc") if s.name in ("use_fast_math", "maxrregcount")]
    launch = LaunchSpec(block=Dim3(128), work=Dim3(1 << 20), block_tunable=True)
    return SearchSpace.from_parts(option_dims(specs), launch)


def setup_campaign(db: Path) -> tuple[Database, int, int]:
    database = open_database(db)
    with database.session_scope() as s:
        launch = KernelLaunch("k", Dim3(8192), Dim3(128))
        rid = repo.add_recording(s, Recording("b", "cd" * 32, "k", launch), {})
        cid = repo.create_campaign(s, Campaign("inner", rid, seed=0))
        vid = repo.add_variant(s, Variant(cid, "__global__ void k(){}", VariantOrigin.SEED))
    return database, cid, vid


def test_run_inner_stores_every_trial_and_marks_the_winner(tmp_path: Path) -> None:
    database, cid, vid = setup_campaign(tmp_path / "e.sqlite")
    settings = InnerSettings(batch=4, rounds=5, seed=3)
    search = make_strategy(make_space(), settings)
    fake = FakeReplayEvaluator()
    result = run_inner(database, cid, vid, search, fake, Budget(max_trials=16), settings)
    assert result.trials == 16
    assert result.winner is not None
    # the landscape's optimum is a 256-thread block with fast math
    assert result.winner.config.block == Dim3(256)
    assert "--use_fast_math" in result.winner.config.options
    assert result.winner.speedup > 1.5
    with database.session_scope() as s:
        stored = repo.finished_trials(s, cid, variant_id=vid)
        variant = repo.get_variant(s, vid)
        events = repo.events(s, cid)
    assert len(stored) == 16 and [config_key(t.config) for t in stored] == fake.evaluated
    failed = [t for t in stored if t.measurement.status is MeasurementStatus.WRONG_RESULT]
    assert failed, "the failing register cap never came up"
    assert all("--maxrregcount=32" in t.config.options for t in failed)
    assert variant is not None
    with database.session_scope() as s:
        (node,) = repo.campaign_tree(s, cid)
    winner_row = next(t for t in stored if t.id == node.best_trial_id)
    assert config_key(winner_row.config) == config_key(result.winner.config)
    assert events[-1].kind == "inner_done" and "winner" in events[-1].message


def test_resume_from_the_database_asks_no_stored_point_again(tmp_path: Path) -> None:
    database, cid, vid = setup_campaign(tmp_path / "r.sqlite")
    settings = InnerSettings(batch=4, rounds=3, seed=5)
    first = FakeReplayEvaluator()
    run_inner(
        database,
        cid,
        vid,
        make_strategy(make_space(), settings),
        first,
        Budget(max_trials=8),
        settings,
    )
    # a new process: rebuild the search from the stored trials only
    with database.session_scope() as s:
        history = [(t.config, t.measurement) for t in repo.finished_trials(s, cid)]
    search = make_strategy(make_space(), settings)
    search.resume(history)
    second = FakeReplayEvaluator()
    result = run_inner(database, cid, vid, search, second, Budget(max_trials=20), settings)
    assert result.trials == 20
    assert len(second.evaluated) == 12
    assert not set(second.evaluated) & set(first.evaluated)
