"""Driving the app with the keyboard on a real generated database (Pilot)."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from rich.style import Style
from textual.binding import Binding
from textual.widgets import Footer, Static
from textual.widgets._footer import FooterKey
from textual.widgets.tabbed_content import ContentTabs

from db.browse import FAILED_STATUSES
from db.series import TrialSort
from db.session import open_database
from r3tui.domain import VariantStatus
from r3tui.ui.screens.campaign import CampaignScreen
from r3tui.ui.screens.campaign_list import CampaignListScreen
from r3tui.ui.screens.help import HelpScreen, binding_rows
from r3tui.ui.widgets.campaign_table import CampaignTable
from r3tui.ui.widgets.convergence import ConvergencePanel
from r3tui.ui.widgets.trials_table import TrialsTable
from r3tui.ui.widgets.variant_tree import VariantTree
from tests.ui.conftest import (
    contrast,
    drawn_colours,
    make_app,
    open_campaign,
    screen_text,
    text_of,
    until,
    visible_variants,
)
from tests.ui.factories import CampaignSpec, add_live_variant, build_database


def _sql(db: Path, query: str, *args: object) -> list[tuple[Any, ...]]:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as c:
        return c.execute(query, args).fetchall()


async def test_campaign_list_shows_sorts_and_filters(standard_db: Path) -> None:
    app = make_app(standard_db)
    async with app.run_test(size=(120, 30)) as pilot:
        await until(pilot, lambda: isinstance(app.screen, CampaignListScreen) and app.screen.rows)
        table = app.screen.query_one("#campaigns", CampaignTable)
        assert [r.name for r in table.rows_shown] == [
            "stencil7-evolve",
            "sgemm-evolve",
            "softmax-crash",
        ]
        first = [str(c) for c in table.get_row_at(0)]
        assert first[:6] == ["1", "stencil7-evolve", "stencil7", "H200", "finished", "60"]
        # db.figures: no final event and no trial of the seed at the recorded configuration,
        # so the best trial over the original's time in the manifest
        best = _sql(
            standard_db,
            "select min(t.median_s) from trials t join variants v on v.id = t.variant_id "
            "where t.campaign_id=1 and t.status='ok' "
            "and (v.origin='seed' or v.status in ('verified', 'improved'))",
        )
        assert first[7] == f"{104.2e-6 / best[0][0]:.2f}× best trial"
        await pilot.press("s")  # sort by name
        assert next(r.name for r in table.rows_shown) == "sgemm-evolve"
        await pilot.press("r")
        assert next(r.name for r in table.rows_shown) == "stencil7-evolve"
        await pilot.press("slash", *"crash")
        assert [r.name for r in table.rows_shown] == ["softmax-crash"]
        await pilot.press("escape")
        assert len(table.rows_shown) == 3


async def test_open_campaign_and_walk_the_tree(standard_db: Path) -> None:
    app = make_app(standard_db)
    async with app.run_test(size=(120, 40)) as pilot:
        await open_campaign(pilot, 1)
        screen = app.screen
        assert isinstance(screen, CampaignScreen)
        shown = visible_variants(app)
        seed_children = [
            r[0] for r in _sql(standard_db, "select id from variants where parent_id=1 order by id")
        ]
        assert shown == [1, *seed_children]  # the seed is expanded, nothing below loaded yet
        tree = screen.query_one(VariantTree)
        assert str(tree.root.children[0].label).startswith("● #1 seed original")
        # jump to the best variant: the one with the fastest ok trial
        best = _sql(
            standard_db,
            "select variant_id from trials where campaign_id=1 "
            "and status='ok' order by median_s limit 1",
        )[0][0]
        await pilot.press("b")
        await until(
            pilot, lambda: tree.cursor_variant is not None and tree.cursor_variant.id == best
        )
        await until(pilot, lambda: screen.detail is not None and screen.detail.node.id == best)
        parent = _sql(standard_db, "select parent_id from variants where id=?", best)[0][0]
        await pilot.press("p")
        await until(
            pilot, lambda: tree.cursor_variant is not None and tree.cursor_variant.id == parent
        )
        await pilot.press("c")
        first_child = _sql(standard_db, "select min(id) from variants where parent_id=?", parent)[
            0
        ][0]
        await until(pilot, lambda: tree.cursor_variant.id == first_child)  # type: ignore[union-attr]


async def test_filters_keep_matches_and_their_lineage(standard_db: Path) -> None:
    app = make_app(standard_db)
    async with app.run_test(size=(120, 40)) as pilot:
        await open_campaign(pilot, 1)
        screen = app.screen
        assert isinstance(screen, CampaignScreen)
        await pilot.press("f")  # improved
        await until(pilot, lambda: screen.tree_ready)
        statuses = dict(_sql(standard_db, "select id, status from variants where campaign_id=1"))
        parents = dict(_sql(standard_db, "select id, parent_id from variants where campaign_id=1"))
        improved = {v for v, s in statuses.items() if s == VariantStatus.IMPROVED.value}

        def has_match_below(vid: int) -> bool:
            return any(_ancestor(parents, m, vid) for m in improved)

        shown = visible_variants(app)
        assert shown and all(v in improved or has_match_below(v) for v in shown)
        assert "filter: improved" in text_of(screen.query_one("#status-bar"))
        await pilot.press("f")  # failed
        await until(pilot, lambda: screen.tree_ready)
        failed = {
            v
            for v, s in statuses.items()
            if s in ("apply_failed", "compile_failed", "wrong_result", "crashed")
        }
        shown = visible_variants(app)
        assert any(v in failed for v in shown)
        assert all(v in failed or any(_ancestor(parents, m, v) for m in failed) for v in shown)
        await pilot.press("f", "i")  # all statuses, island 0
        await until(pilot, lambda: screen.tree_ready and screen.island == 0)
        islands = dict(_sql(standard_db, "select id, island from variants where campaign_id=1"))
        on_zero = {v for v, i in islands.items() if i == 0}
        shown = visible_variants(app)
        assert all(v in on_zero or any(_ancestor(parents, m, v) for m in on_zero) for v in shown)


def _ancestor(parents: dict[int, int | None], vid: int, candidate: int) -> bool:
    """Is ``candidate`` ``vid`` itself or one of its ancestors?"""
    current: int | None = vid
    while current is not None:
        if current == candidate:
            return True
        current = parents[current]
    return False


async def test_selection_shows_details_trials_sorted_and_llm_call(standard_db: Path) -> None:
    app = make_app(standard_db)
    async with app.run_test(size=(160, 48)) as pilot:
        await open_campaign(pilot, 1)
        screen = app.screen
        assert isinstance(screen, CampaignScreen)
        llm_variant = _sql(
            standard_db,
            "select id from variants where parent_id=1 and llm_call_id "
            "is not null order by id limit 1",
        )[0][0]
        tree = screen.query_one(VariantTree)
        while tree.cursor_variant is None or tree.cursor_variant.id != llm_variant:
            await pilot.press("down")
        await until(
            pilot, lambda: screen.detail is not None and screen.detail.node.id == llm_variant
        )
        assert screen.detail is not None and "// " in screen.detail.source
        await pilot.press("4")  # trials
        table = screen.query_one(TrialsTable)
        n = _sql(standard_db, "select count(*) from trials where variant_id=?", llm_variant)[0][0]
        await until(pilot, lambda: table.row_count == n)
        table.focus()
        await pilot.press("s")  # sort by time
        fastest = _sql(
            standard_db,
            "select id from trials where variant_id=? and status='ok' order by median_s limit 1",
            llm_variant,
        )[0][0]
        await until(pilot, lambda: str(table.get_row_at(0)[0]) == str(fastest))
        await pilot.press("r")
        await until(pilot, lambda: str(table.get_row_at(table.row_count - 1)[0]) == str(fastest))
        await pilot.press("5")  # the LLM call
        prompt = _sql(
            standard_db,
            "select c.prompt from llm_calls c join variants v on v.llm_call_id=c.id where v.id=?",
            llm_variant,
        )[0][0]
        text = text_of(screen.query_one("#llm-view .llm"))
        user = json.loads(prompt)[-1]["content"]
        assert user.splitlines()[0] in text and "tokens" in text


async def test_export_writes_source_options_launch_and_patch(
    standard_db: Path, tmp_path: Path
) -> None:
    """``e`` writes r3 export's files (tests/ui/test_figures.py compares the two)."""
    app = make_app(standard_db, export_dir=tmp_path / "out")
    async with app.run_test(size=(120, 40)) as pilot:
        await open_campaign(pilot, 1)
        screen = app.screen
        await pilot.press("b")
        best = _sql(
            standard_db,
            "select variant_id from trials where campaign_id=1 "
            "and status='ok' order by median_s limit 1",
        )[0][0]
        await until(pilot, lambda: screen.detail is not None and screen.detail.node.id == best)  # type: ignore[attr-defined]
        await pilot.press("e")
        folder = tmp_path / "out" / f"variant-{best}"
        await until(pilot, lambda: (folder / "stencil7.patch").exists())
        await until(pilot, lambda: all(w.is_finished for w in app.workers))
    source, seed_source = _sql(
        standard_db,
        "select v.source, s.source from variants v, variants s "
        "where v.id=? and s.campaign_id=1 and s.origin='seed'",
        best,
    )[0]
    assert (folder / "stencil7.cu").read_text() == source
    assert (folder / "stencil7.patch").read_text().startswith("--- a/stencil7.cu")
    assert seed_source != source
    config = json.loads(
        _sql(
            standard_db,
            "select config from trials where variant_id=? and status='ok' "
            "order by median_s limit 1",
            best,
        )[0][0]
    )
    assert (folder / "options.txt").read_text().split() == config["options"]
    launch = json.loads((folder / "launch.json").read_text())
    assert launch["block"] == config["block"] and launch["variant_id"] == best


async def test_help_lists_every_binding(standard_db: Path) -> None:
    app = make_app(standard_db)
    async with app.run_test(size=(120, 48)) as pilot:
        await until(pilot, lambda: isinstance(app.screen, CampaignListScreen) and app.screen.rows)
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen))
        text = text_of(app.screen.query_one("#help-body Static"))
        for where, key, what in binding_rows():
            if what:
                assert key in text and what in text, (where, key, what)
        await pilot.press("escape")
        assert isinstance(app.screen, CampaignListScreen)


async def test_theme_toggle(standard_db: Path) -> None:
    app = make_app(standard_db)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(
            pilot,
            lambda: isinstance(app.screen, CampaignListScreen) and app.screen.rows and app.focused,
        )
        await pilot.pause(0.1)
        await pilot.press("t")
        await until(pilot, lambda: app.current_theme.dark is False)
        await pilot.press("t")
        await until(pilot, lambda: app.current_theme.dark is True)


async def test_no_color_keeps_the_meaning_in_glyphs(
    standard_db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    app = make_app(standard_db)
    assert app.no_color
    async with app.run_test(size=(80, 24)) as pilot:
        await open_campaign(pilot, 1)
        tree = app.screen.query_one(VariantTree)
        labels = [str(line.label) for line in tree.root.children[0].children]
        statuses = dict(_sql(standard_db, "select id, status from variants where parent_id=1"))
        glyph = {"improved": "▲", "verified": "●", "pending": "…"}
        for label, (_vid, status) in zip(labels, sorted(statuses.items()), strict=True):
            assert label.startswith(glyph.get(status, "✗")), (label, status)


async def test_tab_moves_the_focus_pane_by_pane(standard_db: Path) -> None:
    """Tab goes tree → tab strip → the shown pane → tree; the pane's own keys then work."""
    app = make_app(standard_db)
    async with app.run_test(size=(120, 40)) as pilot:
        await open_campaign(pilot, 1)
        screen = app.screen
        assert isinstance(screen, CampaignScreen)
        tree = screen.query_one(VariantTree)
        table = screen.query_one(TrialsTable)
        assert app.focused is tree
        await pilot.press("4")  # the Trials tab; the focus stays in the tree
        n = _sql(standard_db, "select count(*) from trials where variant_id=?", screen.selected)
        await until(pilot, lambda: table.row_count == n[0][0])
        await pilot.press("tab")
        assert isinstance(app.focused, ContentTabs)
        await pilot.press("tab")
        assert app.focused is table
        await pilot.press("s")  # documented in the help: the next sort column
        await until(pilot, lambda: screen.trial_sort is TrialSort.TIME)
        assert "time ▲" in str(table.ordered_columns[1].label)
        await pilot.press("tab")
        assert app.focused is tree
        await pilot.press("shift+tab")
        assert app.focused is table
        # another tab while a pane has the focus: the focus follows to the pane shown
        await pilot.press("6")
        panel = screen.query_one(ConvergencePanel)
        await until(pilot, lambda: app.focused is panel)
        await pilot.press("w")
        assert panel.by_wall_time
        tree.focus()
        await pilot.press("tab", "tab")
        assert app.focused is panel
        await pilot.press("w")
        assert not panel.by_wall_time


async def test_no_color_failed_variants_stay_readable(
    standard_db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under NO_COLOR red turns a grey next to the background: failures keep the normal
    foreground and are marked by ✗ and italics instead."""
    monkeypatch.setenv("NO_COLOR", "1")
    app = make_app(standard_db)
    assert app.no_color
    async with app.run_test(size=(120, 40)) as pilot:
        await open_campaign(pilot, 1)
        await pilot.pause()
        failed = drawn_colours(app, "✗ #")
        statuses = dict(_sql(standard_db, "select id, status from variants where parent_id=1"))
        n_failed = sum(VariantStatus(s) in FAILED_STATUSES for s in statuses.values())
        assert n_failed and len(failed) == n_failed
        for fg, bg in failed:  # WCAG's minimum for text; the red turned grey was 1.3
            assert contrast(fg, bg) >= 4.5, (fg, bg)
        tree = app.screen.query_one(VariantTree)
        for line in tree.root.children[0].children:
            assert line.data is not None and line.data.node is not None
            is_failed = line.data.node.status in FAILED_STATUSES
            assert str(line.label).startswith("✗") is is_failed, line.label
            assert bool(Style.parse(str(line.label.style)).italic) is is_failed, line.label


async def test_footers_fit_80_columns(standard_db: Path) -> None:
    app = make_app(standard_db)

    def footer_fits() -> None:
        footer = app.screen.query_one(Footer)
        keys = list(footer.query(FooterKey))
        assert keys and footer.size.width == 80
        assert footer.max_scroll_x == 0, [k.description for k in keys]
        assert max(k.region.right for k in keys) <= 80
        assert {"q", "question_mark"} <= {k.key for k in keys}  # quit and help always

    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: isinstance(app.screen, CampaignListScreen) and app.screen.rows)
        await pilot.pause(0.2)
        footer_fits()
        await open_campaign(pilot, 1)
        footer_fits()
        # the widest: a pane with keys of its own has the focus
        for keys, focused in ((("4", "tab", "tab"), TrialsTable), (("6",), ConvergencePanel)):
            await pilot.press(*keys)
            await until(pilot, lambda f=focused: isinstance(app.focused, f))  # type: ignore[misc]
            await pilot.pause(0.2)
            footer_fits()


async def test_an_empty_filter_says_so_and_which_key_changes_it(tmp_path: Path) -> None:
    # a small campaign whose variants verified or failed, none faster than its parent
    db = build_database(
        tmp_path / "r3.sqlite",
        (CampaignSpec(name="no-luck", n_variants=6, n_trials=40, islands=1, seed=3),),
    )
    statuses = {s for (s,) in _sql(db, "select status from variants")}
    assert "improved" not in statuses and "compile_failed" in statuses
    key = next(
        b.key
        for b in CampaignScreen.BINDINGS
        if isinstance(b, Binding) and b.action == "cycle_filter"
    )
    app = make_app(db)
    async with app.run_test(size=(80, 24)) as pilot:
        await open_campaign(pilot, 1)
        screen = app.screen
        assert isinstance(screen, CampaignScreen)
        empty = screen.query_one("#tree-empty", Static)
        assert not empty.display and visible_variants(app)
        await pilot.press(key)  # improved
        await until(pilot, lambda: screen.tree_ready and empty.display)
        message = f"no improved variants in this campaign; press {key} to change the filter"
        assert text_of(empty).strip() == message
        assert visible_variants(app) == []
        # on screen, wrapped to the tree's column: its words in order, the panes' between
        shown = " ".join(screen_text(app))
        assert re.search(".*?".join(map(re.escape, message.split())), shown), shown
        # the engine writes a first improvement while the filter is on: it shows, with
        # its parent, in place of the message
        writer = open_database(db)
        try:
            vid = add_live_variant(writer, 1, 1, 100)
        finally:
            writer.close()
        await until(pilot, lambda: visible_variants(app) == [1, vid], timeout=5)
        await until(pilot, lambda: not empty.display)
        await pilot.press(key)  # failed: the failures and their ancestors
        await until(pilot, lambda: screen.tree_ready and bool(visible_variants(app)))
        assert not empty.display
