"""Opening rules and bad input: each failure is the right errors.* class, on one line."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import sqlite3
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from db import migrate
from db import repository as repo
from db.session import Database, open_database
from r3tui.errors import (
    DatabaseCorrupt,
    DatabaseError,
    DatabaseLocked,
    DatabaseMissing,
    R3Error,
    SchemaTooNew,
)
from tests.db import factories as f

NOBODY = 65534


def _one_line(error: R3Error, path: Path | str) -> str:
    line = error.one_line()
    assert "\n" not in line
    assert str(path) in line
    return line


def test_pragmas(database: Database) -> None:
    with database.engine.connect() as conn:
        pragma = lambda name: conn.exec_driver_sql(f"PRAGMA {name}").scalar_one()  # noqa: E731
        assert pragma("journal_mode") == "wal"
        assert pragma("foreign_keys") == 1
        assert pragma("synchronous") == 1  # NORMAL
        assert pragma("busy_timeout") == 10_000
    with open_database(database.path, readonly=True) as reader, reader.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar_one() == "wal"
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar_one() == 1
        assert conn.exec_driver_sql("PRAGMA query_only").scalar_one() == 0  # mode=ro instead


def test_readers_cannot_write(database: Database) -> None:
    with open_database(database.path, readonly=True) as reader:
        with pytest.raises(DatabaseError) as err, reader.session_scope() as s:
            f.seed_campaign(s)
        assert "read-only" in _one_line(err.value, database.path)
    with database.session_scope() as s:
        assert repo.list_recordings(s) == []


def test_session_scope_commits_or_rolls_back(database: Database) -> None:
    with pytest.raises(ValueError), database.session_scope() as s:
        f.seed_campaign(s)
        raise ValueError("the engine failed mid-batch")
    with database.session_scope() as s:
        assert repo.list_recordings(s) == []
        f.seed_campaign(s)
    with open_database(database.path, readonly=True) as reader, reader.session_scope() as s:
        assert len(repo.list_recordings(s)) == 1


def test_missing_file_read_only(tmp_path: Path) -> None:
    path = tmp_path / "nothing-here.sqlite"
    with pytest.raises(DatabaseMissing) as err:
        open_database(path, readonly=True)
    _one_line(err.value, path)
    with pytest.raises(DatabaseMissing):
        open_database(path, create=False)
    assert not path.exists()


def test_missing_file_is_created_for_writers(tmp_path: Path) -> None:
    path = tmp_path / "new.sqlite"
    with open_database(path) as db:
        assert db.revision() == migrate.head_revision()
    assert path.is_file()


def test_missing_parent_directory(tmp_path: Path) -> None:
    path = tmp_path / "no" / "such" / "dir" / "r3.sqlite"
    with pytest.raises(DatabaseError) as err:
        open_database(path)
    assert "does not exist" in _one_line(err.value, path.parent)
    assert not path.parent.exists()


def test_directory_instead_of_file(tmp_path: Path) -> None:
    with pytest.raises(DatabaseError, match="is a directory"):
        open_database(tmp_path)


@pytest.mark.parametrize("readonly", [False, True])
def test_corrupt_file(tmp_path: Path, readonly: bool) -> None:
    path = tmp_path / "random.sqlite"
    data = os.urandom(8192)
    path.write_bytes(data)
    with pytest.raises(DatabaseCorrupt) as err:
        open_database(path, readonly=readonly)
    _one_line(err.value, path)
    assert path.read_bytes() == data  # refused without being touched


def test_truncated_database_is_corrupt(database: Database, tmp_path: Path) -> None:
    with database.session_scope() as s:
        f.seed_campaign(s)
    database.close()
    broken = tmp_path / "broken.sqlite"
    data = database.path.read_bytes()
    # Keep the valid header, wipe the schema page's contents.
    broken.write_bytes(data[:100] + os.urandom(len(data) - 100))
    with pytest.raises(DatabaseCorrupt):
        open_database(broken, readonly=True)


def test_foreign_sqlite_database(tmp_path: Path) -> None:
    path = tmp_path / "someone-else.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE notes (body TEXT)")
    for readonly in (False, True):
        with pytest.raises(DatabaseError, match="not an R³ experiment database"):
            open_database(path, readonly=readonly)
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT name FROM sqlite_master").fetchall() == [("notes",)]


@pytest.mark.parametrize("readonly", [False, True])
def test_newer_schema_is_refused(database: Database, readonly: bool) -> None:
    database.close()
    with sqlite3.connect(database.path) as conn:
        conn.execute("UPDATE alembic_version SET version_num = 'f00dfacef00d'")
    with pytest.raises(SchemaTooNew) as err:
        open_database(database.path, readonly=readonly)
    line = _one_line(err.value, database.path)
    assert "f00dfacef00d" in line and "newer R³" in line
    with sqlite3.connect(database.path) as conn:  # left exactly as it was
        assert conn.execute("SELECT version_num FROM alembic_version").fetchall() == [
            ("f00dfacef00d",)
        ]


def test_locked_beyond_busy_timeout(database: Database) -> None:
    holder = database.session_scope()
    s = holder.__enter__()
    try:
        f.seed_campaign(s)  # holds the write lock (BEGIN IMMEDIATE) until the scope ends
        other = open_database(database.path, busy_timeout_s=0.3)
        try:
            # Opening and looking at the revision take no write lock, so they do not wait.
            assert other.revision() == migrate.head_revision()
            start = time.monotonic()
            with pytest.raises(DatabaseLocked) as err, other.session_scope() as s2:
                repo.list_recordings(s2)
            waited = time.monotonic() - start
            assert 0.25 < waited < 5
            _one_line(err.value, database.path)
        finally:
            other.close()
        # Readers are not blocked by a writer under WAL, and see only committed data.
        with open_database(database.path, readonly=True) as reader, reader.session_scope() as r:
            assert repo.list_recordings(r) == []
    finally:
        holder.__exit__(None, None, None)
    with open_database(database.path, readonly=True) as reader, reader.session_scope() as r:
        assert len(repo.list_recordings(r)) == 1


def test_path_sqlite_cannot_create_even_as_root() -> None:
    """/proc takes no new files whoever asks, so this runs the real failure as root too."""
    path = Path("/proc/r3-test.sqlite")
    with pytest.raises(DatabaseError) as err:
        open_database(path)
    _one_line(err.value, path)


def _in_child_as(uid: int | None, action: Callable[[], str]) -> str:
    """Run ``action`` in a forked child, with ``uid`` as its user when given.

    Forked rather than spawned: the child keeps the modules already imported, which
    matters because an unprivileged user cannot read this interpreter's stdlib (/root).
    """
    context = multiprocessing.get_context("fork")
    parent_end, child_end = context.Pipe()

    def run() -> None:
        try:
            if uid is not None:
                os.setgid(uid)
                os.setuid(uid)
            child_end.send(action())
        except BaseException as e:  # sent to the parent
            child_end.send(f"{type(e).__name__}: {e}")

    process = context.Process(target=run)
    process.start()
    result = parent_end.recv() if parent_end.poll(30) else "no answer"
    process.join(10)
    return str(result)


def test_read_only_directory(database: Database) -> None:
    """chmod 0o500: writers get DatabaseError; as root the check runs as `nobody`.

    Root ignores directory permissions, so a root test would prove nothing; the child
    drops to uid 65534 after fork, where the kernel enforces the mode for real.
    """
    with database.session_scope() as s:
        f.seed_campaign(s)
    database.close()
    directory = Path(tempfile.mkdtemp(prefix="r3-readonly-"))
    try:
        shutil.copy(database.path, directory / "old.sqlite")
        as_user: int | None = None
        if os.geteuid() == 0:
            as_user = NOBODY
            os.chown(directory, NOBODY, NOBODY)
            os.chown(directory / "old.sqlite", NOBODY, NOBODY)
        directory.chmod(0o500)

        def attempt(path: Path, **kwargs: bool) -> Callable[[], str]:
            def action() -> str:
                try:
                    open_database(path, **kwargs).close()
                except DatabaseError as e:
                    return f"{type(e).__name__}|{e.one_line()}"
                return "opened"

            return action

        new = _in_child_as(as_user, attempt(directory / "new.sqlite"))
        assert new.startswith("DatabaseError|cannot create"), new
        assert "not writable" in new and "\n" not in new
        assert not (directory / "new.sqlite").exists()

        old = _in_child_as(as_user, attempt(directory / "old.sqlite"))
        assert old.startswith("DatabaseError|cannot write to"), old
        assert "-wal and -shm" in old

        # A WAL reader needs to create the -shm file, so it is refused with its own message.
        reader = _in_child_as(as_user, attempt(directory / "old.sqlite", readonly=True))
        assert reader.startswith("DatabaseError|cannot open"), reader
        assert "read-only" in reader and "\n" not in reader
    finally:
        directory.chmod(0o700)
        shutil.rmtree(directory)
