"""Starting, pausing, resuming and stopping an engine child process.

The engine here is tests/ui/fake_engine.py (named as a fake: the real ``r3 tune`` needs a
GPU); the process, the signals, the database writes and the UI are all real.
"""

from __future__ import annotations

import sqlite3
import sys
import time
from collections.abc import Callable
from pathlib import Path

from r3tui.ui.launcher import CampaignProcess, LaunchRequest
from r3tui.ui.screens.campaign import CampaignScreen
from tests.ui.conftest import make_app, text_of, until
from tests.ui.factories import build_database

FAKE_ENGINE = Path(__file__).with_name("fake_engine.py")


def fake_argv(db: Path, name: str, *more: str) -> list[str]:
    return [sys.executable, str(FAKE_ENGINE), str(db), name, *more]


def status_of(db: Path, name: str) -> str | None:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as c:
        row = c.execute(
            "select status from campaigns where name=? order by id desc limit 1", (name,)
        ).fetchone()
    return None if row is None else row[0]


def wait_for(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.05)


def test_request_builds_the_r3_tune_command(tmp_path: Path) -> None:
    request = LaunchRequest(
        tmp_path / "k.r3b", tmp_path / "r3.sqlite", "40", "demo", ("--inner-only",)
    )
    argv = request.argv("demo", python="/usr/bin/python3")
    assert argv == [
        "/usr/bin/python3", "-m", "r3tui", "tune", str(tmp_path / "k.r3b"),
        "--db", str(tmp_path / "r3.sqlite"), "--budget", "40", "--name", "demo", "--inner-only",
    ]  # fmt: skip


def test_pause_resume_stop_reach_the_engine(tmp_path: Path) -> None:
    db = build_database(tmp_path / "r3.sqlite", ())
    request = LaunchRequest(tmp_path / "k.r3b", db, name="live")
    process = CampaignProcess.start(request, argv=fake_argv(db, "live"))
    try:
        wait_for(lambda: status_of(db, "live") == "running")
        process.pause()
        wait_for(lambda: status_of(db, "live") == "paused")
        process.resume()
        wait_for(lambda: status_of(db, "live") == "running")
        process.stop()
        assert process.wait(60) == 0
        assert status_of(db, "live") == "stopped"
        assert process.failure() is None
    finally:
        process.shutdown()


def test_a_failing_engine_reports_its_last_stderr_line(tmp_path: Path) -> None:
    db = build_database(tmp_path / "r3.sqlite", ())
    process = CampaignProcess.start(
        LaunchRequest(tmp_path / "k.r3b", db, name="bad"), argv=fake_argv(db, "bad", "--fail")
    )
    assert process.wait(60) == 2
    failure = process.failure()
    assert failure is not None
    assert "exit code 2" in failure and "no recording bundle at" in failure


async def test_the_tui_launches_pauses_and_stops_its_campaign(tmp_path: Path) -> None:
    db = build_database(tmp_path / "r3.sqlite", ())
    request = LaunchRequest(tmp_path / "k.r3b", db, name="owned")
    app = make_app(db, launch=request, engine_argv=fake_argv(db, "owned"))
    async with app.run_test(size=(120, 30)) as pilot:
        # the screen is current before its children are composed: wait for the status bar
        await until(pilot, lambda: isinstance(app.screen, CampaignScreen)
                    and bool(app.screen.query("#status-bar")), timeout=60)
        bar = app.screen.query_one("#status-bar")
        await until(pilot, lambda: "running" in text_of(bar) and "engine pid" in text_of(bar),
                    timeout=60)
        await pilot.press("P")
        await until(pilot, lambda: " paused " in text_of(bar), timeout=60)
        await pilot.press("P")
        await until(pilot, lambda: " running " in text_of(bar), timeout=60)
        await pilot.press("X")
        await until(pilot, lambda: " stopped " in text_of(bar), timeout=60)
        process = app.processes["owned"]
        assert process.wait(60) == 0


async def test_the_tui_shows_why_its_engine_failed(tmp_path: Path) -> None:
    db = build_database(tmp_path / "r3.sqlite", ())
    request = LaunchRequest(tmp_path / "k.r3b", db, name="bad")
    app = make_app(db, launch=request, engine_argv=fake_argv(db, "bad", "--fail"))
    async with app.run_test(size=(120, 30)) as pilot:
        await until(
            pilot,
            lambda: any("no recording bundle" in n.message for n in app._notifications),
            timeout=60,
        )
