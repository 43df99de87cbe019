"""The figures of a campaign that more than one screen shows, each defined once.

``r3 runs``, ``r3 report`` and the TUI (campaign list, status line) read them from here and
write them with the ``*_text`` functions below, so one campaign reads the same everywhere
(docs/database.md, "Figures of a campaign"):

- **the original's time**: the seed variant's fastest ok trial at the recorded configuration
  (nothing changed by the search), timed in this campaign the way every candidate is; where
  there is none yet, the baseline the recorder stored in the manifest
  (``launch.baseline.median_s``).  The seed's fastest trial at *another* configuration is not
  the original: it is already a tuned kernel.
- **the best time**: the fastest ok trial of the seed or of a verified or improved variant.
- **best speedup**: the campaign's ``final`` event (its best variant re-timed against the
  original, interleaved, with a 95% interval; ``r3tui.engine.comparison``) where it has one,
  basis "re-timed"; else the original's time over the best time, basis "best trial".
- **duration**: the sum of the runs' ``wall_s`` (the ``finish`` and ``stop`` events; a
  resumed campaign has several runs), plus, while it runs, the time since its last
  ``start`` or ``resume``; a campaign without such events: ``finished_at - started_at``,
  or ``now - started_at`` while it runs; else unknown (crashed before any run ended).
- **evaluations/s**: stored trials over that duration.
- **workers**: while a run goes on, its runner's workers as last sampled
  (``campaigns.workers``): how many of each kind are busy, and the jobs queued.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import ColumnElement, and_, case, func, select
from sqlalchemy.orm import Session

from db.models import CampaignRow, EventRow, RecordingRow, TrialRow, VariantRow
from r3tui.domain import CampaignStatus, MeasurementStatus, VariantOrigin, VariantStatus

OK_TRIAL: ColumnElement[bool] = TrialRow.status == MeasurementStatus.OK
RECORDED_BASELINE_S = func.json_extract(RecordingRow.manifest, "$.launch.baseline.median_s")
# A trial at the recorded configuration: r3tui.engine.report.is_recorded_config, in SQL.
AT_RECORDED_CONFIG: ColumnElement[bool] = and_(
    func.coalesce(func.json_array_length(TrialRow.config, "$.options"), 0) == 0,
    func.json_extract(TrialRow.config, "$.block").is_(None),
    func.json_extract(TrialRow.config, "$.launch_bounds").is_(None),
    func.coalesce(func.json_extract(TrialRow.config, "$.tunables"), "{}") == "{}",
    func.json_extract(TrialRow.config, "$.pipeline").is_(None),
)
# The variants whose trials can be the campaign's best: a failed or unsafe one cannot.
CANDIDATE_VARIANT: ColumnElement[bool] = (VariantRow.origin == VariantOrigin.SEED) | (
    VariantRow.status.in_([VariantStatus.VERIFIED, VariantStatus.IMPROVED])
)
RUN_ENDS = ("finish", "stop")
RUN_STARTS = ("start", "resume")


# ----------------------------------------------------------------------------------- text


def speedup_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}×"


def duration_text(seconds: float | None) -> str:
    """``42s``, ``3m05s``, ``2h07m``; ``-`` when unknown."""
    if seconds is None:
        return "-"
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def rate_text(per_s: float | None) -> str:
    return "-" if per_s is None else f"{per_s:.1f}/s"


# --------------------------------------------------------------------------------- values


def workers_text(workers: Mapping[str, Any] | None) -> str | None:
    """``local: gpu 1/1 busy, 3 queued · cpu 14/16 busy`` from ``campaigns.workers``; None
    where no run reported its workers."""
    if not workers or not workers.get("workers"):
        return None
    parts = []
    queued = workers.get("queued") or {}
    for kind in ("gpu", "cpu"):
        mine = [w for w in workers["workers"] if len(w) >= 3 and w[1] == kind]
        if not mine:
            continue
        busy = sum(1 for w in mine if w[2])
        text = f"{kind} {busy}/{len(mine)} busy"
        if queued.get(kind):
            text += f", {queued[kind]} queued"
        parts.append(text)
    return f"{workers.get('runner', '?')}: " + " · ".join(parts)


class SpeedupBasis(StrEnum):
    RETIMED = "re-timed"  # the final event: interleaved with the original, with an interval
    BEST_TRIAL = "best trial"  # the original's time over the best trial's median


@dataclass(frozen=True)
class BestSpeedup:
    value: float
    basis: SpeedupBasis
    ci: tuple[float, float] | None = None  # 95%, re-timed only
    variant_id: int | None = None  # re-timed only

    @property
    def text(self) -> str:
        """``1.10× re-timed``: what every screen writes."""
        return f"{speedup_text(self.value)} {self.basis.value}"


def best_speedup(
    original_s: float | None, best_time_s: float | None, retimed: BestSpeedup | None = None
) -> BestSpeedup | None:
    """The re-timed figure where there is one, else the best trial over the original."""
    if retimed is not None:
        return retimed
    if original_s and best_time_s:
        return BestSpeedup(original_s / best_time_s, SpeedupBasis.BEST_TRIAL)
    return None


def retimed_speedup(data: Mapping[str, Any] | None) -> BestSpeedup | None:
    """The figure of a ``final`` event's data (None where it carries no usable speedup)."""
    if not data:
        return None
    value, ci = data.get("speedup"), data.get("ci")
    if not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        return None
    interval = (float(ci[0]), float(ci[1])) if ci and len(ci) == 2 else None
    vid = data.get("variant_id")
    return BestSpeedup(float(value), SpeedupBasis.RETIMED, interval,
                       int(vid) if vid is not None else None)


@dataclass(frozen=True)
class CampaignTiming:
    """What a campaign's duration is made of (see the module doc)."""

    status: CampaignStatus
    started_at: datetime
    finished_at: datetime | None
    run_walls_s: tuple[float, ...] = ()  # one per finish/stop event, oldest first
    open_run_at: datetime | None = None  # the last start/resume after the last run's end

    @property
    def n_runs(self) -> int:
        """Runs counted (those that ended with a finish or stop event, and a running one)."""
        return len(self.run_walls_s) + (self.status is CampaignStatus.RUNNING)

    def duration_s(self, now: datetime) -> float | None:
        running = self.status is CampaignStatus.RUNNING
        if self.run_walls_s:
            since = (now - self.open_run_at).total_seconds() if running and self.open_run_at else 0
            return sum(self.run_walls_s) + max(0.0, since)
        if running:
            return max(0.0, (now - self.started_at).total_seconds())
        if self.finished_at is not None:
            return max(0.0, (self.finished_at - self.started_at).total_seconds())
        return None


def evaluations_per_s(n_trials: int, duration_s: float | None) -> float | None:
    return n_trials / duration_s if duration_s and n_trials else None


@dataclass(frozen=True)
class CampaignFigures:
    """One campaign's figures, as ``r3 runs``, ``r3 report`` and the TUI show them."""

    campaign_id: int
    n_trials: int
    best_time_s: float | None
    original_s: float | None
    retimed: BestSpeedup | None
    timing: CampaignTiming

    @property
    def best_speedup(self) -> BestSpeedup | None:
        return best_speedup(self.original_s, self.best_time_s, self.retimed)

    @property
    def best_speedup_text(self) -> str:
        best = self.best_speedup
        return best.text if best is not None else "-"

    def duration_s(self, now: datetime) -> float | None:
        return self.timing.duration_s(now)

    def evaluations_per_s(self, now: datetime) -> float | None:
        return evaluations_per_s(self.n_trials, self.duration_s(now))


# -------------------------------------------------------------------------------- queries


def _where_campaign(column: Any, ids: Collection[int] | None) -> ColumnElement[bool]:
    return column.in_(sorted(ids)) if ids is not None else column.is_not(None)


def original_times(s: Session, ids: Collection[int] | None = None) -> dict[int, float]:
    """The original's time per campaign (see the module doc); campaigns without one are left
    out.  ``ids`` None: every campaign."""
    seeded = dict(
        s.execute(
            select(TrialRow.campaign_id, func.min(TrialRow.median_s))
            .join(VariantRow, VariantRow.id == TrialRow.variant_id)
            .where(
                _where_campaign(TrialRow.campaign_id, ids),
                VariantRow.origin == VariantOrigin.SEED,
                OK_TRIAL,
                TrialRow.median_s.is_not(None),
                AT_RECORDED_CONFIG,
            )
            .group_by(TrialRow.campaign_id)
        )
        .tuples()
        .all()
    )
    recorded = s.execute(
        select(CampaignRow.id, RECORDED_BASELINE_S)
        .join(RecordingRow, RecordingRow.id == CampaignRow.recording_id)
        .where(_where_campaign(CampaignRow.id, ids))
    ).tuples()
    out = {cid: float(baseline) for cid, baseline in recorded if baseline is not None}
    out.update((cid, float(t)) for cid, t in seeded.items() if t is not None)
    return out


def original_time(s: Session, campaign_id: int) -> float | None:
    return original_times(s, [campaign_id]).get(campaign_id)


@dataclass(frozen=True)
class _RunEvents:
    walls: list[float]
    open_run_at: datetime | None = None
    retimed: BestSpeedup | None = None


def _run_events(s: Session, ids: Collection[int] | None) -> dict[int, _RunEvents]:
    """Per campaign: the runs' wall times, the open run's start, the last final figure."""
    out: dict[int, _RunEvents] = {}
    rows = s.execute(
        select(EventRow.campaign_id, EventRow.kind, EventRow.created_at, EventRow.data)
        .where(
            _where_campaign(EventRow.campaign_id, ids),
            EventRow.kind.in_([*RUN_ENDS, *RUN_STARTS, "final"]),
        )
        .order_by(EventRow.campaign_id, EventRow.id)
    )
    for cid, kind, at, data in rows:
        seen = out.setdefault(cid, _RunEvents([]))
        if kind == "final":
            retimed = retimed_speedup(data)
            if retimed is not None:
                out[cid] = _RunEvents(seen.walls, seen.open_run_at, retimed)
        elif kind in RUN_STARTS:
            out[cid] = _RunEvents(seen.walls, at, seen.retimed)
        else:
            wall = (data or {}).get("wall_s")
            if isinstance(wall, int | float):
                seen.walls.append(float(wall))
            out[cid] = _RunEvents(seen.walls, None, seen.retimed)
    return out


def campaign_timings(
    s: Session, ids: Collection[int] | None = None, *, runs: dict[int, _RunEvents] | None = None
) -> dict[int, CampaignTiming]:
    """What each campaign's duration is made of: one query over its campaign rows and one
    over its run events."""
    runs = _run_events(s, ids) if runs is None else runs
    rows = s.execute(
        select(CampaignRow.id, CampaignRow.status, CampaignRow.started_at, CampaignRow.finished_at)
        .where(_where_campaign(CampaignRow.id, ids))
    )
    out = {}
    for cid, status, started, finished in rows:
        run = runs.get(cid, _RunEvents([]))
        out[cid] = CampaignTiming(status, started, finished, tuple(run.walls), run.open_run_at)
    return out


def campaign_timing(s: Session, campaign_id: int) -> CampaignTiming | None:
    return campaign_timings(s, [campaign_id]).get(campaign_id)


def campaign_figures(
    s: Session, ids: Collection[int] | None = None
) -> dict[int, CampaignFigures]:
    """Every figure of the given campaigns (None: all), in a handful of grouped queries."""
    trials = {
        cid: (int(n), best)
        for cid, n, best in s.execute(
            select(
                TrialRow.campaign_id,
                func.count(),
                func.min(case((and_(OK_TRIAL, CANDIDATE_VARIANT), TrialRow.median_s))),
            )
            .join(VariantRow, VariantRow.id == TrialRow.variant_id)
            .where(_where_campaign(TrialRow.campaign_id, ids))
            .group_by(TrialRow.campaign_id)
        )
    }
    originals = original_times(s, ids)
    runs = _run_events(s, ids)
    timings = campaign_timings(s, ids, runs=runs)
    out = {}
    for cid, timing in timings.items():
        n, best = trials.get(cid, (0, None))
        retimed = runs[cid].retimed if cid in runs else None
        out[cid] = CampaignFigures(cid, n, best, originals.get(cid), retimed, timing)
    return out


def figures_of(s: Session, campaign_id: int) -> CampaignFigures | None:
    return campaign_figures(s, [campaign_id]).get(campaign_id)
