"""Queries of the ``trials`` table: one evaluated (variant, configuration) each, written once
its measurement is complete.

A trial row holds a ``Measurement`` flattened into columns; ``trial_values`` and
``trial_record`` are the one mapping between the two (``db.series`` reads trials through
``trial_record`` too).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import func, insert, select
from sqlalchemy.orm import Session

from db.figures import OK_TRIAL
from db.models import TrialRow, utcnow
from db.rows import from_row
from r3tui.domain import Measurement, ResourceUsage, TimeStats, TrialConfig


@dataclass(frozen=True)
class TrialRecord:
    """A stored trial: what was tried and what came of it."""

    id: int
    campaign_id: int
    variant_id: int
    config: TrialConfig
    measurement: Measurement
    created_at: datetime


class NewTrial(NamedTuple):
    """One row for ``insert_trials``."""

    campaign_id: int
    variant_id: int
    config: TrialConfig
    measurement: Measurement


_RESOURCE_FIELDS = tuple(f.name for f in dataclasses.fields(ResourceUsage))
# Measurement fields stored as same-named columns; status, time and resources are mapped apart,
# and notes (facts of the recording, not of the trial) go into the campaign's events.
_MEASUREMENT_FIELDS = tuple(
    f.name for f in dataclasses.fields(Measurement)
    if f.name not in ("status", "time", "resources", "notes")
)


def trial_values(
    campaign_id: int, variant_id: int, config: TrialConfig, m: Measurement
) -> dict[str, Any]:
    """The column values of a new trial row, stamped with the time now."""
    t = m.time
    values: dict[str, Any] = {
        "campaign_id": campaign_id,
        "variant_id": variant_id,
        "config": config.to_json(),
        "status": m.status,
        "median_s": t.median_s if t else None,
        "min_s": t.min_s if t else None,
        "iqr_s": t.iqr_s if t else None,
        "n_samples": t.n if t else None,
        "created_at": utcnow(),
    }
    values.update((name, getattr(m.resources, name)) for name in _RESOURCE_FIELDS)
    values.update((name, getattr(m, name)) for name in _MEASUREMENT_FIELDS)
    return values


def _measurement(row: TrialRow) -> Measurement:
    time = None
    if row.median_s is not None and row.min_s is not None and row.n_samples is not None:
        time = TimeStats(row.median_s, row.min_s, row.iqr_s or 0.0, row.n_samples)
    return Measurement(
        status=row.status,
        time=time,
        resources=from_row(ResourceUsage, row),
        **{name: getattr(row, name) for name in _MEASUREMENT_FIELDS},
    )


def trial_record(row: TrialRow) -> TrialRecord:
    """A trial row as the frozen value callers get."""
    return TrialRecord(
        id=row.id,
        campaign_id=row.campaign_id,
        variant_id=row.variant_id,
        config=TrialConfig.from_json(row.config),
        measurement=_measurement(row),
        created_at=row.created_at,
    )


def insert_trials(
    s: Session, rows: Iterable[NewTrial | tuple[int, int, TrialConfig, Measurement]]
) -> list[int]:
    """Insert many trials in one executemany; returns their ids in the order given."""
    params = [trial_values(*row) for row in rows]
    if not params:
        return []
    result = s.execute(
        insert(TrialRow).returning(TrialRow.id, sort_by_parameter_order=True), params
    )
    return list(result.scalars())


def insert_trial(
    s: Session, campaign_id: int, variant_id: int, config: TrialConfig, m: Measurement
) -> int:
    return insert_trials(s, [NewTrial(campaign_id, variant_id, config, m)])[0]


def get_trial(s: Session, trial_id: int) -> TrialRecord | None:
    row = s.get(TrialRow, trial_id)
    return None if row is None else trial_record(row)


def trials_of_variant(s: Session, variant_id: int) -> list[TrialRecord]:
    rows = s.execute(
        select(TrialRow).where(TrialRow.variant_id == variant_id).order_by(TrialRow.id)
    ).scalars()
    return [trial_record(r) for r in rows]


def finished_trials(
    s: Session, campaign_id: int, *, variant_id: int | None = None
) -> list[TrialRecord]:
    """Every stored trial (failures included: BO tells them as a penalty), oldest first.

    A trial row is written only once its measurement is complete, so all rows are finished.
    """
    query = select(TrialRow).where(TrialRow.campaign_id == campaign_id)
    if variant_id is not None:
        query = query.where(TrialRow.variant_id == variant_id)
    return [trial_record(r) for r in s.execute(query.order_by(TrialRow.id)).scalars()]


def trial_count(s: Session, campaign_id: int) -> int:
    return int(
        s.execute(
            select(func.count()).select_from(TrialRow).where(TrialRow.campaign_id == campaign_id)
        ).scalar_one()
    )


def best_so_far_series(s: Session, campaign_id: int) -> list[tuple[int, float, datetime]]:
    """(trial id, best median so far, created_at) for each ok trial, in trial order."""
    running_best = func.min(TrialRow.median_s).over(order_by=TrialRow.id, rows=(None, 0))
    query = (
        select(TrialRow.id, running_best, TrialRow.created_at)
        .where(TrialRow.campaign_id == campaign_id, OK_TRIAL, TrialRow.median_s.is_not(None))
        .order_by(TrialRow.id)
    )
    return [(tid, float(best), created) for tid, best, created in s.execute(query)]


def measured_before_call(s: Session, variant_id: int, llm_call_id: int) -> bool:
    """Whether the variant had a trial stored before the LLM call ``llm_call_id`` was: what
    that call could have been shown of it (a re-run from recorded answers asks as it did)."""
    from db.models import LLMCallRow

    asked = select(LLMCallRow.created_at).where(LLMCallRow.id == llm_call_id).scalar_subquery()
    found = s.execute(select(TrialRow.id).where(TrialRow.variant_id == variant_id,
                                                TrialRow.created_at < asked).limit(1)).first()
    return found is not None
