"""Live updates: a writer thread plays the engine while the app is open."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from db import repository as repo
from db.session import open_database
from r3tui.domain import CampaignStatus
from r3tui.ui.screens.campaign import CampaignScreen
from r3tui.ui.screens.campaign_list import CampaignListScreen
from r3tui.ui.widgets.campaign_table import CampaignTable
from r3tui.ui.widgets.event_log import EventLog
from r3tui.ui.widgets.variant_tree import VariantTree
from tests.ui.conftest import make_app, open_campaign, text_of, until, visible_variants
from tests.ui.factories import CampaignSpec, add_live_variant, build_database

LIVE = CampaignSpec(name="live", n_variants=12, n_trials=80, status=CampaignStatus.RUNNING)


async def test_variants_written_while_watching_appear_within_a_second(tmp_path: Path) -> None:
    db_path = build_database(tmp_path / "r3.sqlite", (LIVE,))
    writer = open_database(db_path)
    app = make_app(db_path, poll_interval_s=0.25)
    written: list[tuple[int, float]] = []
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await open_campaign(pilot, 1)
            screen = app.screen
            assert isinstance(screen, CampaignScreen)

            def write(n: int) -> None:
                for k in range(n):
                    # children of the seed, whose line is expanded: they must show up
                    vid = add_live_variant(writer, 1, 1, 100 + k, time_s=50e-6 - k * 1e-6)
                    written.append((vid, time.monotonic()))
                    time.sleep(0.3)

            thread = threading.Thread(target=write, args=(5,))
            thread.start()
            latencies = []
            for i in range(5):
                await until(pilot, lambda: len(written) > i, timeout=10)  # noqa: B023
                vid, at = written[i]
                await until(pilot, lambda: vid in visible_variants(app), timeout=5)  # noqa: B023
                latencies.append(time.monotonic() - at)
            thread.join()
            assert max(latencies) < 1.0, latencies
            # the new best shows in the plot caption and the log
            await until(pilot, lambda: screen.series.best_s == 46e-6, timeout=5)
            log = screen.query_one(EventLog)
            assert log.last_id >= len(written)
            # a campaign that stops is shown as such
            with writer.session_scope() as s:
                repo.set_campaign_status(s, 1, CampaignStatus.STOPPED, finished=True)
                repo.add_event(s, 1, "stop", "stopped by request")
            bar = screen.query_one("#status-bar")
            await until(pilot, lambda: " stopped " in text_of(bar), timeout=5)
    finally:
        writer.close()


async def test_children_of_a_seed_that_had_none_appear_live(tmp_path: Path) -> None:
    # how a campaign starts: the TUI opens it while only the seed exists
    spec = CampaignSpec(name="new", n_variants=1, n_trials=5, status=CampaignStatus.RUNNING)
    db_path = build_database(tmp_path / "r3.sqlite", (spec,))
    writer = open_database(db_path)
    app = make_app(db_path)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await open_campaign(pilot, 1)
            assert visible_variants(app) == [1]
            first = add_live_variant(writer, 1, 1, 1)
            await until(pilot, lambda: visible_variants(app) == [1, first], timeout=5)
            second = add_live_variant(writer, 1, first, 2)
            # deeper: counted under its (collapsed) parent, shown once that is expanded
            tree = app.screen.query_one(VariantTree)
            await until(pilot, lambda: "[1]" in str(tree.root.children[0].children[0].label))
            tree.root.children[0].children[0].expand()
            await until(pilot, lambda: second in visible_variants(app), timeout=5)
    finally:
        writer.close()


async def test_a_stale_running_campaign_is_flagged(standard_db: Path) -> None:
    # sgemm-evolve is marked running but wrote nothing since 14:02; the frozen clock says 15:00
    app = make_app(standard_db)
    async with app.run_test(size=(160, 40)) as pilot:
        await open_campaign(pilot, 2)
        assert "engine gone?" in text_of(app.screen.query_one("#status-bar"))


async def test_a_node_with_many_children_loads_in_pages(tmp_path: Path) -> None:
    db_path = build_database(tmp_path / "r3.sqlite", (CampaignSpec(n_variants=2, n_trials=4),))
    writer = open_database(db_path)
    try:
        from tests.ui.factories import Variant, VariantOrigin

        with writer.session_scope() as s:
            for k in range(450):
                repo.add_variant(
                    s, Variant(1, f"// {k}", VariantOrigin.RULE, parent_id=1, operator="unroll")
                )
    finally:
        writer.close()
    app = make_app(db_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await open_campaign(pilot, 1)
        assert len(visible_variants(app)) == 1 + 200
        tree = app.screen.query_one("#tree", VariantTree)
        more = tree.root.children[0].children[-1]
        assert more.data is not None and more.data.is_more and more.data.remaining == 251
        tree.select_node(more)
        await until(pilot, lambda: len(visible_variants(app)) == 1 + 400)
        more = tree.root.children[0].children[-1]
        tree.select_node(more)
        await until(pilot, lambda: len(visible_variants(app)) == 1 + 451)
        last = tree.root.children[0].children[-1].data
        assert last is not None and not last.is_more


async def test_the_campaign_list_shows_a_campaign_that_stops_or_crashes(tmp_path: Path) -> None:
    db_path = build_database(
        tmp_path / "r3.sqlite", (LIVE, CampaignSpec(name="other", n_variants=4, n_trials=20))
    )
    writer = open_database(db_path)
    app = make_app(db_path, poll_interval_s=0.25)
    try:
        async with app.run_test(size=(120, 30)) as pilot:
            await until(
                pilot, lambda: isinstance(app.screen, CampaignListScreen) and app.screen.rows
            )
            table = app.screen.query_one(CampaignTable)

            def status(name: str) -> str:
                row = next(i for i, r in enumerate(table.rows_shown) if r.name == name)
                return str(table.get_row_at(row)[4])

            assert status("live") == "running"
            with writer.session_scope() as s:
                repo.set_campaign_status(s, 1, CampaignStatus.STOPPED, finished=True)
            await until(pilot, lambda: status("live") == "stopped", timeout=5)
            with writer.session_scope() as s:
                repo.set_campaign_status(s, 1, CampaignStatus.CRASHED, finished=True)
            await until(pilot, lambda: status("live") == "crashed", timeout=5)
    finally:
        writer.close()
