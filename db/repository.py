"""Every query R³ runs against the experiment database.

Functions take a ``Session`` first (from ``Database.session_scope()``), speak the domain
types of ``r3tui.domain`` where one exists, and return plain frozen values, never ORM rows:
callers cannot trigger lazy loads or hold rows past their session.  Lists the TUI shows
(summaries, trees, series) are single aggregate queries, not one query per row.

``get_*`` functions return None for an unknown id; updates of an unknown id raise
``KeyError`` (a caller bug, not something a user can cause).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from sqlalchemy import ColumnElement, case, func, insert, select, text, update
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from db.figures import BestSpeedup, CampaignFigures, campaign_figures
from db.models import (
    Base,
    CampaignRow,
    EliteCellRow,
    EventRow,
    LLMCallRow,
    RecordingRow,
    TrialRow,
    VariantRow,
    utcnow,
)
from r3tui.domain import (
    Campaign,
    CampaignStatus,
    Dim3,
    EliteCell,
    KernelLaunch,
    LLMCall,
    Measurement,
    MeasurementStatus,
    Recording,
    ResourceUsage,
    TimeStats,
    TrialConfig,
    Variant,
    VariantOrigin,
    VariantStatus,
)

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

# ---------------------------------------------------------------------------- result types


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


@dataclass(frozen=True)
class EventRecord:
    id: int
    campaign_id: int
    created_at: datetime
    kind: str
    message: str
    data: dict[str, Any] | None


_D = TypeVar("_D", bound="DataclassInstance")

_OK: ColumnElement[bool] = TrialRow.status == MeasurementStatus.OK


def _require_one(rowcount: int, what: str, id_: int) -> None:
    if rowcount != 1:
        raise KeyError(f"no {what} with id {id_}")


def _rowcount(result: Any) -> int:
    return int(result.rowcount)


def _from_row(cls: type[_D], row: object) -> _D:
    """Build a domain value from a row whose columns carry the same names as its fields.

    Naming columns after the domain fields is deliberate: the conversion cannot drift, and
    the round-trip tests fail at once if a name ever differs.
    """
    return cls(**{f.name: getattr(row, f.name) for f in dataclasses.fields(cls)})


def _columns(value: DataclassInstance, *, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """A domain value's fields as column values (mappings copied into plain dicts for JSON)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(value):
        if f.name in skip:
            continue
        v = getattr(value, f.name)
        out[f.name] = dict(v) if isinstance(v, Mapping) else v
    return out


# ------------------------------------------------------------------------------ recordings


def _db_dir(s: Session) -> Path | None:
    where = s.info.get("db_dir")
    return Path(where) if where else None


def stored_bundle_path(s: Session, path: str) -> str:
    """How a recording's bundle path is stored: relative to the database's folder when the
    bundle lies under it (the folder can then move or ship whole), else as given."""
    base = _db_dir(s)
    if base is None or not Path(path).is_absolute():
        return path
    try:
        return Path(path).relative_to(base.resolve()).as_posix()
    except ValueError:
        return path


def bundle_location(s: Session, stored: str) -> str:
    """A stored bundle path as a path to open: a relative one is under the database's folder."""
    base = _db_dir(s)
    if base is None or Path(stored).is_absolute():
        return stored
    return str(base / stored)


def _recording(row: RecordingRow, s: Session) -> Recording:
    launch = KernelLaunch(
        kernel_name=row.kernel_name,
        grid=Dim3(row.grid_x, row.grid_y, row.grid_z),
        block=Dim3(row.block_x, row.block_y, row.block_z),
        shared_mem_bytes=row.shared_mem_bytes,
        count=row.launch_count,
        total_time_s=row.launch_total_time_s,
    )
    return Recording(
        bundle_path=bundle_location(s, row.bundle_path),
        sha256=row.sha256,
        kernel_name=row.kernel_name,
        launch=launch,
        id=row.id,
        created_at=row.created_at,
    )


def add_recording(s: Session, rec: Recording, manifest: Mapping[str, Any]) -> int:
    """Store a recording; the same manifest hash again returns the existing row's id.

    The first row wins: a bundle moved to a new path keeps its old ``bundle_path``.
    """
    launch = rec.launch
    stmt = (
        sqlite_insert(RecordingRow)
        .values(
            bundle_path=stored_bundle_path(s, rec.bundle_path),
            sha256=rec.sha256,
            kernel_name=rec.kernel_name,
            grid_x=launch.grid.x,
            grid_y=launch.grid.y,
            grid_z=launch.grid.z,
            block_x=launch.block.x,
            block_y=launch.block.y,
            block_z=launch.block.z,
            shared_mem_bytes=launch.shared_mem_bytes,
            launch_count=launch.count,
            launch_total_time_s=launch.total_time_s,
            manifest=dict(manifest),
            created_at=rec.created_at or utcnow(),
        )
        # ON CONFLICT rather than look-then-insert: no window between the two.
        .on_conflict_do_nothing(index_elements=[RecordingRow.sha256])
    )
    s.execute(stmt)
    return s.execute(select(RecordingRow.id).where(RecordingRow.sha256 == rec.sha256)).scalar_one()


def get_recording(s: Session, recording_id: int) -> Recording | None:
    row = s.get(RecordingRow, recording_id)
    return None if row is None else _recording(row, s)


def get_recording_manifest(s: Session, recording_id: int) -> dict[str, Any] | None:
    return s.execute(
        select(RecordingRow.manifest).where(RecordingRow.id == recording_id)
    ).scalar_one_or_none()


def find_recording_by_sha(s: Session, sha256: str) -> Recording | None:
    row = s.execute(select(RecordingRow).where(RecordingRow.sha256 == sha256)).scalar_one_or_none()
    return None if row is None else _recording(row, s)


def list_recordings(s: Session) -> list[Recording]:
    rows = s.execute(select(RecordingRow).order_by(RecordingRow.id)).scalars()
    return [_recording(r, s) for r in rows]


# ------------------------------------------------------------------------------- campaigns


def _campaign(row: CampaignRow) -> Campaign:
    return _from_row(Campaign, row)


def create_campaign(s: Session, c: Campaign) -> int:
    now = utcnow()
    values = _columns(c, skip=("id",)) | {"started_at": c.started_at or now, "updated_at": now}
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
    _require_one(_rowcount(result), "campaign", campaign_id)


def set_campaign_provenance(s: Session, campaign_id: int, provenance: Mapping[str, Any]) -> None:
    """What the campaign's numbers depend on (GPU, driver, toolchain), known once it runs."""
    result = s.execute(
        update(CampaignRow).where(CampaignRow.id == campaign_id).values(provenance=dict(provenance))
    )
    _require_one(_rowcount(result), "campaign", campaign_id)


def set_campaign_workers(s: Session, campaign_id: int,
                         workers: Mapping[str, Any] | None) -> None:
    """Where the campaign's runner stands now (None: no run goes on)."""
    result = s.execute(update(CampaignRow).where(CampaignRow.id == campaign_id)
                       .values(workers=None if workers is None else dict(workers)))
    _require_one(_rowcount(result), "campaign", campaign_id)


def get_campaign(s: Session, campaign_id: int) -> Campaign | None:
    row = s.get(CampaignRow, campaign_id)
    return None if row is None else _campaign(row)


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


# -------------------------------------------------------------------------------- variants


def _variant(row: VariantRow) -> Variant:
    return _from_row(Variant, row)


def add_variant(s: Session, v: Variant) -> int:
    row = VariantRow(**_columns(v, skip=("id",)))
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
    _require_one(_rowcount(result), "variant", variant_id)


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
            func.min(case((_OK, TrialRow.median_s))).label("best"),
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


# ---------------------------------------------------------------------------------- trials


_RESOURCE_FIELDS = tuple(f.name for f in dataclasses.fields(ResourceUsage))
# Measurement fields stored as same-named columns; status, time and resources are mapped apart,
# and notes (facts of the recording, not of the trial) go into the campaign's events.
_MEASUREMENT_FIELDS = tuple(
    f.name for f in dataclasses.fields(Measurement)
    if f.name not in ("status", "time", "resources", "notes")
)


def _trial_values(
    campaign_id: int, variant_id: int, config: TrialConfig, m: Measurement
) -> dict[str, Any]:
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
        resources=_from_row(ResourceUsage, row),
        **{name: getattr(row, name) for name in _MEASUREMENT_FIELDS},
    )


def _trial(row: TrialRow) -> TrialRecord:
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
    params = [_trial_values(*row) for row in rows]
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
    return None if row is None else _trial(row)


def trials_of_variant(s: Session, variant_id: int) -> list[TrialRecord]:
    rows = s.execute(
        select(TrialRow).where(TrialRow.variant_id == variant_id).order_by(TrialRow.id)
    ).scalars()
    return [_trial(r) for r in rows]


def finished_trials(
    s: Session, campaign_id: int, *, variant_id: int | None = None
) -> list[TrialRecord]:
    """Every stored trial (failures included: BO tells them as a penalty), oldest first.

    A trial row is written only once its measurement is complete, so all rows are finished.
    """
    query = select(TrialRow).where(TrialRow.campaign_id == campaign_id)
    if variant_id is not None:
        query = query.where(TrialRow.variant_id == variant_id)
    return [_trial(r) for r in s.execute(query.order_by(TrialRow.id)).scalars()]


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
        .where(TrialRow.campaign_id == campaign_id, _OK, TrialRow.median_s.is_not(None))
        .order_by(TrialRow.id)
    )
    return [(tid, float(best), created) for tid, best, created in s.execute(query)]


# ------------------------------------------------------------------------------- llm calls


def _llm_call(row: LLMCallRow) -> LLMCall:
    return _from_row(LLMCall, row)


def add_llm_call(s: Session, campaign_id: int, call: LLMCall) -> int:
    row = LLMCallRow(campaign_id=campaign_id, **_columns(call))
    s.add(row)
    s.flush()
    return row.id


def get_llm_call(s: Session, call_id: int) -> LLMCall | None:
    row = s.get(LLMCallRow, call_id)
    return None if row is None else _llm_call(row)


def campaign_llm_calls(s: Session, campaign_id: int) -> list[tuple[int, LLMCall]]:
    """(id, call) in the order made: what a model-free re-run of the search replays."""
    rows = s.execute(
        select(LLMCallRow).where(LLMCallRow.campaign_id == campaign_id).order_by(LLMCallRow.id)
    ).scalars()
    return [(r.id, _llm_call(r)) for r in rows]


# ---------------------------------------------------------------------------------- elites


def upsert_elite(s: Session, cell: EliteCell) -> None:
    """Put ``cell`` in its (campaign, island, cell key) slot, replacing any occupant.

    Whether the newcomer deserves the slot is the archive's decision (r3tui.search).
    """
    now = utcnow()
    stmt = sqlite_insert(EliteCellRow).values(**_columns(cell), updated_at=now)
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
    return [_from_row(EliteCell, r) for r in rows]


# ---------------------------------------------------------------------------------- events


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
    return [_from_row(EventRecord, r) for r in rows]


# ------------------------------------------------------------------------ polling and info


def table_counts(s: Session) -> dict[str, int]:
    """Rows per R³ table, for ``r3 db info``; tables an older schema lacks are left out."""
    present = set(s.execute(text("SELECT name FROM sqlite_master WHERE type = 'table'")).scalars())
    counts: dict[str, int] = {}
    for table in Base.metadata.sorted_tables:
        if table.name in present:
            counts[table.name] = int(
                s.execute(select(func.count()).select_from(table)).scalar_one()
            )
    return counts


def data_version(s: Session) -> int:
    """``PRAGMA data_version`` of the session's connection.

    It changes when *another* connection commits, and only compares with earlier values
    from the same connection; ``Database.data_version()`` keeps one connection for that.
    """
    return int(s.execute(text("PRAGMA data_version")).scalar_one())
