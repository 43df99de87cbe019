"""Queries of the ``elite_cells`` table: the MAP-Elites archive as last persisted, one
occupant per (campaign, island, cell key), read back to rebuild the archive on resume."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from db.models import EliteCellRow, utcnow
from db.rows import column_values, from_row
from r3tui.domain import EliteCell


def upsert_elite(s: Session, cell: EliteCell) -> None:
    """Put ``cell`` in its (campaign, island, cell key) slot, replacing any occupant.

    Whether the newcomer deserves the slot is the archive's decision (r3tui.search).
    """
    now = utcnow()
    stmt = sqlite_insert(EliteCellRow).values(**column_values(cell), updated_at=now)
    stmt = stmt.on_conflict_do_update(
        index_elements=[EliteCellRow.campaign_id, EliteCellRow.island, EliteCellRow.cell_key],
        set_={
            "variant_id": stmt.excluded.variant_id,
            "fitness_s": stmt.excluded.fitness_s,
            "updated_at": now,
        },
    )
    s.execute(stmt)


def elites(s: Session, campaign_id: int) -> list[EliteCell]:
    rows = s.execute(
        select(EliteCellRow)
        .where(EliteCellRow.campaign_id == campaign_id)
        .order_by(EliteCellRow.island, EliteCellRow.cell_key)
    ).scalars()
    return [from_row(EliteCell, r) for r in rows]
