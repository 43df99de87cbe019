"""The Dask runner end to end on a real ``dask.distributed`` cluster of worker processes: real
NVRTC compiles on the workers, replays answered by the simulated replayer (a named fake: the
H200's recorded measurements of stencil7's space, tests/data/spaces/stencil7.json) on the
workers that offer a GPU resource, and the engine's inner loop writing a real SQLite file.
The real replay path (the same runner with GpuReplayer) runs on the device."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from db import repository as repo
from db.session import Database, open_database
from r3tui.domain import (
    Campaign,
    Dim3,
    KernelLaunch,
    MeasurementStatus,
    Recording,
    Variant,
    VariantOrigin,
)
from r3tui.engine import InnerSettings, make_strategy, run_inner
from r3tui.engine.inner import KernelSource, ReplayEvaluator
from r3tui.errors import ConfigError
from r3tui.runners.dask_runner import (
    DaskRunner,
    SimulatedBackend,
    bundle_cache_dir,
    connect,
    local_cluster,
)
from r3tui.search import Budget, config_key
from r3tui.search.simulation import parse_space_file
from tests.unit.test_bundle import write_bundle

REPO = Path(__file__).resolve().parents[2]
SPACE = REPO / "tests" / "data" / "spaces" / "stencil7.json"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster() -> Any:
    """One compile worker and two GPU workers (GPU resource only: there is no GPU), each a
    process of its own."""
    started = local_cluster(1, ["0", "1"])
    client = connect(None, started)
    client.wait_for_workers(3, timeout=120)
    yield client
    client.close()
    started.close()


@pytest.fixture(scope="module")
def space_file() -> Any:
    return parse_space_file(json.loads(SPACE.read_text()))


def _campaign(path: Path, source: str) -> tuple[Database, int, int]:
    database = open_database(path, create=True, upgrade=True)
    with database.session_scope() as s:
        launch = KernelLaunch("stencil7", Dim3(32, 32, 32), Dim3(8, 8, 8))
        rid = repo.add_recording(s, Recording("b.r3b", "ab" * 32, "stencil7", launch), {})
        cid = repo.create_campaign(s, Campaign("dask", rid, seed=0))
        vid = repo.add_variant(s, Variant(cid, source, VariantOrigin.SEED))
    return database, cid, vid


def _source() -> KernelSource:
    return KernelSource((REPO / "examples" / "stencil7" / "kernel.cu").read_text(), "stencil7")


def _runner(client: Any, tmp_path: Path, space_file: Any, replay_s: float) -> DaskRunner:
    bundle = write_bundle(tmp_path / "b.r3b")
    return DaskRunner(client, bundle.path, SimulatedBackend(dict(space_file.table),
                                                             replay_s=replay_s))


def test_a_campaigns_compiles_and_replays_run_on_the_cluster(
        cluster: Any, tmp_path: Path, space_file: Any) -> None:
    database, cid, vid = _campaign(tmp_path / "r3.sqlite", _source().text)
    settings = InnerSettings(batch=8, rounds=3, seed=2, launch_bounds=False)
    search = make_strategy(space_file.space, settings)
    with _runner(cluster, tmp_path, space_file, 0.0) as runner:
        evaluator = ReplayEvaluator(_source(), runner)
        result = run_inner(database, cid, vid, search, evaluator, Budget(max_trials=16),
                           settings)
        stats = runner.stats()
        loads = runner.load()
        digest = runner._packed.digest
    with database.session_scope() as s:
        trials = repo.finished_trials(s, cid, variant_id=vid)
    database.close()

    assert len(trials) == 16 == result.trials
    assert len({config_key(t.config) for t in trials}) == 16
    for t in trials:  # each answer reached the configuration it was asked for
        recorded = space_file.table[config_key(t.config)]
        assert t.measurement.status is recorded.status
        if recorded.median_s is not None:
            assert t.measurement.time is not None
            assert t.measurement.time.median_s == recorded.median_s
    ok = [t for t in trials if t.measurement.ok]
    assert ok
    # compiled for real on the workers: NVRTC's cubin and ptxas's report came back
    assert all(t.measurement.binary_sha256 and t.measurement.resources.registers for t in ok)
    # the finalists' re-timing also measures the recorded configuration when no trial did
    baseline = config_key(space_file.space.baseline_config())
    extra = int(baseline not in {config_key(t.config) for t in trials})
    assert stats.compiles == 16 + extra and stats.lost == 0
    assert stats.replays == len(ok) + extra
    assert result.winner is not None
    assert {w.kind for w in loads.workers} == {"gpu", "cpu"}
    assert sum(w.kind == "gpu" for w in loads.workers) == 2
    # the bundle went to the GPU workers once, into their machine's content-addressed cache
    assert (bundle_cache_dir() / digest / "manifest.json").is_file()


def _pretend_version(version: str | None) -> str:
    """Run on a worker: make its R³ report ``version`` (None: its own again)."""
    import r3tui
    from r3tui.runners import dask_runner

    saved = getattr(r3tui, "_real_version", r3tui.__version__)
    r3tui._real_version = saved  # type: ignore[attr-defined]
    r3tui.__version__ = version if version is not None else saved
    dask_runner.code_fingerprint.cache_clear()
    return dask_runner.code_fingerprint()


def test_a_worker_running_another_r3_is_refused_before_any_job(
        cluster: Any, tmp_path: Path, space_file: Any) -> None:
    worker = sorted(cluster.scheduler_info(n_workers=-1)["workers"])[0]
    cluster.run(_pretend_version, "0.0.0-other", workers=[worker])
    try:
        with pytest.raises(ConfigError, match="run another R³") as caught:
            _runner(cluster, tmp_path, space_file, 0.0)
        assert "0.0.0-other" in str(caught.value)
    finally:
        cluster.run(_pretend_version, None, workers=[worker])
    again = tmp_path / "again"
    again.mkdir()
    with _runner(cluster, again, space_file, 0.0) as runner:  # all alike again
        assert runner.stats().compiles == 0


def test_a_killed_worker_loses_nothing_and_counts_nothing_twice(
        cluster: Any, tmp_path: Path, space_file: Any) -> None:
    database, cid, vid = _campaign(tmp_path / "r3.sqlite", _source().text)
    settings = InnerSettings(batch=8, rounds=3, seed=5, launch_bounds=False)
    search = make_strategy(space_file.space, settings)
    budget = 24
    with _runner(cluster, tmp_path, space_file, 0.4) as runner:
        evaluator = ReplayEvaluator(_source(), runner)
        outcome: dict[str, Any] = {}

        def campaign() -> None:
            try:
                outcome["result"] = run_inner(database, cid, vid, search, evaluator,
                                              Budget(max_trials=budget), settings)
            except BaseException as exc:  # reported below, not lost in the thread
                outcome["error"] = exc

        thread = threading.Thread(target=campaign)
        thread.start()
        victim = None
        deadline = time.monotonic() + 120
        while victim is None and time.monotonic() < deadline:  # a GPU worker mid-replay
            assert thread.is_alive(), f"the campaign ended first: {outcome}"
            gpu_workers = set(runner.gpu_workers())
            busy = [w.name for w in runner.load().workers
                    if w.name in gpu_workers and w.running]
            if busy:
                victim = busy[0]
            else:
                time.sleep(0.05)
        assert victim is not None, "no replay was ever in flight"
        pids = cluster.run(os.getpid, workers=[victim])
        os.kill(pids[victim], signal.SIGKILL)
        thread.join(300)
        assert not thread.is_alive()
        stats = runner.stats()
    assert "error" not in outcome, outcome.get("error")
    with database.session_scope() as s:
        trials = repo.finished_trials(s, cid, variant_id=vid)
    database.close()

    # every asked configuration stored exactly once, none lost
    assert len(trials) == budget == outcome["result"].trials
    assert len({config_key(t.config) for t in trials}) == budget
    assert stats.resubmitted >= 1 and stats.lost == 0
    assert stats.replay_calls >= 1  # the victim was replaying through its actor
    assert not [t for t in trials if t.measurement.status is MeasurementStatus.CRASHED]
    for t in trials:
        assert t.measurement.status is space_file.table[config_key(t.config)].status


def test_a_batch_system_cluster_comes_from_r3_toml() -> None:
    from r3tui.errors import ConfigError
    from r3tui.runners.dask_runner import jobqueue_cluster

    cluster = jobqueue_cluster({"jobqueue": "slurm", "cores": 8, "memory": "32GB",
                                "queue": "gpu", "walltime": "01:00:00",
                                "job_extra_directives": ["--gres=gpu:1"]})
    try:
        script = cluster.job_script()  # nothing is submitted before the cluster is scaled
    finally:
        cluster.close()
    assert "#SBATCH -p gpu" in script and "#SBATCH --gres=gpu:1" in script
    assert "--resources GPU=1" in script and "--nthreads 1" in script
    assert "export DASK_DISTRIBUTED__WORKER__DAEMON=False" in script
    with pytest.raises(ConfigError, match="jobqueue must be one of"):
        jobqueue_cluster({"jobqueue": "condor"})


def test_replays_that_queue_up_go_to_the_gpu_workers_in_batches(
        cluster: Any, tmp_path: Path, space_file: Any) -> None:
    """Forty replays asked at once: the first go alone while the GPU workers have free slots,
    the rest wait and go out together; each answer is its own configuration's."""
    from r3tui.replay.candidate import Candidate
    from r3tui.runners.base import ReplayJob
    from r3tui.runners.dask_runner import BATCHES_IN_FLIGHT, MAX_BATCH

    keys = sorted(space_file.table)[:40]
    with _runner(cluster, tmp_path, space_file, 0.02) as runner:
        jobs = [ReplayJob(Candidate(f"cubin {k}".encode(), "stencil7"), key) for k, key in
                enumerate(keys)]
        futures = [runner.replay(job) for job in jobs]
        answers = [f.result(timeout=120) for f in futures]
        stats = runner.stats()
    for job, key, answer in zip(jobs, keys, answers, strict=True):
        recorded = space_file.table[key]
        assert answer.status is recorded.status
        assert answer.binary_sha256 == job.candidate.binary_sha256
        if recorded.median_s is not None:
            assert answer.time is not None and answer.time.median_s == recorded.median_s
    slots = BATCHES_IN_FLIGHT * 2  # two GPU workers
    assert stats.replays == 40 and stats.lost == 0
    # every batch a direct call of a GPU worker's actor, none a task of the scheduler
    assert stats.replay_calls == stats.replay_tasks
    # the first `slots` alone, then the 36 that waited in batches of at most MAX_BATCH
    assert slots + -(-(40 - slots) // MAX_BATCH) <= stats.replay_tasks < 40


def test_replays_cancelled_while_they_wait_are_not_sent_and_hold_back_no_answer(
        cluster: Any, tmp_path: Path, space_file: Any) -> None:
    """A batch that ends on a hang cancels its replays that have not begun
    (ReplayEvaluator.start with hang_ends_batch): those waiting here are dropped from the
    batches sent, and every other replay of those batches is still answered."""
    from r3tui.replay.candidate import Candidate
    from r3tui.runners.base import ReplayJob

    keys = sorted(space_file.table)[:30]
    with _runner(cluster, tmp_path, space_file, 0.05) as runner:
        futures = [runner.replay(ReplayJob(Candidate(f"cubin {k}".encode(), "stencil7"), key))
                   for k, key in enumerate(keys)]
        # every other one of those that wait: a batch sent holds both kinds
        gone = set(range(11, 20, 2))
        cancelled = [futures[k].cancel() for k in sorted(gone)]
        kept = [k for k in range(len(keys)) if k not in gone]
        answers = [futures[k].result(timeout=60) for k in kept]
        tasks = runner.stats().replay_tasks
    assert all(cancelled)  # the first ones went at once; these were still waiting
    assert all(futures[k].cancelled() for k in gone)
    for k, answer in zip(kept, answers, strict=True):
        assert answer.status is space_file.table[keys[k]].status
    assert tasks < 20  # the waiting ones went in batches, the cancelled in none


def _add(x: int, y: int) -> int:
    return x + y


def test_a_result_being_handled_holds_back_no_other_result(
        cluster: Any, tmp_path: Path, space_file: Any) -> None:
    """Dask runs every future's callbacks in one thread; the runner fetched each finished
    task's result there, so every compile and replay waited for the fetches (and the handling)
    of all that finished before it.  Results are now fetched on the runner's own threads: here
    the handling of the first result waits for the second, which would never come if both
    were handled in one thread."""
    with _runner(cluster, tmp_path, space_file, 0.0) as runner:
        first, second = (runner._submit(_add, lambda k=k: (k, 1), on_lost=lambda why: -1,
                                        resources=None) for k in (1, 2))
        seen: list[object] = []

        def waits_for_the_second(done: Any) -> None:
            try:
                seen.append(second.result(timeout=20))
            except Exception as exc:
                seen.append(exc)

        first.add_done_callback(waits_for_the_second)
        assert first.result(timeout=30) == 2
        assert second.result(timeout=30) == 3
        deadline = time.monotonic() + 30
        while not seen and time.monotonic() < deadline:
            time.sleep(0.01)
    assert seen == [3]


def test_a_compile_asked_again_while_it_runs_is_not_sent_twice(
        cluster: Any, tmp_path: Path, space_file: Any) -> None:
    """Configurations that differ only in their launch compile the same code: the second ask
    waits for the first's task (as the local compile pool does), and each gets the kernel."""
    from r3tui.compile.base import CompileRequest
    from r3tui.runners import dask_runner

    sent: list[str] = []
    with _runner(cluster, tmp_path, space_file, 0.0) as runner:
        submit = runner._submit

        def counted(fn: Any, *args: Any, **kwargs: Any) -> Any:
            if fn is dask_runner.compile_task:
                sent.append(kwargs["key"])
            return submit(fn, *args, **kwargs)

        runner._submit = counted
        request = CompileRequest(_source().text, "stencil7", options=("--use_fast_math",))
        other = CompileRequest(_source().text, "stencil7", options=("-lineinfo",))
        futures = [runner.compile("nvrtc", r) for r in (request, request, other, request)]
        kernels = [f.result(timeout=120) for f in futures]
    assert len(sent) == 2
    assert all(k.ok for k in kernels)
    assert kernels[0].binary == kernels[1].binary == kernels[3].binary != kernels[2].binary


def test_compiles_run_on_the_workers_without_a_gpu(
        cluster: Any, tmp_path: Path, space_file: Any) -> None:
    """A GPU worker's one thread is for replays: with a compile worker in the cluster, no
    compile runs on a GPU worker (the scheduler's task stream says where each ran)."""
    from distributed import get_task_stream

    from r3tui.compile.base import CompileRequest

    with _runner(cluster, tmp_path, space_file, 0.0) as runner:
        gpus, others = runner._worker_roles(fresh=True)
        assert len(gpus) == 2 and len(others) == 1
        requests = [CompileRequest(_source().text + f"\n__device__ int placed_{k};\n",
                                   "stencil7") for k in range(6)]
        with get_task_stream(cluster) as stream:
            kernels = [f.result(timeout=120)
                       for f in [runner.compile("nvrtc", r) for r in requests]]
    assert all(k.ok for k in kernels)
    ran = [(str(t["key"]), t["worker"]) for t in stream.data]
    compiled_on = [worker for key, worker in ran if "r3-compile-" in key]
    assert len(compiled_on) == 6
    assert set(compiled_on) == set(others)
