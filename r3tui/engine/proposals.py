"""The proposal side of a campaign's outer loop: what a proposal is made from (the parent,
its measured profile, inspirations, the bandit's order), asking the remix layer for it,
storing it or counting it (declined, a duplicate, the same compiled code), and the repair
turn of a model's change that failed.  :class:`ProposalSide` is mixed into
:class:`~r3tui.engine.campaign.CampaignRun`, which evaluates what is stored."""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from r3tui.domain import MeasurementStatus, Variant, VariantOrigin, VariantStatus
from r3tui.engine.lineage import ArchiveState, fitness_of
from r3tui.engine.novelty import compiled_code
from r3tui.search.strategy import derive_seed

if TYPE_CHECKING:
    from db.session import Database
    from r3tui.engine.campaign import CampaignSettings, EvaluatorFactory, StepReport, Timing
    from r3tui.engine.inner import KernelSource
    from r3tui.engine.ledger import ProposalLedger
    from r3tui.engine.novelty import Novelty
    from r3tui.record.manifest import LaunchInfo
    from r3tui.remix.mutation import Mutator, Proposal
    from r3tui.remix.prompt import Inspiration, VariantProfile
    from r3tui.search import DeviceLimits


@dataclass(frozen=True)
class ProposalRequest:
    """Everything one proposal is made from, read from the DB on the engine's thread."""

    index: int
    island: int
    parent: Variant
    profile: VariantProfile | None
    inspirations: tuple[Inspiration, ...]
    inspiration_ids: tuple[int, ...] = ()
    repair: str | None = None  # the parent's failure, for a repair turn
    repair_example: str | None = None  # its format example (MutationContext; None: "worked")
    example_names: str = "apart"  # the worked example's names (MutationContext.example_names)
    preference: tuple[str, ...] | None = None  # transformations, the one to try first first
    # the one change asked for (a follow-up), by name: its rule makes it, not the model
    transformation: str | None = None

    @classmethod
    def repair_of(cls, index: int, failed: Variant, failure: str) -> ProposalRequest:
        """A repair turn for the model's change ``failed``, told ``failure``, with the generic
        format example (since session 33: its names cannot be copied into the kernel)."""
        return cls(index, failed.island, failed, None, (), (), failure,
                   repair_example="generic")


def square_work(launch: LaunchInfo) -> bool:
    """Whether the recorded launch's work (its threads where no work size was recorded) is as
    wide along x as along y, and more than one wide: a variant with the thread axes exchanged
    (:data:`r3tui.remix.rules.SQUARE_WORK_RULES`) then still covers it."""
    from r3tui.record.app_bundle import launched_threads

    work = launch.work or launched_threads(launch.grid, launch.block)
    return work.x == work.y > 1


class ProposalSide:
    """Proposals for one campaign (mixed into ``CampaignRun``, which sets these)."""

    database: Database
    campaign_id: int
    settings: CampaignSettings
    seed_source: KernelSource
    launch: LaunchInfo
    limits: DeviceLimits
    mutator: Mutator | None
    evaluator_for: EvaluatorFactory | None
    timing: Timing
    state: ArchiveState
    ledger: ProposalLedger
    novelty: Novelty

    # what the evaluation side (CampaignRun) gives a repair turn
    def seed_variant(self) -> Variant:
        raise NotImplementedError

    def evaluate(self, variant: Variant) -> StepReport:
        raise NotImplementedError

    def _announce(self, index: int, variant: Variant) -> None:
        raise NotImplementedError

    def _budget_left(self, made: int) -> bool:
        raise NotImplementedError

    def _profile(self, variant: Variant) -> VariantProfile | None:
        from db import repository as repo
        from r3tui.remix.prompt import VariantProfile

        assert variant.id is not None
        with self.database.session_scope() as s:
            fit = fitness_of(s, variant, self.launch.block)
            trial = repo.get_trial(s, fit.trial_id) if fit else None
        if fit is None:
            return None
        log = trial.measurement.compile_log if trial else None
        return VariantProfile(
            median_s=fit.median_s,
            registers=fit.registers,
            spills_bytes=fit.spills_bytes,
            occupancy=fit.occupancy,
            shared_mem_bytes=fit.shared_mem_bytes,
            achieved_fraction=None,
            ceiling=None,
            compile_warnings=_warnings(log),
        )

    def _request(self, index: int) -> ProposalRequest:
        """Parent and inspirations for proposal ``index``, chosen from the archive."""
        rng = random.Random(derive_seed(self.settings.seed, "select", index))
        archive = self.state.archive
        island = archive.island_for(index)
        elite = archive.select_parent(island, rng)
        others = archive.inspirations(island, elite, rng) if elite is not None else []
        parent_id = elite.variant_id if elite is not None else self.seed_variant().id
        assert parent_id is not None
        return self.request_for(index, island, parent_id, [e.variant_id for e in others])

    def request_for(
        self,
        index: int,
        island: int,
        parent_id: int,
        inspiration_ids: list[int],
        *,
        as_parent: Variant | None = None,
        as_of_call: int | None = None,
    ) -> ProposalRequest:
        """A proposal's inputs from stored variants: the parent's source and measured profile,
        each inspiration's source and fitness.  ``as_parent`` stands in for the parent row
        (a re-run links its proposals to its own copy of the recorded parent); ``as_of_call``
        (a re-run's recorded LLM call) leaves out what was measured only after that call (a
        generational campaign's variants, evaluated on the GPU after they were written)."""
        from db import repository as repo
        from r3tui.remix.prompt import Inspiration

        def known(s: Any, vid: int) -> bool:
            return as_of_call is None or repo.measured_before_call(s, vid, as_of_call)

        with self.database.session_scope() as s:
            parent = repo.get_variant(s, parent_id)
            inspirations: list[Inspiration] = []
            for vid in inspiration_ids:
                v = repo.get_variant(s, vid)
                fit = fitness_of(s, v, self.launch.block) if v is not None else None
                if v is not None and fit is not None and known(s, vid):
                    inspirations.append(Inspiration(v.source, fit.median_s))
            parent_known = known(s, parent_id)
        assert parent is not None
        return ProposalRequest(
            index,
            island,
            as_parent or parent,
            self._profile(parent) if parent_known else None,
            tuple(inspirations),
            tuple(inspiration_ids),
            preference=self._preference(index, (as_parent or parent).source),
        )

    def _preference(self, index: int, parent_source: str) -> tuple[str, ...] | None:
        """The transformations in the order the bandit draws for proposal ``index``, from
        what each one's variants in this campaign have gained so far; where the model makes
        proposals, those relevant to the parent first (:mod:`r3tui.remix.relevance`: the
        model takes the first, and seldom makes one whose pattern the kernel lacks).  A
        variant keeps the order it was asked with, so a re-run asks the same."""
        if not self.settings.adaptive:
            return None
        from db import repository as repo
        from r3tui.remix.catalogue import CATALOGUE
        from r3tui.search.bandit import ArmRecord, preference

        counts: dict[str, list[int]] = {}
        with self.database.session_scope() as s:
            for operator, origin, status in repo.operator_outcomes(s, self.campaign_id):
                if operator and origin is not VariantOrigin.SEED \
                        and status is not VariantStatus.PENDING:
                    tried_gained = counts.setdefault(operator, [0, 0])
                    tried_gained[0] += 1
                    tried_gained[1] += status is VariantStatus.IMPROVED
        records = {name: ArmRecord(t, g) for name, (t, g) in counts.items()}
        # a hint to the compiler starts with misses (r3tui.search.bandit says why)
        prior = {t.name: ArmRecord(self.settings.hint_prior, 0) for t in CATALOGUE if t.hint}
        rng = random.Random(derive_seed(self.settings.seed, "prefer", index))
        order = preference([t.name for t in CATALOGUE], records, rng, prior)
        if self.mutator is None or self.mutator.backend is None:
            return order
        from r3tui.remix.relevance import relevant_first

        return relevant_first(order, parent_source, self.seed_source.kernel_name)

    def generate_proposal(self, request: ProposalRequest) -> tuple[Proposal, float]:
        """Ask the remix layer for one change to the request's parent (any thread)."""
        from r3tui.remix.prompt import MutationContext

        assert self.mutator is not None
        rng = random.Random(derive_seed(self.settings.seed, "propose", request.index))
        started = time.monotonic()
        from r3tui.remix.catalogue import transformation

        wanted = None
        if request.repair is not None and request.parent.operator:
            wanted = transformation(request.parent.operator)
        elif request.transformation is not None:
            wanted = transformation(request.transformation)
        context = MutationContext(
            kernel_name=self.seed_source.kernel_name,
            parent_source=request.parent.source,
            profile=request.profile,
            inspirations=request.inspirations,
            transformation=wanted,
            is_known=self.has_source,
            confined=self.seed_source.confined,
            grid_fixed=self.settings.inner.grid_fixed,
            square_work=square_work(self.launch),
            repair=request.repair,
            repair_example=request.repair_example or "worked",
            example_names=request.example_names,
            preference=request.preference,
        )
        if request.transformation is not None and wanted is not None and wanted.rule:
            proposal = self.mutator.propose_rule(context, rng)  # a follow-up: the rule makes it
        else:
            proposal = self.mutator.propose(context, rng)
        return proposal, time.monotonic() - started

    def has_source(self, source: str) -> bool:
        """Whether a variant of this campaign has ``source`` up to comments and layout (any
        thread).  Proposals are generated after the previous one is stored, so the answer is
        the same in a re-run."""
        with self.database.session_scope() as s:
            return self.novelty.has_source(s, source)

    def store_proposal(self, request: ProposalRequest, proposal: Proposal) -> Variant | None:
        """The proposal as a variant row (pending, or apply_failed/unsafe with the reason); None
        for a proposal that is no candidate -- a rule that does not apply to the parent, or a
        source the campaign already has -- which is counted (:attr:`skipped`), not stored."""
        from db import repository as repo

        with self.database.session_scope() as s:
            call_id = (
                repo.add_llm_call(s, self.campaign_id, proposal.llm_call)
                if proposal.llm_call is not None
                else None
            )
            ok = proposal.ok and proposal.source is not None
            reason = proposal.reason
            failed = VariantStatus.APPLY_FAILED
            if not ok and proposal.llm_call is None:
                self._skip("declined", proposal.operator)
                return None
            # the same source twice would cost a second inner loop and say nothing new
            if ok and proposal.source is not None and self.novelty.has_source(s, proposal.source):
                self._skip("duplicate", proposal.operator)
                return None
        code = None
        if ok and proposal.source is not None:
            refusal = unsafe_reason(self.seed_source.text, proposal.source)
            if refusal is not None:  # never compiled, never run
                ok, reason, failed = False, refusal, VariantStatus.UNSAFE
        if ok and proposal.source is not None:
            # a new text whose compiled code and search are a stored variant's (a `const` the
            # compiler had inferred, a renamed local) would measure the same; compiled outside
            # any transaction
            code = self._code_of(proposal.source)
            if code is not None:
                self.novelty.load(self.database)
                if self.novelty.has_code(code):
                    self._skip("same_code", proposal.operator)
                    return None
        with self.database.session_scope() as s:
            vid = repo.add_variant(
                s,
                Variant(
                    self.campaign_id,
                    proposal.source if proposal.source is not None else request.parent.source,
                    proposal.origin,
                    parent_id=request.parent.id,
                    diff=proposal.diff,
                    operator=proposal.operator,
                    status=VariantStatus.PENDING if ok else failed,
                    status_reason=None if ok else reason,
                    island=request.island,
                    features={
                        "family": proposal.transformation.family,
                        "index": request.index,
                        "inspirations": list(request.inspiration_ids),
                        # how it was made: what a rule changed, or how much of the answer applied
                        **({"applied": proposal.detail} if proposal.detail else {}),
                        # what it was asked with, so that a re-run from the recorded answers
                        # asks the same: the bandit's order, the failure a repair fixes
                        **({"preference": list(request.preference)}
                           if request.preference is not None else {}),
                        **({"repair": request.repair} if request.repair is not None else {}),
                        **({"repair_example": request.repair_example}
                           if request.repair_example is not None else {}),
                        **({"example_names": request.example_names}
                           if proposal.origin is not VariantOrigin.RULE else {}),
                        **({"code": code} if code is not None else {}),
                    },
                    llm_call_id=call_id,
                ),
            )
            if code is not None:
                self.novelty.add_code(code, vid)
            if not ok:
                variant_event(s, self.campaign_id, vid, proposal.origin, proposal.operator,
                              failed, reason)
            variant = repo.get_variant(s, vid)
        assert variant is not None
        return variant

    def _code_of(self, source: str) -> str | None:
        return compiled_code(self.evaluator_for, self.seed_source, source, self.launch,
                             self.settings.inner, self.limits)

    def _skip(self, why: str, operator: str) -> None:
        self.ledger.skip(why, operator)

    @property
    def skipped(self) -> dict[str, int]:
        return self.ledger.skipped

    @property
    def stop_reason(self) -> str | None:
        return self.ledger.stop_reason

    def record_skipped(self) -> None:
        """One event with the proposals that were counted instead of stored since the last."""
        self.ledger.record(self.database, self.campaign_id)

    def _unproductive(self, variant: Variant | None) -> bool:
        return self.ledger.unproductive(variant, self.mutator, self.database, self.campaign_id)

    # the failures a repair turn is for: the model can act on a compiler error or a mismatch
    REPAIRABLE = (VariantStatus.COMPILE_FAILED, VariantStatus.WRONG_RESULT)

    def _unrepaired(self) -> list[tuple[Variant, str]]:
        """The model's changes that failed to compile or verify and have no repair child yet,
        oldest first, each with its failure (a generational run's repair turns)."""
        from db import repository as repo

        with self.database.session_scope() as s:
            variants = repo.campaign_variants(s, self.campaign_id)
            repaired = {v.parent_id for v in variants if v.origin is VariantOrigin.REPAIR}
            return [(v, self._failure_of(s, v)) for v in variants
                    if self._repairable(v) and v.id not in repaired]

    def _repairable(self, v: Variant) -> bool:
        return (v.origin is VariantOrigin.LLM and v.status in self.REPAIRABLE
                and bool(v.operator) and v.id is not None)

    def _failure_of(self, s: Any, v: Variant) -> str:
        """:meth:`told_failure` with the first failed trial's compiler error or mismatch."""
        from db import repository as repo

        assert v.id is not None
        return self.told_failure(v, _first_failure(repo.trials_of_variant(s, v.id)))

    def told_failure(self, v: Variant, first: str | None = None) -> str:
        """What a repair turn tells the model: the status and ``first`` (a trial's compiler
        error or mismatch; else the variant's own reason), with the line a compiler error
        names quoted from the variant (not for an application's unit: it is compiled whole,
        its lines are not the variant's)."""
        from r3tui.remix.prompt import quote_error_line

        why = f"{v.status.value}: {first or v.status_reason}"
        return why if self.seed_source.confined else quote_error_line(why, v.source)

    def _repair(self, request: ProposalRequest, variant: Variant, made: int) -> int:
        """Once for a model's change that did not compile or verify: ask the model to fix it,
        with the failure, and evaluate the answer as the failed variant's child.  The number
        of proposals it made (0 or 1)."""
        from db import repository as repo

        if (not self.settings.repair or variant.origin is not VariantOrigin.LLM
                or variant.id is None or not self._budget_left(made)):
            return 0
        with self.database.session_scope() as s:
            failed = repo.get_variant(s, variant.id)  # as the evaluation left it
            if failed is None or not self._repairable(failed):
                return 0
            why = self._failure_of(s, failed)
        return self._propose_and_evaluate(ProposalRequest.repair_of(made, failed, why), made)

    def _propose_and_evaluate(self, request: ProposalRequest, made: int) -> int:
        """Ask for ``request``'s proposal now, store it and evaluate what is stored (a repair
        turn or a follow-up, outside the loop's prefetch); 1, the proposals made."""
        proposal, llm_s = self.generate_proposal(request)
        self.timing.llm_s += llm_s
        child = self.store_proposal(request, proposal)
        if child is not None and child.status is VariantStatus.PENDING:
            self.evaluate(child)
        elif child is not None:
            self._announce(made, child)
        return 1

    def _follow_up(self, variant: Variant, made: int) -> int:
        """Once for a variant whose change enables another (``Transformation.enables``) and
        that replayed right: propose that change on it at once and evaluate the result, as
        its child, whatever the variant's own time.  The number of proposals made (0 or 1).

        Register blocking alone seldom pays, and a tile of the blocked loop pays most: sgemm
        at 1290^3 on an H100 (session 45, bench/rule_gains.py), 2x4 outputs a thread 1.075x,
        a tile alone 0.828x, both 2.237x.  A coarsened child that is not the best is seldom
        chosen as a parent, so one of six 30-second campaigns never tiled one (645.6 us
        against 235-352 us for the five that did)."""
        from db import repository as repo
        from r3tui.engine.lineage import EVALUATED_OK
        from r3tui.errors import ConfigError
        from r3tui.remix.catalogue import transformation

        if (not self.settings.follow_up or variant.id is None or not variant.operator
                or variant.origin is not VariantOrigin.RULE or not self._budget_left(made)):
            return 0
        try:
            enables = transformation(variant.operator).enables
        except ConfigError:  # an operator no longer in the catalogue
            return 0
        if enables is None:
            return 0
        with self.database.session_scope() as s:
            evaluated = repo.get_variant(s, variant.id)
        if evaluated is None or evaluated.status not in EVALUATED_OK:
            return 0
        return self._propose_and_evaluate(
            replace(self.request_for(made, evaluated.island, variant.id, []),
                    transformation=enables), made)


def variant_event(s: Any, campaign_id: int, variant_id: int, origin: VariantOrigin,
                  operator: str | None, status: VariantStatus, reason: str | None,
                  best_s: float | None = None) -> None:
    """The ``variant`` event of a variant's outcome, as the TUI's log and `r3 report` read it:
    ``#ID origin:operator → status (reason), time``."""
    from db import repository as repo

    repo.add_event(
        s,
        campaign_id,
        "variant",
        f"#{variant_id} {origin.value}:{operator} → {status.value}"
        + (f" ({reason})" if reason else "")
        + (f", {best_s * 1e6:.1f} µs" if best_s is not None else ""),
        {"variant_id": variant_id, "status": status.value, "best_s": best_s},
    )


def _first_failure(trials: Sequence[Any]) -> str | None:
    """What a failed variant's first failed trial says: the compiler's first error, or the
    verification's mismatch (what a repair turn shows the model)."""
    from r3tui.compile.base import first_error_line

    for trial in trials:
        m = trial.measurement
        if m.status is MeasurementStatus.COMPILE_ERROR and m.compile_log:
            return first_error_line(m.compile_log)
        if not m.ok and m.error_text:
            return m.error_text
    return None


def unsafe_reason(original: str, candidate: str) -> str | None:
    """Why ``candidate`` must not be compiled (host code, device heap, clock reads), or None:
    the static half of docs/verification.md, run before any compile."""
    from r3tui.analysis import check_candidate

    report = check_candidate(original, candidate)
    return report.reason if report.refused else None


def _warnings(log: str | None) -> str | None:
    if not log:
        return None
    lines = [ln.strip() for ln in log.splitlines() if "warning" in ln.lower()]
    return "\n".join(lines[:5]) or None
