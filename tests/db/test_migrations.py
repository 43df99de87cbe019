"""Migrations on real files: up from empty, down and up, no drift, one head, CLI."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect

from db import migrate
from db import repository as repo
from db.migrate import SchemaNeedsUpgrade, SchemaState
from db.models import Base
from db.session import Database, open_database
from r3tui.errors import DatabaseError, DatabaseLocked
from tests.db import factories as f

ROOT = Path(__file__).resolve().parents[2]
MODEL_TABLES = {t.name for t in Base.metadata.sorted_tables}


def _tables(path: Path) -> set[str]:
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    return {name for (name,) in rows}


def test_exactly_one_head() -> None:
    heads = migrate.script_directory().get_heads()
    assert len(heads) == 1
    assert migrate.head_revision() == heads[0]
    assert migrate.MIGRATIONS_DIR == ROOT / "migrations"


def test_two_heads_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scripts = tmp_path / "migrations"
    shutil.copytree(migrate.MIGRATIONS_DIR, scripts, ignore=shutil.ignore_patterns("__pycache__"))
    (scripts / "versions" / "branch.py").write_text(
        'revision = "b0b0b0b0b0b0"\ndown_revision = None\nbranch_labels = None\n'
        "depends_on = None\n\ndef upgrade():\n    pass\n\ndef downgrade():\n    pass\n"
    )
    monkeypatch.setattr(migrate, "script_directory", lambda: ScriptDirectory(str(scripts)))
    with pytest.raises(DatabaseError, match="2 heads"):
        migrate.head_revision()
    with pytest.raises(DatabaseError, match="2 heads"):
        open_database(tmp_path / "new.sqlite")
    assert not (tmp_path / "new.sqlite").exists()


def test_upgrade_from_empty(db_path: Path) -> None:
    db = open_database(db_path)
    try:
        assert db.revision() == db.head_revision() == migrate.head_revision()
        assert not db.needs_upgrade
        info = db.schema_info()
        assert info.state is SchemaState.CURRENT and info.journal_mode == "wal"
        assert set(info.row_counts) == MODEL_TABLES
        # The connection that ran the migration went back to the pool with foreign keys on.
        with db.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar_one() == 1
    finally:
        db.close()
    assert _tables(db_path) == MODEL_TABLES | {"alembic_version"}


def test_downgrade_to_base_and_up_again(database: Database) -> None:
    with database.session_scope() as s:
        f.seed_campaign(s)
    with database.engine.connect() as conn:
        migrate.downgrade(conn, "base")
        assert migrate.current_revision(conn) is None
        assert set(inspect(conn).get_table_names()) == {"alembic_version"}
        conn.rollback()
        migrate.upgrade(conn)
        assert migrate.current_revision(conn) == migrate.head_revision()
        conn.rollback()
    with database.session_scope() as s:
        assert repo.list_recordings(s) == []
        f.seed_campaign(s)  # the rebuilt schema takes rows again
        assert len(repo.list_campaign_summaries(s)) == 1


def test_models_and_migrations_do_not_drift(database: Database) -> None:
    """The equivalent of `alembic check`: autogenerate finds nothing to do."""
    with database.engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        assert compare_metadata(context, Base.metadata) == []


def test_upgrade_is_one_transaction(database: Database) -> None:
    """A failing migration leaves nothing behind: SQLite DDL is transactional here."""
    with database.engine.connect() as conn:
        migrate.downgrade(conn, "base")
        with pytest.raises(RuntimeError, match="boom"), migrate.schema_transaction(conn):
            migrate._run(conn, "upgrade", "head")
            assert set(inspect(conn).get_table_names()) >= MODEL_TABLES
            raise RuntimeError("boom")
        assert migrate.current_revision(conn) is None
        assert set(inspect(conn).get_table_names()) == {"alembic_version"}
        conn.rollback()


def test_older_database_needs_upgrade(db_path: Path) -> None:
    with open_database(db_path) as db, db.engine.connect() as conn:
        migrate.downgrade(conn, "base")
    # Readers never migrate.
    with pytest.raises(SchemaNeedsUpgrade) as err:
        open_database(db_path, readonly=True)
    assert str(db_path) in err.value.one_line()
    assert "r3 db upgrade" in err.value.one_line()
    # Asked not to upgrade, a reader opens it as it is and says so (r3 db info, r3 doctor).
    with open_database(db_path, readonly=True, upgrade=False) as reader:
        assert reader.needs_upgrade and reader.revision() is None
        with reader.session_scope() as s:
            assert repo.table_counts(s) == {}
    # So does a writer.
    with open_database(db_path, upgrade=False) as db:
        assert db.needs_upgrade and db.revision() is None
        assert db.schema_info().needs_upgrade
        db.upgrade()
        assert not db.needs_upgrade and db.revision() == migrate.head_revision()
    with open_database(db_path, readonly=True) as reader:
        assert reader.revision() == migrate.head_revision()
        with pytest.raises(DatabaseError, match="read-only"):
            reader.upgrade()


def test_concurrent_first_opens_migrate_once(db_path: Path) -> None:
    barrier = threading.Barrier(4)
    revisions: list[str | None] = []
    errors: list[BaseException] = []

    def opener() -> None:
        try:
            barrier.wait()
            with open_database(db_path) as db:
                revisions.append(db.revision())
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=opener) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert revisions == [migrate.head_revision()] * 4
    with sqlite3.connect(db_path) as conn:
        assert conn.execute("SELECT count(*) FROM alembic_version").fetchone() == (1,)


def test_switch_to_wal_waits_for_another_writer(db_path: Path) -> None:
    """SQLite refuses a journal-mode switch at once while another connection holds the
    write lock, without calling the busy handler; opening must wait that lock out."""
    holder = sqlite3.connect(db_path, isolation_level=None, check_same_thread=False)
    try:
        # An existing empty file in rollback-journal mode, its write lock held.
        holder.execute("BEGIN IMMEDIATE")
        release = threading.Timer(0.3, lambda: holder.execute("COMMIT"))
        started = time.monotonic()
        release.start()
        try:
            with open_database(db_path, busy_timeout_s=5) as db:
                waited = time.monotonic() - started
                assert db.revision() == migrate.head_revision()
        finally:
            release.join()
    finally:
        holder.close()
    assert waited >= 0.25
    with sqlite3.connect(db_path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_switch_to_wal_gives_up_after_the_busy_timeout(db_path: Path) -> None:
    holder = sqlite3.connect(db_path, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        started = time.monotonic()
        with pytest.raises(DatabaseLocked, match="locked by another process"):
            open_database(db_path, busy_timeout_s=0.5)
        assert 0.4 <= time.monotonic() - started < 5
    finally:
        holder.close()


def test_alembic_cli_with_alembic_ini(tmp_path: Path) -> None:
    """alembic.ini at the root drives the same migrations (`alembic upgrade`, `check`)."""
    path = tmp_path / "cli.sqlite"
    base = [sys.executable, "-m", "alembic", "-c", str(ROOT / "alembic.ini"), "-x", f"db={path}"]
    up = subprocess.run([*base, "upgrade", "head"], cwd=ROOT, capture_output=True, text=True)
    assert up.returncode == 0, up.stderr
    with open_database(path, readonly=True) as db:
        assert db.revision() == migrate.head_revision()
    check = subprocess.run([*base, "check"], cwd=ROOT, capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    assert "No new upgrade operations detected" in check.stdout + check.stderr
