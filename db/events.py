"""Queries of the ``events`` table: a campaign's log, written by the engine and polled by
the TUI for the lines after the last one it shows."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from db.models import EventRow
from db.rows import from_row


@dataclass(frozen=True)
class EventRecord:
    """A stored log line; ``data`` is its JSON payload, if any."""

    id: int
    campaign_id: int
    created_at: datetime
    kind: str
    message: str
    data: dict[str, Any] | None


def add_event(
    s: Session,
    campaign_id: int,
    kind: str,
    message: str,
    data: Mapping[str, Any] | None = None,
) -> int:
    row = EventRow(
        campaign_id=campaign_id,
        kind=kind,
        message=message,
        data=dict(data) if data is not None else None,
    )
    s.add(row)
    s.flush()
    return row.id


def events(s: Session, campaign_id: int, after_id: int = 0, limit: int = 1000) -> list[EventRecord]:
    """Events with id > ``after_id``, oldest first: the TUI polls with its last id."""
    rows = s.execute(
        select(EventRow)
        .where(EventRow.campaign_id == campaign_id, EventRow.id > after_id)
        .order_by(EventRow.id)
        .limit(limit)
    ).scalars()
    return [from_row(EventRecord, r) for r in rows]
