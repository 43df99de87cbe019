"""What a campaign's proposals came to when they gave nothing to evaluate.

A rule that does not apply to its parent and a source the campaign already has are no
candidates: they are counted (one ``skipped`` event per run, a figure in ``r3 report``), never
nodes of the tree.  A run of :data:`STREAK_LIMIT` proposals in a row with nothing to evaluate
changes the mix once (every proposal to the model) and then stops the proposals with the
reason; under a wall-time budget the campaign spends what is left on its fastest variant's inner
search (``CampaignRun._spend_rest``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from r3tui.domain import Variant, VariantStatus

if TYPE_CHECKING:
    from db.session import Database
    from r3tui.remix.mutation import Mutator

# proposals in a row that give nothing to evaluate before the campaign changes its mix or stops
STREAK_LIMIT = 20


@dataclass
class ProposalLedger:
    skipped: dict[str, int] = field(default_factory=dict)  # since the last "skipped" event
    skipped_by_operator: dict[str, int] = field(default_factory=dict)  # "why:operator"
    streak: int = 0  # proposals in a row that gave nothing to evaluate
    stop_reason: str | None = None

    def skip(self, why: str, operator: str) -> None:
        self.skipped[why] = self.skipped.get(why, 0) + 1
        key = f"{why}:{operator}"
        self.skipped_by_operator[key] = self.skipped_by_operator.get(key, 0) + 1

    def record(self, database: Database, campaign_id: int) -> None:
        """One ``skipped`` event with the counts since the last one."""
        from db import repository as repo

        if not self.skipped:
            return
        with database.session_scope() as s:
            repo.add_event(
                s, campaign_id, "skipped",
                ", ".join(f"{n} {why}" for why, n in sorted(self.skipped.items()))
                + " proposal(s) not stored (a rule that does not apply, or a source or "
                "compiled code the campaign has)",
                {"counts": dict(self.skipped), "by_operator": dict(self.skipped_by_operator)})
        self.skipped.clear()
        self.skipped_by_operator.clear()

    def unproductive(self, variant: Variant | None, mutator: Mutator | None,
                     database: Database, campaign_id: int) -> bool:
        """Count a proposal that gave nothing to evaluate; True when the campaign must stop."""
        if variant is not None and variant.status is VariantStatus.PENDING:
            self.streak = 0
            return False
        self.streak += 1
        if self.streak < STREAK_LIMIT:
            return False
        from db import repository as repo

        self.streak = 0
        share = mutator.settings.llm_share if mutator is not None else 1.0
        with database.session_scope() as s:
            if mutator is not None and mutator.backend is not None and share < 1.0:
                mutator.settings = replace(mutator.settings, llm_share=1.0)
                repo.add_event(s, campaign_id, "mix",
                               f"{STREAK_LIMIT} proposals in a row gave nothing to evaluate: "
                               "every proposal now goes to the model")
                return False
            self.stop_reason = (f"{STREAK_LIMIT} proposals in a row gave nothing to evaluate "
                                "(rules that do not apply, duplicates or failed edits)")
            repo.add_event(s, campaign_id, "give_up", self.stop_reason)
        return True
