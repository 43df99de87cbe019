"""A pool of compiler processes that keeps every CPU core busy while the GPU replays.

Why processes and not threads: a crash or a runaway compile inside NVRTC would take the engine
down with it, and processes use every core whatever the bindings do with the GIL.  Why not
``ProcessPoolExecutor``: when one of its workers dies every pending future fails with
``BrokenProcessPool`` and nobody knows which request killed it.  Here each worker runs one
request at a time over its own pipe, so a worker that dies (a segfault in the compiler, the OOM
killer) fails exactly the request it was compiling, as a value —
``CompiledKernel(ok=False, log="compiler process crashed: ...")`` — and a fresh worker takes its
place.  A compile that runs past ``timeout_s`` is killed the same way.

Workers start with the ``spawn`` method: the parent runs a dispatcher thread, and forking a
threaded process can copy a held lock into the child.  As with any spawning pool, a script that
creates one must guard its entry point with ``if __name__ == "__main__":`` (the ``r3`` console
script does), because each worker imports the parent's main module.

The cache is consulted in the parent before anything is sent and filled when a result comes
back; a request whose key is already being compiled waits for that compile instead of starting
a second one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import multiprocessing
import os
import signal
import threading
import time
import traceback
from collections import deque
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from types import TracebackType
from typing import Any

from r3tui import errors
from r3tui.compile.base import CompiledKernel, CompileRequest, Toolchain, cache_key, get_toolchain
from r3tui.compile.cache import CompileCache

log = logging.getLogger(__name__)

# Workers that die before they are ready this many times in a row mean the environment is
# broken (an import fails); the queued requests then fail instead of respawning forever.
MAX_START_FAILURES = 3


@dataclass
class _Job:
    id: int
    toolchain: str
    version: str
    request: CompileRequest
    key: str
    futures: list[Future[CompiledKernel]]
    started: float = 0.0


@dataclass
class _Worker:
    process: BaseProcess
    conn: Connection
    ready: bool = False
    job: _Job | None = None


class CompilePool:
    """Compile requests on ``workers`` processes (default: one per CPU core)."""

    def __init__(
        self,
        workers: int | None = None,
        cache: CompileCache | None = None,
        *,
        timeout_s: float | None = 600.0,
        start_method: str = "spawn",
    ) -> None:
        self.workers = max(1, workers or os.cpu_count() or 1)
        self.cache = cache
        self.timeout_s = timeout_s
        # Any: typeshed's BaseContext lacks .Process, which every concrete context has.
        self._context: Any = multiprocessing.get_context(start_method)
        self._lock = threading.Lock()
        self._queue: deque[_Job] = deque()
        self._inflight: dict[str, _Job] = {}
        self._pool: list[_Worker] = []
        self._ids = itertools.count()
        self._wake_reader, self._wake_writer = multiprocessing.Pipe(duplex=False)
        self._toolchains: dict[str, Toolchain] = {}
        self._thread: threading.Thread | None = None
        self._closing = False
        self._start_failures = 0

    def submit(self, toolchain_name: str, req: CompileRequest) -> Future[CompiledKernel]:
        """Queue ``req``; :class:`~r3tui.errors.ConfigError` at once for a bad request."""
        if self._closing:
            raise RuntimeError("the compile pool is closed")
        toolchain = self._toolchain(toolchain_name)
        toolchain.validate(req)
        key = cache_key(toolchain, req)
        future: Future[CompiledKernel] = Future()
        hit = self.cache.get(key) if self.cache is not None else None
        if hit is not None:
            future.set_result(hit)
            return future
        with self._lock:
            job = self._inflight.get(key)
            if job is not None:
                job.futures.append(future)
                return future
            job = _Job(next(self._ids), toolchain_name, toolchain.version(), req, key, [future])
            self._inflight[key] = job
            self._queue.append(job)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._dispatch, name="r3-compile-pool", daemon=True
                )
                self._thread.start()
        self._wake()
        return future

    def map(self, toolchain_name: str, reqs: Iterable[CompileRequest]) -> list[CompiledKernel]:
        """Compile all ``reqs`` in parallel; results in the order of ``reqs``."""
        futures = [self.submit(toolchain_name, req) for req in reqs]
        return [future.result() for future in futures]

    def running(self) -> dict[int, CompileRequest]:
        """Worker pid -> the request it is compiling now."""
        with self._lock:
            return {w.process.pid or 0: w.job.request for w in self._pool if w.job is not None}

    def queued(self) -> int:
        """Requests waiting for a worker (a status bar's load)."""
        with self._lock:
            return len(self._queue)

    def close(self, cancel_pending: bool = False) -> None:
        """Finish every submitted request (or cancel the queued ones and kill running
        compiles when ``cancel_pending``), then stop the workers."""
        cancelled: list[Future[CompiledKernel]] = []
        with self._lock:
            self._closing = True
            if cancel_pending:
                for job in list(self._queue) + [w.job for w in self._pool if w.job]:
                    cancelled.extend(job.futures)
                    self._inflight.pop(job.key, None)
                self._queue.clear()
                for worker in self._pool:
                    if worker.job is not None:
                        worker.job = None
                        worker.process.kill()
            thread = self._thread
        for future in cancelled:
            future.cancel()
        self._wake()
        if thread is not None:
            thread.join()
        self._wake_reader.close()
        self._wake_writer.close()

    def __enter__(self) -> CompilePool:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(cancel_pending=exc is not None)

    # -- parent side ---------------------------------------------------------------------

    def _toolchain(self, name: str) -> Toolchain:
        if name not in self._toolchains:
            self._toolchains[name] = get_toolchain(name)
        return self._toolchains[name]

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_writer.send_bytes(b"x")

    def _dispatch(self) -> None:
        try:
            while True:
                with self._lock:
                    busy = any(w.job is not None for w in self._pool)
                    if self._closing and not self._queue and not busy:
                        break
                    self._assign()
                    waitables: list[Any] = [self._wake_reader]
                    waitables += [w.conn for w in self._pool]
                    waitables += [w.process.sentinel for w in self._pool]
                    timeout = self._next_deadline()
                ready = wait(waitables, timeout)
                if self._wake_reader in ready:
                    while self._wake_reader.poll():
                        self._wake_reader.recv_bytes()
                for worker in list(self._pool):
                    if worker.conn in ready:
                        self._receive(worker)
                for worker in list(self._pool):
                    if worker.process.sentinel in ready and not worker.process.is_alive():
                        self._lost(worker, _exit_reason(worker.process))
                self._expire()
        except BaseException as exc:  # a bug here must not leave callers waiting forever
            log.exception("compile pool dispatcher failed")
            self._fail_all(f"compile pool failed: {exc!r}")
        finally:
            self._stop_workers()

    def _assign(self) -> None:
        idle = [w for w in self._pool if w.ready and w.job is None]
        while self._queue and idle:
            worker = idle.pop()
            job = self._queue.popleft()
            try:
                worker.conn.send((job.id, job.toolchain, job.version, job.key, job.request))
            except OSError:
                self._queue.appendleft(job)  # never started: another worker takes it
                continue
            job.started = time.monotonic()
            worker.job = job
        starting = sum(1 for w in self._pool if not w.ready)
        wanted = min(len(self._queue) - starting, self.workers - len(self._pool))
        for _ in range(max(wanted, 0)):
            self._spawn()

    def _spawn(self) -> None:
        parent, child = self._context.Pipe()
        process = self._context.Process(
            target=_worker_main, args=(child,), name="r3-compile-worker", daemon=True
        )
        process.start()
        child.close()
        self._pool.append(_Worker(process, parent))

    def _receive(self, worker: _Worker) -> None:
        try:
            message = worker.conn.recv()
        except (EOFError, OSError):
            self._lost(worker, _exit_reason(worker.process, wait_s=1.0))
            return
        if message[0] == "ready":
            worker.ready = True
            self._start_failures = 0
            return
        _, job_id, result, error = message
        job = worker.job
        worker.job = None
        if job is None or job.id != job_id:
            return  # cancelled by close()
        if error is not None:
            self._finish(job, exception=_rebuild_error(*error))
        else:
            self._finish(job, result)

    def _lost(self, worker: _Worker, why: str) -> None:
        with self._lock:
            if worker in self._pool:
                self._pool.remove(worker)
            if not worker.ready:
                self._start_failures += 1
        worker.conn.close()
        job, worker.job = worker.job, None
        if job is not None:
            request = job.request
            text = (
                f"compiler process crashed: {why} while compiling {request.kernel_name!r} "
                f"({job.toolchain}, {request.arch}, options {' '.join(request.options) or 'none'})"
            )
            self._fail_job(job, text)
        elif self._start_failures >= MAX_START_FAILURES:
            self._fail_all(f"compiler process could not start: {why}")

    def _expire(self) -> None:
        if self.timeout_s is None:
            return
        now = time.monotonic()
        for worker in list(self._pool):
            job = worker.job
            if job is not None and now - job.started > self.timeout_s:
                worker.process.kill()
                worker.process.join(5)
                with self._lock:
                    self._pool.remove(worker)
                worker.conn.close()
                worker.job = None
                text = (
                    f"compile timed out after {self.timeout_s:g} s; the compiler process "
                    f"was killed while compiling {job.request.kernel_name!r}"
                )
                self._fail_job(job, text)

    def _fail_job(self, job: _Job, text: str) -> None:
        """End ``job`` as a failed compile whose log is ``text``."""
        failure = CompiledKernel.failure(
            (job.toolchain, job.version),
            text,
            cache_key=job.key,
            seconds=time.monotonic() - job.started,
        )
        self._finish(job, failure)

    def _next_deadline(self) -> float | None:
        if self.timeout_s is None:
            return None
        deadlines = [w.job.started + self.timeout_s for w in self._pool if w.job is not None]
        return max(0.0, min(deadlines) - time.monotonic()) + 0.01 if deadlines else None

    def _finish(
        self,
        job: _Job,
        result: CompiledKernel | None = None,
        exception: BaseException | None = None,
    ) -> None:
        with self._lock:
            self._inflight.pop(job.key, None)
        if result is not None and self.cache is not None:
            self.cache.put(result)
        # Outside the lock: a done-callback may submit again.
        for index, future in enumerate(job.futures):
            if future.done():
                continue
            if exception is not None:
                future.set_exception(exception)
            elif result is not None:
                # Requests that joined a compile already running did not compile anything.
                shared = dataclasses.replace(result, cached=True, seconds=0.0)
                future.set_result(result if index == 0 else shared)

    def _fail_all(self, text: str) -> None:
        with self._lock:
            jobs = list(self._queue) + [w.job for w in self._pool if w.job is not None]
            self._queue.clear()
        for job in jobs:
            self._finish(
                job, CompiledKernel.failure((job.toolchain, job.version), text, cache_key=job.key)
            )

    def _stop_workers(self) -> None:
        with self._lock:
            workers, self._pool = self._pool, []
        for worker in workers:
            with contextlib.suppress(OSError):
                worker.conn.send(None)
        for worker in workers:
            worker.process.join(5)
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join(5)
            worker.conn.close()


def _exit_reason(process: BaseProcess, wait_s: float = 0.0) -> str:
    process.join(wait_s)
    code = process.exitcode
    if code is None:
        return "its pipe closed"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


def _rebuild_error(name: str, message: str, hint: str | None) -> BaseException:
    cls = getattr(errors, name, None)
    if not (isinstance(cls, type) and issubclass(cls, errors.R3Error)):
        cls = errors.ToolchainError
    return cls(message, hint=hint)


# -- worker side -------------------------------------------------------------------------


def _worker_main(conn: Connection) -> None:
    """One compiler process: compile the requests the parent sends, one at a time."""
    # Ctrl-C reaches the whole process group; the parent decides what to stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    conn.send(("ready",))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        job_id, toolchain_name, version, key, request = message
        try:
            reply: tuple[Any, ...] = (
                "done",
                job_id,
                get_toolchain(toolchain_name).compile(request),
                None,
            )
        except errors.R3Error as exc:
            reply = ("done", job_id, None, (type(exc).__name__, str(exc), exc.hint))
        except Exception:
            text = f"compiler process error:\n{traceback.format_exc()}"
            failure = CompiledKernel.failure((toolchain_name, version), text, cache_key=key)
            reply = ("done", job_id, failure, None)
        try:
            conn.send(reply)
        except OSError:
            return
