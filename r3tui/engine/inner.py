"""The loop: ask → (remix) → compile → replay → persist → tell.

This module wires the pure search core to the compile pool, the replay worker and the
experiment database.  The inner loop (one source variant, Bayesian optimization over its
compiler options, launch configuration and tunables) lives here; the outer loop builds on it.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from r3tui.domain import Measurement, MeasurementStatus, TrialConfig
from r3tui.engine.options import option

if TYPE_CHECKING:
    from db.session import Database
    from r3tui.compile.base import CompiledKernel, CompileRequest
    from r3tui.engine.gpu import RunnerSettings
    from r3tui.record.bundle import Bundle
    from r3tui.record.manifest import LaunchInfo
    from r3tui.replay.candidate import Candidate
    from r3tui.replay.worker import WorkerInfo
    from r3tui.runners import ReplayJob, Runner
    from r3tui.search import BayesSettings, Budget, DeviceLimits, InnerSearch, SearchSpace, Winner
    from r3tui.search.block import BlockFacts
    from r3tui.search.source import Tunable


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

    def submit(self, config: TrialConfig) -> Future[tuple[Measurement, ReplayJob | None]]:
        """``config`` compiled, then replayed: its measurement and what it ran as."""
        out: Future[tuple[Measurement, ReplayJob | None]] = Future()
        self._compile(config).add_done_callback(partial(self._compiled, config, out))
        return out

    def _compile(self, config: TrialConfig) -> Future[CompiledKernel]:
        return self.runner.compile(config.toolchain,
                                   compile_request(self.source, config, self.arch))

    def _compiled(self, config: TrialConfig, out: Future[tuple[Measurement, ReplayJob | None]],
                  compiling: Future[CompiledKernel]) -> None:
        from r3tui.runners import ReplayJob
        from r3tui.search import config_key

        try:
            compiled = compiling.result()
            if not compiled.ok:
                out.set_result((compile_failure(compiled), None))
                return
            job = ReplayJob(self.candidate(config, compiled), config_key(config))
            replaying = self.runner.replay(job)
        except BaseException as exc:  # the runner failed, not the candidate
            out.set_exception(exc)
            return

        def replayed(done: Future[Measurement]) -> None:
            try:
                measured = done.result()
            except BaseException as exc:
                out.set_exception(exc)
                return
            out.set_result((replace(measured, compile_time_s=compiled.seconds), job))

        replaying.add_done_callback(replayed)

    def code_hash(self, config: TrialConfig) -> str | None:
        """The compiler's code hash of ``config`` (None where it does not compile): the compile
        the evaluation of ``config`` makes, which the compile cache then answers."""
        compiled = self._compile(config).result()
        return compiled.binary_sha256 if compiled.ok else None

    def start(self, configs: Sequence[TrialConfig]) -> Callable[[], list[Measurement]]:
        """Submit ``configs``; the returned call waits for their measurements (request order)."""
        from r3tui.search import config_key

        pending = [self.submit(c) for c in configs]

        def results() -> list[Measurement]:
            out = []
            for config, future in zip(configs, pending, strict=True):
                measured, job = future.result()
                if measured.ok and job is not None:
                    self.jobs[config_key(config)] = job
                out.append(measured)
            return out

        return results

    def evaluate(self, configs: Sequence[TrialConfig]) -> list[Measurement]:
        return self.start(configs)()

    def interleave_with(
        self, other: ReplayEvaluator, mine: TrialConfig, theirs: TrialConfig, rounds: int
    ) -> tuple[list[float], list[float]]:
        """Times of ``mine`` (this source) and ``theirs`` (``other``'s source), interleaved on
        one GPU round by round; both must have been measured OK before."""
        from r3tui.search import config_key

        a = self.jobs[config_key(mine)]
        b = other.jobs[config_key(theirs)]
        per_job = self.runner.interleaved([a, b], rounds)
        return list(per_job[0]), list(per_job[1])

    def retime(self, configs: Sequence[TrialConfig], rounds: int) -> list[list[float]]:
        """``samples[round][i]`` for ``configs`` (measured OK before), interleaved on one GPU."""
        from r3tui.search import config_key

        missing = [c for c in configs if config_key(c) not in self.jobs]
        if missing:
            for config, measured in zip(missing, self.evaluate(missing), strict=True):
                if config_key(config) not in self.jobs:
                    raise NotRetimed(config, measured)
        jobs = [self.jobs[config_key(c)] for c in configs]
        per_job = self.runner.interleaved(jobs, rounds)
        return [[per_job[i][r] for i in range(len(configs))] for r in range(rounds)]


class NotRetimed(Exception):
    """A configuration to re-time that did not measure OK when it was evaluated for it (one
    the search never measured: the recorded one, or a finalist told on resume)."""

    def __init__(self, config: TrialConfig, measured: Measurement) -> None:
        detail = (measured.error_text or "").strip().splitlines()
        super().__init__(f"{measured.status.value}" + (f": {detail[0][:200]}" if detail else ""))
        self.config, self.measured = config, measured


# -- the inner loop ----------------------------------------------------------------------
@dataclass(frozen=True)
class InnerSettings:
    """How one variant's configurations are searched."""

    # the fields with an option() are the user's: flags and r3.toml's [search] section
    strategy: str = option("bayes", "--strategy", "how configurations are chosen",
                           choices=("bayes", "random", "exhaustive"))
    estimator: str = option("GP", "--estimator", "surrogate model of the Bayesian search",
                            choices=("GP", "RF", "ET"))
    bayes: str = option("defaults", "--bo", "more settings of the Bayesian search, e.g. "
                        "acq_func=EI,xi=0.05 (a wrong NAME lists the valid ones)",
                        metavar="NAME=VALUE,...")
    # configurations asked at once, so the compile pool stays busy
    batch: int = option(8, "--batch", "configurations asked at once")
    # batches evaluated at once: with 2 the next batch is asked, and compiled, while one is
    # replayed, so the GPU does not wait for the search or the compiler (the search asks it
    # with the batch in flight as pending points)
    in_flight: int = option(2, "--in-flight", "batches evaluated at once (1: ask each batch "
                            "after the last one's results)")
    finalists: int = 3  # best configurations re-timed against the baseline
    rounds: int = 9  # interleaved re-timing rounds
    seed: int = 0
    toolchain: str = "nvrtc"
    launch_bounds: bool = option(True, "--no-launch-bounds", "do not search __launch_bounds__",
                                 negate=True)  # inject __launch_bounds__ as a dimension
    # the most threads per block the application launches the kernel with over all its
    # recorded configurations (with_app_limits): injected bounds below it would fail those
    # launches in the application, so the search never tries them (0: the recorded block only)
    launch_bounds_floor: int = 0
    # the application's host code computes the kernel's grid (any bundle of an application
    # recording): a `// r3: work_per_thread` tunable is held at 1, since r3 apply could not
    # ship a smaller grid
    grid_fixed: bool = False


@dataclass(frozen=True)
class InnerResult:
    trials: int
    failures: dict[str, int]
    best: TrialConfig | None
    best_s: float | None
    winner: Winner | None
    # what the space did with the block (SearchSpace.launch_notes): fixed shapes and why
    launch_notes: tuple[str, ...] = ()
    campaign_id: int | None = None  # where run_inner_campaign stored the trials


def with_app_limits(settings: InnerSettings, bundle_path: Path) -> InnerSettings:
    """``settings`` for a bundle of an application recording (unchanged for a kernel
    recording, also when `r3 tune` is given the bundle directly): no ``__launch_bounds__``
    below a block the application launches the kernel with, and no smaller grid (its host
    code computes the grid)."""
    from r3tui.engine.app_recording import most_threads_launched

    most = most_threads_launched(bundle_path)
    return replace(settings, launch_bounds_floor=max(settings.launch_bounds_floor, most),
                   grid_fixed=settings.grid_fixed or most > 0)


def build_space(
    launch: LaunchInfo, source: KernelSource, settings: InnerSettings, limits: DeviceLimits
) -> SearchSpace:
    """The variant's space: the toolchain's options, the launch, the source's tunables."""
    from r3tui.compile.llvm import PIPELINES
    from r3tui.compile.options import accepted_options
    from r3tui.search import (
        LaunchSpec,
        SearchSpace,
        option_dims,
        parse_relations,
        parse_shared,
        parse_tunables,
    )
    from r3tui.search.source import Tunable, grid_tunables

    specs = [s for s in accepted_options(settings.toolchain) if s.name != "passes"]
    tunables = parse_tunables(source.text)
    per_thread = grid_tunables(source.text)
    fixed = None
    app = source.confined or settings.grid_fixed
    if per_thread and (app or launch.work is None):
        # an application's host code computes its grid: r3 apply cannot divide it
        fixed = (f"{', '.join(sorted(per_thread))} fixed at 1: "
                 + ("the application's host code computes the grid" if app
                    else "no work size recorded to derive a smaller grid from"))
        tunables = tuple(Tunable(t.name, (1,), 1) if t.name in per_thread else t
                         for t in tunables)
    space = SearchSpace.from_parts(
        option_dims(specs),
        LaunchSpec.of(launch, facts=launch_facts(launch, source, tunables)),
        tunables,
        parse_relations(source.text),
        limits,
        include_launch_bounds=settings.launch_bounds,
        launch_bounds_floor=settings.launch_bounds_floor,
        pipelines=list(PIPELINES) if settings.toolchain == "llvm" else None,
        toolchain=settings.toolchain,
        shared=parse_shared(source.text),
    )
    if fixed is not None:
        space._launch_notes.append(fixed)
    return space


def launch_facts(
    launch: LaunchInfo, source: KernelSource, tunables: Sequence[Tunable] = ()
) -> BlockFacts | None:
    """What the variant's source says about the kernel's block (fixed axes and why, macros
    tied to the block, its own launch bounds); None where the recording already keeps the
    block as it is."""
    from r3tui.search.block_source import block_facts

    if not launch.block_tunable or launch.work is None:
        return None
    name = source.kernel_name
    if name.startswith("_Z"):  # a mangled symbol: the parser knows the plain name
        from r3tui.record.sources import qualified_name

        demangled = qualified_name(name)
        name = demangled.name if demangled is not None else name
    declared = {t.name: [v for v in t.values if isinstance(v, int)] for t in tunables
                if t.numeric}
    return block_facts(source.text, name, launch.block, source.defines, declared)


def make_strategy(space: SearchSpace, settings: InnerSettings) -> InnerSearch:
    from r3tui.search.simulation import make_search

    bayes = bayes_settings(settings) if settings.strategy == "bayes" else None
    return make_search(settings.strategy, space, settings.seed, bayes)


def bayes_settings(settings: InnerSettings) -> BayesSettings:
    """The Bayesian search's settings: ``--estimator``, then the ``--bo`` spec over it."""
    from r3tui.search import BayesSettings

    return BayesSettings.parse(settings.bayes, estimator=settings.estimator)


Progress = Callable[["InnerSearch"], None]


class Evaluator(Protocol):
    """What the inner loop needs: :class:`ReplayEvaluator` on a GPU.  An evaluator that also
    has ``start(configs)`` (submit now, the returned call waits) can have several batches in
    flight; one that has only ``evaluate`` is asked one batch at a time."""

    def evaluate(self, configs: Sequence[TrialConfig]) -> list[Measurement]: ...

    def retime(self, configs: Sequence[TrialConfig], rounds: int) -> list[list[float]]: ...


def _start(evaluator: Evaluator, configs: list[TrialConfig]) -> Callable[[], list[Measurement]]:
    start = getattr(evaluator, "start", None)
    if start is not None:
        return start(configs)
    measured = evaluator.evaluate(configs)
    return lambda: measured


def run_inner(
    database: Database,
    campaign_id: int,
    variant_id: int,
    search: InnerSearch,
    evaluator: Evaluator,
    budget: Budget,
    settings: InnerSettings,
    progress: Progress | None = None,
    *,
    give_up_after: int | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> InnerResult:
    """Search one variant: ask a batch, evaluate it, store every trial, tell; then re-time.

    With ``settings.in_flight`` 2 the next batch is asked and submitted before the last one's
    results are told (its configurations pending), so the runner always has work.  Each
    batch's trials are committed together before they are told, so a kill loses at most the
    batches in flight and a resume tells exactly what is stored.  ``give_up_after``
    abandons a variant whose first that many trials all failed (a child that does not compile
    or verify costs a few trials, not a whole budget); ``should_stop`` is polled between batches.
    """
    from db import repository as repo
    from r3tui.search import choose_winner, config_key

    trial_ids: dict[str, int] = {}
    flight: deque[tuple[list[TrialConfig], Callable[[], list[Measurement]]]] = deque()
    # an evaluator that measures as it is asked gains nothing from a second batch in flight
    depth = max(1, settings.in_flight) if hasattr(evaluator, "start") else 1
    stopped = False
    while True:
        while not stopped and len(flight) < depth:
            if should_stop is not None and should_stop():
                stopped = True
                break
            if search.done(budget):
                break
            if (
                give_up_after is not None
                and search.n_evaluated >= give_up_after
                and search.best() is None
            ):
                stopped = True
                break
            unproven = give_up_after is not None and search.best() is None
            if unproven and flight:
                break  # until something works, one batch at a time
            remaining = search.remaining(budget)
            batch = settings.batch if remaining is None else min(settings.batch, remaining)
            if give_up_after is not None and unproven:
                # until something works, ask only as many as may be wasted
                batch = max(1, min(batch, give_up_after - search.n_evaluated))
            configs = search.ask(batch) if batch > 0 else []
            if not configs:
                break
            flight.append((configs, _start(evaluator, configs)))
        if not flight:
            break
        configs, results = flight.popleft()
        measurements = results()
        with database.session_scope() as s:
            rows = [
                repo.NewTrial(campaign_id, variant_id, c, m)
                for c, m in zip(configs, measurements, strict=True)
            ]
            ids = repo.insert_trials(s, rows)
        for config, measurement, trial_id in zip(configs, measurements, ids, strict=True):
            search.tell(config, measurement)
            trial_ids[config_key(config)] = trial_id
        if progress:
            progress(search)

    failures: dict[str, int] = {}
    for record in search.history:
        if not record.ok:
            reason = str(record.status) if record.status else "invalid"
            failures[reason] = failures.get(reason, 0) + 1
    best = search.best()
    winner = None
    finalists = search.finalists(settings.finalists)
    baseline = search.space.baseline_config()
    unmeasured = ""  # why the recorded configuration could not be re-timed
    while finalists:
        try:
            winner = choose_winner(finalists, baseline, evaluator.retime,
                                   rounds=settings.rounds)
            break
        except NotRetimed as exc:
            if config_key(exc.config) == config_key(baseline):
                # no speedup can be stated against a configuration that does not run
                unmeasured = f"the recorded configuration did not measure to re-time: {exc}"
                break
            finalists = [f for f in finalists if config_key(f) != config_key(exc.config)]
    with database.session_scope() as s:
        best_id = trial_ids.get(config_key(winner.config)) if winner else None
        if winner is not None and best_id is None:
            # the winner came from trials told on resume: find its stored row
            for stored in repo.finished_trials(s, campaign_id, variant_id=variant_id):
                if config_key(stored.config) == config_key(winner.config):
                    best_id = stored.id
        if best_id is not None:
            repo.update_variant(s, variant_id, best_trial_id=best_id)
        repo.add_event(
            s,
            campaign_id,
            "inner_done",
            f"{search.n_evaluated} trials; "
            + (
                f"winner {winner.speedup:.3f}x [{winner.best.low:.3f}, {winner.best.high:.3f}] "
                f"over the recorded configuration"
                if winner
                else unmeasured or "no configuration succeeded"
            ),
            {
                "variant_id": variant_id,
                "failures": failures,
                "winner": winner.config.to_json() if winner else None,
                "speedup": winner.speedup if winner else None,
                "ci": [winner.best.low, winner.best.high] if winner else None,
                # ancestors' trials its model was told (a child's prior), when it has one
                "prior_points": sum(len(g) for g in search.prior),
            },
        )
    return InnerResult(
        search.n_evaluated,
        failures,
        best[0] if best else None,
        best[1] if best else None,
        winner,
    )


@dataclass(frozen=True)
class InnerCampaign:
    """``r3 tune BUNDLE --inner-only``: the recorded source alone, its configurations searched."""

    bundle_path: Path
    db_path: Path
    budget_trials: int | None = 50
    budget_seconds: float | None = None
    settings: InnerSettings = InnerSettings()
    resume_campaign: int | None = None
    name: str | None = None
    timeout_s: float = 60.0  # per candidate, before the watchdog restarts the worker
    runner: RunnerSettings | None = None  # where candidates run (None: the local runner)


def seed_source(bundle: Bundle) -> KernelSource:
    """What a search on ``bundle`` starts from: the recorded source, or the device unit of an
    application's kernel (:mod:`r3tui.engine.unit_source`)."""
    from r3tui.engine.unit_source import seed_unit

    return seed_unit(bundle).source


def provenance(info: WorkerInfo, toolchain: str) -> dict[str, object]:
    from r3tui.compile.base import get_toolchain

    return {
        "gpu": info.gpu,
        "arch": info.arch,
        "driver_version": info.driver_version,
        "toolchain": toolchain,
        "toolchain_version": get_toolchain(toolchain).version(),
        "limits": dict(info.limits),
    }


def device_limits(info: WorkerInfo | None) -> DeviceLimits:
    """The launch limits of the worker's GPU (shared memory up to the opt-in limit), or the
    conservative defaults (48 KiB of shared memory) where no GPU has reported them."""
    from r3tui.search import DeviceLimits

    return DeviceLimits.from_json(info.limits) if info is not None and info.limits else (
        DeviceLimits())


def run_inner_campaign(job: InnerCampaign, progress: Progress | None = None) -> InnerResult:
    """Record-replay + BO on the original source, every trial in the experiment database."""
    from db import repository as repo
    from db.session import open_database
    from r3tui.domain import Campaign, CampaignStatus, Variant, VariantOrigin
    from r3tui.engine.lifecycle import campaign_run, finish
    from r3tui.engine.unit_source import preflight, searched_launch, seed_unit
    from r3tui.errors import R3Error
    from r3tui.record.bundle import Bundle
    from r3tui.record.registration import recording_of
    from r3tui.search import Budget

    bundle = Bundle.open(job.bundle_path, verify=True)
    manifest = bundle.manifest
    seed = seed_unit(bundle)
    source = seed.source
    launch, kept = searched_launch(bundle, seed)
    text = source.text
    settings = job.settings
    database = open_database(job.db_path, create=True, upgrade=True)
    from r3tui.engine.gpu import open_runner, report_load

    with open_runner(job.bundle_path, job.timeout_s, job.runner) as runner:
        info = runner.info
        # before any campaign row: an original that does not compile ends here, in one line
        checked = preflight(source, settings.toolchain, info.arch)
        settings = with_app_limits(replace(settings, toolchain=checked.toolchain),
                                   job.bundle_path)
        with database.session_scope() as s:
            if job.resume_campaign is None:
                recording_id = repo.add_recording(s, recording_of(bundle), manifest.to_json())
                campaign_id = repo.create_campaign(
                    s,
                    Campaign(
                        name=job.name or f"{manifest.kernel.name}-inner",
                        recording_id=recording_id,
                        seed=settings.seed,
                        settings={
                            "mode": "inner-only",
                            **settings.__dict__,
                            "budget_trials": job.budget_trials,
                            "budget_seconds": job.budget_seconds,
                        },
                        provenance=provenance(info, settings.toolchain),
                        status=CampaignStatus.RUNNING,
                    ),
                )
                variant_id = repo.add_variant(s, Variant(campaign_id, text, VariantOrigin.SEED))
                history = []
            else:
                campaign_id = job.resume_campaign
                if repo.get_campaign(s, campaign_id) is None:
                    raise R3Error(f"no campaign {campaign_id} in {job.db_path}")
                seeds = [
                    v
                    for v in repo.campaign_variants(s, campaign_id)
                    if v.origin is VariantOrigin.SEED
                ]
                if not seeds or seeds[0].id is None:
                    raise R3Error(f"campaign {campaign_id} has no seed variant to resume")
                variant_id = seeds[0].id
                history = [
                    (t.config, t.measurement)
                    for t in repo.finished_trials(s, campaign_id, variant_id=variant_id)
                ]
                repo.set_campaign_status(s, campaign_id, CampaignStatus.RUNNING)
            repo.add_event(
                s,
                campaign_id,
                "start" if not history else "resume",
                f"inner search on {info.gpu}, {len(history)} trials already stored"
                + (f"; {checked.note}" if checked.note else ""),
            )
            if info.l2_note:
                repo.add_event(s, campaign_id, "timing", info.l2_note)
        space = build_space(launch, source, settings, device_limits(info))
        notes = [kept] if kept else []
        if space.launch_notes() or notes:
            with database.session_scope() as s:
                repo.add_event(s, campaign_id, "launch",
                               "; ".join([*notes, *space.launch_notes()]))
        search = make_strategy(space, settings)
        search.resume(history)
        budget = Budget(max_trials=job.budget_trials, max_seconds=job.budget_seconds)
        started = time.monotonic()
        with campaign_run(database, campaign_id), report_load(database, campaign_id, runner):
            evaluator = ReplayEvaluator(source, runner)
            result = run_inner(
                database, campaign_id, variant_id, search, evaluator, budget, settings, progress
            )
        finish(database, campaign_id, CampaignStatus.FINISHED,
               f"{result.trials} trial(s) done", {"wall_s": time.monotonic() - started})
    database.close()
    return replace(result, launch_notes=space.launch_notes(), campaign_id=campaign_id)
