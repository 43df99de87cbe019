"""Typed ORM models of the experiment database.

The schema itself is owned by the Alembic revisions in ``migrations/versions``; these models
must match them (``tests/db/test_migrations.py`` compares the two).  ``create_all`` is only
used by tests.

Conventions:

- Enums are stored as their ``StrEnum`` *values* in ``VARCHAR(32)`` columns through
  ``Enum(native_enum=False, create_constraint=False, validate_strings=True)``: no CHECK
  constraint, so a new member needs no table rebuild, but an older R³ cannot read a row
  carrying a member it does not know -- add a (possibly empty) revision with the new member
  so that older readers refuse the file with ``SchemaTooNew`` instead of failing mid-query.
- Timestamps are stored as naive UTC (SQLite has no time zone type) and come back aware.
- Relationships are ``lazy="raise"``: every query says what it loads, so the TUI never
  issues a hidden query per row.
"""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    DateTime,
    Dialect,
    Enum,
    ForeignKey,
    Index,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from r3tui.domain import CampaignStatus, MeasurementStatus, VariantOrigin, VariantStatus

# Deterministic constraint names: SQLite batch migrations can only drop or alter a
# constraint they can name.
NAMING_CONVENTION: dict[str, str] = {
    "ix": "ix_%(column_0_N_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

ENUM_LENGTH = 32


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """A ``DATETIME`` that stores naive UTC and returns aware UTC datetimes."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            # Naive values are taken to be UTC already; converting them as local time
            # would shift every timestamp on machines not set to UTC.
            return value
        return value.astimezone(UTC).replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        return None if value is None else value.replace(tzinfo=UTC)


def _enum(cls: type[StrEnum]) -> Enum:
    return Enum(
        cls,
        native_enum=False,
        create_constraint=False,
        validate_strings=True,
        length=ENUM_LENGTH,
        values_callable=lambda members: [m.value for m in members],
    )


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        datetime: UTCDateTime(),
        dict[str, Any]: JSON(),
        CampaignStatus: _enum(CampaignStatus),
        MeasurementStatus: _enum(MeasurementStatus),
        VariantOrigin: _enum(VariantOrigin),
        VariantStatus: _enum(VariantStatus),
    }


class RecordingRow(Base):
    __tablename__ = "recordings"

    id: Mapped[int] = mapped_column(primary_key=True)
    bundle_path: Mapped[str] = mapped_column(Text)
    # The manifest's hash identifies a recording: the same bundle added twice is one row.
    sha256: Mapped[str] = mapped_column(String(64), unique=True)
    kernel_name: Mapped[str] = mapped_column(Text)
    grid_x: Mapped[int]
    grid_y: Mapped[int]
    grid_z: Mapped[int]
    block_x: Mapped[int]
    block_y: Mapped[int]
    block_z: Mapped[int]
    shared_mem_bytes: Mapped[int]
    launch_count: Mapped[int]
    launch_total_time_s: Mapped[float | None]
    manifest: Mapped[dict[str, Any]]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    campaigns: Mapped[list[CampaignRow]] = relationship(back_populates="recording", lazy="raise")


class CampaignRow(Base):
    __tablename__ = "campaigns"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(Text)
    recording_id: Mapped[int] = mapped_column(ForeignKey("recordings.id"), index=True)
    seed: Mapped[int]
    settings: Mapped[dict[str, Any]]
    # {"gpu": {"name": ...}, "driver": ..., "toolchains": {...}}: what the numbers depend on.
    provenance: Mapped[dict[str, Any]]
    status: Mapped[CampaignStatus]
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None]
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
    # while a run goes on, where its runner stands (r3tui.engine.gpu.report_load): {"runner",
    # "at", "workers": [[name, kind, running, queued, done], ...]}; NULL otherwise
    workers: Mapped[dict[str, Any] | None]

    recording: Mapped[RecordingRow] = relationship(back_populates="campaigns", lazy="raise")
    variants: Mapped[list[VariantRow]] = relationship(
        back_populates="campaign", lazy="raise", passive_deletes=True
    )


class LLMCallRow(Base):
    __tablename__ = "llm_calls"

    id: Mapped[int] = mapped_column(primary_key=True)
    campaign_id: Mapped[int] = mapped_column(
        ForeignKey("campaigns.id", ondelete="CASCADE"), index=True
    )
    prompt: Mapped[str] = mapped_column(Text)
    response: Mapped[str] = mapped_column(Text)
    model_path: Mapped[str] = mapped_column(Text)
    model_sha256: Mapped[str] = mapped_column(String(64))
    sampling: Mapped[dict[str, Any]]
    seed: Mapped[int | None]
    tokens_in: Mapped[int]
    tokens_out: Mapped[int]
    latency_s: Mapped[float]
    backend: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class VariantRow(Base):
    __tablename__ = "variants"
    __table_args__ = (
        Index("ix_variants_campaign_parent", "campaign_id", "parent_id"),
        Index("ix_variants_campaign_status", "campaign_id", "status"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    campaign_id: Mapped[int] = mapped_column(ForeignKey("campaigns.id", ondelete="CASCADE"))
    parent_id: Mapped[int | None] = mapped_column(ForeignKey("variants.id", ondelete="SET NULL"))
    source: Mapped[str] = mapped_column(Text)
    diff: Mapped[str | None] = mapped_column(Text)
    origin: Mapped[VariantOrigin]
    operator: Mapped[str | None] = mapped_column(Text)
    status: Mapped[VariantStatus]
    status_reason: Mapped[str | None] = mapped_column(Text)
    island: Mapped[int]
    features: Mapped[dict[str, Any]]
    # variants and trials point at each other; use_alter lets the metadata sort the cycle
    # (SQLite itself checks foreign keys only on write, so CREATE order does not matter).
    best_trial_id: Mapped[int | None] = mapped_column(
        ForeignKey("trials.id", ondelete="SET NULL", use_alter=True)
    )
    llm_call_id: Mapped[int | None] = mapped_column(ForeignKey("llm_calls.id", ondelete="SET NULL"))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    campaign: Mapped[CampaignRow] = relationship(back_populates="variants", lazy="raise")
    parent: Mapped[VariantRow | None] = relationship(
        remote_side=[id], back_populates="children", lazy="raise"
    )
    children: Mapped[list[VariantRow]] = relationship(back_populates="parent", lazy="raise")
    trials: Mapped[list[TrialRow]] = relationship(
        back_populates="variant",
        lazy="raise",
        foreign_keys="TrialRow.variant_id",
        passive_deletes=True,
    )


class TrialRow(Base):
    __tablename__ = "trials"
    __table_args__ = (
        Index("ix_trials_variant", "variant_id"),
        Index("ix_trials_campaign_id", "campaign_id", "id"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    variant_id: Mapped[int] = mapped_column(ForeignKey("variants.id", ondelete="CASCADE"))
    campaign_id: Mapped[int] = mapped_column(ForeignKey("campaigns.id", ondelete="CASCADE"))
    config: Mapped[dict[str, Any]]
    status: Mapped[MeasurementStatus]
    compile_time_s: Mapped[float | None]
    replay_wall_s: Mapped[float | None]
    median_s: Mapped[float | None]
    min_s: Mapped[float | None]
    iqr_s: Mapped[float | None]
    n_samples: Mapped[int | None]
    verified: Mapped[bool | None]
    max_error: Mapped[float | None]
    registers: Mapped[int | None]
    spill_stores_bytes: Mapped[int | None]
    spill_loads_bytes: Mapped[int | None]
    shared_mem_bytes: Mapped[int | None]
    local_mem_bytes: Mapped[int | None]
    max_threads_per_block: Mapped[int | None]
    binary_sha256: Mapped[str | None] = mapped_column(String(64))
    error_text: Mapped[str | None] = mapped_column(Text)
    compile_log: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    variant: Mapped[VariantRow] = relationship(
        back_populates="trials", lazy="raise", foreign_keys=[variant_id]
    )


class EliteCellRow(Base):
    __tablename__ = "elite_cells"
    __table_args__ = (UniqueConstraint("campaign_id", "island", "cell_key"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    campaign_id: Mapped[int] = mapped_column(ForeignKey("campaigns.id", ondelete="CASCADE"))
    island: Mapped[int]
    cell_key: Mapped[str] = mapped_column(Text)
    variant_id: Mapped[int] = mapped_column(
        ForeignKey("variants.id", ondelete="CASCADE"), index=True
    )
    fitness_s: Mapped[float]
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class EventRow(Base):
    __tablename__ = "events"
    __table_args__ = (Index("ix_events_campaign_id", "campaign_id", "id"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    campaign_id: Mapped[int] = mapped_column(ForeignKey("campaigns.id", ondelete="CASCADE"))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    kind: Mapped[str] = mapped_column(String(64))
    message: Mapped[str] = mapped_column(Text)
    # none_as_null: "no data" is SQL NULL rather than the JSON text 'null'.
    data: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))
