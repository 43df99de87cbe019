"""Evaluating configurations of one source variant through a runner.

:class:`KernelSource` is the source variant; :func:`compile_request` turns it and a
configuration into what the compile pool builds; :class:`ReplayEvaluator` compiles and
replays configurations on a runner (:mod:`r3tui.runners`) and re-times the finalists;
:class:`NotRetimed` says which configuration could not be re-timed and why.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING, cast

from r3tui.domain import Measurement, MeasurementStatus, TrialConfig
from r3tui.errors import RetimeFailed

if TYPE_CHECKING:
    from r3tui.compile.base import CompiledKernel, CompileRequest
    from r3tui.replay.candidate import Candidate
    from r3tui.runners import ReplayJob, Runner


@dataclass(frozen=True)
class KernelSource:
    """One source variant of the recorded kernel."""

    text: str
    kernel_name: str
    source_name: str = "kernel.cu"
    defines: tuple[tuple[str, str], ...] = ()  # the recording's own -D values
    include_dirs: tuple[str, ...] = ()
    # an application's kernel (a device unit): only its definition may change, since that is
    # what `r3 apply` writes back to the application's file
    confined: bool = False


def compile_request(source: KernelSource, config: TrialConfig, arch: str) -> CompileRequest:
    """What to compile for one configuration: launch bounds injected, tunables as -D."""
    from r3tui.compile.base import CompileRequest
    from r3tui.search import guard_defines, inject_launch_bounds

    text = source.text
    if config.tunables:
        # a tunable's own `#define` must yield to the -D value the search chose
        text = guard_defines(text, frozenset(config.tunables))
    if config.launch_bounds is not None:
        max_threads, min_blocks = config.launch_bounds
        text = inject_launch_bounds(text, source.kernel_name, max_threads, min_blocks)
    options = list(config.options)
    if config.pipeline:
        options.append(f"--passes={config.pipeline}")
    tunables = {k: str(v) for k, v in config.tunables.items()}
    defines = {**dict(source.defines), **tunables}
    return CompileRequest(
        source=text,
        kernel_name=source.kernel_name,
        arch=arch,
        options=tuple(options),
        defines=tuple(sorted(defines.items())),
        include_dirs=source.include_dirs,
        source_name=source.source_name,
    )


def compile_failure(compiled: CompiledKernel) -> Measurement:
    from r3tui.compile.base import first_error_line

    return Measurement(
        MeasurementStatus.COMPILE_ERROR,
        compile_time_s=compiled.seconds,
        error_text=first_error_line(compiled.log),
        compile_log=compiled.log,
    )


class ReplayEvaluator:
    """Evaluates configurations of one source variant on a runner (:mod:`r3tui.runners`).

    Every configuration's compile is submitted at once; each is queued for replay the moment
    its compile completes, so the GPUs replay while the cores compile the rest of the batch.
    Results come back in request order.
    """

    def __init__(self, source: KernelSource, runner: Runner, *, arch: str | None = None) -> None:
        self.source = source
        self.runner = runner
        self.arch = arch or runner.info.arch
        # what each successfully measured config ran as, for re-timing the finalists
        self.jobs: dict[str, ReplayJob] = {}

    def with_source(self, source: KernelSource) -> ReplayEvaluator:
        return ReplayEvaluator(source, self.runner, arch=self.arch)

    def candidate(self, config: TrialConfig, compiled: CompiledKernel) -> Candidate:
        from r3tui.replay.candidate import Candidate
        from r3tui.search.source import grid_scaling

        divisor, multiplier = grid_scaling(self.source.text, config.tunables)
        return Candidate.from_compiled(compiled, block=config.block,
                                       shared_mem_bytes=config.shared_mem_bytes,
                                       label=str(config.options), work_divisor=divisor,
                                       work_multiplier=multiplier)

    def submit(self, config: TrialConfig, batch: _Batch | None = None
               ) -> Future[tuple[Measurement | None, ReplayJob | None]]:
        """``config`` compiled, then replayed: its measurement and what it ran as (``None``
        for a configuration ``batch`` abandoned before its replay began)."""
        out: Future[tuple[Measurement | None, ReplayJob | None]] = Future()
        self._compile(config).add_done_callback(partial(self._compiled, config, out, batch))
        return out

    def _compile(self, config: TrialConfig) -> Future[CompiledKernel]:
        return self.runner.compile(config.toolchain,
                                   compile_request(self.source, config, self.arch))

    def _compiled(self, config: TrialConfig,
                  out: Future[tuple[Measurement | None, ReplayJob | None]],
                  batch: _Batch | None, compiling: Future[CompiledKernel]) -> None:
        from r3tui.runners import ReplayJob
        from r3tui.search import config_key

        try:
            compiled = compiling.result()
            if not compiled.ok:
                out.set_result((compile_failure(compiled), None))
                return
            if batch is not None and batch.hung:
                out.set_result((None, None))  # another configuration hung: not replayed
                return
            job = ReplayJob(self.candidate(config, compiled), config_key(config))
            replaying = self.runner.replay(job)
            if batch is not None:
                batch.add(replaying)
        except BaseException as exc:  # the runner failed, not the candidate
            out.set_exception(exc)
            return

        def replayed(done: Future[Measurement]) -> None:
            if done.cancelled() and batch is not None and batch.hung:
                out.set_result((None, None))  # another configuration of the batch hung
                return
            try:
                measured = done.result()
            except BaseException as exc:
                out.set_exception(exc)
                return
            if batch is not None and measured.status is MeasurementStatus.TIMEOUT:
                batch.abandon()
            out.set_result((replace(measured, compile_time_s=compiled.seconds), job))

        replaying.add_done_callback(replayed)

    def code_hash(self, config: TrialConfig) -> str | None:
        """The compiler's code hash of ``config`` (None where it does not compile): the compile
        the evaluation of ``config`` makes, which the compile cache then answers."""
        compiled = self._compile(config).result()
        return compiled.binary_sha256 if compiled.ok else None

    def start(self, configs: Sequence[TrialConfig], *, hang_ends_batch: bool = False
              ) -> Callable[[], list[Measurement | None]]:
        """Submit ``configs``; the returned call waits for their measurements (request order).

        With ``hang_ends_batch``, the first configuration that hangs (its replay timed out, a
        worker killed) ends the batch: the replays of the others that have not begun are
        cancelled and their entries are ``None`` (neither measured nor a failure).  A
        variant not yet shown to work is abandoned after a hang, so each further
        configuration would only cost the runner's whole timeout again."""
        from r3tui.search import config_key

        batch = _Batch() if hang_ends_batch else None
        pending = [self.submit(c, batch) for c in configs]

        def results() -> list[Measurement | None]:
            out: list[Measurement | None] = []
            for config, future in zip(configs, pending, strict=True):
                measured, job = future.result()
                if measured is not None and measured.ok and job is not None:
                    self.jobs[config_key(config)] = job
                out.append(measured)
            return out

        return results

    def evaluate(self, configs: Sequence[TrialConfig]) -> list[Measurement]:
        measured = self.start(configs)()
        assert all(m is not None for m in measured)  # only a batch that ends on a hang skips
        return cast("list[Measurement]", measured)

    def interleave_with(
        self, other: ReplayEvaluator, mine: TrialConfig, theirs: TrialConfig, rounds: int
    ) -> tuple[list[float], list[float]]:
        """Times of ``mine`` (this source) and ``theirs`` (``other``'s source), interleaved on
        one GPU round by round; both must have been measured OK before."""
        base, (times,) = self.interleave_many(other, mine, [theirs], rounds)
        return base, times

    def interleave_many(
        self, other: ReplayEvaluator, mine: TrialConfig, theirs: Sequence[TrialConfig],
        rounds: int,
    ) -> tuple[list[float], list[list[float]]]:
        """Times of ``mine`` (this source) and of each of ``theirs`` (``other``'s source), all
        interleaved on one GPU round by round; each must have been measured OK before."""
        from r3tui.search import config_key

        jobs = [self.jobs[config_key(mine)], *(other.jobs[config_key(c)] for c in theirs)]
        per_job = self.runner.interleaved(jobs, rounds)
        return list(per_job[0]), [list(times) for times in per_job[1:]]

    def retime(self, configs: Sequence[TrialConfig], rounds: int) -> list[list[float]]:
        """``samples[round][i]`` for ``configs`` (measured OK before), interleaved on one GPU."""
        from r3tui.search import config_key

        missing = [c for c in configs if config_key(c) not in self.jobs]
        if missing:
            for config, measured in zip(missing, self.evaluate(missing), strict=True):
                if config_key(config) not in self.jobs:
                    raise NotRetimed(config, measured)
        jobs = [self.jobs[config_key(c)] for c in configs]
        try:
            per_job = self.runner.interleaved(jobs, rounds)
        except RetimeFailed:
            # a launch that fails in re-timing although it measured (a candidate the worker
            # cannot launch again as it did): the one that fails alone is not re-timed, and
            # the caller goes on without it (sgemm, session 44: one such finalist stopped its
            # whole campaign); where none fails alone the error is the set's, and stands
            for config, job in zip(configs, jobs, strict=True):
                try:
                    self.runner.interleaved([job], 1)
                except RetimeFailed as alone:
                    raise NotRetimed(config, Measurement(
                        MeasurementStatus.LAUNCH_ERROR, error_text=alone.one_line(),
                        binary_sha256=job.candidate.binary_sha256)) from None
            raise
        return [[per_job[i][r] for i in range(len(configs))] for r in range(rounds)]


class _Batch:
    """The replays of one :meth:`ReplayEvaluator.start` batch, so that a hang can cancel the
    rest (runner futures whose replay has not begun cancel; running ones finish)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._replays: list[Future[Measurement]] = []
        self.hung = False

    def add(self, replaying: Future[Measurement]) -> None:
        with self._lock:
            if not self.hung:
                self._replays.append(replaying)
                return
        replaying.cancel()  # submitted while another configuration's hang was being told

    def abandon(self) -> None:
        with self._lock:
            self.hung = True
            replays, self._replays = self._replays, []
        for replaying in replays:
            replaying.cancel()


class NotRetimed(Exception):
    """A configuration to re-time that did not measure OK when it was evaluated for it (one
    the search never measured: the recorded one, or a finalist told on resume)."""

    def __init__(self, config: TrialConfig, measured: Measurement) -> None:
        detail = (measured.error_text or "").strip().splitlines()
        super().__init__(f"{measured.status.value}" + (f": {detail[0][:200]}" if detail else ""))
        self.config, self.measured = config, measured
