"""Opening the experiment database: engine, pragmas, migrations on open, sessions.

Rules (docs/database.md has the long form):

- Writers (``readonly=False``) create a missing file when ``create`` is true, always bring a
  new file to head, and migrate an older file when ``upgrade`` is true.
- Readers (``readonly=True``) open with ``mode=ro`` and never migrate: a missing file raises
  ``DatabaseMissing``; an older schema raises ``SchemaNeedsUpgrade`` (``upgrade=True``, the
  default, asks for a current schema and a reader cannot make one).
- ``upgrade=False``, in either mode, opens an older file as it is and sets
  ``Database.needs_upgrade``: for ``r3 db info`` / ``r3 doctor``, which report the revision
  instead of failing.  Queries against an older schema may then fail; check the flag.
- Every mode refuses a file written by a newer R³ (``SchemaTooNew``), a non-SQLite file
  (``DatabaseCorrupt``) and an SQLite file that is not ours (``DatabaseError``).
- ``one_shot=True`` (with ``readonly``): a command that reads once and exits (``r3 runs``,
  ``r3 report``) leaves the database's folder as it found it.  A ``mode=ro`` reader of a
  WAL file creates the ``-wal`` and ``-shm`` files when they are missing, and only a
  writer's last close removes them.  When both are missing no connection has the file open
  (SQLite's last close deletes them), so the file is complete and the reader opens it
  ``immutable=1``: no side files, no locks.  Otherwise the reader opens ``mode=ro`` as
  usual: the files are there already, in use or left by an earlier reader.  What
  ``immutable`` does not cover: a writer that opens the file *during* the read and
  checkpoints into it before the read ends (at close, or after 1000 pages) could show the
  reader a torn page, an error or odd numbers in that one command; it cannot damage the
  file.  A command's read takes milliseconds, so this is accepted for one-shot commands; a
  reader that stays open (the TUI, which polls for a campaign's writes) must not use it.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, create_engine, event, exc
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import ConnectionPoolEntry, QueuePool

from db import migrate
from db.migrate import SchemaNeedsUpgrade, SchemaState
from r3tui.errors import (
    DatabaseCorrupt,
    DatabaseError,
    DatabaseLocked,
    DatabaseMissing,
    R3Error,
)

__all__ = [
    "DEFAULT_BUSY_TIMEOUT_S",
    "Database",
    "SchemaNeedsUpgrade",
    "idle_wal_file",
    "open_database",
    "sqlite_engine",
    "translate_error",
]

DEFAULT_BUSY_TIMEOUT_S = 10.0

_T = TypeVar("_T")


def _sqlite_uri(path: Path, mode: str, *, immutable: bool = False) -> str:
    # A URI filename is the only way to pass mode=ro; quote the path so that '?', '#'
    # and '%' in directory names stay part of the path.
    return f"file:{urllib.parse.quote(str(path))}?mode={mode}" + (
        "&immutable=1" if immutable else ""
    )


_SQLITE_MAGIC = b"SQLite format 3\x00"


def idle_wal_file(path: Path) -> bool:
    """A WAL-mode database that no connection has open: its header says WAL (file format
    bytes 18 and 19 are 2) and neither ``-wal`` nor ``-shm`` lies beside it."""
    try:
        with path.open("rb") as handle:
            header = handle.read(20)
    except OSError:
        return False
    if header[:16] != _SQLITE_MAGIC or header[18:20] != b"\x02\x02":
        return False
    return not any(path.with_name(path.name + side).exists() for side in ("-wal", "-shm"))


def sqlite_engine(
    path: str | os.PathLike[str],
    *,
    readonly: bool = False,
    create: bool = False,
    busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S,
    immutable: bool = False,
) -> Engine:
    """An engine for one SQLite file with R³'s pragmas and transaction handling.

    Lower level than ``open_database``: no path checks, no migrations (used by
    ``migrations/env.py`` for the ``alembic`` CLI and by tests).  ``immutable`` (readers
    only): SQLite takes no locks and makes no side files; see the module doc for when that
    is safe.
    """
    if immutable and not readonly:
        raise ValueError("only a reader can open a database immutable")
    file = Path(os.fspath(path)).expanduser().absolute()
    uri = _sqlite_uri(file, "ro" if readonly else ("rwc" if create else "rw"),
                      immutable=immutable)

    def connect() -> sqlite3.Connection:
        # check_same_thread: the pool hands a connection to whichever thread checks it out.
        return sqlite3.connect(uri, uri=True, timeout=busy_timeout_s, check_same_thread=False)

    # creator= hides the file from SQLAlchemy's URL, so name the pool: for a URL without a
    # database it would pick SingletonThreadPool, which is meant for :memory:.
    engine = create_engine("sqlite+pysqlite://", creator=connect, poolclass=QueuePool)
    busy_ms = max(0, round(busy_timeout_s * 1000))

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: ConnectionPoolEntry) -> None:
        # pysqlite's own transaction handling defers BEGIN to the first write, so a reader's
        # two SELECTs could see two different snapshots.  Autocommit here, and the "begin"
        # listener below emits BEGIN itself: SQLAlchemy's documented recipe.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout = {busy_ms}")
            if not readonly:
                # Readers cannot change the journal mode; the writer made the file WAL
                # (the mode is stored in the file).
                _switch_to_wal(cursor, busy_timeout_s)
            cursor.execute("PRAGMA foreign_keys = ON")
            # NORMAL under WAL: a process crash loses nothing committed; only a power cut
            # may lose the last transactions, never corrupting the file.
            cursor.execute("PRAGMA synchronous = NORMAL")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        # A writer takes the write lock up front: a deferred transaction that reads and then
        # writes can fail at once with SQLITE_BUSY when another writer committed in between,
        # without waiting for busy_timeout.  Readers take a snapshot that lasts the session.
        begin = connection.get_execution_options().get("r3_begin")
        connection.exec_driver_sql(begin or ("BEGIN" if readonly else "BEGIN IMMEDIATE"))

    return engine


def _switch_to_wal(cursor: sqlite3.Cursor, busy_timeout_s: float) -> None:
    """Put the file in WAL mode, waiting out other connections doing the same.

    Switching a file's journal mode needs an exclusive lock, and SQLite answers
    "database is locked" at once there instead of calling the busy handler: several
    processes opening a new file together would fail at random.  So retry here, for as
    long as the busy timeout, and skip the switch when the file is in WAL already.
    """
    deadline = time.monotonic() + busy_timeout_s
    pause = 0.002
    while True:
        try:
            mode = cursor.execute("PRAGMA journal_mode").fetchone()[0]
            if str(mode).lower() == "wal":
                return
            mode = cursor.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() == "wal":
                return
            # SQLite keeps the old mode, without an error, when it cannot switch now.
            failure: sqlite3.Error = sqlite3.OperationalError(
                f"database is locked (journal mode stayed {mode})"
            )
        except sqlite3.OperationalError as error:
            if not _is_busy(error):
                raise
            failure = error
        if time.monotonic() + pause > deadline:
            raise failure
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


def _is_busy(error: sqlite3.Error) -> bool:
    """SQLite's "database is locked" / "busy": another connection holds a lock."""
    text = str(error).lower()
    return "locked" in text or "busy" in text


def translate_error(
    error: BaseException,
    path: str | os.PathLike[str],
    *,
    readonly: bool = False,
    opening: bool = False,
) -> R3Error | None:
    """The R³ error for an SQLite failure a user can cause, or None for anything else."""
    original = error.orig if isinstance(error, exc.DBAPIError) else error
    if not isinstance(original, sqlite3.Error):
        return None
    text = str(original).lower()
    cannot_write = "readonly" in text or "read-only" in text or "unable to open" in text
    if _is_busy(original):
        return DatabaseLocked(
            f"database {path} is locked by another process beyond the busy timeout",
            hint="wait for the other writer to finish, or stop it",
        )
    if "not a database" in text or "malformed" in text or "corrupt" in text:
        return DatabaseCorrupt(
            f"{path} is not a usable SQLite database ({original})",
            hint="point --db at an R³ experiment database, or move this file away",
        )
    if cannot_write and readonly and opening:
        # A WAL reader still needs the shared-memory file (-shm) next to the database.
        return DatabaseError(
            f"cannot open {path} read-only ({original})",
            hint=f"{Path(path).parent} must be writable or hold the -shm file; "
            "copy the database somewhere writable",
        )
    if cannot_write and readonly:
        return DatabaseError(
            f"database {path} is open read-only ({original})",
            hint="this needs a database opened for writing",
        )
    if cannot_write:
        return DatabaseError(
            f"cannot open {path} for writing ({original})",
            hint=f"check that {Path(path).parent} and the file are writable",
        )
    return None


class Database:
    """One experiment database file, opened by ``open_database``."""

    def __init__(self, path: Path, engine: Engine, *, readonly: bool, needs_upgrade: bool):
        self.path = path
        self.engine = engine
        self.readonly = readonly
        # Only a database opened with upgrade=False can be behind; see the module doc.
        self.needs_upgrade = needs_upgrade
        # the database's folder, for recordings stored relative to it (repository: a folder
        # holding the database and its recordings can move, or ship, as a whole)
        self._sessions = sessionmaker(engine, expire_on_commit=False,
                                      info={"db_dir": str(path.parent)})
        self._poll_lock = threading.Lock()
        self._poll_connection: Any = None

    def __repr__(self) -> str:
        mode = "ro" if self.readonly else "rw"
        return f"Database({str(self.path)!r}, {mode})"

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @contextmanager
    def session_scope(self) -> Iterator[Session]:
        """A session that commits when the block ends and rolls back if it raises.

        "database is locked" past the busy timeout comes out as ``DatabaseLocked``.
        """
        session = self._sessions()
        try:
            yield session
            session.commit()
        except exc.DBAPIError as error:
            session.rollback()
            translated = translate_error(error, self.path, readonly=self.readonly)
            if translated is None:
                raise
            raise translated from error
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()

    @contextmanager
    def _reading(self) -> Iterator[Connection]:
        # A deferred BEGIN even on a writer: looking at the revision must not take (or wait
        # for) the write lock.
        with self.engine.connect() as connection:
            yield connection.execution_options(r3_begin="BEGIN")

    def revision(self) -> str | None:
        with self._reading() as connection:
            return migrate.current_revision(connection)

    def head_revision(self) -> str:
        return migrate.head_revision()

    def schema_info(self) -> migrate.SchemaInfo:
        with self._reading() as connection:
            return migrate.schema_info(connection)

    def upgrade(self) -> None:
        """Migrate to head (``r3 db upgrade``); a reader cannot."""
        if self.readonly:
            raise DatabaseError(
                f"database {self.path} is open read-only and cannot be upgraded",
                hint="open it for writing",
            )
        _guarded(self.path, lambda: migrate.upgrade(self.engine))
        self.needs_upgrade = False

    def data_version(self) -> int:
        """``PRAGMA data_version`` on a connection kept for polling.

        The value only means something compared with earlier values *of the same
        connection*; pooled sessions may get a different connection each time, so the TUI
        polls through this method rather than ``repository.data_version``.
        """
        with self._poll_lock:
            if self._poll_connection is None:
                self._poll_connection = self.engine.raw_connection()
            cursor = self._poll_connection.cursor()
            try:
                cursor.execute("PRAGMA data_version")
                return int(cursor.fetchone()[0])
            finally:
                cursor.close()

    def close(self) -> None:
        with self._poll_lock:
            if self._poll_connection is not None:
                self._poll_connection.close()
                self._poll_connection = None
        self.engine.dispose()


def _guarded(path: Path, action: Callable[[], _T], *, readonly: bool = False) -> _T:
    """Run an opening step, turning SQLite failures a user can cause into R³ errors."""
    try:
        return action()
    except (exc.DBAPIError, sqlite3.Error) as error:
        translated = translate_error(error, path, readonly=readonly, opening=True)
        if translated is None:
            raise
        raise translated from error


def _check_path(file: Path, *, readonly: bool, create: bool) -> bool:
    """Refuse paths SQLite would fail on with an unhelpful message; True for a new file."""
    if file.is_dir():
        raise DatabaseError(
            f"{file} is a directory, not a database file", hint="pass the path of a .sqlite file"
        )
    if file.exists():
        if readonly:
            if not os.access(file, os.R_OK):
                raise DatabaseError(f"cannot read {file}", hint="check its permissions")
            return False
        if not os.access(file, os.R_OK | os.W_OK):
            raise DatabaseError(
                f"database {file} is not writable", hint="fix its permissions or open it read-only"
            )
        if not os.access(file.parent, os.W_OK | os.X_OK):
            # WAL mode keeps two side files (-wal, -shm) next to the database.
            raise DatabaseError(
                f"cannot write to {file}: its directory {file.parent} is not writable",
                hint="SQLite needs to create its -wal and -shm files there; fix the permissions",
            )
        return False
    if readonly or not create:
        raise DatabaseMissing(
            f"no experiment database at {file}",
            hint="check the path, or run a campaign first to create it",
        )
    if not file.parent.is_dir():
        raise DatabaseError(
            f"cannot create {file}: directory {file.parent} does not exist",
            hint="create the directory first, or choose another path",
        )
    if not os.access(file.parent, os.W_OK | os.X_OK):
        raise DatabaseError(
            f"cannot create {file}: directory {file.parent} is not writable",
            hint="choose a writable directory",
        )
    return True


def _prepare(engine: Engine, *, readonly: bool, upgrade: bool) -> bool:
    """Check (and for writers, migrate) the schema; True where it stays behind head."""
    with engine.connect() as connection:
        # A deferred probe: checking the revision must not wait for another writer's lock.
        connection.execution_options(r3_begin="BEGIN")
        # A reader that wants a current schema cannot get one by migrating: refuse.
        state = migrate.check_schema(connection, allow_behind=not (readonly and upgrade))
    if state is SchemaState.CURRENT:
        return False
    if readonly or not upgrade:
        return True
    migrate.upgrade(engine)
    return False


def open_database(
    path: str | os.PathLike[str],
    *,
    readonly: bool = False,
    create: bool = True,
    upgrade: bool = True,
    busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S,
    one_shot: bool = False,
) -> Database:
    """Open an experiment database; the rules are in this module's docstring.

    Raises ``DatabaseMissing``, ``DatabaseCorrupt``, ``SchemaTooNew``,
    ``SchemaNeedsUpgrade``, ``DatabaseLocked`` or ``DatabaseError``, each with a one-line
    message naming the file and what to do.
    """
    file = Path(os.fspath(path)).expanduser().absolute()
    migrate.head_revision()  # a broken revision graph is refused before any file is touched
    is_new = _check_path(file, readonly=readonly, create=create)
    # a one-shot reader of an idle WAL file: no -wal/-shm left beside it (module doc)
    immutable = readonly and one_shot and idle_wal_file(file)
    engine = sqlite_engine(file, readonly=readonly, create=is_new, busy_timeout_s=busy_timeout_s,
                           immutable=immutable)
    try:
        # A new file always goes to head: an R³ database without tables is of no use.
        behind = _guarded(
            file,
            lambda: _prepare(engine, readonly=readonly, upgrade=upgrade or is_new),
            readonly=readonly,
        )
    except BaseException:
        engine.dispose()
        raise
    return Database(file, engine, readonly=readonly, needs_upgrade=behind)
