"""The campaign screen's panes against the database they show: archive grid, plot, status
line, and the help overlay against every binding the UI declares (Pilot, real SQLite)."""

from __future__ import annotations

import importlib
import inspect
import sqlite3
from datetime import datetime
from pathlib import Path
from typing import Any

from textual.binding import Binding
from textual.dom import DOMNode

import r3tui.ui
from r3tui.remix.backends import ChatMessage, parse_prompt, render_prompt
from r3tui.ui.screens.campaign import CampaignScreen
from r3tui.ui.screens.campaign_list import CampaignListScreen
from r3tui.ui.screens.help import HelpScreen, binding_rows
from r3tui.ui.widgets.convergence import ConvergencePanel
from r3tui.ui.widgets.elite_grid import EliteGrid
from r3tui.ui.widgets.llm_call_view import conversation
from r3tui.ui.widgets.trials_table import TrialsTable
from r3tui.ui.widgets.variant_tree import VariantTree
from tests.ui.conftest import make_app, open_campaign, screen_text, text_of, until


def _sql(db: Path, query: str, *args: object) -> list[tuple[Any, ...]]:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as c:
        return c.execute(query, args).fetchall()


async def test_choosing_an_archive_cell_opens_its_elite(standard_db: Path) -> None:
    app = make_app(standard_db)
    async with app.run_test(size=(160, 48)) as pilot:
        await open_campaign(pilot, 1)
        screen = app.screen
        assert isinstance(screen, CampaignScreen)
        await pilot.press("7")
        grid = screen.query_one(EliteGrid)
        await until(pilot, lambda: grid.row_count > 1)
        elites = {
            vid
            for (vid,) in _sql(
                standard_db, "select variant_id from elite_cells where campaign_id=1"
            )
        }
        # the last occupied cell of the grid: an elite that is not the tree's first lines
        cells = [
            (r, c, str(grid.get_cell_at(_coord(r, c))))
            for r in range(grid.row_count)
            for c in range(1, len(grid.columns))
        ]
        row, column, text = [cell for cell in cells if "#" in cell[2]][-1]
        target = int(text.rsplit("#", 1)[1])
        assert target in elites
        grid.focus()
        grid.move_cursor(row=row, column=column)
        await pilot.press("enter")
        tree = screen.query_one(VariantTree)
        await until(
            pilot, lambda: tree.cursor_variant is not None and tree.cursor_variant.id == target
        )
        await until(pilot, lambda: screen.detail is not None and screen.detail.node.id == target)
        assert app.focused is tree


def _coord(row: int, column: int) -> Any:
    from textual.coordinate import Coordinate

    return Coordinate(row, column)


async def test_plot_by_evaluations_then_wall_time(standard_db: Path) -> None:
    app = make_app(standard_db)
    async with app.run_test(size=(160, 48)) as pilot:
        await open_campaign(pilot, 1)
        screen = app.screen
        assert isinstance(screen, CampaignScreen)
        await pilot.press("6")
        panel = screen.query_one(ConvergencePanel)
        await until(pilot, lambda: panel.series.points and panel.size.width > 0)
        await pilot.pause()
        assert screen.query_one("#convergence-plot").display
        assert not screen.query_one("#convergence-sparkline").display
        shown = "\n".join(screen_text(app))
        assert "evaluations" in shown and "wall time" not in shown
        total = _sql(standard_db, "select count(*) from trials where campaign_id=1")[0][0]
        assert f"of {total} evaluations" in shown
        panel.focus()
        await pilot.press("w")
        await until(pilot, lambda: panel.by_wall_time)
        await pilot.pause()
        shown = "\n".join(screen_text(app))
        assert "wall time (s)" in shown
        # the x axis now ends at the last trial's offset from the campaign's start
        started, last = _sql(
            standard_db,
            "select c.started_at, max(t.created_at) from campaigns c "
            "join trials t on t.campaign_id=c.id where c.id=1",
        )[0]
        span = (datetime.fromisoformat(last) - datetime.fromisoformat(started)).total_seconds()
        assert f"{span:.1f}" in shown or f"{span:.0f}" in shown, span
        await pilot.press("w")
        await until(pilot, lambda: not panel.by_wall_time)


async def test_a_small_terminal_gets_a_sparkline_instead_of_the_plot(standard_db: Path) -> None:
    app = make_app(standard_db)
    async with app.run_test(size=(80, 14)) as pilot:  # the plot pane is < 10 lines high
        await open_campaign(pilot, 1)
        screen = app.screen
        await pilot.press("6")
        panel = screen.query_one(ConvergencePanel)
        await until(pilot, lambda: panel.series.points and panel.size.height > 0)
        await pilot.pause()
        spark = screen.query_one("#convergence-sparkline")
        assert spark.display and not screen.query_one("#convergence-plot").display
        data = list(spark.data or [])  # type: ignore[attr-defined]
        # best-so-far inverted: never falls, and ends at first / best
        assert data and data == sorted(data)
        assert data[-1] == panel.series.points[0].best_s / panel.series.points[-1].best_s


async def test_status_line_shows_rate_time_split_and_gpu(standard_db: Path) -> None:
    app = make_app(standard_db)
    async with app.run_test(size=(160, 48)) as pilot:
        await open_campaign(pilot, 1)
        line = text_of(app.screen.query_one("#status-bar"))
    n, first, last, compile_s, replay_s = _sql(
        standard_db,
        "select count(*), min(created_at), max(created_at), sum(compile_time_s), "
        "sum(replay_wall_s) from trials where campaign_id=1",
    )[0]
    llm_s = _sql(standard_db, "select sum(latency_s) from llm_calls where campaign_id=1")[0][0]
    span = (datetime.fromisoformat(last) - datetime.fromisoformat(first)).total_seconds()
    total = llm_s + compile_s + replay_s
    assert line.startswith(" finished ")
    assert f"{n} evals {(n - 1) / span:.1f}/s" in line
    assert (
        f"LLM {100 * llm_s / total:.0f}% compile {100 * compile_s / total:.0f}% "
        f"replay {100 * replay_s / total:.0f}%"
    ) in line
    assert "NVIDIA H200" in line


def _binding_classes() -> list[type[DOMNode]]:
    """Every app, screen and widget class of r3tui.ui that declares its own bindings."""
    found: list[type[DOMNode]] = []
    root = Path(r3tui.ui.__file__).parent  # screens/ and widgets/ are namespace packages
    for path in sorted(root.rglob("*.py")):
        name = ".".join(("r3tui", "ui", *path.relative_to(root).with_suffix("").parts))
        module = importlib.import_module(name.removesuffix(".__init__"))
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if (
                cls.__module__ == module.__name__
                and issubclass(cls, DOMNode)
                and cls.__dict__.get("BINDINGS")
            ):
                found.append(cls)
    return found


async def test_help_overlay_lists_every_binding_the_ui_declares(standard_db: Path) -> None:
    classes = _binding_classes()
    assert {c.__name__ for c in classes} >= {
        "R3App",
        "CampaignScreen",
        "VariantTree",
        "ConvergencePanel",
        "DatabaseErrorScreen",
    }
    app = make_app(standard_db)
    async with app.run_test(size=(120, 60)) as pilot:
        await until(pilot, lambda: isinstance(app.screen, CampaignListScreen) and app.screen.rows)
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen))
        text = text_of(app.screen.query_one("#help-body Static"))
    rows = binding_rows()
    for cls in classes:
        for b in cls.__dict__["BINDINGS"]:
            binding = b if isinstance(b, Binding) else Binding(*b)
            keys = " / ".join(
                "?" if k == "question_mark" else k
                for k in (binding.key_display or binding.key).split(",")
            )
            assert (keys, binding.description) in {(k, w) for _, k, w in rows}, (
                cls.__name__,
                keys,
                binding.description,
            )
            assert keys in text and binding.description in text, (cls.__name__, keys)
    assert "open the cell's elite in the tree" in text


async def test_a_click_on_a_trials_header_sorts_by_it(standard_db: Path) -> None:
    app = make_app(standard_db)
    async with app.run_test(size=(160, 48)) as pilot:
        await open_campaign(pilot, 1)
        screen = app.screen
        assert isinstance(screen, CampaignScreen)
        await pilot.press("4")
        table = screen.query_one(TrialsTable)
        variant = screen.selected
        n = _sql(standard_db, "select count(*) from trials where variant_id=?", variant)[0][0]
        await until(pilot, lambda: table.row_count == n)
        await pilot.pause()
        columns = list(table.columns.values())
        regs = next(i for i, c in enumerate(columns) if c.key.value == "regs")
        x = sum(c.get_render_width(table) for c in columns[:regs]) + 1
        order = [
            str(tid)
            for (tid,) in _sql(
                standard_db,
                "select id from trials where variant_id=? "
                "order by registers is null, registers, id",
                variant,
            )
        ]
        await pilot.click(TrialsTable, offset=(x, 0))
        await until(pilot, lambda: [str(table.get_row_at(i)[0]) for i in range(n)] == order)
        assert screen.trial_sort.value == "registers" and not screen.trial_descending
        await pilot.click(TrialsTable, offset=(x, 0))  # the same header again: descending
        await until(pilot, lambda: screen.trial_descending)
        descending = [
            str(tid)
            for (tid,) in _sql(
                standard_db,
                "select id from trials where variant_id=? "
                "order by registers is null, registers desc, id",
                variant,
            )
        ]
        assert descending != order
        await until(pilot, lambda: [str(table.get_row_at(i)[0]) for i in range(n)] == descending)


async def test_llm_pane_shows_the_prompt_as_a_conversation(standard_db: Path) -> None:
    vid, prompt, response = _sql(
        standard_db,
        "select v.id, c.prompt, c.response from variants v join llm_calls c "
        "on c.id = v.llm_call_id where v.parent_id = 1 order by v.id limit 1",
    )[0]
    # stored as the engine stores it: its own reader takes it back
    messages = parse_prompt(prompt)
    assert [m.role for m in messages] == ["system", "user"]
    app = make_app(standard_db)
    async with app.run_test(size=(160, 48)) as pilot:
        await open_campaign(pilot, 1)
        screen = app.screen
        assert isinstance(screen, CampaignScreen)
        tree = screen.query_one(VariantTree)
        while tree.cursor_variant is None or tree.cursor_variant.id != vid:
            await pilot.press("down")
        await until(pilot, lambda: screen.detail is not None and screen.detail.node.id == vid)
        await pilot.press("5")
        lines = [line.rstrip() for line in text_of(screen.query_one("#llm-view .llm")).splitlines()]
    assert not any('"role"' in line or line.startswith("[{") for line in lines)  # no raw JSON
    # each message: its role alone on a line, then its text, line for line
    at = 0
    for m in messages:
        at = lines.index(m.role, at) + 1
        content = m.content.rstrip("\n").splitlines()
        assert lines[at : at + len(content)] == [c.rstrip() for c in content], m.role
        at += len(content)
    assert lines.index("system") < lines.index("user")
    assert response.splitlines()[0] in lines[at:]  # the response follows the prompt


def test_a_prompt_that_is_not_a_message_list_is_shown_as_stored() -> None:
    said = [ChatMessage("system", "be brief"), ChatMessage("user", "a[i] = b[i];")]
    assert conversation(render_prompt(said)) == [("system", "be brief"), ("user", "a[i] = b[i];")]
    for stored in ("plain text [with brackets]", "[]", '{"role": "user"}', '[{"role": 1}]'):
        assert conversation(stored) is None
