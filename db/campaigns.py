"""Queries of the ``campaigns`` table: creating a campaign, its status and provenance as it
runs, and the campaign list with its figures (defined in ``db.figures``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from db.figures import BestSpeedup, CampaignFigures, campaign_figures
from db.models import CampaignRow, RecordingRow, VariantRow, utcnow
from db.rows import column_values, from_row, require_one
from r3tui.domain import Campaign, CampaignStatus


@dataclass(frozen=True)
class CampaignSummary:
    """One line of the campaign list."""

    id: int
    name: str
    kernel_name: str
    gpu: str | None  # the GPU's name, from the campaign's provenance
    status: CampaignStatus
    n_variants: int
    started_at: datetime
    figures: CampaignFigures  # trials, best time, original, best speedup, duration

    @property
    def n_trials(self) -> int:
        return self.figures.n_trials

    @property
    def best_time_s(self) -> float | None:
        return self.figures.best_time_s

    @property
    def original_s(self) -> float | None:
        return self.figures.original_s

    @property
    def best_speedup(self) -> BestSpeedup | None:
        return self.figures.best_speedup


def create_campaign(s: Session, c: Campaign) -> int:
    now = utcnow()
    values = column_values(c, skip=("id",))
    values |= {"started_at": c.started_at or now, "updated_at": now}
    row = CampaignRow(**values)
    s.add(row)
    s.flush()
    return row.id


def set_campaign_status(
    s: Session, campaign_id: int, status: CampaignStatus, finished: bool = False
) -> None:
    """Set the status; ``finished=True`` also stamps ``finished_at`` with now."""
    now = utcnow()
    values: dict[str, Any] = {"status": status, "updated_at": now}
    if finished:
        values["finished_at"] = now
    result = s.execute(update(CampaignRow).where(CampaignRow.id == campaign_id).values(**values))
    require_one(result, "campaign", campaign_id)


def set_campaign_provenance(s: Session, campaign_id: int, provenance: Mapping[str, Any]) -> None:
    """What the campaign's numbers depend on (GPU, driver, toolchain), known once it runs."""
    result = s.execute(
        update(CampaignRow).where(CampaignRow.id == campaign_id).values(provenance=dict(provenance))
    )
    require_one(result, "campaign", campaign_id)


def set_campaign_workers(s: Session, campaign_id: int,
                         workers: Mapping[str, Any] | None) -> None:
    """Where the campaign's runner stands now (None: no run goes on)."""
    result = s.execute(update(CampaignRow).where(CampaignRow.id == campaign_id)
                       .values(workers=None if workers is None else dict(workers)))
    require_one(result, "campaign", campaign_id)


def get_campaign(s: Session, campaign_id: int) -> Campaign | None:
    row = s.get(CampaignRow, campaign_id)
    return None if row is None else from_row(Campaign, row)


def gpu_name(provenance: Mapping[str, Any] | None) -> str | None:
    """The GPU a campaign ran on, as every screen names it."""
    # Provenance is free-form JSON written by the engine; accept both {"gpu": "H200"} and
    # {"gpu": {"name": "H200", ...}} rather than fail the whole list on one odd row.
    gpu = (provenance or {}).get("gpu")
    if isinstance(gpu, Mapping):
        gpu = gpu.get("name")
    return str(gpu) if gpu is not None else None


def list_campaign_summaries(s: Session) -> list[CampaignSummary]:
    """Every campaign with its counts and figures (``db.figures``), oldest first, in a
    handful of grouped queries."""
    n_variants = (
        select(VariantRow.campaign_id, func.count().label("n"))
        .group_by(VariantRow.campaign_id)
        .subquery()
    )
    query = (
        select(
            CampaignRow.id,
            CampaignRow.name,
            RecordingRow.kernel_name,
            CampaignRow.provenance,
            CampaignRow.status,
            CampaignRow.started_at,
            func.coalesce(n_variants.c.n, 0),
        )
        .join(RecordingRow, RecordingRow.id == CampaignRow.recording_id)
        .outerjoin(n_variants, n_variants.c.campaign_id == CampaignRow.id)
        .order_by(CampaignRow.id)
    )
    figures = campaign_figures(s)
    return [
        CampaignSummary(
            id=cid,
            name=name,
            kernel_name=kernel,
            gpu=gpu_name(provenance),
            status=status,
            n_variants=int(n_var),
            started_at=started,
            figures=figures[cid],
        )
        for cid, name, kernel, provenance, status, started, n_var in s.execute(query)
    ]
