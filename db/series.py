"""Read-only queries of the panes beside the tree: details, trials, convergence, events.

The campaign screen shows, for the selected variant, its source, parent and best trial, and
its trials sorted in SQL; for the campaign, the totals of the status line and the series of
best times, both extended on every poll from the values the screen already holds (200,000
trials are summed once, not every second), and the last events.  Like ``db.browse``, every
function only reads, takes a ``Session`` first and returns frozen values.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from db.browse import VariantNode, variant_nodes
from db.events import EventRecord, events
from db.figures import OK_TRIAL, original_time
from db.models import CampaignRow, EventRow, LLMCallRow, TrialRow, VariantRow

# trial_record: the one mapping of trial rows to Measurement lives in db.trials.
from db.trials import TrialRecord, get_trial, trial_record

# --------------------------------------------------------------------------------- totals


@dataclass(frozen=True)
class CampaignStats:
    """Totals for the status bar: evaluations and where the time went (evaluations/s is
    ``db.figures.evaluations_per_s`` of ``n_trials`` and the campaign's duration)."""

    n_trials: int = 0
    n_ok: int = 0
    first_trial_at: datetime | None = None
    last_trial_at: datetime | None = None
    compile_s: float = 0.0
    replay_s: float = 0.0
    llm_s: float = 0.0
    n_llm_calls: int = 0
    last_trial_id: int = 0
    last_llm_call_id: int = 0


def campaign_stats(
    s: Session, campaign_id: int, *, since: CampaignStats | None = None
) -> CampaignStats:
    """The totals, extended from ``since`` by the trials stored after it (200,000 trials
    are summed once, not on every poll)."""
    since = since or CampaignStats()
    n, n_ok, first, last, compile_s, replay_s, last_id = s.execute(
        select(
            func.count(),
            func.coalesce(func.sum(case((OK_TRIAL, 1), else_=0)), 0),
            func.min(TrialRow.created_at),
            func.max(TrialRow.created_at),
            func.coalesce(func.sum(TrialRow.compile_time_s), 0.0),
            func.coalesce(func.sum(TrialRow.replay_wall_s), 0.0),
            func.max(TrialRow.id),
        ).where(TrialRow.campaign_id == campaign_id, TrialRow.id > since.last_trial_id)
    ).one()
    n_calls, llm_s, last_call = s.execute(
        select(
            func.count(),
            func.coalesce(func.sum(LLMCallRow.latency_s), 0.0),
            func.max(LLMCallRow.id),
        ).where(LLMCallRow.campaign_id == campaign_id, LLMCallRow.id > since.last_llm_call_id)
    ).one()
    return CampaignStats(
        n_trials=since.n_trials + int(n),
        n_ok=since.n_ok + int(n_ok),
        # aggregates of a DATETIME column come back as text (no type decorator on them)
        first_trial_at=since.first_trial_at or _as_datetime(first),
        last_trial_at=_as_datetime(last) or since.last_trial_at,
        compile_s=since.compile_s + float(compile_s),
        replay_s=since.replay_s + float(replay_s),
        llm_s=since.llm_s + float(llm_s),
        n_llm_calls=since.n_llm_calls + int(n_calls),
        last_trial_id=int(last_id) if last_id is not None else since.last_trial_id,
        last_llm_call_id=int(last_call) if last_call is not None else since.last_llm_call_id,
    )


def _as_datetime(value: object) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    return datetime.fromisoformat(str(value)).replace(tzinfo=UTC)


# -------------------------------------------------------------------------------- details


@dataclass(frozen=True)
class VariantDetail:
    """One variant with its source, its parent's source and its best trial."""

    node: VariantNode
    source: str
    diff: str | None  # as stored by the engine
    parent_source: str | None
    features: dict[str, Any]
    llm_call_id: int | None
    created_at: datetime
    best_trial: TrialRecord | None


def variant_detail(s: Session, variant_id: int) -> VariantDetail | None:
    row = s.get(VariantRow, variant_id)
    if row is None:
        return None
    node = variant_nodes(s, [row], row.campaign_id, None)[0]
    parent_source = None
    if row.parent_id is not None:
        parent_source = s.execute(
            select(VariantRow.source).where(VariantRow.id == row.parent_id)
        ).scalar_one_or_none()
    best_id = row.best_trial_id
    if best_id is None:
        # Before the engine names a best trial, the fastest ok one so far stands in.
        best_id = s.execute(
            select(TrialRow.id)
            .where(TrialRow.variant_id == variant_id, OK_TRIAL, TrialRow.median_s.is_not(None))
            .order_by(TrialRow.median_s, TrialRow.id)
            .limit(1)
        ).scalar_one_or_none()
    return VariantDetail(
        node=node,
        source=row.source,
        diff=row.diff,
        parent_source=parent_source,
        features=dict(row.features or {}),
        llm_call_id=row.llm_call_id,
        created_at=row.created_at,
        best_trial=None if best_id is None else get_trial(s, best_id),
    )


class TrialSort(StrEnum):
    """Columns the trials table sorts by."""

    ID = "id"
    TIME = "time"
    STATUS = "status"
    VERIFIED = "verified"
    REGISTERS = "registers"
    CONFIG = "config"


_SORT_COLUMNS: dict[TrialSort, Any] = {
    TrialSort.ID: TrialRow.id,
    TrialSort.TIME: TrialRow.median_s,
    TrialSort.STATUS: TrialRow.status,
    TrialSort.VERIFIED: TrialRow.verified,
    TrialSort.REGISTERS: TrialRow.registers,
    TrialSort.CONFIG: func.json(TrialRow.config),
}


@dataclass(frozen=True)
class TrialPage:
    variant_id: int
    rows: tuple[TrialRecord, ...]
    total: int
    sort: TrialSort
    descending: bool


def trial_page(
    s: Session,
    variant_id: int,
    *,
    sort: TrialSort = TrialSort.ID,
    descending: bool = False,
    offset: int = 0,
    limit: int = 500,
) -> TrialPage:
    """A variant's trials sorted in SQL; rows without a value sort last either way."""
    column = _SORT_COLUMNS[sort]
    order = column.desc() if descending else column.asc()
    rows = s.execute(
        select(TrialRow)
        .where(TrialRow.variant_id == variant_id)
        .order_by(column.is_(None), order, TrialRow.id)
        .offset(offset)
        .limit(limit)
    ).scalars()
    total = s.execute(
        select(func.count()).select_from(TrialRow).where(TrialRow.variant_id == variant_id)
    ).scalar_one()
    records = tuple(trial_record(r) for r in rows)
    return TrialPage(variant_id, records, int(total), sort, descending)


# ---------------------------------------------------------------------------- convergence


@dataclass(frozen=True)
class ConvergencePoint:
    evaluation: int  # 1-based count of trials (failures included) up to this one
    trial_id: int
    best_s: float
    at: datetime


@dataclass(frozen=True)
class Convergence:
    """The best time so far, as a step series: only the trials that improved it."""

    points: tuple[ConvergencePoint, ...] = ()
    n_evaluations: int = 0
    last_trial_id: int = 0
    last_at: datetime | None = None
    started_at: datetime | None = None
    original_s: float | None = None

    @property
    def best_s(self) -> float | None:
        return self.points[-1].best_s if self.points else None


def _count_trials(s: Session, campaign_id: int, above: int, through: int) -> int:
    return int(
        s.execute(
            select(func.count()).where(
                TrialRow.campaign_id == campaign_id, TrialRow.id > above, TrialRow.id <= through
            )
        ).scalar_one()
    )


def convergence(s: Session, campaign_id: int, *, since: Convergence | None = None) -> Convergence:
    """The step series, extended from ``since`` by the trials stored after it."""
    since = since or Convergence()
    after = since.last_trial_id
    # One window over the ok trials: a trial is a step when it beats every earlier one.
    ok = (
        select(
            TrialRow.id.label("id"),
            TrialRow.median_s.label("t"),
            TrialRow.created_at.label("at"),
            func.min(TrialRow.median_s).over(order_by=TrialRow.id, rows=(None, -1)).label("prev"),
        )
        .where(
            TrialRow.campaign_id == campaign_id,
            OK_TRIAL,
            TrialRow.median_s.is_not(None),
            TrialRow.id > after,
        )
        .subquery()
    )
    steps = s.execute(
        select(ok.c.id, ok.c.t, ok.c.at)
        .where(ok.c.prev.is_(None) | (ok.c.t < ok.c.prev))
        .order_by(ok.c.id)
    ).all()
    points = list(since.points)
    best = since.best_s
    n, counted_to = since.n_evaluations, after
    for tid, value, at in steps:
        if best is not None and value >= best:
            continue
        best = float(value)
        # the evaluation count includes failed trials; the ranges between steps partition
        # the (campaign_id, id) index, so all counts together scan it once
        n += _count_trials(s, campaign_id, counted_to, tid)
        counted_to = tid
        stamp = _as_datetime(at)
        assert stamp is not None
        points.append(ConvergencePoint(n, tid, best, stamp))
    last = s.execute(
        select(TrialRow.id, TrialRow.created_at)
        .where(TrialRow.campaign_id == campaign_id)
        .order_by(TrialRow.id.desc())
        .limit(1)
    ).one_or_none()
    last_id = last[0] if last is not None else after
    n += _count_trials(s, campaign_id, counted_to, last_id) if last_id > counted_to else 0
    started = s.execute(
        select(CampaignRow.started_at).where(CampaignRow.id == campaign_id)
    ).scalar_one()
    original = original_time(s, campaign_id)
    return Convergence(
        points=tuple(points),
        n_evaluations=n,
        last_trial_id=int(last_id),
        last_at=last[1] if last is not None else since.last_at,
        started_at=started,
        original_s=original,
    )


# --------------------------------------------------------------------------------- events


def recent_events(s: Session, campaign_id: int, limit: int = 500) -> list[EventRecord]:
    """The last ``limit`` events, oldest first (later ones come from repository.events)."""
    first = s.execute(
        select(EventRow.id)
        .where(EventRow.campaign_id == campaign_id)
        .order_by(EventRow.id.desc())
        .offset(limit - 1)
        .limit(1)
    ).scalar_one_or_none()
    return events(s, campaign_id, after_id=(first - 1) if first else 0, limit=limit)
