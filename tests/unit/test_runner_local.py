"""The local runner on CPU: the real compile pool (NVRTC), and simulated replayers (a named
fake answering from the H200's recorded measurements of stencil7's space) standing in for two
GPUs.  The real replayers run under the same runner in tests/gpu."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from db.figures import workers_text
from r3tui.compile.pool import CompilePool
from r3tui.engine.inner import KernelSource, ReplayEvaluator
from r3tui.errors import GpuUnavailable
from r3tui.replay.candidate import Candidate
from r3tui.runners import LocalRunner, ReplayJob
from r3tui.runners.simulated import SimulatedReplayer
from r3tui.search import config_key
from r3tui.search.simulation import SpaceFile, parse_space_file

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def space_file() -> SpaceFile:
    path = REPO / "tests" / "data" / "spaces" / "stencil7.json"
    return parse_space_file(json.loads(path.read_text()))


def test_two_gpus_share_the_replays_and_answers_reach_their_configurations(
        space_file: SpaceFile) -> None:
    gpus = [SimulatedReplayer(space_file.table, replay_s=0.05) for _ in range(2)]
    source = KernelSource((REPO / "examples" / "stencil7" / "kernel.cu").read_text(), "stencil7")
    configs = list(space_file.space.enumerate())[::147]
    with LocalRunner(gpus, CompilePool(workers=2)) as runner:
        evaluator = ReplayEvaluator(source, runner)
        measured = evaluator.evaluate(configs)
        loads = runner.load()
        stats = runner.stats()
    for config, m in zip(configs, measured, strict=True):
        recorded = space_file.table[config_key(config)]
        assert m.status is recorded.status, config
        if m.ok:
            assert m.time is not None and m.time.median_s == recorded.median_s
            assert m.compile_time_s is not None and m.resources.registers
    # both GPUs replayed, each configuration once
    assert all(g.replayed for g in gpus)
    replayed = gpus[0].replayed + gpus[1].replayed
    assert sorted(replayed) == sorted(config_key(c) for c, m in zip(configs, measured,
                                                                    strict=True)
                                      if m.status.value != "compile_error")
    assert [w.name for w in loads.workers if w.kind == "gpu"] == ["gpu0", "gpu1"]
    assert [w.done for w in loads.workers if w.kind == "gpu"] == [len(g.replayed) for g in gpus]
    assert sum(w.kind == "cpu" for w in loads.workers) == 2
    assert loads.queued == {"gpu": 0, "cpu": 0}
    assert stats.compiles == 10 and stats.replays == len(replayed)
    assert workers_text(loads.to_json("local", "now")) == "local: gpu 0/2 busy · cpu 0/2 busy"


def test_closing_cancels_the_replays_still_waiting(space_file: SpaceFile) -> None:
    key = next(iter(space_file.table))
    gpu = SimulatedReplayer(space_file.table, replay_s=0.2)
    runner = LocalRunner([gpu], CompilePool(workers=1))
    job = ReplayJob(Candidate(b"cubin", "k"), key)
    futures = [runner.replay(job) for _ in range(10)]
    time.sleep(0.05)  # the first one is running
    load = runner.load()
    assert [w.running for w in load.workers if w.kind == "gpu"] == [1]
    assert load.queued["gpu"] == 9
    assert workers_text(load.to_json("local", "now")) == (
        "local: gpu 1/1 busy, 9 queued · cpu 0/1 busy")
    began = time.monotonic()
    runner.close()
    assert time.monotonic() - began < 1.5  # not the 2 s the ten would take
    assert futures[0].result().ok
    assert sum(f.cancelled() for f in futures) >= 8
    with pytest.raises(RuntimeError):
        runner.replay(job)


def test_gpus_of_different_architectures_are_refused(space_file: SpaceFile) -> None:
    gpus = [SimulatedReplayer(space_file.table, arch="sm_90"),
            SimulatedReplayer(space_file.table, arch="sm_80")]
    pool = CompilePool(workers=1)
    with pytest.raises(GpuUnavailable, match="differ in architecture"):
        LocalRunner(gpus, pool)
    pool.close()


def test_the_campaigns_imports_run_while_every_gpu_starts(space_file: SpaceFile) -> None:
    # every replayer that can be begun is begun (its child spawned) before while_starting
    # runs, and waited for after it: the import of the search's model overlaps the GPUs'
    # start instead of the first ask
    calls: list[str] = []

    class Begun(SimulatedReplayer):
        def __init__(self, name: str) -> None:
            super().__init__(space_file.table)
            self.name = name

        def begin(self) -> None:
            calls.append(f"begin {self.name}")

        def start(self):  # type: ignore[no-untyped-def]
            calls.append(f"start {self.name}")
            return super().start()

    pool = CompilePool(workers=1)
    with LocalRunner([Begun("a"), Begun("b")], pool, lambda: calls.append("imports")):
        pass
    assert calls == ["begin a", "begin b", "imports", "start a", "start b"]


class Watched:
    """The real ReplayEvaluator, with the order of its batches' submissions and waits kept."""

    def __init__(self, inner: ReplayEvaluator) -> None:
        self.inner = inner
        self.events: list[str] = []

    def start(self, configs: list[object], *, hang_ends_batch: bool = False) -> object:
        self.events.append("start")
        results = self.inner.start(configs, hang_ends_batch=hang_ends_batch)  # type: ignore[arg-type]

        def wait() -> object:
            self.events.append("wait")
            return results()

        return wait

    def evaluate(self, configs: list[object]) -> object:
        return self.inner.evaluate(configs)  # type: ignore[arg-type]

    def retime(self, configs: list[object], rounds: int) -> object:
        return self.inner.retime(configs, rounds)  # type: ignore[arg-type]


@pytest.mark.parametrize("in_flight", [1, 2])
def test_the_next_batch_is_submitted_while_one_is_in_flight(
        tmp_path: Path, space_file: SpaceFile, in_flight: int) -> None:
    from db import repository as repo
    from db.session import open_database
    from r3tui.engine import InnerSettings, make_strategy, run_inner
    from r3tui.search import Budget
    from tests.db import factories as f

    database = open_database(tmp_path / "r3.sqlite", create=True, upgrade=True)
    with database.session_scope() as s:
        _, cid, vid = f.seed_campaign(s)
    settings = InnerSettings(batch=4, rounds=2, seed=1, launch_bounds=False, in_flight=in_flight)
    search = make_strategy(space_file.space, settings)
    source = KernelSource((REPO / "examples" / "stencil7" / "kernel.cu").read_text(), "stencil7")
    with LocalRunner([SimulatedReplayer(space_file.table, replay_s=0.01)],
                     CompilePool(workers=2)) as runner:
        watched = Watched(ReplayEvaluator(source, runner))
        result = run_inner(database, cid, vid, search, watched,  # type: ignore[arg-type]
                           Budget(max_trials=16), settings)
    with database.session_scope() as s:
        trials = repo.finished_trials(s, cid, variant_id=vid)
    database.close()
    assert result.trials == len(trials) == 16
    assert len({config_key(t.config) for t in trials}) == 16  # nothing asked twice
    if in_flight == 1:
        assert watched.events == ["start", "wait"] * 4
    else:  # the second batch goes out before the first one's results are waited for
        assert watched.events[:3] == ["start", "start", "wait"]
        assert watched.events.count("start") == 4 and watched.events[-2:] == ["wait", "wait"]


def test_a_recorded_configuration_that_does_not_replay_ends_the_search_without_a_winner(
        tmp_path: Path, space_file: SpaceFile) -> None:
    """Re-timing compares the finalists with the recorded configuration: where that one does
    not measure (here the simulated GPU has no result for it: a crash), no speedup can be
    stated, and the campaign says so instead of failing on a missing job (as it did for
    jacobi on the H200, 2026-12-05)."""
    from db import repository as repo
    from db.session import open_database
    from r3tui.engine import InnerSettings, make_strategy, run_inner
    from r3tui.search import Budget
    from tests.db import factories as f

    baseline = config_key(space_file.space.baseline_config())
    assert baseline in space_file.table
    table = {k: v for k, v in space_file.table.items() if k != baseline}
    database = open_database(tmp_path / "r3.sqlite", create=True, upgrade=True)
    with database.session_scope() as s:
        _, cid, vid = f.seed_campaign(s)
    settings = InnerSettings(batch=4, rounds=2, seed=1, launch_bounds=False)
    source = KernelSource((REPO / "examples" / "stencil7" / "kernel.cu").read_text(), "stencil7")
    with LocalRunner([SimulatedReplayer(table)], CompilePool(workers=2)) as runner:
        result = run_inner(database, cid, vid, make_strategy(space_file.space, settings),
                           ReplayEvaluator(source, runner), Budget(max_trials=8), settings)
    with database.session_scope() as s:
        done = [e for e in repo.events(s, cid) if e.kind == "inner_done"]
    database.close()
    assert result.best is not None  # the search itself found configurations that run
    assert result.winner is None
    assert len(done) == 1
    assert done[0].message.startswith("8 trials; the recorded configuration did not measure "
                                      "to re-time: crashed: simulated replay: no recorded")


def test_a_finalist_that_fails_to_launch_in_re_timing_is_left_out_not_the_campaign(
        tmp_path: Path, space_file: SpaceFile) -> None:
    """A finalist whose launch fails when re-timed (it measured before: sgemm on the H100,
    session 44, a tiled variant's dynamic shared memory limit) is found by re-timing each
    alone and left out; the winner comes from the rest, and the search is not stopped.  The
    replayer is the simulated one (a named fake) with that failure added."""
    from db.session import open_database
    from r3tui.engine import InnerSettings, make_strategy, run_inner
    from r3tui.errors import RetimeFailed
    from r3tui.search import Budget
    from tests.db import factories as f

    failing: set[str] = set()

    class FailsOne(SimulatedReplayer):
        def interleaved(self, jobs: list[ReplayJob], rounds: int) -> list[list[float]]:
            if any(j.key in failing for j in jobs):
                raise RetimeFailed("re-timing failed in the replay worker: CudaError: "
                                   "cuLaunchKernel failed: CUDA_ERROR_INVALID_VALUE")
            return super().interleaved(jobs, rounds)

    database = open_database(tmp_path / "r3.sqlite", create=True, upgrade=True)
    with database.session_scope() as s:
        _, cid, vid = f.seed_campaign(s)
    settings = InnerSettings(batch=4, rounds=2, seed=1, launch_bounds=False)
    source = KernelSource((REPO / "examples" / "stencil7" / "kernel.cu").read_text(), "stencil7")
    search = make_strategy(space_file.space, settings)

    class FailsBest(FailsOne):
        def interleaved(self, jobs: list[ReplayJob], rounds: int) -> list[list[float]]:
            if not failing:  # the search's best so far: the finalist re-timing ranks first
                best = search.best()
                assert best is not None
                failing.add(config_key(best[0]))
            return super().interleaved(jobs, rounds)

    with LocalRunner([FailsBest(space_file.table)], CompilePool(workers=2)) as runner:
        result = run_inner(database, cid, vid, search, ReplayEvaluator(source, runner),
                           Budget(max_trials=12), settings)
    database.close()
    (left_out,) = failing
    assert result.winner is not None and result.best is not None
    assert config_key(result.best) == left_out  # the search's best, which re-timing lost
    assert config_key(result.winner.config) != left_out
    assert left_out not in {config_key(f.config) for f in result.winner.ranking}
