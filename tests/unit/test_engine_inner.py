"""The inner loop's bookkeeping on CPU: real skopt, a real SQLite file, and a named fake in
place of the GPU (the real evaluator runs in tests/gpu/test_gpu_tune.py on the device)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import pytest

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
from r3tui.errors import ConfigError
from r3tui.search import (
    BayesSearch,
    BayesSettings,
    Budget,
    LaunchSpec,
    SearchSpace,
    config_key,
    option_dims,
)


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
    # where the loop's time went, phase by phase, for a campaign that is slower than its GPU
    seconds = (events[-1].data or {})["seconds"]
    assert {"ask", "submit", "wait", "store", "tell", "retime"} <= set(seconds)
    assert all(s >= 0 for s in seconds.values()) and seconds["ask"] > 0


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


# -- dynamic shared memory: the engine passes each config's size to the launch ----------------
TILE_SOURCE = """// r3: tune TILE 256 1024 4096
// r3: shared TILE * 4
#define TILE 256
extern "C" __global__ void k(const int* x, int* out, int n)
{
    extern __shared__ int tile[];
    tile[threadIdx.x] = x[threadIdx.x];
}
"""


class FakeCompilePool:
    """Stands in for CompilePool (these tests look at requests, not binaries): every request
    'compiles' to the same fake binary, and the requests are kept."""

    workers = 1

    def __init__(self) -> None:
        self.requests: list[object] = []

    def running(self) -> dict[int, object]:
        return {}

    def queued(self) -> int:
        return 0

    def close(self, cancel_pending: bool = False) -> None:
        return None

    def submit(self, toolchain: str, request: object) -> object:
        from concurrent.futures import Future

        from r3tui.compile.base import CompiledKernel
        from r3tui.domain import ResourceUsage

        self.requests.append(request)
        future: Future[CompiledKernel] = Future()
        future.set_result(CompiledKernel(
            ok=True, toolchain=toolchain, toolchain_version="fake", binary=b"fake cubin",
            binary_kind="cubin", lowered_name="k", resources=ResourceUsage(), log="",
            seconds=0.0, cache_key=f"fake-{len(self.requests)}", binary_sha256=None))
        return future


class FakeReplayer:
    """Stands in for a GPU's replayer (no GPU here): keeps every candidate it is asked to
    launch, in the order the local runner's GPU thread takes them."""

    def __init__(self) -> None:
        self.candidates: list[object] = []

    def start(self) -> object:
        from r3tui.replay.worker import WorkerInfo

        return WorkerInfo(pid=0, gpu="fake", arch="sm_90", driver_version=0, startup_s=0.0,
                          l2_flush=True)

    def evaluate(self, job: object) -> Measurement:
        self.candidates.append(cast(Any, job).candidate)
        return Measurement(MeasurementStatus.OK, time=TimeStats(1e-5, 1e-5, 0.0, 5), verified=True)

    def interleaved(self, jobs: list[object], rounds: int) -> list[list[float]]:
        return [[1e-5] * rounds for _ in jobs]

    def close(self) -> None:
        return None


def fake_runner(pool: FakeCompilePool, replayer: FakeReplayer) -> object:
    """The real local runner over the two fakes."""
    from r3tui.runners import LocalRunner

    return LocalRunner([cast(Any, replayer)], cast(Any, pool))


def test_each_config_launches_with_its_dynamic_shared_memory(tmp_path: Path) -> None:
    from types import SimpleNamespace
    from typing import Any, cast

    from r3tui.engine import KernelSource, ReplayEvaluator, build_space
    from r3tui.record.manifest import LaunchInfo
    from r3tui.search import DeviceLimits

    launch = LaunchInfo(grid=Dim3(256), block=Dim3(128), shared_mem_bytes=1024)
    source = KernelSource(TILE_SOURCE, "k")
    space = build_space(launch, source, InnerSettings(launch_bounds=False), DeviceLimits())
    assert "tune.TILE" in space.names
    configs = [space.baseline_config(),
               TrialConfig(tunables={"TILE": 1024}, shared_mem_bytes=4096),
               TrialConfig(tunables={"TILE": 4096}, shared_mem_bytes=16384)]
    assert all(space.check(c) == [] for c in configs)
    pool, worker = FakeCompilePool(), FakeReplayer()
    with cast(Any, fake_runner(pool, worker)) as runner:
        results = ReplayEvaluator(source, runner).evaluate(configs)
    assert all(m.ok for m in results)
    # the tunable reaches the compile as -D, the size reaches the launch
    assert [dict(cast(Any, r).defines).get("TILE") for r in pool.requests] == [
        None, "1024", "4096"]
    recording = SimpleNamespace(launch=launch, arg_bytes=lambda: b"")  # what resolve() reads
    launched = sorted(cast(Any, c).resolve(recording)[2] for c in worker.candidates)
    assert launched == [1024, 4096, 16384]

    # stored and read back from the database with the size, as a resume tells them
    database, cid, vid = setup_campaign(tmp_path / "shm.sqlite")
    settings = InnerSettings(batch=3, rounds=2, seed=1, launch_bounds=False)

    class Timed(FakeReplayEvaluator):
        def evaluate(self, configs: Sequence[TrialConfig]) -> list[Measurement]:
            return [Measurement(MeasurementStatus.OK, time=TimeStats(t, t, 0.0, 5))
                    for t in (1e-5 * (1 + (c.shared_mem_bytes or 0) / 4096) for c in configs)]

    search = make_strategy(space, settings)
    run_inner(database, cid, vid, search, Timed(), Budget(max_trials=6), settings)
    with database.session_scope() as s:
        stored = repo.finished_trials(s, cid, variant_id=vid)
    assert {config_key(t.config) for t in stored} == {config_key(r.config) for r in search.history}
    assert any(t.config.shared_mem_bytes for t in stored)
    assert all(space.check(t.config) == [] for t in stored)


def test_search_limits_come_from_the_worker_with_the_shared_memory_opt_in() -> None:
    from r3tui.engine.inner import device_limits, provenance
    from r3tui.replay.worker import WorkerInfo
    from r3tui.search import DeviceLimits

    # what cuda.driver.device_info reports on an H200 (sm_90: 227 KiB opt-in)
    reported = {"max_threads_per_block": 1024, "max_block_dims": [1024, 1024, 64],
                "max_shared_per_block": 232448, "max_threads_per_sm": 2048, "warp_size": 32,
                "sm_count": 132}
    info = WorkerInfo(1, "NVIDIA H200", "sm_90", 13000, 0.1, True, reported)
    limits = device_limits(info)
    assert limits.max_shared_per_block == 232448
    assert limits.sm_count == 132 and limits.resident_threads == 132 * 2048
    assert limits.to_json() == reported
    # a worker of before session 38 reported no multiprocessors: not known, and not written
    older = {k: v for k, v in reported.items() if k != "sm_count"}
    assert DeviceLimits.from_json(older).resident_threads == 0
    assert DeviceLimits.from_json(older).to_json() == older
    assert provenance(info, "nvrtc")["limits"] == reported
    # no GPU has reported (generate-only), or an old worker without limits: the 48 KiB default
    assert device_limits(None) == DeviceLimits()
    assert device_limits(WorkerInfo(1, "gpu", "sm_90", 13000, 0.1, True)).max_shared_per_block \
        == 48 * 1024


def test_make_strategy_applies_the_bo_spec_over_the_estimator() -> None:
    search = make_strategy(make_space(), InnerSettings(estimator="ET", bayes="transform=power"))
    assert isinstance(search, BayesSearch)
    assert (search.settings.estimator, search.settings.transform) == ("ET", "power")
    assert make_strategy(make_space(), InnerSettings()).settings == BayesSettings()
    with pytest.raises(ConfigError, match="xi is float"):
        make_strategy(make_space(), InnerSettings(bayes="xi=big"))


def test_elements_per_thread_reach_the_launch_and_stay_1_where_apply_cannot_rescale() -> None:
    import random
    from typing import Any, cast

    from r3tui.engine import KernelSource, ReplayEvaluator, build_space
    from r3tui.record.manifest import LaunchInfo
    from r3tui.remix.rules import grid_stride
    from r3tui.search import DeviceLimits

    kernel = (Path(__file__).resolve().parents[2] / "examples" / "nbody" / "kernel.cu")
    varied = grid_stride(kernel.read_text(), "nbody", random.Random(0)).source
    assert varied is not None
    launch = LaunchInfo(grid=Dim3(64), block=Dim3(256), work=Dim3(16384), block_tunable=True)
    free = build_space(launch, KernelSource(varied, "nbody"), InnerSettings(), DeviceLimits())
    name = "tune.R3_WPT_15"
    assert name in free.names
    pool, worker = FakeCompilePool(), FakeReplayer()
    with cast(Any, fake_runner(pool, worker)) as runner:
        ReplayEvaluator(KernelSource(varied, "nbody"), runner).evaluate(
            [TrialConfig(tunables={"R3_WPT_15": 4}), TrialConfig()])
    assert sorted(cast(Any, c).divisors for c in worker.candidates) == [(1, 1, 1), (4, 1, 1)]
    # an application's kernel whose launches r3 apply can rescale keeps the tunable
    rescalable = build_space(launch, KernelSource(varied, "nbody", confined=True),
                             InnerSettings(), DeviceLimits())
    assert name in rescalable.names
    app = build_space(launch, KernelSource(varied, "nbody", confined=True),
                      InnerSettings(grid_fixed=True), DeviceLimits())
    assert name not in app.names
    # a bundle of an application recording whose unit needed no device unit: not confined,
    # but its grid is the host code's all the same
    unconfined = build_space(launch, KernelSource(varied, "nbody"),
                             InnerSettings(grid_fixed=True), DeviceLimits())
    assert name not in unconfined.names
    assert any("R3_WPT_15 fixed at 1: the application's host code computes the grid" in n
               for n in app.launch_notes())


class HangingReplayer(FakeReplayer):
    """Stands in for a GPU's replayer whose every candidate hangs: the real worker's watchdog
    answers TIMEOUT after its whole deadline (tests/gpu/test_gpu_containment.py runs that
    path); here the deadline is a short sleep."""

    def evaluate(self, job: object) -> Measurement:
        import time

        self.candidates.append(cast(Any, job).candidate)
        time.sleep(0.05)
        return Measurement(MeasurementStatus.TIMEOUT,
                           error_text="no result within 0.05 s: the worker was killed")


def _eight_trials(db: Path, worker: FakeReplayer, give_up_after: int | None
                  ) -> tuple[Database, int, int, Any]:
    """A variant's inner loop of 8 trials in batches of 4 through the real local runner and
    ReplayEvaluator, the fake compile pool and ``worker`` standing in for the GPU."""
    from r3tui.engine import KernelSource, ReplayEvaluator

    database, cid, vid = setup_campaign(db)
    settings = InnerSettings(batch=4, rounds=2, seed=1, launch_bounds=False)
    search = make_strategy(make_space(), settings)
    with cast(Any, fake_runner(FakeCompilePool(), worker)) as runner:
        evaluator = ReplayEvaluator(KernelSource("__global__ void k(){}", "k"), runner)
        result = run_inner(database, cid, vid, search, evaluator, Budget(max_trials=8),
                           settings, give_up_after=give_up_after)
    return database, cid, vid, result


@pytest.mark.parametrize("seed", [False, True])
def test_a_variant_that_hangs_before_it_works_costs_one_timeout(tmp_path: Path,
                                                                 seed: bool) -> None:
    """An LLM variant that hung replayed 4 configurations on the H100 (session 35), 60 s each,
    before the inner loop gave it up: a hang of a variant not yet shown to work now ends its
    batch, and the configurations not replayed are not stored as trials."""
    worker = HangingReplayer()
    # a seed (give_up_after None) is searched whatever fails; a child is given up
    database, cid, vid, result = _eight_trials(tmp_path / "hang.sqlite", worker,
                                               None if seed else 4)
    with database.session_scope() as s:
        stored = repo.finished_trials(s, cid, variant_id=vid)
        (done,) = [e for e in repo.events(s, cid) if e.kind == "inner_done"]
    assert result.winner is None
    if seed:
        assert len(worker.candidates) == 8 and len(stored) == 8
        assert done.data["not_replayed"] == 0
    else:
        assert len(worker.candidates) == 1  # the other three never reached the GPU
        assert [t.measurement.status for t in stored] == [MeasurementStatus.TIMEOUT]
        assert done.data["not_replayed"] == 3
        assert result.failures == {"timeout": 1}


class SecondHangs(FakeReplayer):
    """Stands in for a GPU's replayer (a fake, as FakeReplayer): the second candidate it is
    given hangs (TIMEOUT after a short sleep), every other one runs."""

    def evaluate(self, job: object) -> Measurement:
        import time

        self.candidates.append(cast(Any, job).candidate)
        if len(self.candidates) == 2:
            time.sleep(0.05)
            return Measurement(MeasurementStatus.TIMEOUT, error_text="no result within 0.05 s")
        return Measurement(MeasurementStatus.OK, time=TimeStats(1e-5, 1e-5, 0.0, 5),
                           verified=True)


def test_configurations_a_hang_left_unreplayed_hold_no_trial_of_the_budget(
        tmp_path: Path) -> None:
    """The first configuration of an unproven variant works, the second hangs: the other two
    of that batch are not replayed, the variant is not given up (one worked), and the two it
    never measured are forgotten by the search, so the budget's 8 trials are all run."""
    database, cid, vid, _ = _eight_trials(tmp_path / "half.sqlite", SecondHangs(), 4)
    with database.session_scope() as s:
        stored = repo.finished_trials(s, cid, variant_id=vid)
        (done,) = [e for e in repo.events(s, cid) if e.kind == "inner_done"]
    assert done.data["not_replayed"] == 2
    assert len(stored) == 8
    statuses = [t.measurement.status for t in stored]
    assert statuses.count(MeasurementStatus.TIMEOUT) == 1
    assert statuses.count(MeasurementStatus.OK) == 7


# -- a climb from the best: one-step moves of each tunable while they gain -------------------
FACTOR_SOURCE = """// r3: tune R3_F 1 2 4 8 16
#define R3_F 1
extern "C" __global__ void k(float* x) { x[(blockIdx.x * blockDim.x + threadIdx.x) * R3_F] = 0.0f; }
"""


class FactorTimed(FakeReplayEvaluator):
    """A landscape over R3_F alone: 8 is fastest, each step away costs 10 µs."""

    @staticmethod
    def time_of(config: TrialConfig) -> float:
        factor = int(config.tunables.get("R3_F", 1))
        return 100e-6 + 10e-6 * abs(factor.bit_length() - 4)

    def evaluate(self, configs: Sequence[TrialConfig]) -> list[Measurement]:
        self.evaluated += [config_key(c) for c in configs]
        return [Measurement(MeasurementStatus.OK, time=TimeStats(t, t, 0.0, 10))
                for t in map(self.time_of, configs)]

    def retime(self, configs: Sequence[TrialConfig], rounds: int) -> list[list[float]]:
        return [[self.time_of(c) for c in configs] for _ in range(rounds)]


def _climbed(db: Path, to_beat: float | None, rounds: int, seconds: float | None = None,
             start: int = 1, added: frozenset[str] = frozenset(), slack: float = 1.0
             ) -> tuple[list[int], dict[str, Any]]:
    """One trial at R3_F ``start``, then the climb (``added``: the tunables the variant's
    change declared): the factors tried, in order, and the event.  ``seconds``: a time budget
    on a clock that reads 0 until the first trial is asked and 10 s after."""
    import itertools

    from r3tui.engine import KernelSource, build_space
    from r3tui.engine.lineage import Climb
    from r3tui.record.manifest import LaunchInfo
    from r3tui.search import DeviceLimits
    from r3tui.search.strategy import RandomSearch

    database, cid, vid = setup_campaign(db)
    launch = LaunchInfo(grid=Dim3(64), block=Dim3(128), work=Dim3(8192), block_tunable=False)
    settings = InnerSettings(batch=4, rounds=2, seed=1)
    space = build_space(launch, KernelSource(FACTOR_SOURCE, "k"), settings, DeviceLimits())
    search = RandomSearch(space, 0)
    first = replace(space.baseline_config(), tunables={"R3_F": start})
    assert search.warm_start([first]) == 1
    evaluator = FactorTimed()
    result = run_inner(database, cid, vid, search, evaluator,
                       Budget(max_trials=1, max_seconds=seconds,
                              clock=itertools.chain([0.0, 0.0], itertools.repeat(10.0)).__next__),
                       settings,
                       climb=Climb(space, to_beat, rounds, added, slack))
    with database.session_scope() as s:
        stored = repo.finished_trials(s, cid, variant_id=vid)
        event = repo.events(s, cid)[-1]
    assert result.trials == len(stored)
    return [int(t.config.tunables.get("R3_F", 1)) for t in stored], event.data or {}


def test_a_climb_moves_a_tunable_while_it_gains_and_grows_the_budget(tmp_path: Path) -> None:
    """From R3_F 1, each round tries the best's neighbours not yet tried: 2, 4, 8, then 16,
    which loses, so the climb ends at 8 (the landscape's best) without trying anything twice."""
    factors, data = _climbed(tmp_path / "a.sqlite", None, rounds=10)
    assert factors == [1, 2, 4, 8, 16]
    assert data["climbed"] == 4 and data["winner"]["tunables"] == {"R3_F": 8}


def test_a_climb_stops_at_its_rounds_and_needs_a_best_to_beat(tmp_path: Path) -> None:
    factors, data = _climbed(tmp_path / "r.sqlite", None, rounds=2)
    assert factors == [1, 2, 4] and data["climbed"] == 2
    # the campaign's best is faster than anything this variant found: no climb
    factors, data = _climbed(tmp_path / "b.sqlite", 50e-6, rounds=10)
    assert factors == [1] and data["climbed"] == 0
    # the variant's time budget is spent: no climb either
    factors, data = _climbed(tmp_path / "t.sqlite", None, rounds=10, seconds=5.0)
    assert factors == [1] and data["climbed"] == 0


def test_a_change_at_work_a_little_behind_the_best_climbs_from_there(tmp_path: Path) -> None:
    """A variant whose change declared R3_F, measured only at R3_F 2 (120 µs), 7 % behind the
    campaign's best (112 µs): with CLIMB_SLACK (a new tile's) it climbs from there, past the
    best, to 8; the same trial where R3_F is not the change's (inherited), or without the
    slack, or 14 % behind, does not."""
    from r3tui.engine.lineage import CLIMB_SLACK

    assert 1.07 < CLIMB_SLACK < 1.14
    mine, slack = frozenset({"R3_F"}), CLIMB_SLACK
    factors, data = _climbed(tmp_path / "w.sqlite", 112e-6, 10, start=2, added=mine, slack=slack)
    assert factors == [2, 4, 1, 8, 16] and data["winner"]["tunables"] == {"R3_F": 8}
    for db, to_beat, added, allowed in (("i", 112e-6, frozenset(), slack),
                                        ("s", 112e-6, mine, 1.0),
                                        ("f", 105e-6, mine, slack)):
        factors, data = _climbed(tmp_path / f"{db}.sqlite", to_beat, 10, start=2, added=added,
                                 slack=allowed)
        assert factors == [2] and data["climbed"] == 0, db


class BlockTimed(FactorTimed):
    """FactorTimed's landscape plus the block: 256 threads best, 5 µs for each halving away."""

    @staticmethod
    def time_of(config: TrialConfig) -> float:
        threads = config.block.x if config.block else 128
        return FactorTimed.time_of(config) + 5e-6 * abs(threads.bit_length() - 9)


def test_a_climb_whose_factor_moves_are_all_tried_moves_the_block(tmp_path: Path) -> None:
    """R3_F at 8 (its best) with 4 and 16 tried already, at the recorded 128 threads: the
    climb doubles and halves the block instead (256 gains), then from 256 moves the factor
    again (no gain); before it ends, the block moves from 256 not tried yet (512: no gain)."""
    from r3tui.engine import KernelSource, build_space
    from r3tui.engine.lineage import Climb
    from r3tui.record.manifest import LaunchInfo
    from r3tui.search import DeviceLimits
    from r3tui.search.strategy import RandomSearch

    database, cid, vid = setup_campaign(tmp_path / "b.sqlite")
    launch = LaunchInfo(grid=Dim3(64), block=Dim3(128), work=Dim3(8192), block_tunable=True)
    settings = InnerSettings(batch=4, rounds=2, seed=1)
    space = build_space(launch, KernelSource(FACTOR_SOURCE, "k"), settings, DeviceLimits())
    search = RandomSearch(space, 0)
    recorded = space.baseline_config()
    assert search.warm_start([replace(recorded, tunables={"R3_F": f}) for f in (8, 4, 16)]) == 3
    run_inner(database, cid, vid, search, BlockTimed(), Budget(max_trials=3), settings,
              climb=Climb(space, None, 10))
    with database.session_scope() as s:
        tried = [(t.config.block.x if t.config.block else 128, t.config.tunables.get("R3_F"))
                 for t in repo.finished_trials(s, cid, variant_id=vid)]
        event = repo.events(s, cid)[-1]
    assert tried == [(128, 8), (128, 4), (128, 16), (256, 8), (64, 8), (256, 16), (256, 4),
                     (512, 8)]
    assert (event.data or {})["winner"]["block"] == [256, 1, 1]


def test_a_climb_whose_last_round_gained_nothing_moves_the_block_once(tmp_path: Path) -> None:
    """R3_F at 8 at the recorded 128 threads, its factor moves untried: the first round moves
    the factor (4 and 16: no gain); before the climb ends the block moves once (256 gains), a
    gain that starts another round of factor moves from 256 (no gain), and the climb ends
    without moving the block again."""
    from r3tui.engine import KernelSource, build_space
    from r3tui.engine.lineage import Climb
    from r3tui.record.manifest import LaunchInfo
    from r3tui.search import DeviceLimits
    from r3tui.search.strategy import RandomSearch

    database, cid, vid = setup_campaign(tmp_path / "o.sqlite")
    launch = LaunchInfo(grid=Dim3(64), block=Dim3(128), work=Dim3(8192), block_tunable=True)
    settings = InnerSettings(batch=4, rounds=2, seed=1)
    space = build_space(launch, KernelSource(FACTOR_SOURCE, "k"), settings, DeviceLimits())
    search = RandomSearch(space, 0)
    assert search.warm_start([replace(space.baseline_config(), tunables={"R3_F": 8})]) == 1
    climb = Climb(space, None, 10)
    run_inner(database, cid, vid, search, BlockTimed(), Budget(max_trials=1), settings,
              climb=climb)
    with database.session_scope() as s:
        tried = [(t.config.block.x if t.config.block else 128, t.config.tunables.get("R3_F"))
                 for t in repo.finished_trials(s, cid, variant_id=vid)]
    assert tried == [(128, 8), (128, 16), (128, 4), (256, 8), (64, 8), (256, 16), (256, 4)]
    assert climb.blocks_moved and climb.made == 2
