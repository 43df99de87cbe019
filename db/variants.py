"""Queries of the ``variants`` table: the kernel sources a campaign proposes, and the
evolutionary tree they form (parent links, with each variant's trial counts)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import case, func, select, update
from sqlalchemy.orm import Session

from db.figures import OK_TRIAL
from db.models import TrialRow, VariantRow
from db.rows import column_values, from_row, require_one
from r3tui.domain import Variant, VariantOrigin, VariantStatus


@dataclass(frozen=True)
class TreeNode:
    """One variant in the evolutionary tree, with its fitness so far."""

    id: int
    parent_id: int | None
    origin: VariantOrigin
    operator: str | None
    status: VariantStatus
    island: int
    best_time_s: float | None  # best median of its ok trials
    best_trial_id: int | None  # as the engine last set it
    n_trials: int


def _variant(row: VariantRow) -> Variant:
    return from_row(Variant, row)


def add_variant(s: Session, v: Variant) -> int:
    row = VariantRow(**column_values(v, skip=("id",)))
    s.add(row)
    s.flush()
    return row.id


def update_variant(
    s: Session,
    variant_id: int,
    *,
    status: VariantStatus | None = None,
    status_reason: str | None = None,
    best_trial_id: int | None = None,
    features: Mapping[str, Any] | None = None,
) -> None:
    """Change the given fields; None leaves a field as it is."""
    values: dict[str, Any] = {}
    if status is not None:
        values["status"] = status
    if status_reason is not None:
        values["status_reason"] = status_reason
    if best_trial_id is not None:
        values["best_trial_id"] = best_trial_id
    if features is not None:
        values["features"] = dict(features)
    if not values:
        return
    result = s.execute(update(VariantRow).where(VariantRow.id == variant_id).values(**values))
    require_one(result, "variant", variant_id)


def get_variant(s: Session, variant_id: int) -> Variant | None:
    row = s.get(VariantRow, variant_id)
    return None if row is None else _variant(row)


def best_trial_id(s: Session, variant_id: int) -> int | None:
    """The trial the engine chose as the variant's best (None until its inner loop ends)."""
    return s.execute(
        select(VariantRow.best_trial_id).where(VariantRow.id == variant_id)
    ).scalar_one_or_none()


def children(s: Session, variant_id: int) -> list[Variant]:
    rows = s.execute(
        select(VariantRow).where(VariantRow.parent_id == variant_id).order_by(VariantRow.id)
    ).scalars()
    return [_variant(r) for r in rows]


def campaign_variants(s: Session, campaign_id: int) -> list[Variant]:
    """Every variant with its source, in creation order (rebuilding the archive on resume)."""
    rows = s.execute(
        select(VariantRow).where(VariantRow.campaign_id == campaign_id).order_by(VariantRow.id)
    ).scalars()
    return [_variant(r) for r in rows]


def operator_outcomes(s: Session, campaign_id: int
                      ) -> list[tuple[str, VariantOrigin, VariantStatus]]:
    """``(operator, origin, status)`` of the campaign's variants that name an operator, in
    creation order, without their sources (what the bandit counts before each proposal)."""
    rows = s.execute(
        select(VariantRow.operator, VariantRow.origin, VariantRow.status)
        .where(VariantRow.campaign_id == campaign_id, VariantRow.operator.is_not(None))
        .order_by(VariantRow.id)
    )
    return [(str(op), origin, status) for op, origin, status in rows]


def variant_sources_after(s: Session, campaign_id: int, after_id: int) -> list[tuple[int, str]]:
    """``(id, source)`` of the campaign's variants with an id above ``after_id``, in creation
    order: what a caller that keeps something per variant has not seen yet (ids only grow)."""
    rows = s.execute(
        select(VariantRow.id, VariantRow.source)
        .where(VariantRow.campaign_id == campaign_id, VariantRow.id > after_id)
        .order_by(VariantRow.id)
    )
    return [(int(vid), str(source)) for vid, source in rows]


def campaign_tree(s: Session, campaign_id: int) -> list[TreeNode]:
    """The campaign's variants without their source, with trial counts, in one query."""
    stats = (
        select(
            TrialRow.variant_id,
            func.count().label("n"),
            func.min(case((OK_TRIAL, TrialRow.median_s))).label("best"),
        )
        .where(TrialRow.campaign_id == campaign_id)
        .group_by(TrialRow.variant_id)
        .subquery()
    )
    query = (
        select(
            VariantRow.id,
            VariantRow.parent_id,
            VariantRow.origin,
            VariantRow.operator,
            VariantRow.status,
            VariantRow.island,
            stats.c.best,
            VariantRow.best_trial_id,
            func.coalesce(stats.c.n, 0),
        )
        .outerjoin(stats, stats.c.variant_id == VariantRow.id)
        .where(VariantRow.campaign_id == campaign_id)
        .order_by(VariantRow.id)
    )
    # The columns are selected in TreeNode's field order.
    return [TreeNode(*row) for row in s.execute(query)]
