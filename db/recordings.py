"""Queries of the ``recordings`` table: the bundles campaigns tune.

A bundle under the database's folder is stored relative to it, so a folder holding the
database and its recordings can move or ship whole; reads resolve it against the folder the
database is opened from (``Session.info["db_dir"]``, set by ``db.session``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from db.models import RecordingRow, utcnow
from r3tui.domain import Dim3, KernelLaunch, Recording


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
