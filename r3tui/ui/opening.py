"""Opening a database for browsing, without ever changing the file a user pointed at.

The TUI reads only.  A file at the current schema opens read-only as it is.  A file of an
older schema cannot be read by the current queries and must not be migrated in place (it
may be an archive, or still in use by an older R³), so the TUI copies it with SQLite's
backup API, migrates the copy and browses that, saying so in a notice.
"""

from __future__ import annotations

import sqlite3
import tempfile
from dataclasses import dataclass
from pathlib import Path

from db.session import Database, open_database
from r3tui.errors import DatabaseError, SchemaNeedsUpgrade

# Short: a reader under WAL is never blocked by the writer, so waiting longer only delays
# the message about a lock held by something else (an exclusive-mode connection).
BUSY_TIMEOUT_S = 2.0


@dataclass
class BrowseTarget:
    """An opened database and what the user should know about it."""

    database: Database
    shown_path: Path  # the file the user named
    notice: str | None = None  # e.g. "older schema: showing a migrated copy"
    copy_dir: tempfile.TemporaryDirectory[str] | None = None

    def close(self) -> None:
        self.database.close()
        if self.copy_dir is not None:
            self.copy_dir.cleanup()


def open_for_browsing(path: Path, *, busy_timeout_s: float = BUSY_TIMEOUT_S) -> BrowseTarget:
    """Open ``path`` read-only, or a migrated copy of it; raises ``R3Error`` subclasses."""
    try:
        db = open_database(path, readonly=True, create=False, busy_timeout_s=busy_timeout_s)
        return BrowseTarget(db, path)
    except SchemaNeedsUpgrade:
        pass
    # A reader that outlives the app (a worker past its drain bound) may still create a -shm
    # file while the folder is removed: that must not turn quitting into a traceback.
    folder = tempfile.TemporaryDirectory(prefix="r3-tui-", ignore_cleanup_errors=True)
    copy = Path(folder.name) / path.name
    try:
        _backup(path, copy)
        with open_database(
            copy, create=False, upgrade=False, busy_timeout_s=busy_timeout_s
        ) as writer:
            before = writer.revision() or "no revision"
            writer.upgrade()
        db = open_database(copy, readonly=True, create=False, busy_timeout_s=busy_timeout_s)
    except BaseException:
        folder.cleanup()
        raise
    notice = (
        f"{path.name} has an older schema ({before}): showing a migrated copy, {copy}; "
        "the file itself is untouched (`r3 db upgrade` migrates it in place)"
    )
    return BrowseTarget(db, path, notice, folder)


def _backup(source: Path, target: Path) -> None:
    """Copy through SQLite (consistent even while a writer works), never writing ``source``."""
    try:
        src = sqlite3.connect(f"file:{source}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise DatabaseError(f"cannot read {source} to copy it ({exc})") from exc
    try:
        dst = sqlite3.connect(target)
        try:
            src.backup(dst)
        finally:
            dst.close()
    finally:
        src.close()
