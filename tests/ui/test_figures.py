"""One campaign reads the same in ``r3 runs``, ``r3 report`` and the TUI (issue #20), and
the TUI's ``e`` writes what ``r3 export`` writes.

A real SQLite file: the standard finished campaign, plus what a resumed campaign with a
final comparison stores: the original timed at the recorded configuration, two runs ended
by ``finish`` / ``stop`` events with their wall times, a ``resume`` between them, and the
``final`` event (the best variant re-timed against the original).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from db import repository as repo
from db.session import open_database
from r3tui.domain import TrialConfig
from r3tui.ui.screens.campaign_list import CampaignListScreen
from tests.db import factories as dbf
from tests.ui.conftest import make_app, open_campaign, screen_text, until
from tests.ui.factories import CampaignSpec, add_campaign

SPEEDUP = "1.10× re-timed"  # the final event's 1.101x
TOOK = "7m38s"  # 100.0 s + 358.9 s over two runs
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def resumed_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("figures") / "r3.sqlite"
    database = open_database(path, create=True)
    try:
        with database.session_scope() as s:
            built = add_campaign(s, CampaignSpec(n_variants=20, n_trials=120))
        with database.session_scope() as s:
            cid, seed = built.id, built.seed_variant_id
            repo.insert_trial(s, cid, seed, TrialConfig(), dbf.ok(101.0e-6))
            best = min(
                (t for v in built.variant_ids for t in repo.trials_of_variant(s, v)
                 if t.measurement.time is not None),
                key=lambda t: t.measurement.time.median_s,  # type: ignore[union-attr]
            )
            repo.add_event(s, cid, "finish", "budget spent", {"wall_s": 100.0, "llm_s": 60.0})
            repo.add_event(s, cid, "resume", "resumed by request")
            repo.add_event(s, cid, "stop", "stopped by request", {"wall_s": 358.9})
            repo.add_event(
                s, cid, "final", f"best variant #{best.variant_id}: 1.101x",
                {"variant_id": best.variant_id, "speedup": 1.101, "ci": [1.083, 1.119],
                 "rounds": 15, "median_s": 92e-6},
            )
    finally:
        database.close()
    return path


def _r3(*args: str) -> str:
    env = {**os.environ, "COLUMNS": "250", "NO_COLOR": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "r3tui", *args], capture_output=True, text=True, env=env,
        cwd=ROOT, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_runs_report_and_tui_show_the_same_speedup_and_duration(resumed_db: Path) -> None:
    row = next(ln for ln in _r3("runs", "--db", str(resumed_db)).splitlines()
               if "stencil7-evolve" in ln)
    assert SPEEDUP in row and f" {TOOK} " in row

    report = _r3("report", "1", "--db", str(resumed_db)).splitlines()
    assert f"best speedup: {SPEEDUP} [1.083, 1.119] (95% CI)" in report
    took = next(ln for ln in report if ln.startswith("took "))
    assert took.startswith(f"took {TOOK} over 2 runs, 121 evaluations, ")
    rate = took.rsplit(", ", 1)[1]
    assert rate == f"{121 / 458.9:.1f}/s"


async def test_the_tui_shows_them_too(resumed_db: Path) -> None:
    app = make_app(resumed_db)
    async with app.run_test(size=(160, 40)) as pilot:
        await until(pilot, lambda: isinstance(app.screen, CampaignListScreen) and app.screen.rows)
        cells = [str(c) for c in app.screen.query_one("#campaigns").get_row_at(0)]  # type: ignore[attr-defined]
        assert SPEEDUP in cells
        await open_campaign(pilot, 1)
        status = next(ln for ln in screen_text(app) if " evals" in ln)
        assert f"took {TOOK}" in status
        assert f"121 evals {121 / 458.9:.1f}/s" in status


async def test_the_tui_export_is_r3_export(resumed_db: Path, tmp_path: Path) -> None:
    app = make_app(resumed_db, export_dir=tmp_path / "tui")
    async with app.run_test(size=(120, 40)) as pilot:
        await open_campaign(pilot, 1)
        screen = app.screen
        await pilot.press("b")  # the best variant
        await until(pilot, lambda: screen.detail is not None  # type: ignore[attr-defined]
                    and screen.detail.node.id == screen.selected)  # type: ignore[attr-defined]
        variant = screen.selected  # type: ignore[attr-defined]
        await pilot.press("e")
        folder = tmp_path / "tui" / f"variant-{variant}"
        await until(pilot, lambda: (folder / "launch.json").exists()
                    and (folder / "stencil7.patch").exists())
        await until(pilot, lambda: all(w.is_finished for w in app.workers))
    cli = tmp_path / "cli"
    _r3("export", "1", "--variant", str(variant), "--out", str(cli), "--db", str(resumed_db))
    names = sorted(p.name for p in cli.iterdir())
    assert names == sorted(p.name for p in folder.iterdir())
    assert {"stencil7.cu", "options.txt", "launch.json", "stencil7.patch"} <= set(names)
    for name in names:
        assert (folder / name).read_text() == (cli / name).read_text(), name
