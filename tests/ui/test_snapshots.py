"""SVG snapshots of every screen and every campaign tab at 80×24 and 160×48, plus the
light theme and NO_COLOR (pytest-textual-snapshot).

Time is frozen (an injected clock and time zone; the data's timestamps are fixed), the cursor
does not blink, and each snapshot is taken once every worker has answered.  After a
deliberate change of the look: ``pytest tests/ui/test_snapshots.py --snapshot-update``,
check the SVGs in ``__snapshots__``, commit them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import DataTable

from r3tui.ui.screens.campaign_list import CampaignListScreen
from r3tui.ui.screens.database_error import DatabaseErrorScreen
from r3tui.ui.screens.help import HelpScreen
from r3tui.ui.screens.launch import LaunchScreen
from r3tui.ui.widgets.convergence import ConvergencePanel
from tests.ui.conftest import make_app, open_campaign, until

SIZES = [(80, 24), (160, 48)]


@pytest.fixture
def shown_db(standard_db: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The database by a relative path: the screens show the path, and it must not vary."""
    monkeypatch.chdir(standard_db.parent)
    return Path(standard_db.name)


Step = Callable[[Pilot[Any]], Awaitable[None]]


async def _settle(pilot: Pilot[Any]) -> None:
    """Until no worker runs (a cancelled exclusive one counts as done) and the screen drew."""
    await pilot.pause()
    await until(pilot, lambda: all(w.is_finished for w in pilot.app.workers))
    # the footer recomposes after focus changes; under load it can lag a few frames
    await pilot.pause(0.3)
    await until(pilot, lambda: all(w.is_finished for w in pilot.app.workers))
    # a DataTable sizes its columns to new rows on a later idle: wait for that (a private
    # flag, read-only: Textual has no public "laid out" signal for it)
    tables = pilot.app.screen.query(DataTable)
    await until(pilot, lambda: not any(t._require_update_dimensions for t in tables))
    await pilot.pause()
    # and until two frames 0.2 s apart are the same: under load a table was once captured
    # with its columns still at their headers' widths, although no update was pending
    previous = None
    for _ in range(25):
        frame = pilot.app.export_screenshot()
        if frame == previous:
            break
        previous = frame
        await pilot.pause(0.2)


async def _list(pilot: Pilot[Any]) -> None:
    app = pilot.app
    await until(pilot, lambda: isinstance(app.screen, CampaignListScreen) and app.screen.rows)
    await _settle(pilot)


def _campaign(*keys: str) -> Step:
    async def run(pilot: Pilot[Any]) -> None:
        await open_campaign(pilot, 1)
        await pilot.press(*keys)
        await _settle(pilot)

    return run


def _modal(key: str, screen: type) -> Step:
    async def run(pilot: Pilot[Any]) -> None:
        await _list(pilot)
        await pilot.press(key)
        await until(pilot, lambda: isinstance(pilot.app.screen, screen))
        await _settle(pilot)

    return run


SCREENS: dict[str, Step] = {
    "campaign_list": _list,
    "campaign": _campaign(),
    "help": _modal("question_mark", HelpScreen),
    "launch": _modal("n", LaunchScreen),
}


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("screen", list(SCREENS))
def test_screen(snap_compare: Any, shown_db: Path, screen: str, size: tuple[int, int]) -> None:
    assert snap_compare(make_app(shown_db), terminal_size=size, run_before=SCREENS[screen])


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_database_error_screen(snap_compare: Any, tmp_path: Path, size: tuple[int, int]) -> None:
    async def run(pilot: Pilot[Any]) -> None:
        await until(pilot, lambda: isinstance(pilot.app.screen, DatabaseErrorScreen))
        await _settle(pilot)

    # a fixed path: the message names the file
    app = make_app(Path("/nonexistent/r3.sqlite"))
    assert snap_compare(app, terminal_size=size, run_before=run)


# Every tab of the campaign screen, on a child of the seed (it has a parent to diff against
# and an LLM call), at both sizes: at 80×24 the plot pane is too narrow for a plot and shows
# the sparkline.
TABS = {
    "variant": "1",
    "source": "2",
    "diff": "3",
    "trials": "4",
    "llm": "5",
    "plot": "6",
    "elites": "7",
    "events": "8",
}


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("tab", list(TABS))
def test_campaign_tab(snap_compare: Any, shown_db: Path, tab: str, size: tuple[int, int]) -> None:
    step = _campaign("down", "down", TABS[tab])
    assert snap_compare(make_app(shown_db), terminal_size=size, run_before=step)


def test_plot_by_wall_time(snap_compare: Any, shown_db: Path) -> None:
    async def run(pilot: Pilot[Any]) -> None:
        await _campaign("6")(pilot)
        pilot.app.screen.query_one(ConvergencePanel).focus()
        await pilot.press("w")
        await _settle(pilot)

    assert snap_compare(make_app(shown_db), terminal_size=(160, 48), run_before=run)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_light_theme(snap_compare: Any, shown_db: Path, size: tuple[int, int]) -> None:
    async def run(pilot: Pilot[Any]) -> None:
        await _campaign()(pilot)
        await pilot.press("t")
        await until(pilot, lambda: not pilot.app.current_theme.dark)
        await _settle(pilot)

    assert snap_compare(make_app(shown_db), terminal_size=size, run_before=run)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_no_color(
    snap_compare: Any,
    shown_db: Path,
    monkeypatch: pytest.MonkeyPatch,
    size: tuple[int, int],
) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    app = make_app(shown_db)
    assert app.no_color
    assert snap_compare(app, terminal_size=size, run_before=_campaign())


# NO_COLOR at 80×24, where the footers are tightest: each with a pane that has keys of its
# own focused (they come first in the footer), and the failed filter (failures must stay
# readable in monochrome).
NO_COLOR_SCREENS: dict[str, Step] = {
    "campaign_list": _list,
    "trials_focused": _campaign("down", "down", "4", "tab", "tab"),
    "plot_focused": _campaign("6", "tab", "tab"),
    "failed_filter": _campaign("f", "f"),
    "help": _modal("question_mark", HelpScreen),
}


@pytest.mark.parametrize("screen", list(NO_COLOR_SCREENS))
def test_no_color_80x24(
    snap_compare: Any, shown_db: Path, monkeypatch: pytest.MonkeyPatch, screen: str
) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    app = make_app(shown_db)
    assert app.no_color
    assert snap_compare(app, terminal_size=(80, 24), run_before=NO_COLOR_SCREENS[screen])
