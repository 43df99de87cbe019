"""Queries of the ``llm_calls`` table: every prompt and response, kept so that a campaign
can be re-run without the model by replaying them in order."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from db.models import LLMCallRow
from db.rows import column_values, from_row
from r3tui.domain import LLMCall


def add_llm_call(s: Session, campaign_id: int, call: LLMCall) -> int:
    row = LLMCallRow(campaign_id=campaign_id, **column_values(call))
    s.add(row)
    s.flush()
    return row.id


def get_llm_call(s: Session, call_id: int) -> LLMCall | None:
    row = s.get(LLMCallRow, call_id)
    return None if row is None else from_row(LLMCall, row)


def campaign_llm_calls(s: Session, campaign_id: int) -> list[tuple[int, LLMCall]]:
    """(id, call) in the order made: what a model-free re-run of the search replays."""
    rows = s.execute(
        select(LLMCallRow).where(LLMCallRow.campaign_id == campaign_id).order_by(LLMCallRow.id)
    ).scalars()
    return [(r.id, from_row(LLMCall, r)) for r in rows]
