"""The outer loop: MAP-Elites over source variants, each tuned by the inner loop.

One step: pick an island and a parent from the archive, ask the remix layer (LLM or rule
operator) for one small, named change, store the proposal, then push it through the funnel
apply → compile → verify → inner BO on replay; a verified variant is offered to the archive
with its best time as fitness.  Every proposal, LLM call, trial and archive change is in the
database before the next step starts.

The next proposal is generated while the GPU evaluates the current one (the LLM is the slow
part on a login node), from the archive as it was before the current evaluation.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from r3tui.domain import Variant, VariantOrigin, VariantStatus
from r3tui.engine.control import CampaignControl
from r3tui.engine.inner import (
    Evaluator,
    InnerSettings,
    KernelSource,
    bayes_settings,
    build_space,
    run_inner,
)
from r3tui.engine.ledger import ProposalLedger
from r3tui.engine.lineage import (
    CLIMB_SLACK,
    EVALUATED_OK,
    SWAP_OPERATOR,
    ArchiveState,
    Climb,
    adds_tile,
    ancestor_trials,
    best_configs,
    classify,
    exercising,
    family_of,
    features_for,
    filling,
    first_lines,
    fitness_of,
    rebuild_archive,
    store_elites,
    transposed,
)
from r3tui.engine.novelty import Novelty
from r3tui.engine.options import option
from r3tui.engine.proposals import (
    ProposalRequest,
    ProposalSide,
    unsafe_reason,
    variant_event,
)
from r3tui.search.strategy import derive_seed

if TYPE_CHECKING:
    from db.session import Database
    from r3tui.record.manifest import LaunchInfo
    from r3tui.remix.mutation import Mutator, Proposal
    from r3tui.search import DeviceLimits
    from r3tui.search.elites import ArchiveSettings
    from r3tui.search.space import SearchSpace


# the share of a wall-time budget the original's own inner search may take
SEED_SHARE = 0.4


@dataclass(frozen=True)
class CampaignSettings:
    """How a campaign searches; stored with the campaign so a resume searches the same way."""

    # the fields with an option() are the user's: r3 tune's flags and r3.toml's [campaign]
    # section come from them (engine.options)
    variants: int | None = 20  # child proposals to make (the outer budget)
    seconds: float | None = None  # or a wall-time budget
    inner_trials: int = option(12, "--inner-budget", "trials per child variant")
    seed_trials: int = option(40, "--seed-budget", "trials for the original source")
    warm_start: int = option(1, "--warm-start", "a child first tries its parent's K best "
                             "configurations", metavar="K")
    # a rule's factor (R3_CF_X, R3_TILE, R3_STREAM, ...) at its default reproduces the parent:
    # the child first tries its parent's best configuration with its new tunables at their K
    # smallest other values, where the change can show within a few trials
    exercise: int = option(2, "--exercise", "a child first tries the tunables its change "
                           "added at their K smallest values other than the default, on its "
                           "parent's best configuration", metavar="K")
    # a child's model is also told its ancestors' trials (this many generations; 0: off),
    # shifted onto the child's scale: the inner searches of a lineage continue one another
    transfer: int = option(4, "--transfer", "tell a child's model the trials of its last G "
                           "ancestors (0: off)", metavar="G")
    # a child whose trials beat the campaign's best climbs from its best: each tunable one
    # value up and down, for up to this many rounds while a round gains (lineage.Climb)
    climb: int = option(3, "--climb", "a child that beats the campaign's best then tries its "
                        "best with each tunable one value up or down, for up to R rounds "
                        "while they gain (0: off)", metavar="R")
    give_up_after: int = 4  # trials without one success before a variant is abandoned
    islands: int = option(2, "--islands", "MAP-Elites islands")
    migration_interval: int = 10
    seed: int = option(0, "--seed", "seed of every random choice of the campaign")
    llm_share: float = option(0.75, "--llm-share", "fraction of proposals asked of the model "
                              "(the rest: rule operators; --rules-only: none)")
    edit_format: str = option("search_replace", "--edit-format", "how the model answers: "
                              "SEARCH/REPLACE edits or the whole kernel",
                              choices=("search_replace", "whole"))
    # while the model writes a REPLACE section, a token that would use a name the unit does
    # not have and the answer does not declare is refused (r3tui.remix.names; llama.cpp in
    # process only: a server samples its tokens itself)
    check_names: bool = option(True, "--no-check-names", "let the model use names the unit "
                               "does not have in its edits (no check while it samples)",
                               negate=True)
    # a REPLACE section may end only where its brackets balance as its SEARCH section's
    # (r3tui.remix.balance; llama.cpp in process only)
    check_balance: bool = option(True, "--no-check-balance", "let the model end a REPLACE "
                                 "section whose braces, parentheses or brackets do not balance "
                                 "as its SEARCH section's (no check while it samples)",
                                 negate=True)
    prefetch: bool = True  # generate the next proposal while the GPU evaluates
    # a model's change that does not compile or verify goes back to it once with the failure
    # (a repair turn); the answer is a child of the failed variant, origin "repair".  Off by
    # default: with SmolLM2-135M and Qwen2.5-Coder-1.5B it compiled 1 of 69 repairs over
    # sessions 33-37 and verified none, while taking a quarter of the model's time
    # (docs/remix.md)
    repair: bool = option(False, "--repair", "send a model's change that fails to compile or "
                          "verify back to it once with the failure (the repair turn)")
    # a variant made by a transformation that enables another (Transformation.enables:
    # register blocking enables a shared-memory tile of its coarsened loop) is given that one
    # as its next proposal, whatever its own time (proposals.ProposalSide._follow_up)
    follow_up: bool = option(True, "--no-follow-up", "do not propose at once, on a variant "
                             "whose change enables another (a tile of a register-blocked "
                             "loop), that other change", negate=True)
    # which transformation to try first follows what each has gained in this campaign
    # (Thompson sampling, r3tui.search.bandit); off: a uniform draw
    adaptive: bool = True
    # the misses a hint to the compiler (Transformation.hint) starts the bandit with
    hint_prior: int = 2
    inner: InnerSettings = field(default_factory=InnerSettings)

    def __post_init__(self) -> None:
        from r3tui.errors import ConfigError

        if min(self.warm_start, self.transfer, self.exercise, self.climb) < 0:
            raise ConfigError("--warm-start, --exercise, --transfer and --climb must be at "
                              "least 0")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CampaignSettings:
        known = {f for f in cls.__dataclass_fields__}
        values = {k: v for k, v in data.items() if k in known and k != "inner"}
        values.setdefault("transfer", 0)  # campaigns stored before it searched without it
        # nor did they repair or adapt: a re-run from their recorded answers asks the same
        values.setdefault("repair", False)
        values.setdefault("adaptive", False)
        values.setdefault("exercise", 0)  # nor first try a child's new tunables
        values.setdefault("climb", 0)  # nor climb from a new best
        values.setdefault("follow_up", False)  # nor follow an enabling change up
        values.setdefault("hint_prior", 0)  # nor start hints with misses
        values.setdefault("check_names", False)  # nor check the names of their answers
        values.setdefault("check_balance", False)  # nor their sections' brackets
        inner_known = set(InnerSettings.__dataclass_fields__)
        inner = InnerSettings(
            **{k: v for k, v in data.get("inner", {}).items() if k in inner_known}
        )
        return cls(**values, inner=inner)

    def archive_settings(self) -> ArchiveSettings:
        from r3tui.search.elites import ArchiveSettings

        return ArchiveSettings(islands=self.islands, migration_interval=self.migration_interval)


@dataclass(frozen=True)
class StepReport:
    """What the CLI's progress display and the event log show after each proposal."""

    index: int  # 0-based proposal number in the campaign
    variant_id: int
    origin: VariantOrigin
    operator: str
    status: VariantStatus
    reason: str | None
    best_s: float | None
    seed_s: float | None


Progress = Callable[[StepReport], None]
EvaluatorFactory = Callable[[KernelSource], Evaluator]


@dataclass
class Timing:
    """Where the campaign's wall time went (the paper's "inference-bound" question)."""

    llm_s: float = 0.0  # model time, summed over calls (overlapped or not)
    llm_wait_s: float = 0.0  # time the evaluation side waited for the model
    evaluate_s: float = 0.0  # inner loops: compile + replay + bookkeeping
    started: float = field(default_factory=time.monotonic)

    def wall_s(self) -> float:
        return time.monotonic() - self.started


class CampaignRun(ProposalSide):
    """One campaign's outer loop over an open database (a single writer)."""

    def __init__(
        self,
        database: Database,
        campaign_id: int,
        settings: CampaignSettings,
        seed_source: KernelSource,
        launch: LaunchInfo,
        limits: DeviceLimits,
        mutator: Mutator | None,
        evaluator_for: EvaluatorFactory | None,
        *,
        control: CampaignControl | None = None,
        progress: Progress | None = None,
    ) -> None:
        self.database = database
        self.campaign_id = campaign_id
        self.settings = settings
        self.seed_source = seed_source
        self.launch = launch
        self.limits = limits
        self.mutator = mutator
        self.evaluator_for = evaluator_for
        self.control = control or CampaignControl()
        self.progress = progress
        self.timing = Timing()
        self.state = self._load_state()
        self.ledger = ProposalLedger()  # proposals counted instead of stored; streaks
        self.novelty = Novelty(campaign_id, self._code_of)
        self.stored = 0  # proposals of this run stored as variants
        # generate-only: the GPU architecture (sm_90) the model's changes are compiled for on
        # this machine before they are written, so a compile error gets its repair turn here
        self.compile_arch: str | None = None

    # -- state from the database ---------------------------------------------------------
    def _variants(self) -> list[Variant]:
        from db import repository as repo

        with self.database.session_scope() as s:
            return repo.campaign_variants(s, self.campaign_id)

    def _load_state(self) -> ArchiveState:
        with self.database.session_scope() as s:
            from db import repository as repo

            variants = repo.campaign_variants(s, self.campaign_id)
            return rebuild_archive(
                s,
                variants,
                self.settings.archive_settings(),
                self.launch.block,
                seed=self.settings.seed,
            )

    def seed_variant(self) -> Variant:
        """The original source's variant, created on first use."""
        from db import repository as repo

        with self.database.session_scope() as s:
            for v in repo.campaign_variants(s, self.campaign_id):
                if v.origin is VariantOrigin.SEED:
                    return v
            vid = repo.add_variant(
                s,
                Variant(
                    self.campaign_id,
                    self.seed_source.text,
                    VariantOrigin.SEED,
                    operator="original",
                    features={"family": "seed"},
                ),
            )
            variant = repo.get_variant(s, vid)
        assert variant is not None
        return variant

    def n_children(self) -> int:
        """Proposals made so far: the next proposal's index.  Proposals that were counted and
        not stored leave gaps in the stored indices, so this is one past the largest."""
        indices = [int(v.features.get("index", -1)) for v in self._variants()
                   if v.origin is not VariantOrigin.SEED]
        return max([len(indices) - 1, *indices]) + 1

    def _fitness_s(self, variant_id: int | None) -> float | None:
        from db import repository as repo

        if variant_id is None:
            return None
        with self.database.session_scope() as s:
            v = repo.get_variant(s, variant_id)
            fit = fitness_of(s, v, self.launch.block) if v is not None else None
        return fit.median_s if fit else None

    # -- proposals -------------------------------------------------------------------------
    # -- evaluation -----------------------------------------------------------------------
    def evaluate(self, variant: Variant, *, extend_s: float | None = None) -> StepReport:
        """Tune one pending variant and put it where it belongs in the funnel and archive.
        ``extend_s``: go on with an evaluated variant's inner search from its stored trials
        for that many seconds more (:meth:`_spend_rest`), the original unchecked again."""
        from db import repository as repo
        from r3tui.errors import R3Error
        from r3tui.search import Budget, parse_first, parse_tunables
        from r3tui.search.simulation import make_search

        assert variant.id is not None and self.evaluator_for is not None
        is_seed = variant.origin is VariantOrigin.SEED
        source = replace(self.seed_source, text=variant.source)
        extending = extend_s is not None  # evaluated already: checked, or refused before
        if is_seed and not extending:
            self.check_original()
        elif not extending:  # a variant stored before the check existed, or by another writer
            refusal = unsafe_reason(self.seed_source.text, variant.source)
            if refusal is not None:
                return self._finish(variant, VariantStatus.UNSAFE, refusal, None)
        started = time.monotonic()
        inner = self.settings.inner
        try:
            space = build_space(self.launch, source, inner, self.limits)
            named_first = parse_first(variant.source)  # a writer that did not check them
        except (R3Error, ValueError) as exc:
            return self._finish(variant, VariantStatus.APPLY_FAILED, f"search space: {exc}", None)
        search = make_search(
            inner.strategy,
            space,
            derive_seed(self.settings.seed, "inner", variant.id),
            None if inner.strategy != "bayes" else bayes_settings(inner),
        )
        added: frozenset[str] = frozenset()  # the tunables the child's change declared
        new_tile = False  # its change added a shared-memory tile (`// r3: shared`)
        with self.database.session_scope() as s:
            stored = [(t.config, t.measurement) for t in repo.trials_of_variant(s, variant.id)]
            if variant.parent_id is not None:
                parents = best_configs(s, variant.parent_id, max(1, self.settings.warm_start))
                if variant.operator == SWAP_OPERATOR:  # its parent's blocks, transposed
                    parents = [transposed(c, self.launch.block) for c in parents]
                parent = repo.get_variant(s, variant.parent_id)
                inherited = ({t.name for t in parse_tunables(parent.source)}
                             if parent is not None else set())
                added = frozenset(t.name for t in space.tunables if t.name not in inherited)
                new_tile = adds_tile(parent.source if parent else None, variant.source)
                # the child's change's own first lines (a descendant keeps its ancestors')
                earlier = first_lines(parent.source) if parent is not None else {}
                named_first = {n: v for n, v in named_first.items() if earlier.get(n) != v}
                first = {**(filling(space, variant.source, parents[0]) if parents else {}),
                         **named_first}  # what the rule says wins
                search.warm_start(exercising(space, parents[:1], self.settings.exercise,
                                             inherited, first))
                search.warm_start(parents[: self.settings.warm_start])
                if self.settings.transfer > 0:
                    search.set_prior(ancestor_trials(s, variant, self.settings.transfer,
                                                     self.launch.block))
        search.warm_start([space.baseline_config()])
        search.resume(stored)
        trials = self.settings.seed_trials if is_seed else self.settings.inner_trials
        # extending, the time alone bounds it, from the trials it has
        budget = (Budget(max_seconds=extend_s) if extending
                  else Budget(max_trials=trials, max_seconds=self._inner_seconds(is_seed)))
        result = run_inner(
            self.database,
            self.campaign_id,
            variant.id,
            search,
            self.evaluator_for(source),
            budget,
            replace(inner, seed=derive_seed(self.settings.seed, "winner", variant.id)),
            give_up_after=None if is_seed or extending else self.settings.give_up_after,
            should_stop=lambda: self.control.stop_requested,
            climb=None if extending else self._climb(space, is_seed, added, new_tile),
        )
        self.timing.evaluate_s += time.monotonic() - started
        parent_s = self._fitness_s(variant.parent_id)
        best_s = self._fitness_s(variant.id)
        status, reason = classify(result.failures, best_s, parent_s)
        return self._finish(variant, status, reason, best_s)

    def _climb(self, space: SearchSpace, is_seed: bool,
               added: frozenset[str] = frozenset(), new_tile: bool = False) -> Climb | None:
        """A child's climb from where it stands against the campaign's best (``added``: the
        tunables its change declared; ``new_tile``: its change added a shared-memory tile,
        which may start CLIMB_SLACK behind; none for the original, whose inner search is the
        Bayesian one the comparison arm runs alone)."""
        if is_seed or self.settings.climb <= 0:
            return None
        best = self.state.archive.best()
        return Climb(space, best.fitness_s if best else None, self.settings.climb, added,
                     CLIMB_SLACK if new_tile else 1.0)

    def _finish(
        self, variant: Variant, status: VariantStatus, reason: str | None, best_s: float | None
    ) -> StepReport:
        from db import repository as repo

        assert variant.id is not None
        family = family_of(variant)
        with self.database.session_scope() as s:
            features: dict[str, Any] = dict(variant.features)
            if status in EVALUATED_OK:
                fit = fitness_of(s, variant, self.launch.block)
                assert fit is not None
                features = {**features, **features_for(fit, family, variant.source),
                            "family": family}
            repo.update_variant(
                s, variant.id, status=status, status_reason=reason, features=features
            )
            if status in EVALUATED_OK and best_s is not None:
                placed, moved = self.state.offer(
                    replace(variant, features=features), features, best_s, seed=self.settings.seed
                )
                store_elites(s, self.campaign_id, placed, moved)
                if moved:
                    repo.add_event(
                        s,
                        self.campaign_id,
                        "migration",
                        f"{len(moved)} elite(s) migrated along the island ring",
                        {"moved": [[e.variant_id, i] for e, i in moved]},
                    )
            seed_s = None
            report = StepReport(
                int(variant.features.get("index", -1)),
                variant.id,
                variant.origin,
                variant.operator or "",
                status,
                reason,
                best_s,
                seed_s,
            )
            variant_event(s, self.campaign_id, variant.id, variant.origin, variant.operator,
                          status, reason, best_s)
        if self.progress:
            self.progress(report)
        return report

    def pending(self) -> list[Variant]:
        return [v for v in self._variants() if v.status is VariantStatus.PENDING]

    # -- the loop ---------------------------------------------------------------------------
    def _inner_seconds(self, is_seed: bool) -> float | None:
        """Under a wall-time budget, the original's inner search may take SEED_SHARE of it
        (its trials would otherwise spend a short budget before any source is proposed) and
        a child's what is left; without one, trials alone bound them."""
        seconds = self.settings.seconds
        if seconds is None:
            return None
        if is_seed:
            return seconds * SEED_SHARE
        return max(1.0, seconds - self.timing.wall_s())

    def _budget_left(self, made: int) -> bool:
        """Whether to propose another variant.  Under a wall-time budget the first one is
        always proposed: the original's evaluation (its check, its inner search, its
        finalists' re-timing) may spend a short budget alone where a replay is slow (gelu on
        the H200: 8 s, no source variant at all), and a campaign that searched no source
        is no three-level search; that variant's own inner search gets a second at least.
        A proposal counted and not stored (declined, a duplicate, the same compiled code) is
        no source searched, so proposals go on until one is stored (or the ledger's streak
        of unproductive proposals ends the campaign)."""
        if self.control.stop_requested:
            return False
        if self.settings.variants is not None and made >= self.settings.variants:
            return False
        seconds = self.settings.seconds
        return seconds is None or self.timing.wall_s() < seconds or self.stored == 0

    def _checkpoint(self) -> None:
        from db import repository as repo
        from r3tui.domain import CampaignStatus

        def paused() -> None:
            with self.database.session_scope() as s:
                repo.set_campaign_status(s, self.campaign_id, CampaignStatus.PAUSED)
                repo.add_event(s, self.campaign_id, "pause", "paused by request")

        def resumed() -> None:
            with self.database.session_scope() as s:
                repo.set_campaign_status(s, self.campaign_id, CampaignStatus.RUNNING)
                repo.add_event(s, self.campaign_id, "resume", "resumed by request")

        self.control.wait_while_paused(paused, resumed)

    def evaluate_pending(self) -> int:
        """Evaluate every pending variant, seed first (also what `r3 evaluate` does)."""
        done = 0
        for variant in sorted(
            self.pending(), key=lambda v: (v.origin is not VariantOrigin.SEED, v.id or 0)
        ):
            self._checkpoint()
            if self.control.stop_requested:
                break
            self.evaluate(variant)
            done += 1
        return done

    def check_original(self) -> None:
        """Replay the original once, as recorded, before any search: it must reproduce the
        recorded result, or there is nothing to search from (:class:`OriginalUnusable`)."""
        from db import repository as repo
        from r3tui.engine.unit_source import OriginalUnusable

        assert self.evaluator_for is not None
        space = build_space(self.launch, self.seed_source, self.settings.inner, self.limits)
        if space.launch_notes():  # which block shapes are searched, or why none
            with self.database.session_scope() as s:
                repo.add_event(s, self.campaign_id, "launch", "; ".join(space.launch_notes()))
        (measured,) = self.evaluator_for(self.seed_source).evaluate([space.baseline_config()])
        if measured.notes:  # e.g. a float sum whose last bits depend on the blocks' order
            with self.database.session_scope() as s:
                repo.add_event(s, self.campaign_id, "verify", "; ".join(measured.notes))
        if not measured.ok:
            raise OriginalUnusable(
                f"the original kernel does not replay ({measured.status.value}): "
                f"{measured.error_text or 'no detail'}; nothing to search from")

    def run(self) -> int:
        """Propose and evaluate until the budget is spent or a stop is requested."""
        seed = self.seed_variant()
        if seed.status is VariantStatus.PENDING:
            self.evaluate(seed)
        self.evaluate_pending()
        made = self.n_children()
        self.stored = made  # a resumed campaign's stored children count
        if self.mutator is None:
            return made
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="r3-remix") as llm:
            ahead: tuple[ProposalRequest, Future[tuple[Proposal, float]]] | None = None
            while self._budget_left(made):
                self._checkpoint()
                if self.control.stop_requested:
                    break
                if ahead is None:
                    request = self._request(made)
                    ahead = (request, llm.submit(self.generate_proposal, request))
                request, future = ahead
                waited = time.monotonic()
                proposal, llm_s = future.result()
                self.timing.llm_wait_s += time.monotonic() - waited
                self.timing.llm_s += llm_s
                variant = self.store_proposal(request, proposal)
                made += 1
                self.stored += variant is not None
                ahead = None
                if self._unproductive(variant):
                    break
                if self.settings.prefetch and self._budget_left(made):
                    # from the archive before this evaluation: overlap costs one step of lag
                    nxt = self._request(made)
                    ahead = (nxt, llm.submit(self.generate_proposal, nxt))
                if variant is not None and variant.status is VariantStatus.PENDING:
                    self.evaluate(variant)
                    made += self._repair(request, variant, made)
                    made += self._follow_up(variant, made)
                elif variant is not None:
                    self._announce(request.index, variant)
            if ahead is not None:
                # a stop or the budget arrived with a proposal in flight: keep it for resume
                request, future = ahead
                proposal, llm_s = future.result()
                self.timing.llm_s += llm_s
                if self.control.stop_requested:
                    self.store_proposal(request, proposal)
                    made += 1
        self.record_skipped()
        if self.stop_reason is not None:
            self._spend_rest()
        if not self.control.stop_requested:
            self.compare_with_original()
        return made

    def _spend_rest(self) -> None:
        """The source proposals ran dry (the ledger's streak) with wall time left: the rest
        goes to the inner search of the campaign's best variant, resumed from its trials, not
        back unused.  Rules-only campaigns of the corpus (8 s) stopped this way: hotspot3D's and
        streamcluster's tune-app ran 10.9 s and 8.7 s where BO alone's, given the same budget,
        ran 13.4 s and 13.6 s (session 44), so the comparison gave the full campaign less
        search."""
        from db import repository as repo

        seconds = self.settings.seconds
        best = self.state.archive.best()
        if seconds is None or best is None or self.control.stop_requested:
            return
        left = seconds - self.timing.wall_s()
        if left < 1.0:
            return
        with self.database.session_scope() as s:
            variant = repo.get_variant(s, best.variant_id)
            repo.add_event(s, self.campaign_id, "mix",
                           f"the source proposals ran dry: the {left:.1f} s left go to the "
                           f"inner search of variant {best.variant_id}, the fastest")
        if variant is not None:
            self.evaluate(variant, extend_s=left)
            self.ledger.stop_reason = (f"{self.ledger.stop_reason}; the {left:.1f} s left went "
                                       "to the inner search of the fastest variant")

    def compare_with_original(self, rounds: int = 15) -> dict[str, Any] | None:
        from r3tui.engine.comparison import compare_with_original

        return compare_with_original(self, rounds)

    def _announce(self, index: int, variant: Variant) -> None:
        """Progress for a proposal that is not evaluated (failed to apply, or pending)."""
        if self.progress:
            self.progress(
                StepReport(
                    index,
                    variant.id or 0,
                    variant.origin,
                    variant.operator or "",
                    variant.status,
                    variant.status_reason,
                    None,
                    None,
                )
            )

    def generate(self, n: int) -> list[Variant]:
        """Generational mode: write ``n`` pending proposals from the archive as it stands;
        first the repair turns of the model's evaluated changes that failed and have none."""
        seed = self.seed_variant()
        made = self.n_children()
        out: list[Variant] = [] if seed.status is not VariantStatus.PENDING else [seed]
        repairs = deque(self._unrepaired() if self.settings.repair else [])
        for _ in range(n):
            if self.control.stop_requested:
                break
            if repairs:
                failed, why = repairs.popleft()
                request = ProposalRequest.repair_of(made, failed, why)
            else:
                request = self._request(made)
            proposal, llm_s = self.generate_proposal(request)
            self.timing.llm_s += llm_s
            variant = self.store_proposal(request, proposal)
            made += 1
            if variant is not None:
                variant = self._checked(variant)
                out.append(variant)
                self._announce(request.index, variant)
                if (self.settings.repair and variant.status is VariantStatus.COMPILE_FAILED
                        and variant.origin is VariantOrigin.LLM):
                    repairs.appendleft((variant, self.told_failure(variant)))
        self.record_skipped()
        return out

    def _checked(self, variant: Variant) -> Variant:
        """generate-only (``compile_arch`` set): a model's pending change compiled here at its
        baseline configuration (NVRTC needs no GPU); one that does not compile is stored as
        compile_failed with the compiler's first error, so its repair turn comes in this run
        instead of after a round trip through the GPU node."""
        from db import repository as repo
        from r3tui.engine.unit_source import compile_error

        if (self.compile_arch is None or variant.status is not VariantStatus.PENDING
                or variant.origin not in (VariantOrigin.LLM, VariantOrigin.REPAIR)
                or variant.id is None):
            return variant
        error = compile_error(replace(self.seed_source, text=variant.source), self.launch,
                              self.settings.inner, self.limits, self.compile_arch)
        if error is None:
            return variant
        reason = f"compile_error (compiled on this machine before any GPU): {error}"
        with self.database.session_scope() as s:
            repo.update_variant(s, variant.id, status=VariantStatus.COMPILE_FAILED,
                                status_reason=reason)
            variant_event(s, self.campaign_id, variant.id, variant.origin, variant.operator,
                          VariantStatus.COMPILE_FAILED, reason)
        return replace(variant, status=VariantStatus.COMPILE_FAILED, status_reason=reason)
