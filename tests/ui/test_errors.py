"""Databases the TUI cannot show as they are: missing, locked, newer, older, and the CLI."""

from __future__ import annotations

import hashlib
import sqlite3
import threading
from pathlib import Path

import pytest

from r3tui import cli
from r3tui.cli.demo import DemoUnavailable, gpu_available, open_shipped_demo
from r3tui.ui.screens.campaign_list import CampaignListScreen
from r3tui.ui.screens.database_error import DatabaseErrorScreen
from tests.ui.conftest import make_app, text_of, until
from tests.ui.factories import CampaignSpec, build_database


async def _error_text(db: Path) -> str:
    app = make_app(db)
    async with app.run_test(size=(100, 24)) as pilot:
        await until(
            pilot,
            lambda: isinstance(app.screen, DatabaseErrorScreen) and app.screen.query("#error-text"),
        )
        text = text_of(app.screen.query_one("#error-text"))
        await pilot.press("q")
    assert app.return_code == 2
    return " ".join(text.split())


async def test_missing_database(tmp_path: Path) -> None:
    text = await _error_text(tmp_path / "nope.sqlite")
    assert "no experiment database at" in text and "nope.sqlite" in text


async def test_newer_schema_is_refused_and_left_alone(tmp_path: Path) -> None:
    db = build_database(tmp_path / "r3.sqlite", ())
    with sqlite3.connect(db) as c:
        c.execute("update alembic_version set version_num = 'ffffffffffff'")
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    text = await _error_text(db)
    assert "ffffffffffff" in text and "does not know" in text
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before


async def test_locked_database_is_reported_not_waited_on(tmp_path: Path) -> None:
    db = build_database(tmp_path / "r3.sqlite", ())
    # An exclusive-mode writer locks even WAL readers out: the one case a reader meets a lock.
    holder = sqlite3.connect(db, check_same_thread=False)
    holder.execute("PRAGMA locking_mode = EXCLUSIVE")
    holder.execute("BEGIN EXCLUSIVE")
    holder.execute(
        "INSERT INTO events (campaign_id, created_at, kind, message) SELECT 0, 0, 'x', 'x' WHERE 0"
    )
    try:
        text = await _error_text(db)
    finally:
        holder.rollback()
        holder.close()
    assert "locked" in text


async def test_older_schema_opens_a_migrated_copy_and_never_touches_the_file(
    tmp_path: Path,
) -> None:
    # an SQLite file without the R³ schema yet: behind head, as an older R³ leaves one
    db = tmp_path / "old.sqlite"
    sqlite3.connect(db).close()
    before = db.read_bytes()
    app = make_app(db)
    async with app.run_test(size=(100, 24)) as pilot:
        await until(
            pilot,
            lambda: isinstance(app.screen, CampaignListScreen) and app.screen.query("#list-title"),
        )
        await until(pilot, lambda: any("older schema" in n.message for n in app._notifications))
        assert "migrated read-only copy" in text_of(app.screen.query_one("#list-title"))
        assert app.target is not None and app.target.database.path != db.resolve()
    assert db.read_bytes() == before


def test_cli_missing_database_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(["tui", "--db", str(tmp_path / "missing.sqlite")])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("r3: error: no experiment database at")


def test_demo_without_gpu_or_database_says_so_in_one_error(tmp_path: Path) -> None:
    assert gpu_available() is False  # this machine has no NVIDIA driver
    with pytest.raises(DemoUnavailable, match="no demo database at"):
        open_shipped_demo(tmp_path / "absent.sqlite")


def test_polling_reader_is_not_blocked_by_a_writer_transaction(tmp_path: Path) -> None:
    """Under WAL the TUI's reads go on while the engine holds its write transaction."""
    from db.browse import campaign_rows
    from db.session import open_database

    db = build_database(tmp_path / "r3.sqlite", (CampaignSpec(n_variants=5, n_trials=20),))
    writer = open_database(db)
    reader = open_database(db, readonly=True, busy_timeout_s=0.5)
    started, release = threading.Event(), threading.Event()

    def hold() -> None:
        with writer.session_scope() as s:
            s.connection().exec_driver_sql("UPDATE campaigns SET name = 'renamed'")
            started.set()
            release.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert started.wait(10)
        with reader.session_scope() as s:
            assert [r.name for r in campaign_rows(s)] == ["stencil7-evolve"]
    finally:
        release.set()
        thread.join()
        reader.close()
        writer.close()
