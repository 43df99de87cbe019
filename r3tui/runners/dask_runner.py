"""The Dask runner: compiles on any worker of a ``dask.distributed`` cluster, replays on the
workers that offer a GPU (the worker resource ``GPU=1``), one replay at a time on each.

- **Bundles travel once.**  The bundle is packed once and scattered; a worker that replays
  fetches it the first time, unpacks it into a content-addressed folder of its machine's temp
  directory (``r3-bundles/<manifest sha256>``, reused by later campaigns on the same recording)
  and keeps the replay worker with the bundle resident for the runner's life.
- **The campaign stays the only writer.**  Workers return values; the engine, in the campaign's
  process, writes the database.  Nothing a worker does touches the database or a shared file
  system.
- **Compiles stay off the GPU workers.**  A GPU worker has one thread, for replays: a compile
  placed there would hold the GPU's replays back for as long as it runs.  Where the cluster has
  workers without a GPU, compiles go to those only; a cluster of GPU workers alone compiles on
  them.
- **Replays are direct calls.**  Each GPU worker holds a :class:`ReplayActor`: a replay
  batch goes to it and back without the scheduler (a task costs a round trip through the
  scheduler and the worker's state changes, as long as a small kernel's replay).  A call that
  fails (its worker lost) goes again once, as a task; a worker without an actor yet (one that
  joined, or came back) gets its replays as tasks while its actor is made.
- **Replays go in batches when they queue up.**  A task costs the scheduler a round trip, a
  few milliseconds, as long as a small kernel's whole replay: a GPU worker given one replay a
  task would wait on the scheduler about as long as it works.  Each GPU worker has at most
  :data:`BATCHES_IN_FLIGHT` replay tasks at a time; a replay asked for while they are all
  taken waits, and the replays waiting go out together, up to :data:`MAX_BATCH` in one task,
  when one of them comes back.  A replay asked for when a slot is free goes at once, alone.
- **A lost worker costs its jobs in flight, once.**  A job whose worker dies (node lost, job
  preempted, the process killed) is submitted again once, under a new key; if that worker is
  lost too, the job comes back as a failure (``crashed``, "lost twice") and counts in
  :attr:`RunnerStats.lost`.  A job is answered once: the engine stores what it is answered.
  The clusters R³ starts set ``distributed.scheduler.allowed-failures`` to 0 so that the one
  resubmission is R³'s; a scheduler of your own may retry a few times first (its setting).

Clusters: ``--scheduler ADDR`` joins a running one (GPU workers started with
``--resources GPU=1 --nthreads 1``, one per GPU with ``CUDA_VISIBLE_DEVICES`` set); without it
R³ starts one on this machine (:func:`local_cluster`) or, with ``[runner] jobqueue`` in
``r3.toml``, submits its workers to Slurm, PBS or LSF through dask-jobqueue
(:func:`jobqueue_cluster`).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import os
import shutil
import tarfile
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from r3tui.errors import ConfigError, GpuUnavailable
from r3tui.runners.base import ReplayJob, Runner, RunnerLoad, RunnerStats, WorkerLoad

if TYPE_CHECKING:
    from r3tui.compile.base import CompiledKernel, CompileRequest
    from r3tui.compile.cache import CompileCache
    from r3tui.domain import Measurement
    from r3tui.replay.worker import WorkerInfo
    from r3tui.runners.base import Replayer
    from r3tui.search.simulation import RecordedResult

T = TypeVar("T")
GPU = {"GPU": 1}
MAX_BATCH = 16  # replays in one task at most
FETCH_THREADS = 8  # finished tasks' results fetched at once
BATCHES_IN_FLIGHT = 2  # replay tasks a GPU worker has at once: one runs while one travels


# -- what travels to the workers -----------------------------------------------------------
@dataclass(frozen=True)
class BundleBlob:
    """A bundle directory as one uncompressed tar (its blobs are compressed already)."""

    digest: str  # the manifest's sha256: the bundle's content address
    data: bytes


def pack_bundle(path: Path) -> BundleBlob:
    from r3tui.record.bundle import Bundle

    digest = Bundle.open(path).sha256
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(path, arcname=".")
    return BundleBlob(digest, buffer.getvalue())


def bundle_cache_dir() -> Path:
    return Path(tempfile.gettempdir()) / "r3-bundles"


def unpack_bundle(blob: BundleBlob, cache: Path | None = None) -> Path:
    """The bundle's folder on this machine, unpacked the first time (atomically: into a
    temporary folder, then renamed, so a worker killed half-way leaves no bundle that opens)."""
    root = cache or bundle_cache_dir()
    target = root / blob.digest
    if (target / "manifest.json").exists():
        return target
    root.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{blob.digest[:12]}-", dir=root))
    try:
        with tarfile.open(fileobj=io.BytesIO(blob.data), mode="r") as tar:
            tar.extractall(scratch, filter="data")
        try:
            os.rename(scratch, target)
        except OSError:  # another worker of this machine unpacked it first
            if not (target / "manifest.json").exists():
                raise
    finally:
        if scratch.exists():
            shutil.rmtree(scratch, ignore_errors=True)
    return target


@dataclass(frozen=True)
class GpuBackend:
    """Replays on the worker's GPU (device 0 of what ``CUDA_VISIBLE_DEVICES`` leaves it)."""

    timeout_s: float = 60.0
    reference_s: float | None = None  # the application's own time (TimingPolicy)

    def build(self, bundle_dir: Path) -> Replayer:
        from r3tui.replay.timing import TimingPolicy
        from r3tui.replay.worker import ReplayWorker
        from r3tui.runners.local import GpuReplayer

        return GpuReplayer(ReplayWorker(bundle_dir, 0, timeout_s=self.timeout_s,
                                        policy=TimingPolicy(reference_s=self.reference_s)))


@dataclass(frozen=True)
class SimulatedBackend:
    """Replays answered from recorded measurements (:mod:`r3tui.runners.simulated`): a fake
    GPU, for clusters without one (CI)."""

    table: Mapping[str, RecordedResult] = field(default_factory=dict)
    replay_s: float = 0.0
    arch: str = "sm_90"

    def build(self, bundle_dir: Path) -> Replayer:
        from r3tui.runners.simulated import SimulatedReplayer

        return SimulatedReplayer(self.table, gpu="simulated GPU (recorded measurements)",
                                 arch=self.arch, replay_s=self.replay_s)


Backend = GpuBackend | SimulatedBackend


# -- worker side (run in the Dask workers' processes) --------------------------------------
_RESIDENT: dict[str, Replayer] = {}  # runner token -> this worker's replayer
_RESIDENT_LOCK = threading.Lock()
# one use of this worker's GPU at a time: replays come as tasks (the task thread) and as
# calls of its ReplayActor (the actor thread)
_GPU_LOCK = threading.Lock()


def _resident(blob: BundleBlob, backend: Backend, token: str) -> Replayer:
    with _RESIDENT_LOCK:
        found = _RESIDENT.get(token)
        if found is None:
            found = backend.build(unpack_bundle(blob))
            found.start()
            _RESIDENT[token] = found
        return found


def start_task(blob: BundleBlob, backend: Backend, token: str) -> WorkerInfo:
    return _resident(blob, backend, token).start()


def replay_task(blob: BundleBlob, backend: Backend, token: str, jobs: list[ReplayJob]
                ) -> list[Measurement]:
    """A batch of replays, one after another on the worker's GPU."""
    replayer = _resident(blob, backend, token)
    with _GPU_LOCK:
        return [replayer.evaluate(job) for job in jobs]


def interleave_task(blob: BundleBlob, backend: Backend, token: str, jobs: list[ReplayJob],
                    rounds: int) -> list[list[float]]:
    replayer = _resident(blob, backend, token)
    with _GPU_LOCK:
        return replayer.interleaved(jobs, rounds)


class ReplayActor:
    """A GPU worker's replays called by the campaign directly (a Dask actor): a call goes
    to the worker and back without the scheduler, where a task costs a round trip through
    it and a state change on the worker.  A simulated flow of 100 replays of 2.7 ms asked
    2.6 ms apart took 26-35% longer than its replays as tasks and 6-10% as actor calls (two
    calls or tasks at once, batches of up to 16; 2-core machine, session 36)."""

    def __init__(self, blob: BundleBlob, backend: Backend, token: str) -> None:
        self._args = (blob, backend, token)

    def evaluate(self, jobs: list[ReplayJob]) -> list[Measurement]:
        return replay_task(*self._args, jobs)


def compile_task(toolchain: str, request: CompileRequest) -> CompiledKernel:
    """Compile in the worker's process; an error the toolchain raises is a failed compile."""
    import traceback

    from r3tui.compile.base import CompiledKernel, cache_key, get_toolchain

    chain = get_toolchain(toolchain)
    try:
        return chain.compile(request)
    except Exception as exc:
        text = f"compile on a Dask worker failed: {exc}\n{traceback.format_exc()}"
        return CompiledKernel.failure(chain, text, cache_key=cache_key(chain, request))


def release_task(token: str) -> int:
    """Close this worker's replayer of the runner ``token`` (run on every worker at close)."""
    with _RESIDENT_LOCK:
        found = _RESIDENT.pop(token, None)
    if found is not None:
        found.close()
        return 1
    return 0


# -- the engine's side ---------------------------------------------------------------------
@functools.cache
def code_fingerprint() -> str:
    """R³'s version and a hash of its package's Python files: what a worker must share with
    the campaign for its compiles and measurements to be the campaign's."""
    from r3tui import __version__

    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return f"{__version__}+{digest.hexdigest()[:12]}"


def check_versions(client: Any) -> None:
    """:class:`ConfigError` where a worker of the cluster runs another R³ (another version,
    or the same version with other code): its compiles and measurements would not be
    comparable with the campaign's, and its task functions may not match."""
    mine = code_fingerprint()
    found: dict[str, str] = client.run(code_fingerprint)
    other = {worker: v for worker, v in found.items() if v != mine}
    if other:
        worker, version = sorted(other.items())[0]
        raise ConfigError(
            f"{len(other)} of the cluster's {len(found)} worker(s) run another R³ than this "
            f"campaign ({mine}), e.g. {worker} runs {version}",
            hint="install the same r3tui on every worker (pip install of one wheel or one "
                 "checkout shared by all)")


def _is_lost(exc: BaseException) -> bool:
    """Whether ``exc`` says the worker (not the job) failed."""
    from distributed.comm.core import CommClosedError
    from distributed.scheduler import KilledWorker

    return isinstance(exc, KilledWorker | CommClosedError | CancelledError | OSError)


class DaskRunner(Runner):
    """Compile and replay jobs on ``client``'s cluster.  ``owned`` (a cluster R³ started) is
    closed with the runner."""

    name = "dask"

    def __init__(self, client: Any, bundle_path: Path, backend: Backend, *,
                 cache: CompileCache | None = None, owned: Any = None) -> None:
        self.client = client
        self.backend = backend
        self.cache = cache
        self._owned = owned
        self._token = uuid.uuid4().hex
        self._lock = threading.Lock()
        self._stats = {"compiles": 0, "replays": 0, "resubmitted": 0, "lost": 0,
                       "replay_tasks": 0, "replay_calls": 0}
        self._closed = False
        self._waiting: list[tuple[ReplayJob, Future[Measurement]]] = []
        # compiles on the cluster by cache key: a request asked again while its compile runs
        # (configs that differ only in their launch) waits for that one, as CompilePool does
        self._compiling: dict[str, Future[CompiledKernel]] = {}
        self._batches = 0  # replay tasks in flight
        # each GPU worker's ReplayActor (replays as direct calls), its calls in flight, and
        # the workers whose actor is being made; a worker without one gets replays as tasks
        self._actors: dict[str, Any] = {}
        self._actor_calls: dict[str, int] = {}
        self._making: set[str] = set()
        # where a finished task's result is fetched: Dask runs every future's callbacks in
        # one thread, and a result fetched there (a blocking gather from the worker) made
        # each compile and replay wait for the fetches of all that finished before it
        self._fetchers = ThreadPoolExecutor(FETCH_THREADS, thread_name_prefix="r3-dask-fetch")
        # where an actor call is waited for (as long as its replays run: on the fetch threads,
        # eight GPU workers' calls would hold back every compile's result); threads are made
        # as calls need them, at most two a GPU worker of a large cluster
        self._callers = ThreadPoolExecutor(BATCHES_IN_FLIGHT * 256,
                                           thread_name_prefix="r3-dask-actor")
        # (GPU workers, the others), asked of the scheduler at most once a second
        self._roles: tuple[list[str], list[str]] = ([], [])
        self._roles_seen_at = 0.0
        check_versions(client)
        gpus = self._worker_roles(fresh=True)[0]
        if not gpus:
            raise GpuUnavailable("no worker of the Dask cluster offers a GPU",
                                 hint="start one worker per GPU with "
                                 "`dask worker ADDR --resources GPU=1 --nthreads 1`")
        self._packed = pack_bundle(bundle_path)
        self._blob = self._scatter()
        starts = [client.submit(start_task, self._blob, backend, self._token, workers=[w],
                                allow_other_workers=False, resources=GPU, pure=False)
                  for w in gpus]
        infos: list[WorkerInfo] = client.gather(starts)
        archs = {i.arch for i in infos}
        if len(archs) > 1:
            self.close()
            raise GpuUnavailable(f"the cluster's GPUs differ in architecture "
                                 f"({', '.join(sorted(archs))}): candidates must be comparable")
        self._info = infos[0]
        made = {w: self._submit_actor(w) for w in gpus}
        for w, future in made.items():
            self._actors[w] = future.result()
            self._actor_calls[w] = 0

    def _submit_actor(self, worker: str) -> Any:
        """A :class:`ReplayActor` made on ``worker`` (a Dask future of its proxy)."""
        return self.client.submit(ReplayActor, self._current_blob(), self.backend, self._token,
                                  workers=[worker], allow_other_workers=False, actor=True,
                                  pure=False)

    def _make_actors(self) -> None:
        """An actor for each GPU worker that has none (one that joined, or came back after
        it was lost), made in the background: its replays go as tasks meanwhile."""
        gpus = self._worker_roles()[0]  # may ask the scheduler: not under the lock
        with self._lock:
            missing = [w for w in gpus if w not in self._actors and w not in self._making]
            self._making.update(missing)
        for w in missing:
            def make(w: str = w) -> None:
                try:
                    proxy = self._submit_actor(w).result(timeout=60)
                except Exception:  # gone again, or busy: asked again at a later send
                    proxy = None
                with self._lock:
                    self._making.discard(w)
                    if proxy is not None and not self._closed:
                        self._actors[w] = proxy
                        self._actor_calls[w] = 0

            with contextlib.suppress(RuntimeError):  # the runner is closing
                self._callers.submit(make)

    def _take_actor(self) -> tuple[str, Any] | None:
        """The GPU worker's actor with the fewest calls in flight, below the limit (None:
        none has a free slot, or no worker has an actor)."""
        with self._lock:
            free = [(n, w) for w, n in self._actor_calls.items() if n < BATCHES_IN_FLIGHT]
            if not free:
                return None
            _, w = min(free)
            self._actor_calls[w] += 1
            self._stats["replay_calls"] += 1
            return w, self._actors[w]

    def _scatter(self) -> Any:
        """The bundle sent to every GPU worker (each keeps it while the runner lives; a worker
        that joins later fetches it from one of them)."""
        return self.client.scatter(self._packed, workers=self.gpu_workers(), broadcast=True,
                                   hash=False)

    def _current_blob(self) -> Any:
        """The scattered bundle, sent again if every worker holding it was lost."""
        with self._lock:
            if self._blob.status in ("lost", "error", "cancelled"):
                self._blob = self._scatter()
            return self._blob

    def gpu_workers(self) -> list[str]:
        return self._worker_roles(fresh=True)[0]

    def _worker_roles(self, fresh: bool = False) -> tuple[list[str], list[str]]:
        """(the workers that offer a GPU, the others), as the scheduler last told it: asked
        again at most once a second (workers of a batch system join while the campaign runs),
        or now where ``fresh`` (which raises what asking raises; otherwise a scheduler busy or
        gone leaves the last answer)."""
        now = time.monotonic()
        if fresh or now - self._roles_seen_at > 1.0:
            with contextlib.nullcontext() if fresh else contextlib.suppress(Exception):
                workers = self.client.scheduler_info(n_workers=-1)["workers"]
                gpu = {a for a, w in workers.items() if w.get("resources", {}).get("GPU", 0) >= 1}
                self._roles = (sorted(gpu), sorted(set(workers) - gpu))
            self._roles_seen_at = now
        return self._roles

    def _compile_workers(self) -> list[str] | None:
        """Where compiles may run: the workers without a GPU, where the cluster has any (a
        compile on a GPU worker's one thread holds its replays back); else any worker."""
        return self._worker_roles()[1] or None

    @property
    def info(self) -> WorkerInfo:
        return self._info

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._stats[name] += n

    def _submit(self, fn: Callable[..., T], args: Callable[[], Sequence[Any]], *,
                on_lost: Callable[[str], T], resources: dict[str, int] | None,
                key: str | None = None, jobs: int = 1,
                workers: Callable[[], list[str] | None] | None = None,
                attempt: int = 0) -> Future[T]:
        """``fn(*args())`` on the cluster as a ``concurrent.futures`` future, on one of
        ``workers()`` where that names any; a lost worker resubmits once (``args`` and
        ``workers`` asked again: the bundle may have been sent again, the worker may be gone),
        then answers ``on_lost(why)``.  ``jobs``: how many jobs the task holds, as the stats
        count them; ``attempt`` 1: the jobs were sent once already (to an actor lost since),
        so a lost worker answers ``on_lost`` at once."""
        out: Future[T] = Future()

        def launch(attempt: int) -> None:
            name = f"{key}-{attempt}" if key else None
            remote = self.client.submit(fn, *args(), resources=resources, pure=False,
                                        key=name or f"r3-{fn.__name__}-{uuid.uuid4().hex}",
                                        workers=workers() if workers else None,
                                        allow_other_workers=False)

            def done(remote: Any) -> None:
                try:
                    out.set_result(remote.result())
                except BaseException as exc:
                    if self._closed:
                        out.cancel()
                    elif _is_lost(exc) and attempt == 0:
                        self._count("resubmitted", jobs)
                        launch(1)
                    elif _is_lost(exc):
                        self._count("lost", jobs)
                        out.set_result(on_lost(f"{type(exc).__name__}: {exc}"))
                    else:
                        out.set_exception(exc)

            remote.add_done_callback(lambda remote: self._fetch(done, remote))

        launch(attempt)
        return out

    def _fetch(self, done: Callable[[Any], None], remote: Any) -> None:
        """``done(remote)`` on a fetch thread (in Dask's callback thread once the runner
        has closed: no result is fetched then, the job is cancelled)."""
        try:
            self._fetchers.submit(done, remote)
        except RuntimeError:  # the fetch threads have shut down: the runner is closing
            done(remote)

    def compile(self, toolchain: str, request: CompileRequest) -> Future[CompiledKernel]:
        from r3tui.compile.base import CompiledKernel, cache_key, get_toolchain

        chain = get_toolchain(toolchain)
        chain.validate(request)
        key = cache_key(chain, request)
        self._count("compiles")
        hit = self.cache.get(key) if self.cache is not None else None
        if hit is not None:
            ready: Future[CompiledKernel] = Future()
            ready.set_result(hit)
            return ready

        def lost(why: str) -> CompiledKernel:
            return CompiledKernel.failure(chain, f"the Dask worker compiling it was lost twice "
                                          f"({why})", cache_key=key)

        with self._lock:
            running = self._compiling.get(key)
            if running is None:
                running = self._submit(compile_task, lambda: (toolchain, request), on_lost=lost,
                                       resources=None, workers=self._compile_workers,
                                       key=f"r3-compile-{key[:32]}-{uuid.uuid4().hex[:8]}")
                self._compiling[key] = running
                first = True
            else:
                first = False
        mine: Future[CompiledKernel] = Future()
        cache = self.cache

        def answered(done: Future[CompiledKernel]) -> None:
            if first:
                with self._lock:
                    self._compiling.pop(key, None)
                if cache is not None and not done.cancelled() and done.exception() is None:
                    cache.put(done.result())
            if done.cancelled():
                mine.cancel()
            elif done.exception() is not None:
                mine.set_exception(done.exception())
            else:
                mine.set_result(done.result())

        running.add_done_callback(answered)
        return mine

    def replay(self, job: ReplayJob) -> Future[Measurement]:
        if self._closed:
            raise RuntimeError("the runner is closed")
        out: Future[Measurement] = Future()
        with self._lock:
            self._stats["replays"] += 1
            self._waiting.append((job, out))
        self._send_waiting()
        return out

    def _gpu_slots(self) -> int:
        """Replay tasks the cluster's GPU workers take at once."""
        return BATCHES_IN_FLIGHT * max(1, len(self._worker_roles()[0]))

    def _send_waiting(self) -> None:
        """The replays waiting, in batches, while GPU workers have a free slot."""
        batches = []
        slots = self._gpu_slots()
        with self._lock:
            while self._waiting and self._batches < slots and not self._closed:
                batch, self._waiting = self._waiting[:MAX_BATCH], self._waiting[MAX_BATCH:]
                # a replay cancelled while it waited (its batch ended on a hang) is not sent;
                # one that is sent can no longer be cancelled
                batch = [(job, out) for job, out in batch if out.set_running_or_notify_cancel()]
                if not batch:
                    continue
                self._batches += 1
                self._stats["replay_tasks"] += 1
                batches.append(batch)
        for batch in batches:
            self._send(batch)

    def _send(self, batch: list[tuple[ReplayJob, Future[Measurement]]]) -> None:
        """The batch to a GPU worker's actor with a free slot, else as a task; an actor
        call that fails (its worker lost) goes again once, as a task."""
        self._make_actors()
        taken = self._take_actor()
        if taken is None:
            self._send_task(batch)
            return
        worker, actor = taken
        jobs = [job for job, _ in batch]

        def call() -> None:
            try:
                results: list[Measurement] = actor.evaluate(jobs).result()
            except Exception:  # a replay never raises: the worker (or the link) failed
                with self._lock:
                    self._actors.pop(worker, None)
                    self._actor_calls.pop(worker, None)
                if self._closed:
                    self._answer(batch, CancelledError())
                    return
                self._count("resubmitted", len(jobs))
                # not to the worker whose call failed: the scheduler may not know yet that it
                # is gone, and a task placed there is lost a second time (a test saw it)
                self._send_task(batch, attempt=1, avoid=worker)
                return
            with self._lock:
                if worker in self._actor_calls:
                    self._actor_calls[worker] -= 1
            self._answer(batch, results)

        try:
            self._callers.submit(call)
        except RuntimeError:  # the runner is closing: the batch is answered as cancelled
            self._answer(batch, CancelledError())

    def _answer(self, batch: list[tuple[ReplayJob, Future[Measurement]]],
                outcome: list[Measurement] | BaseException) -> None:
        """Each replay of ``batch`` its result, or the batch's exception (CancelledError: the
        runner closed with it sent), then the replays waiting go out."""
        with self._lock:
            self._batches -= 1
        for k, (_, out) in enumerate(batch):
            if isinstance(outcome, BaseException):
                out.set_exception(outcome)
            else:
                out.set_result(outcome[k])
        self._send_waiting()

    def _send_task(self, batch: list[tuple[ReplayJob, Future[Measurement]]],
                   attempt: int = 0, avoid: str | None = None) -> None:
        """The batch as a replay task; ``avoid``: a worker it must not go to (one just
        lost) while the cluster has another GPU worker."""
        from r3tui.domain import Measurement, MeasurementStatus

        jobs = [job for job, _ in batch]

        def lost(why: str) -> list[Measurement]:
            return [Measurement(MeasurementStatus.CRASHED,
                                binary_sha256=job.candidate.binary_sha256,
                                resources=job.candidate.resources,
                                compile_time_s=job.candidate.compile_time_s,
                                error_text=f"the Dask worker replaying it was lost twice "
                                           f"({why})") for job in jobs]

        def others() -> list[str] | None:
            if avoid is None:
                return None
            rest = [w for w in self._worker_roles()[0] if w != avoid]
            return rest or None

        remote = self._submit(replay_task,
                              lambda: (self._current_blob(), self.backend, self._token, jobs),
                              on_lost=lost, resources=GPU, jobs=len(jobs), attempt=attempt,
                              workers=others)

        def answered(done: Future[list[Measurement]]) -> None:
            if done.cancelled():  # the runner closed: a sent replay is running, not pending
                self._answer(batch, CancelledError())
            else:
                self._answer(batch, done.exception() or done.result())

        remote.add_done_callback(answered)

    def interleaved(self, jobs: list[ReplayJob], rounds: int) -> list[list[float]]:
        # one task: every round of every candidate on the one GPU that runs it
        remote = self.client.submit(interleave_task, self._current_blob(), self.backend,
                                    self._token, jobs, rounds, resources=GPU, pure=False)
        try:
            result: list[list[float]] = remote.result()
        except Exception as exc:
            if _is_lost(exc):
                raise GpuUnavailable(f"the GPU worker re-timing the finalists was lost "
                                     f"({type(exc).__name__}: {exc})") from None
            raise
        return result

    def load(self) -> RunnerLoad:
        """From the scheduler: each worker's tasks in progress (with the replay calls its actor
        has in flight); queued, those assigned to a worker beyond those it runs (replays on GPU
        workers, the rest on CPU workers)."""
        info = self.client.scheduler_info(n_workers=-1)["workers"]
        processing = self.client.processing()
        with self._lock:
            calls = dict(self._actor_calls)  # replays sent to actors: no task of the scheduler
        loads = []
        queued = {"gpu": 0, "cpu": 0}
        for address in sorted(info):
            worker = info[address]
            kind = "gpu" if worker.get("resources", {}).get("GPU", 0) >= 1 else "cpu"
            assigned = len(processing.get(address, ())) + calls.get(address, 0)
            running = min(assigned, int(worker.get("nthreads", 1) or 1))
            queued[kind] += assigned - running
            loads.append(WorkerLoad(address, kind, running, 0))
        return RunnerLoad(tuple(loads), queued)

    def stats(self) -> RunnerStats:
        with self._lock:
            s = dict(self._stats)
        return RunnerStats(compiles=s["compiles"], replays=s["replays"],
                           resubmitted=s["resubmitted"], lost=s["lost"],
                           replay_tasks=s["replay_tasks"], replay_calls=s["replay_calls"])

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with self._lock:
            waiting, self._waiting = self._waiting, []
            self._actors.clear()
            self._actor_calls.clear()
        for _, out in waiting:  # never sent: nothing to answer them with
            out.cancel()
        with contextlib.suppress(Exception):  # a cluster already gone has nothing to release
            self.client.run(release_task, self._token)
        if self._owned is not None:
            self.client.close()
            self._owned.close()
        self._fetchers.shutdown(wait=False)
        self._callers.shutdown(wait=False)


# -- clusters R³ starts ----------------------------------------------------------------------
def _config() -> dict[str, Any]:
    return {
        # R³ resubmits a job of a lost worker once itself (DaskRunner._submit)
        "distributed.scheduler.allowed-failures": 0,
        # a GPU worker's replay worker is a child process: workers must be allowed children
        "distributed.worker.daemon": False,
    }


def local_cluster(cpu_workers: int, gpus: Sequence[str], *, gpu_resources: bool = True
                  ) -> Any:
    """A cluster of processes on this machine: ``cpu_workers`` compile workers and one GPU
    worker per entry of ``gpus`` (the ``CUDA_VISIBLE_DEVICES`` value it sees)."""
    import dask
    from distributed import Nanny, Scheduler, SpecCluster

    workers: dict[str, dict[str, Any]] = {}
    for i in range(cpu_workers):
        workers[f"cpu-{i}"] = {"cls": Nanny, "options": {"nthreads": 1}}
    for device in gpus:
        options: dict[str, Any] = {"nthreads": 1, "env": {"CUDA_VISIBLE_DEVICES": device}}
        if gpu_resources:
            options["resources"] = dict(GPU)
        workers[f"gpu-{device}"] = {"cls": Nanny, "options": options}
    scheduler = {"cls": Scheduler, "options": {"dashboard_address": None}}
    # set for this process, not for a block: a nanny restarting a lost worker later reads it
    dask.config.set(_config())
    return SpecCluster(workers=workers, scheduler=scheduler, silence_logs=40)


JOBQUEUES = ("slurm", "pbs", "lsf")


def jobqueue_cluster(table: Mapping[str, Any]) -> Any:
    """Workers as batch jobs (``[runner] jobqueue = "slurm"`` and that table's other keys,
    dask-jobqueue's own: cores, memory, queue, account, walltime, job_extra_directives, ...).
    Each job is one GPU worker; none is submitted until the cluster is scaled."""
    kind = table.get("jobqueue")
    if kind not in JOBQUEUES:
        raise ConfigError(f"[runner] jobqueue must be one of {', '.join(JOBQUEUES)}")
    try:
        import dask_jobqueue
    except ImportError:
        raise ConfigError("[runner] jobqueue needs dask-jobqueue",
                          hint="pip install -e '.[dask]'") from None
    cls = {"slurm": dask_jobqueue.SLURMCluster, "pbs": dask_jobqueue.PBSCluster,
           "lsf": dask_jobqueue.LSFCluster}[kind]
    options = {k: v for k, v in table.items() if k not in ("jobqueue", "runner", "workers",
                                                              "scheduler")}
    options.setdefault("processes", 1)
    options.setdefault("worker_extra_args", ["--resources", "GPU=1", "--nthreads", "1"])
    # the replay worker is a child process of the Dask worker
    options.setdefault("job_script_prologue", ["export DASK_DISTRIBUTED__WORKER__DAEMON=False"])
    import dask

    dask.config.set(_config())  # for this process: nannies restarting workers read it later
    return cls(**options)


def connect(address: str | None, cluster: Any = None, timeout_s: float = 60.0) -> Any:
    """A client of the scheduler at ``address``, or of ``cluster``; one clear error line if
    none answers."""
    from distributed import Client

    try:
        return Client(cluster if cluster is not None else address, timeout=timeout_s)
    except (OSError, TimeoutError) as exc:
        raise GpuUnavailable(f"no Dask scheduler answered at {address}: {exc}",
                             hint="check the address, or leave --scheduler out to start "
                             "a cluster on this machine") from None
