"""The local runner: the compile pool on this machine's cores, one replay worker per GPU.

Replays wait in one queue that every GPU's thread takes from, so a GPU that finishes early
takes the next candidate; compiles go to the pool as soon as they are asked for and a
candidate is queued for replay the moment its compile completes, so the GPUs replay while the
cores compile the rest of the batch.  Re-timing (interleaved rounds) runs on the first GPU
alone: samples that are compared must come from one device.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING

from r3tui.runners.base import ReplayJob, Runner, RunnerLoad, RunnerStats, WorkerLoad

if TYPE_CHECKING:
    from r3tui.compile.base import CompiledKernel, CompileRequest
    from r3tui.compile.pool import CompilePool
    from r3tui.domain import Measurement
    from r3tui.replay.worker import ReplayWorker, WorkerInfo
    from r3tui.runners.base import Replayer


class GpuReplayer:
    """A :class:`~r3tui.replay.worker.ReplayWorker` as a runner's replayer."""

    def __init__(self, worker: ReplayWorker) -> None:
        self.worker = worker

    def begin(self) -> None:
        self.worker.begin()

    def start(self) -> WorkerInfo:
        return self.worker.start()

    def evaluate(self, job: ReplayJob) -> Measurement:
        return self.worker.evaluate(job.candidate)

    def interleaved(self, jobs: list[ReplayJob], rounds: int) -> list[list[float]]:
        return self.worker.interleaved([j.candidate for j in jobs], rounds)

    def close(self) -> None:
        self.worker.close()


@dataclass
class _Gpu:
    name: str
    replayer: Replayer
    lock: threading.Lock
    thread: threading.Thread | None = None
    running: int = 0
    done: int = 0


class LocalRunner(Runner):
    """``replayers`` (one per GPU, started here) and ``pool``; the runner closes both."""

    name = "local"

    def __init__(self, replayers: Sequence[Replayer], pool: CompilePool,
                 while_starting: Callable[[], object] | None = None) -> None:
        if not replayers:
            raise ValueError("a local runner needs at least one replayer")
        self.pool = pool
        self._gpus = [_Gpu(f"gpu{i}", r, threading.Lock()) for i, r in enumerate(replayers)]
        self._jobs: queue.Queue[tuple[ReplayJob, Future[Measurement]] | None] = queue.Queue()
        self._count = threading.Lock()
        self._compiles = 0
        self._closed = False
        infos = []
        try:
            # every GPU's worker spawned first, then ``while_starting`` (the campaign's own
            # imports) runs here while they map the bundle, then each is waited for
            for gpu in self._gpus:
                if (begin := getattr(gpu.replayer, "begin", None)) is not None:
                    begin()
            if while_starting is not None:
                while_starting()
            for gpu in self._gpus:
                infos.append(gpu.replayer.start())
        except BaseException:
            self._close_replayers()
            raise
        archs = {i.arch for i in infos}
        if len(archs) > 1:
            self._close_replayers()
            from r3tui.errors import GpuUnavailable

            raise GpuUnavailable(f"the GPUs differ in architecture ({', '.join(sorted(archs))}): "
                                 "a campaign's candidates must be comparable; pick GPUs of one "
                                 "kind with CUDA_VISIBLE_DEVICES")
        self._info = infos[0]
        for gpu in self._gpus:
            gpu.thread = threading.Thread(target=self._serve, args=(gpu,), daemon=True,
                                          name=f"r3-replay-{gpu.name}")
            gpu.thread.start()

    @property
    def info(self) -> WorkerInfo:
        return self._info

    def compile(self, toolchain: str, request: CompileRequest) -> Future[CompiledKernel]:
        future = self.pool.submit(toolchain, request)
        with self._count:
            self._compiles += 1
        return future

    def replay(self, job: ReplayJob) -> Future[Measurement]:
        if self._closed:
            raise RuntimeError("the runner is closed")
        future: Future[Measurement] = Future()
        self._jobs.put((job, future))
        return future

    def _serve(self, gpu: _Gpu) -> None:
        while True:
            item = self._jobs.get()
            if item is None:
                self._jobs.put(None)  # the other GPUs' threads stop too
                return
            job, future = item
            if not future.set_running_or_notify_cancel():
                continue
            with gpu.lock:
                gpu.running = 1
                try:
                    measurement = gpu.replayer.evaluate(job)
                except BaseException as exc:  # the worker itself failed (it cannot start)
                    future.set_exception(exc)
                    continue
                finally:
                    gpu.running = 0
                gpu.done += 1
            future.set_result(measurement)

    def interleaved(self, jobs: list[ReplayJob], rounds: int) -> list[list[float]]:
        first = self._gpus[0]
        with first.lock:
            first.running = 1
            try:
                return first.replayer.interleaved(jobs, rounds)
            finally:
                first.running = 0

    def load(self) -> RunnerLoad:
        loads = [WorkerLoad(g.name, "gpu", g.running, g.done) for g in self._gpus]
        busy = len(self.pool.running())
        # the pool counts its compiles as a whole, not per process
        loads += [WorkerLoad(f"compile{i}", "cpu", int(i < busy), 0)
                  for i in range(self.pool.workers)]
        return RunnerLoad(tuple(loads), {"gpu": self._jobs.qsize(), "cpu": self.pool.queued()})

    def stats(self) -> RunnerStats:
        with self._count:
            compiles = self._compiles
        return RunnerStats(compiles=compiles, replays=sum(g.done for g in self._gpus))

    def _close_replayers(self) -> None:
        for gpu in self._gpus:
            gpu.replayer.close()

    def close(self) -> None:
        """Cancel what waits (nothing does once the engine has its results; a stopped or
        failed run does not wait for it), let the replays running now finish, stop."""
        if self._closed:
            return
        self._closed = True
        while True:
            try:
                item = self._jobs.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                item[1].cancel()
        self._jobs.put(None)
        for gpu in self._gpus:
            if gpu.thread is not None:
                gpu.thread.join()
        self._close_replayers()
        self.pool.close(cancel_pending=True)
