"""A campaign's variants as the outer loop sees them, read from and written to the database.

The database is the campaign's only state: the MAP-Elites archive is rebuilt by offering the
evaluated variants again in the order they were created (migrations included, at the same
points), so a resumed campaign continues from exactly the archive it had; ``elite_cells`` is
the persisted view of that archive for readers such as the TUI.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from r3tui.domain import (
    Dim3,
    EliteCell,
    MeasurementStatus,
    TrialConfig,
    Variant,
    VariantOrigin,
    VariantStatus,
)
from r3tui.search.occupancy import occupancy
from r3tui.search.strategy import derive_seed

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from db.repository import TrialRecord
    from r3tui.search.elites import ArchiveSettings, Elite, EliteArchive
    from r3tui.search.source import Tunable, TunableValue
    from r3tui.search.space import SearchSpace
    from r3tui.search.strategy import InnerSearch

# Variants that made it through the funnel (apply → compile → verify → tune).
EVALUATED_OK = (VariantStatus.VERIFIED, VariantStatus.IMPROVED)


@dataclass(frozen=True)
class VariantFitness:
    """A variant's best stored trial: its fitness and what the compiler and replay said."""

    variant_id: int
    median_s: float
    config: TrialConfig
    registers: int | None
    spills_bytes: int | None
    shared_mem_bytes: int | None
    occupancy: float | None
    trial_id: int


def fitness_of(
    s: Session, variant: Variant, recorded_block: Dim3, dynamic_shared: int = 0
) -> VariantFitness | None:
    """The variant's best trial: the one the inner loop chose (re-timed against the baseline),
    or the fastest ok trial when it chose none.  Its shared memory is the compiled kernel's
    static bytes plus the dynamic bytes the trial launched with (``dynamic_shared`` where the
    trial launched with the recorded size)."""
    from db import repository as repo

    assert variant.id is not None
    trial: TrialRecord | None = None
    chosen = repo.best_trial_id(s, variant.id)
    if chosen is not None:
        trial = repo.get_trial(s, chosen)
    if trial is None or trial.measurement.time is None:
        ok = [
            t
            for t in repo.trials_of_variant(s, variant.id)
            if t.measurement.status is MeasurementStatus.OK and t.measurement.time is not None
        ]
        if not ok:
            return None
        trial = min(ok, key=lambda t: t.measurement.time.median_s if t.measurement.time else 0)
    assert trial.measurement.time is not None
    res = trial.measurement.resources
    block = trial.config.block or recorded_block
    static = res.shared_mem_bytes or 0
    if trial.config.shared_mem_bytes is not None:  # a size of its own (`// r3: shared`)
        dynamic_shared = trial.config.shared_mem_bytes
    return VariantFitness(
        variant.id,
        trial.measurement.time.median_s,
        trial.config,
        res.registers,
        res.spills_bytes,
        static + dynamic_shared,
        occupancy(block.volume, res.registers, static + dynamic_shared),
        trial.id,
    )


def best_configs(s: Session, variant_id: int, k: int) -> list[TrialConfig]:
    """The ``k`` fastest successful configurations of a variant (a child's warm start)."""
    from db import repository as repo

    ok = [
        t
        for t in repo.trials_of_variant(s, variant_id)
        if t.measurement.status is MeasurementStatus.OK and t.measurement.time is not None
    ]
    ok.sort(key=lambda t: (t.measurement.time.median_s if t.measurement.time else 0.0, t.id))
    out: list[TrialConfig] = []
    for t in ok:
        if t.config not in out:
            out.append(t.config)
        if len(out) >= k:
            break
    return out


def exercising(space: SearchSpace, parents: list[TrialConfig], k: int,
               inherited: set[str] | frozenset[str] = frozenset(),
               first: Mapping[str, Sequence[TunableValue]] | None = None) -> list[TrialConfig]:
    """A child's first configurations: its parent's best (``parents[0]``) with the tunables
    the child's change added (neither the parent's source declares them, ``inherited``, nor
    its configuration sets them) at their ``k`` smallest values other than the default, all
    at once (the second smallest of each in the second, and so on; a tunable with fewer
    values keeps its largest; values the space allows with none of the parent's
    configurations are left out, and a step whose values do not fit together tries each
    alone).  At its default a rule's factor reproduces the parent's code,
    so these are where the change can show within a child's few trials.  ``first`` (the
    child's ``// r3: first`` lines, :func:`~r3tui.search.source.parse_first`) puts a
    tunable's named values before the others, or keeps it at its default where that alone is
    named.  A tunable the parent already had that ``first`` names (the caller passes only the
    lines the child's change wrote) is set to the named values alone in these steps: a tile
    along both axes of a coarsened matrix product pays with more outputs a thread than its
    parent's factors, tuned without it, have (:data:`r3tui.remix.tile_blocked.BLOCK_FIRST`).
    Shared-memory tiles of 4 or 8 iterations paid
    least (sgemm on an H100, session 38: the 15 tile children of five campaigns spent two to
    four of their five trials on tiles of 4 and 8, 0.8-3.4 ms against their parents'
    533-727 µs, where two by four outputs a thread with a tile of 64 gave 1.32x at the
    recorded block).

    Each step is tried twice where the parent's best block is not the recorded one or it
    limits registers: on the parent's configuration, then on the recorded block with the
    same options less ``--maxrregcount`` and launch bounds (:func:`uncapped`).  A change of
    each thread's work often pays at another block than the one the parent's code preferred,
    and needs more registers than the parent's limits left it: sgemm on an H100
    (session 36) preferred 128x2 as written, where 2 columns a thread took 712 µs against
    the parent's 671, while at the recorded 16x16 coarsening gave 2.34x (session 28).
    Configurations outside the space are left out; each comes as the space completes it
    (the shared memory a new tile needs)."""
    if not parents or k <= 0:
        return []
    base = parents[0]
    # the recorded block with the parent's options, less its register limits
    recorded = uncapped(replace(base, block=None))

    def placed(values: Mapping[str, TunableValue]) -> list[TrialConfig]:
        """The parent's best with ``values`` set, and that on the recorded block without the
        parent's register limits (those that are points of the space)."""
        tunables = {**base.tunables, **values}
        found = [space.completed(replace(c, tunables=tunables)) for c in (base, recorded)]
        return [c for k, c in enumerate(found) if c is not None and c not in found[:k]]

    added = [t for t in space.tunables
             if t.name not in base.tunables and t.name not in inherited]
    choices = {t.name: _others(t) for t in added}
    defaults = {t.name: t.default for t in added}
    declared = {t.name for t in space.tunables}
    for name, values in (first or {}).items():
        if name in choices and tuple(values) == (defaults[name],):
            del choices[name]  # the rule's word: left at its default, as the parent has it
        elif name in choices:
            named = [v for v in values if v in choices[name]]
            choices[name] = named + [v for v in choices[name] if v not in named]
        elif name in declared:  # a factor the parent's change declared: the named values alone
            choices[name] = list(values)
    # a value that no configuration of the parent's can take alone is not tried: a relation
    # of the child's may hold at the default only (sgemm coarsened along x and z: its one
    # layer makes `// r3: exact z` allow R3_CF_Z 1 alone, and every step setting R3_CF_Z
    # 2 with R3_CF_X 2 was dropped whole: 8 of session 39's 17 coarsened sgemm children
    # started with no step)
    choices = {name: [v for v in values if placed({name: v})]
               for name, values in choices.items()}
    choices = {name: values for name, values in choices.items() if values}
    out: list[TrialConfig] = []
    for step in range(k if choices else 0):
        together = {name: values[min(step, len(values) - 1)]
                    for name, values in choices.items()}
        # all at once; where they do not fit together, each alone
        found = placed(together) or [c for name, v in together.items()
                                     for c in placed({name: v})]
        for config in found:
            if config not in out:
                out.append(config)
    return out


def first_lines(source: str) -> dict[str, tuple[TunableValue, ...]]:
    """``source``'s ``// r3: first`` lines (:func:`~r3tui.search.source.parse_first`), none
    where they do not parse: what a parent's lines were, to leave out of its child's own."""
    from r3tui.errors import R3Error
    from r3tui.search.source import parse_first

    try:
        return parse_first(source)
    except (R3Error, ValueError):
        return {}


def neighbours(space: SearchSpace, config: TrialConfig) -> list[TrialConfig]:
    """``config`` with one tunable moved one declared value up or down (each at its value in
    ``config``, else its default): every move up first, then every move down; only points of
    the space, each as the space completes it (a tile's shared memory).

    What a child's few first trials cannot reach: its change and its parent's factors pay
    together.  sgemm on an H100 (session 40, 1290^3): the campaigns' tiled children ran their
    parents' two by two outputs a thread (532-600 µs) while two by four with the same tile,
    double-buffered, took 432 µs at the recorded block (1.75x, bench/rule_gains.py) — one
    move of R3_CF_Y and one of R3_X_CONTIGUOUS away."""
    here = space.completed(config) or config
    ups: list[TrialConfig] = []
    downs: list[TrialConfig] = []
    for tunable in space.tunables:
        ordered = sorted(tunable.values, key=_order)
        now = config.tunables.get(tunable.name, tunable.default)
        if now not in ordered:
            continue
        at = ordered.index(now)
        for to, moves in ((at + 1, ups), (at - 1, downs)):
            if 0 <= to < len(ordered):
                moved = space.completed(
                    replace(config, tunables={**config.tunables, tunable.name: ordered[to]}))
                if moved is not None and moved not in ups + downs and moved != here:
                    moves.append(moved)
    return ups + downs


# how far behind the campaign's best a child whose change added a shared-memory tile may start
# a climb: sgemm's tiled children (H100, session 40) ran their tiles 8 % behind the best at
# their parents' factors (599 against 553 us) and 22 % ahead one move of R3_CF_Y away
# (bench/rule_gains.py: 1x4 outputs, tile 64, two stages at the recorded block, 480 us).  A
# tile's reuse grows with the outputs a thread computes, so it is behind where its parent's
# factors were tuned without it.  Other changes get none: over session 40's twelve sgemm
# campaigns a slack for every change would have started 40 more climbs, most of them unroll
# factors and coarsenings within a few per cent of the best; six were tile children, at most
# one a campaign.
CLIMB_SLACK = 1.10


def adds_tile(parent: str | None, child: str) -> bool:
    """Whether ``child``'s change added a shared-memory tile (a ``// r3: shared`` declaration
    its parent's source does not have): such a child's climb may start :data:`CLIMB_SLACK`
    behind the campaign's best."""
    from r3tui.search import parse_shared

    return parse_shared(child) is not None and (parent is None or parse_shared(parent) is None)


@dataclass
class Climb:
    """``run_inner``'s ``climb`` for a child: the :func:`neighbours` of where it stands, for
    up to ``rounds`` rounds while they gain.

    It stands at its fastest trial with its change at work (one of ``added``, the tunables
    its change declared, off its default), else at its fastest.  The first round needs that
    trial to beat ``to_beat`` (the campaign's best when the child started), or to be less
    than ``slack`` times it where the change is at work (:data:`CLIMB_SLACK` for a new tile:
    a change whose factors pay only together with the parent's is behind at the parent's
    values and ahead one move away).  Each later round needs the last to have gained.  A
    child that is behind costs its few trials only."""

    space: SearchSpace
    to_beat: float | None
    rounds: int
    added: frozenset[str] = frozenset()
    slack: float = 1.0
    made: int = 0
    blocks_moved: bool = False  # the one round of block moves after a round that gained nothing

    def __call__(self, search: InnerSearch) -> list[TrialConfig]:
        ok = [r for r in search.history if r.ok and r.time_s is not None]
        if not ok:
            return []
        defaults = {t.name: t.default for t in self.space.tunables if t.name in self.added}
        working = [r for r in ok if any(r.config.tunables.get(name, default) != default
                                        for name, default in defaults.items())]
        start = min(working or ok, key=lambda r: r.time_s or 0.0)
        assert start.time_s is not None
        bar = self.to_beat
        if bar is not None and self.made == 0 and working:
            bar *= self.slack
        if bar is not None and start.time_s >= bar:
            return self._blocks_before_ending(search, start.config)
        if self.made >= self.rounds:
            return []
        self.to_beat = start.time_s
        self.made += 1
        moves = neighbours(self.space, start.config)
        # every factor's move tried (or no factor at all): the block's
        if all(search.known(m) for m in moves):
            moves = block_moves(self.space, start.config)
        return moves

    def _blocks_before_ending(self, search: InnerSearch, config: TrialConfig
                              ) -> list[TrialConfig]:
        """A climb that has made a round and whose last gained nothing ends, once its best's
        block moves (not tried yet) are tried: a thread's new work may pay at another block
        (sgemm on an H100, session 40: two by four outputs a thread with a tile of 32, 1.751x
        [1.743, 1.796] at the recorded 16x16, 1.806x [1.751, 1.813] at 16x8, within noise of
        each other), and the factor moves alone stop where one of them loses at the block the
        parent chose.  A gain there starts another round."""
        if self.made == 0 or self.blocks_moved:
            return []
        self.blocks_moved = True
        return [m for m in block_moves(self.space, config) if not search.known(m)]


def block_moves(space: SearchSpace, config: TrialConfig) -> list[TrialConfig]:
    """``config`` with one axis of its block doubled or halved (x, y, z in turn), the points
    of the space only, as it completes them (the grid follows the work).  A climb's moves where
    its factors' are all tried: sgemm's children coarsened along one axis (H100, session 40,
    seeds 0 and 2) had tried the factor's values either side among their first steps, at the
    parent's block and the recorded one only, and never climbed."""
    if not space.launch.tunes_block:
        return []
    here = space.completed(config)
    sizes = (config.block or space.launch.block).as_tuple()
    out: list[TrialConfig] = []
    for axis, size in enumerate(sizes):
        for moved_size in (size * 2, size // 2):
            if moved_size < 1:
                continue
            axes = list(sizes)
            axes[axis] = moved_size
            moved = space.completed(replace(config, block=Dim3(*axes)))
            if moved is not None and moved not in out and moved != here:
                out.append(moved)
    return out


def uncapped(config: TrialConfig) -> TrialConfig:
    """``config`` without its register limits: no ``--maxrregcount``, no launch bounds.  A
    limit the parent's code fit can spill its child's: sgemm's 4x4 outputs a thread under
    its parent's ``--maxrregcount=32`` spilled 748 bytes and took 3.0 ms where 2x2 took
    709 µs (H100, session 39; 45 of that session's 516 sgemm trials spilled)."""
    from r3tui.compile.options import canonicalize, render
    from r3tui.errors import ConfigError

    try:
        canonical = canonicalize(config.toolchain, config.options)
    except ConfigError:  # not options this toolchain reads: left as they are
        return replace(config, launch_bounds=None)
    kept = tuple(p for p in canonical if p[0] != "maxrregcount")
    if kept == canonical:
        return replace(config, launch_bounds=None)
    return replace(config, options=tuple(render(config.toolchain, kept)), launch_bounds=None)


def filling(space: SearchSpace, source: str, base: TrialConfig
            ) -> dict[str, tuple[TunableValue, ...]]:
    """For each tunable of ``source`` that multiplies the grid (``// r3: threads_per_item``,
    several threads sharing an element's loop) and that ``base`` does not set: where ``base``
    launches fewer threads than the device holds at once, the smallest value that fills it
    (the largest where none does), to try first (:func:`exercising`'s ``first``).  Empty where
    the device's multiprocessors or the work are not known.

    A kernel short of threads pays most for the split that fills the device: nbody's loop
    split gained most at 16 threads a body with 32768 bodies (3.28x, H100, session 31,
    bench/rule_gains.py), the smallest split past the 270,336 threads an H100 holds; the
    campaigns' nbody has 7327 bodies, where the smallest values (2 and 4) leave the device
    nearly empty.  Where the grid fills the device already the order stays the smallest first
    (spmv_csr's split gained most at 4 with a million rows, for its loads, not its threads)."""
    from r3tui.search.source import parse_grid_scaling, work_divisors, work_multipliers

    capacity, work = space.limits.resident_threads, space.launch.work
    if not capacity or work is None:
        return {}
    names = {name for (verb, _), name in parse_grid_scaling(source).items()
             if verb == "threads_per_item"}

    def threads(tunables: Mapping[str, TunableValue]) -> int:
        divisors, multipliers = work_divisors(source, tunables), work_multipliers(source, tunables)
        total = 1
        for extent, d, m in zip((work.x, work.y, work.z), divisors, multipliers, strict=True):
            total *= -(-extent // d) * m
        return total

    if not names or threads(base.tunables) >= capacity:
        return {}
    out: dict[str, tuple[TunableValue, ...]] = {}
    for tunable in space.tunables:
        if tunable.name not in names or tunable.name in base.tunables or not tunable.numeric:
            continue
        values = _others(tunable)
        fill = next((v for v in values if threads({**base.tunables, tunable.name: v})
                     >= capacity), values[-1] if values else None)
        if fill is not None:
            out[tunable.name] = (fill,)
    return out


def _others(tunable: Tunable) -> list[TunableValue]:
    """``tunable``'s values other than its default, smallest first."""
    return [v for v in sorted(tunable.values, key=_order) if v != tunable.default]


def _order(value: object) -> tuple[int, float, str]:
    """Numbers by value, then anything else by its text (a tunable's values, smallest first)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return (1, 0.0, str(value))
    return (0, float(value), "")


# the operator whose variant launched at (G, B) computes what its parent does at the launch
# with x and y exchanged (r3tui.remix.swap): its parent's configurations, transposed, are its
# own (what the parent ran along x it runs along y)
SWAP_OPERATOR = "swap_xy"


def transposed(config: TrialConfig, recorded: Dim3) -> TrialConfig:
    """``config`` with the x and y of its block exchanged (of the ``recorded`` block where it
    sets none): the same launch for a variant across a :data:`SWAP_OPERATOR` change."""
    block = config.block or recorded
    if block.x == block.y:
        return config
    return replace(config, block=Dim3(block.y, block.x, block.z))


def ancestor_trials(s: Session, variant: Variant, generations: int,
                    recorded: Dim3 | None = None) -> list[list[Any]]:
    """Trials of ``variant``'s parent, grandparent, ... (at most ``generations``), nearest first,
    as :class:`~r3tui.search.strategy.TrialRecord`: a child's prior.  With the ``recorded``
    block, the trials of an ancestor across an odd number of :data:`SWAP_OPERATOR` changes
    are transposed into the variant's orientation."""
    from db import repository as repo
    from r3tui.search.strategy import TrialRecord

    groups: list[list[Any]] = []
    child: Variant | None = variant
    flipped = False
    while child is not None and child.parent_id is not None and len(groups) < generations:
        flipped ^= recorded is not None and child.operator == SWAP_OPERATOR
        groups.append([
            TrialRecord.of(transposed(t.config, recorded) if flipped and recorded else t.config,
                           t.measurement)
            for t in repo.trials_of_variant(s, child.parent_id)])
        child = repo.get_variant(s, child.parent_id)
    return groups


def family_of(variant: Variant) -> str:
    """The transformation family the variant came from (a MAP-Elites feature)."""
    if variant.origin is VariantOrigin.SEED:
        return "seed"
    family = variant.features.get("family") if variant.features else None
    return str(family) if family else "other"


def features_for(fitness: VariantFitness, family: str, source: str = "") -> dict[str, Any]:
    """The variant's archive descriptors: its best trial's resources, its family, and how
    many elements a thread handles (``source``'s vector width, the trial's work per thread)."""
    from r3tui.analysis.text import vector_width
    from r3tui.search.elites import describe
    from r3tui.search.source import work_divisor, work_multipliers

    per_thread = work_divisor(source, fitness.config.tunables) if source else 1
    x, y, z = work_multipliers(source, fitness.config.tunables) if source else (1, 1, 1)
    return describe(fitness.registers, fitness.shared_mem_bytes, fitness.occupancy, family,
                    vector_width=vector_width(source), work_per_thread=per_thread,
                    threads_per_item=x * y * z)


def migration_rng(seed: int, n_evaluated: int) -> random.Random:
    return random.Random(derive_seed(seed, "migrate", n_evaluated))


@dataclass
class ArchiveState:
    """The archive plus how many variants it has seen (migrations are due by that count)."""

    archive: EliteArchive
    n_evaluated: int = 0
    migrations: int = 0

    def offer(
        self, variant: Variant, features: Mapping[str, Any], fitness_s: float, *, seed: int
    ) -> tuple[list[Elite], list[tuple[Elite, int]]]:
        """Offer an evaluated variant; the seed goes to every island.  Returns the cells it
        took and the migrations that became due."""
        assert variant.id is not None
        islands = (
            range(self.archive.settings.islands)
            if variant.origin is VariantOrigin.SEED
            else [variant.island]
        )
        placed = [
            e
            for e in (self.archive.offer(i, variant.id, features, fitness_s) for i in islands)
            if e is not None
        ]
        self.n_evaluated += 1
        moved: list[tuple[Elite, int]] = []
        if self.archive.due_migration(self.n_evaluated):
            moved = self.archive.migrate(migration_rng(seed, self.n_evaluated))
            self.migrations += 1
        return placed, moved


def rebuild_archive(
    s: Session,
    variants: Sequence[Variant],
    settings: ArchiveSettings,
    recorded_block: Dim3,
    *,
    seed: int,
) -> ArchiveState:
    """Replay the campaign's evaluated variants into a fresh archive, in creation order."""
    from r3tui.search.elites import EliteArchive

    state = ArchiveState(EliteArchive(settings))
    for v in variants:
        if v.status not in EVALUATED_OK:
            continue
        fit = fitness_of(s, v, recorded_block)
        if fit is None:
            continue
        state.offer(v, v.features or features_for(fit, family_of(v), v.source), fit.median_s,
                    seed=seed)
    return state


def store_elites(
    s: Session, campaign_id: int, placed: Sequence[Elite], moved: Sequence[tuple[Elite, int]]
) -> None:
    from db import repository as repo

    for e in placed:
        repo.upsert_elite(
            s, EliteCell(campaign_id, e.island, e.cell_key, e.variant_id, e.fitness_s)
        )
    for e, island in moved:
        repo.upsert_elite(s, EliteCell(campaign_id, island, e.cell_key, e.variant_id, e.fitness_s))


def classify(
    failures: Mapping[str, int], best_s: float | None, parent_s: float | None
) -> tuple[VariantStatus, str | None]:
    """Where a variant ended in the funnel, from its inner loop's outcome."""
    if best_s is None:
        if not failures:
            return VariantStatus.COMPILE_FAILED, "no configuration was evaluated"
        reason, _ = max(failures.items(), key=lambda kv: kv[1])
        status = {
            MeasurementStatus.COMPILE_ERROR.value: VariantStatus.COMPILE_FAILED,
            MeasurementStatus.WRONG_RESULT.value: VariantStatus.WRONG_RESULT,
            MeasurementStatus.UNSAFE.value: VariantStatus.UNSAFE,
        }.get(reason, VariantStatus.CRASHED)
        return status, f"{reason} in {sum(failures.values())} trial(s)"
    if parent_s is not None and best_s < parent_s:
        return VariantStatus.IMPROVED, None
    return VariantStatus.VERIFIED, None
