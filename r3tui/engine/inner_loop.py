"""The inner loop: one source variant's configurations searched on an evaluator.

:class:`InnerSettings` says how (strategy, batch, finalists); :func:`build_space` and
:func:`make_strategy` make the variant's search space and search; :func:`run_inner` asks,
evaluates, stores and tells batch by batch, then re-times the finalists against the
recorded configuration.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, cast

from r3tui.domain import Measurement, MeasurementStatus, TrialConfig
from r3tui.engine.evaluator import NotRetimed
from r3tui.engine.options import option

if TYPE_CHECKING:
    from db.session import Database
    from r3tui.engine.evaluator import KernelSource
    from r3tui.record.manifest import LaunchInfo
    from r3tui.search import BayesSettings, Budget, DeviceLimits, InnerSearch, SearchSpace, Winner
    from r3tui.search.block import BlockFacts
    from r3tui.search.source import Tunable


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
    # the application's host code computes the kernel's grid in a way r3 apply cannot rescale
    # (a bundle of an application recording whose unit launches the kernel other than by
    # `<<<grid, ...>>>`, or not at all): a `// r3: work_per_thread` tunable is held at 1
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
    below a block the application launches the kernel with, and the grid held as recorded
    where ``r3 apply`` could not rescale it in the host code (:func:`grid_fixed_reason`)."""
    from r3tui.engine.app_recording import most_threads_launched

    most = most_threads_launched(bundle_path)
    fixed = most > 0 and grid_fixed_reason(bundle_path) is not None
    return replace(settings, launch_bounds_floor=max(settings.launch_bounds_floor, most),
                   grid_fixed=settings.grid_fixed or fixed)


def grid_fixed_reason(bundle_path: Path) -> str | None:
    """Why ``r3 apply`` could not ship a grid other than the application's for the kernel of
    ``bundle_path`` (an application's bundle): the recorded unit, where the host code is,
    launches it other than by ``<<<grid, ...>>>`` or not at all.  None: every launch there
    can take the grid a variant's ``work_per_thread`` / ``threads_per_item`` asks for."""
    from r3tui.engine.splice import grid_launches
    from r3tui.errors import R3Error
    from r3tui.record.bundle import Bundle

    try:
        bundle = Bundle.open(bundle_path)
        text = bundle.source()
    except R3Error as exc:  # nothing to read the launches from: the grid stays
        return str(exc)
    if text is None:
        return "the bundle holds no source"
    return grid_launches(text, bundle.manifest.kernel.name)[1]


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
    if per_thread and (settings.grid_fixed or launch.work is None):
        # an application's host code computes its grid where r3 apply cannot rescale it
        fixed = (f"{', '.join(sorted(per_thread))} fixed at 1: "
                 + ("the application's host code computes the grid" if settings.grid_fixed
                    else "no work size recorded to derive a smaller grid from"))
        tunables = tuple(Tunable(t.name, (1,), 1) if t.name in per_thread else t
                         for t in tunables)
    exact, exact_note = exact_grid_relations(launch, source)
    space = SearchSpace.from_parts(
        option_dims(specs),
        LaunchSpec.of(launch, facts=launch_facts(launch, source, tunables)),
        tunables,
        (*parse_relations(source.text), *exact),
        limits,
        include_launch_bounds=settings.launch_bounds,
        launch_bounds_floor=settings.launch_bounds_floor,
        pipelines=list(PIPELINES) if settings.toolchain == "llvm" else None,
        toolchain=settings.toolchain,
        shared=parse_shared(source.text),
    )
    if fixed is not None:
        space._launch_notes.append(fixed)
    if exact_note is not None:
        space._launch_notes.append(exact_note)
    return space


def exact_grid_relations(launch: LaunchInfo, source: KernelSource
                         ) -> tuple[tuple[str, ...], str | None]:
    """The relations that keep a launch's grid covering the work exactly along the axes where
    the kernel does not check its index against a bound (``unchecked_axes``) or its source
    says so (``// r3: exact``): the block, times the elements a thread covers along the axis
    and over the threads that share one, divides the recorded work.  A grid past the work
    would run such a kernel past its arrays.  None where there is no work size (the grid
    stays the recorded one) or the recorded launch itself does not cover its work exactly
    (the kernel then bounds its index some way this reading does not see); and a note."""
    from r3tui.search.source import AXES, parse_grid_scaling

    if launch.work is None:
        return (), None
    axes = exact_axes(source.text, source.kernel_name)
    scaling = parse_grid_scaling(source.text)
    relations, kept = [], []
    for axis in (a for a in AXES if a in axes):
        k = AXES.index(axis)
        work, block = launch.work.as_tuple()[k], launch.block.as_tuple()[k]
        if work % block != 0:
            continue
        per = scaling.get(("work_per_thread", axis), "1")
        share = scaling.get(("threads_per_item", axis), "1")
        relations.append(f"({work} * {share}) % (BLOCK_{axis.upper()} * {per}) == 0")
        kept.append(axis)
    if not kept:
        return (), None
    return tuple(relations), (
        f"{' and '.join(f'block.{a}' for a in kept)}: only grids that cover the work exactly "
        "(the kernel does not check its index against a bound along "
        + ("it" if len(kept) == 1 else "them") + ")")


def exact_axes(text: str, kernel: str) -> tuple[str, ...]:
    """The axes along which a grid must cover the kernel's work exactly: those it never bounds
    its index along (``unchecked_axes``) and those its source declares (``// r3: exact``)."""
    from r3tui.analysis.per_thread import unchecked_axes
    from r3tui.search.source import AXES, parse_exact

    found = set(parse_exact(text)) | set(unchecked_axes(text, plain_name(kernel)))
    return tuple(a for a in AXES if a in found)


def plain_kernel_name(source: KernelSource) -> str:
    """The kernel's name as the parser knows it (a mangled symbol demangled)."""
    return plain_name(source.kernel_name)


def plain_name(name: str) -> str:
    """``name``, demangled where it is a mangled symbol."""
    if name.startswith("_Z"):
        from r3tui.record.sources import qualified_name

        demangled = qualified_name(name)
        name = demangled.name if demangled is not None else name
    return name


def launch_facts(
    launch: LaunchInfo, source: KernelSource, tunables: Sequence[Tunable] = ()
) -> BlockFacts | None:
    """What the variant's source says about the kernel's block (fixed axes and why, macros
    tied to the block, its own launch bounds); None where the recording already keeps the
    block as it is."""
    from r3tui.search.block_source import block_facts

    if not launch.block_tunable or launch.work is None:
        return None
    name = plain_kernel_name(source)
    declared = {t.name: [v for v in t.values if isinstance(v, int)] for t in tunables
                if t.numeric}
    return block_facts(source.text, name, launch.block, source.defines, declared)


def make_strategy(space: SearchSpace, settings: InnerSettings) -> InnerSearch:
    from r3tui.search.simulation import make_search

    bayes = bayes_settings(settings) if settings.strategy == "bayes" else None
    return make_search(settings.strategy, space, settings.seed, bayes)


def preload(settings: InnerSettings) -> None:
    """Import what the search's first asks would import (scikit-optimize and scikit-learn
    for the Bayesian search: 1.1-1.2 s here), for a caller to run while the GPUs start
    instead of in the first ask.  In the calling thread: an import in a thread of its own
    deadlocked a process forked meanwhile (session 31)."""
    if settings.strategy == "bayes":
        import skopt.sampler
        import skopt.utils  # noqa: F401


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


@contextmanager
def _timed(seconds: dict[str, float], phase: str) -> Iterator[None]:
    """Adds the wall seconds of the ``with`` body to ``seconds[phase]``."""
    began = time.perf_counter()
    try:
        yield
    finally:
        seconds[phase] = seconds.get(phase, 0.0) + time.perf_counter() - began


def _start(evaluator: Evaluator, configs: list[TrialConfig], hang_ends_batch: bool
           ) -> Callable[[], list[Measurement | None]]:
    start = getattr(evaluator, "start", None)
    if start is not None:
        return cast("Callable[[], list[Measurement | None]]",
                    start(configs, hang_ends_batch=hang_ends_batch))
    measured: list[Measurement | None] = list(evaluator.evaluate(configs))
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
    climb: Callable[[InnerSearch], Sequence[TrialConfig]] | None = None,
) -> InnerResult:
    """Search one variant: ask a batch, evaluate it, store every trial, tell; then re-time.

    With ``settings.in_flight`` 2 the next batch is asked and submitted before the last one's
    results are told (its configurations pending), so the runner always has work.  Each
    batch's trials are committed together before they are told, so a kill loses at most the
    batches in flight and a resume tells exactly what is stored.  ``give_up_after``
    abandons a variant whose first that many trials all failed (a child that does not compile
    or verify costs a few trials, not a whole budget); ``should_stop`` is polled between batches.
    ``climb``, asked when the budget is spent and nothing is in flight, gives configurations
    to try next (a climb from the best so far, :func:`~r3tui.engine.lineage.neighbours`): the
    trial budget grows by those not yet tried, and it is asked again after them, until it
    gives none new, the time budget is spent or a stop is requested.
    """
    from db import repository as repo
    from r3tui.search import choose_winner, config_key

    # where the loop's wall time goes, phase by phase (the inner_done event keeps it)
    seconds: dict[str, float] = {}
    trial_ids: dict[str, int] = {}
    flight: deque[tuple[list[TrialConfig], Callable[[], list[Measurement | None]]]] = deque()
    not_replayed = 0  # configurations a hang left unreplayed (not trials: never measured)
    climbed = 0  # trials ``climb`` added to the budget
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
            with _timed(seconds, "ask"):
                configs = search.ask(batch) if batch > 0 else []
            if not configs:
                break
            with _timed(seconds, "submit"):
                # a variant not yet shown to work is abandoned after a hang: its batch's
                # other configurations are not replayed (each would cost the whole timeout)
                flight.append((configs, _start(evaluator, configs, hang_ends_batch=unproven)))
        if not flight:
            more = 0
            if climb is not None and not stopped and not search.exhausted and not (
                    budget.max_seconds is not None
                    and search.elapsed(budget) >= budget.max_seconds):
                with _timed(seconds, "ask"):
                    more = search.extend(climb(search))
            if not more:
                break
            if budget.max_trials is not None:
                budget = replace(budget, max_trials=search.n_evaluated + more)
            climbed += more
            continue
        configs, results = flight.popleft()
        with _timed(seconds, "wait"):
            answered = results()
        measured: list[tuple[TrialConfig, Measurement]] = []
        for config, answer in zip(configs, answered, strict=True):
            if answer is None:  # never measured: no trial, and the search forgets the ask
                search.forget(config)
                not_replayed += 1
            else:
                measured.append((config, answer))
        configs, measurements = [c for c, _ in measured], [m for _, m in measured]
        if (give_up_after is not None and search.best() is None
                and any(m.status is MeasurementStatus.TIMEOUT for m in measurements)
                and not any(m.ok for m in measurements)):
            stopped = True  # it hangs before it ever worked: give it up now
        with _timed(seconds, "store"), database.session_scope() as s:
            rows = [
                repo.NewTrial(campaign_id, variant_id, c, m)
                for c, m in zip(configs, measurements, strict=True)
            ]
            ids = repo.insert_trials(s, rows)
        with _timed(seconds, "tell"):
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
            with _timed(seconds, "retime"):
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
                # configurations not replayed because another one hung before any worked
                "not_replayed": not_replayed,
                # trials a climb from the best added to the budget (0: none)
                "climbed": climbed,
                # where the loop's wall time went (s): the search's asks and tells, waiting
                # for the runner, storing trials, re-timing the finalists
                "seconds": {k: round(v, 4) for k, v in seconds.items()},
            },
        )
    return InnerResult(
        search.n_evaluated,
        failures,
        best[0] if best else None,
        best[1] if best else None,
        winner,
    )
