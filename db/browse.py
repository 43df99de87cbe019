"""Read-only queries of the terminal UI: the campaign list and the tree of variants.

Everything here only reads, takes a ``Session`` first and returns frozen values (no ORM rows),
like ``db.repository``.  The shapes follow what a screen needs in one round trip: the tree is
loaded one page of children at a time (a campaign of 10,000 variants opens without reading
them all), and live updates ask only for rows newer than the ones already shown.  What the
panes beside the tree show (a variant's details and trials, the convergence series, the
totals of the status line, the events) is in ``db.series``.

"The original", its time and the campaign's figures (best speedup, duration, evaluations/s)
are defined once, in ``db.figures``.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Select, case, func, literal, select
from sqlalchemy.orm import Session

from db.campaigns import CampaignSummary, gpu_name, list_campaign_summaries
from db.figures import OK_TRIAL, CampaignTiming, campaign_timing, original_time
from db.models import CampaignRow, EventRow, RecordingRow, TrialRow, VariantRow
from db.recordings import bundle_location
from r3tui.domain import CampaignStatus, VariantOrigin, VariantStatus

FAILED_STATUSES = frozenset(
    {
        VariantStatus.APPLY_FAILED,
        VariantStatus.COMPILE_FAILED,
        VariantStatus.WRONG_RESULT,
        VariantStatus.CRASHED,
        VariantStatus.UNSAFE,
    }
)

# The campaign list is db.campaigns' summaries: one definition of every figure it shows.
CampaignListRow = CampaignSummary


def campaign_rows(s: Session) -> list[CampaignListRow]:
    """Every campaign with counts and figures, oldest first."""
    return list_campaign_summaries(s)


def find_campaign(s: Session, name: str) -> int | None:
    """The newest campaign of that name (how the TUI finds the campaign it launched)."""
    return s.execute(
        select(CampaignRow.id)
        .where(CampaignRow.name == name)
        .order_by(CampaignRow.id.desc())
        .limit(1)
    ).scalar_one_or_none()


@dataclass(frozen=True)
class CampaignHeader:
    """What the campaign screen shows above and below its panes."""

    id: int
    name: str
    kernel_name: str
    gpu: str | None
    status: CampaignStatus
    settings: dict[str, Any]
    provenance: dict[str, Any]
    started_at: datetime
    finished_at: datetime | None
    updated_at: datetime
    bundle_path: str
    original_s: float | None  # db.figures.original_time
    timing: CampaignTiming  # the campaign's duration (db.figures)
    n_variants: int
    last_variant_id: int  # 0 while there is none: live updates ask for ids above these
    last_trial_id: int
    last_event_id: int
    islands: tuple[int, ...]
    workers: dict[str, Any] | None = None  # campaigns.workers: the runner's load, while it runs


def campaign_header(
    s: Session, campaign_id: int, *, islands: tuple[int, ...] | None = None
) -> CampaignHeader | None:
    """The header; pass the ``islands`` already known to skip the one query that reads
    every variant row (polls do: islands come and go only with new variants, which the
    tree sees anyway)."""
    row = s.execute(
        select(CampaignRow, RecordingRow.kernel_name, RecordingRow.bundle_path)
        .join(RecordingRow, RecordingRow.id == CampaignRow.recording_id)
        .where(CampaignRow.id == campaign_id)
    ).one_or_none()
    if row is None:
        return None
    campaign, kernel, bundle = row
    n_variants, last_variant = s.execute(
        select(func.count(), func.coalesce(func.max(VariantRow.id), 0)).where(
            VariantRow.campaign_id == campaign_id
        )
    ).one()
    last_trial = s.execute(
        select(func.coalesce(func.max(TrialRow.id), 0)).where(TrialRow.campaign_id == campaign_id)
    ).scalar_one()
    last_event = s.execute(
        select(func.coalesce(func.max(EventRow.id), 0)).where(EventRow.campaign_id == campaign_id)
    ).scalar_one()
    if islands is None:
        islands = tuple(
            s.execute(
                select(VariantRow.island)
                .where(VariantRow.campaign_id == campaign_id)
                .distinct()
                .order_by(VariantRow.island)
            ).scalars()
        )
    timing = campaign_timing(s, campaign_id)
    assert timing is not None  # the campaign row was just read in this session
    return CampaignHeader(
        id=campaign.id,
        name=campaign.name,
        kernel_name=kernel,
        gpu=gpu_name(campaign.provenance),
        status=campaign.status,
        settings=dict(campaign.settings or {}),
        provenance=dict(campaign.provenance or {}),
        started_at=campaign.started_at,
        finished_at=campaign.finished_at,
        updated_at=campaign.updated_at,
        bundle_path=bundle_location(s, bundle),
        original_s=original_time(s, campaign_id),
        timing=timing,
        n_variants=int(n_variants),
        last_variant_id=int(last_variant),
        last_trial_id=int(last_trial),
        last_event_id=int(last_event),
        islands=islands,
        workers=campaign.workers,
    )


# ------------------------------------------------------------------------------------ tree


@dataclass(frozen=True)
class VariantFilter:
    """Which variants the tree shows: ``None`` fields do not filter.

    A variant that does not match stays visible when one of its descendants matches, so a
    filtered tree still shows the lineage of every match.
    """

    statuses: frozenset[VariantStatus] | None = None
    island: int | None = None

    @property
    def active(self) -> bool:
        return self.statuses is not None or self.island is not None


@dataclass(frozen=True)
class VariantNode:
    """One variant as the tree shows it."""

    id: int
    parent_id: int | None
    origin: VariantOrigin
    operator: str | None
    status: VariantStatus
    status_reason: str | None
    island: int
    best_time_s: float | None  # best median of its ok trials
    n_trials: int
    n_children: int  # under the filter the page was loaded with


@dataclass(frozen=True)
class ChildPage:
    parent_id: int | None  # None: the roots of the tree
    nodes: tuple[VariantNode, ...]
    remaining: int  # children after the last node of this page


def _kept(campaign_id: int, flt: VariantFilter) -> Any:
    """A recursive CTE of the ids a filtered tree shows: the matches and their ancestors."""
    match = select(VariantRow.id, VariantRow.parent_id).where(VariantRow.campaign_id == campaign_id)
    if flt.statuses is not None:
        match = match.where(VariantRow.status.in_(sorted(flt.statuses)))
    if flt.island is not None:
        match = match.where(VariantRow.island == flt.island)
    kept = match.cte("kept", recursive=True)
    parent = select(VariantRow.id, VariantRow.parent_id).join(
        kept, VariantRow.id == kept.c.parent_id
    )
    # UNION (not UNION ALL) drops ids already kept, so the recursion ends at the roots.
    return kept.union(parent)


def _children_of(campaign_id: int, parent_id: int | None) -> ColumnElement[bool]:
    where = VariantRow.campaign_id == campaign_id
    if parent_id is None:
        return where & VariantRow.parent_id.is_(None)
    return where & (VariantRow.parent_id == parent_id)


def _restrict(query: Select[Any], kept: Any) -> Select[Any]:
    return query if kept is None else query.where(VariantRow.id.in_(select(kept.c.id)))


def variant_nodes(
    s: Session, rows: Iterable[Any], campaign_id: int, kept: Any
) -> list[VariantNode]:
    """Attach trial stats and child counts to variant rows, two grouped queries per page."""
    rows = list(rows)
    ids = [r.id for r in rows]
    if not ids:
        return []
    stats = {
        vid: (best, n)
        for vid, best, n in s.execute(
            select(TrialRow.variant_id, func.min(case((OK_TRIAL, TrialRow.median_s))), func.count())
            .where(TrialRow.variant_id.in_(ids))
            .group_by(TrialRow.variant_id)
        )
    }
    counts = dict(
        s.execute(
            _restrict(
                select(VariantRow.parent_id, func.count())
                .where(VariantRow.campaign_id == campaign_id, VariantRow.parent_id.in_(ids))
                .group_by(VariantRow.parent_id),
                kept,
            )
        )
        .tuples()
        .all()
    )
    out = []
    for r in rows:
        best, n = stats.get(r.id, (None, 0))
        out.append(
            VariantNode(
                id=r.id,
                parent_id=r.parent_id,
                origin=r.origin,
                operator=r.operator,
                status=r.status,
                status_reason=r.status_reason,
                island=r.island,
                best_time_s=best,
                n_trials=int(n),
                n_children=int(counts.get(r.id, 0)),
            )
        )
    return out


_NODE_COLUMNS = (
    VariantRow.id,
    VariantRow.parent_id,
    VariantRow.origin,
    VariantRow.operator,
    VariantRow.status,
    VariantRow.status_reason,
    VariantRow.island,
)


def child_page(
    s: Session,
    campaign_id: int,
    parent_id: int | None,
    *,
    flt: VariantFilter | None = None,
    after_id: int = 0,
    limit: int = 200,
    through_id: int | None = None,
) -> ChildPage:
    """Children of ``parent_id`` (None: the roots) with ids above ``after_id``, oldest first.

    ``through_id`` extends the page until it holds that child: jumping to a variant loads
    the pages its ancestors sit in.
    """
    flt = flt or VariantFilter()
    kept = _kept(campaign_id, flt) if flt.active else None
    base = _restrict(
        select(*_NODE_COLUMNS).where(
            _children_of(campaign_id, parent_id), VariantRow.id > after_id
        ),
        kept,
    )
    if through_id is not None:
        before = s.execute(
            _restrict(
                select(func.count()).where(
                    _children_of(campaign_id, parent_id),
                    VariantRow.id > after_id,
                    VariantRow.id <= through_id,
                ),
                kept,
            )
        ).scalar_one()
        limit = max(limit, int(before) + limit // 2)
    rows = list(s.execute(base.order_by(VariantRow.id).limit(limit)))
    nodes = variant_nodes(s, rows, campaign_id, kept)
    remaining = 0
    if len(rows) == limit:
        remaining = int(
            s.execute(
                _restrict(
                    select(func.count()).where(
                        _children_of(campaign_id, parent_id), VariantRow.id > rows[-1].id
                    ),
                    kept,
                )
            ).scalar_one()
        )
    return ChildPage(parent_id, tuple(nodes), remaining)


def ancestry(s: Session, variant_id: int) -> list[int]:
    """The ids from the variant's root down to the variant itself."""
    up = (
        select(VariantRow.id, VariantRow.parent_id, literal(0).label("d"))
        .where(VariantRow.id == variant_id)
        .cte("up", recursive=True)
    )
    up = up.union_all(
        select(VariantRow.id, VariantRow.parent_id, (up.c.d + 1).label("d")).join(
            up, VariantRow.id == up.c.parent_id
        )
    )
    ids = s.execute(select(up.c.id).order_by(up.c.d.desc())).scalars()
    return list(ids)


def best_variant(s: Session, campaign_id: int, *, island: int | None = None) -> int | None:
    """The variant with the fastest best trial (on one island if given); None before any.

    Looks at the trials the engine named best first (one per variant, not every trial);
    while no variant has one yet, at every ok trial.
    """
    named = (
        select(VariantRow.id)
        .join(TrialRow, TrialRow.id == VariantRow.best_trial_id)
        .where(VariantRow.campaign_id == campaign_id, OK_TRIAL, TrialRow.median_s.is_not(None))
        .order_by(TrialRow.median_s, TrialRow.id)
        .limit(1)
    )
    scan = (
        select(TrialRow.variant_id)
        .join(VariantRow, VariantRow.id == TrialRow.variant_id)
        .where(TrialRow.campaign_id == campaign_id, OK_TRIAL, TrialRow.median_s.is_not(None))
        .order_by(TrialRow.median_s, TrialRow.id)
        .limit(1)
    )
    if island is not None:
        named = named.where(VariantRow.island == island)
        scan = scan.where(VariantRow.island == island)
    found = s.execute(named).scalar_one_or_none()
    return found if found is not None else s.execute(scan).scalar_one_or_none()


@dataclass(frozen=True)
class TreeChanges:
    """What changed since the ids a screen last saw."""

    new_nodes: tuple[VariantNode, ...]  # variants above after_variant_id, oldest first
    changed: tuple[VariantNode, ...]  # watched or newly tried variants, as they are now
    last_variant_id: int
    last_trial_id: int


def tree_changes(
    s: Session,
    campaign_id: int,
    *,
    after_variant_id: int,
    after_trial_id: int,
    watch_ids: Collection[int] = (),
    flt: VariantFilter | None = None,
    limit: int = 2000,
) -> TreeChanges:
    """New variants, and the current state of variants that got trials or are watched.

    Watch the shown variants that are still pending: their status changes without a trial
    when a rewrite fails to apply or to compile.
    """
    flt = flt or VariantFilter()
    kept = _kept(campaign_id, flt) if flt.active else None
    new_rows = list(
        s.execute(
            _restrict(
                select(*_NODE_COLUMNS)
                .where(VariantRow.campaign_id == campaign_id, VariantRow.id > after_variant_id)
                .order_by(VariantRow.id)
                .limit(limit),
                kept,
            )
        )
    )
    new_nodes = variant_nodes(s, new_rows, campaign_id, kept)
    last_variant = max([after_variant_id, *(n.id for n in new_nodes)])
    if len(new_rows) < limit:
        # Filtered-out variants count as seen too, or every poll would ask for them again.
        last_variant = max(
            last_variant,
            int(
                s.execute(
                    select(func.coalesce(func.max(VariantRow.id), 0)).where(
                        VariantRow.campaign_id == campaign_id
                    )
                ).scalar_one()
            ),
        )
    touched = set(
        s.execute(
            select(TrialRow.variant_id)
            .where(TrialRow.campaign_id == campaign_id, TrialRow.id > after_trial_id)
            .distinct()
        ).scalars()
    )
    last_trial = s.execute(
        select(func.coalesce(func.max(TrialRow.id), after_trial_id)).where(
            TrialRow.campaign_id == campaign_id
        )
    ).scalar_one()
    new_ids = {n.id for n in new_nodes}
    ask = sorted((touched | set(watch_ids)) - new_ids)
    changed: list[VariantNode] = []
    for start in range(0, len(ask), 500):  # stay far below SQLite's bound-parameter limit
        chunk = ask[start : start + 500]
        rows = s.execute(
            select(*_NODE_COLUMNS).where(VariantRow.id.in_(chunk)).order_by(VariantRow.id)
        )
        changed.extend(variant_nodes(s, rows, campaign_id, kept))
    return TreeChanges(tuple(new_nodes), tuple(changed), last_variant, int(last_trial))
