"""A bundle as the experiment database knows it: its :class:`~r3tui.domain.Recording`, and
its registration there (what every ``r3 record`` does with the bundles it writes, and what a
campaign does with the bundle it opens)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from r3tui.domain import Recording
    from r3tui.record.bundle import Bundle


def recording_of(bundle: Bundle) -> Recording:
    from r3tui.domain import Recording

    m = bundle.manifest
    return Recording(bundle_path=str(bundle.path.resolve()), sha256=bundle.sha256,
                     kernel_name=m.kernel.name, launch=m.to_launch())


def register(db_path: Path, bundle: Bundle) -> int:
    """Add the bundle to the experiment database (idempotent on its sha256)."""
    from db import repository as repo
    from db.session import open_database

    database = open_database(db_path, create=True, upgrade=True)
    try:
        with database.session_scope() as session:
            return repo.add_recording(session, recording_of(bundle), bundle.manifest.to_json())
    finally:
        database.close()
