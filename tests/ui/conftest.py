from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot

from r3tui.ui.app import R3App
from tests.ui.factories import STANDARD_CAMPAIGNS, build_database

# Frozen time: rendered text never depends on the wall clock.
NOW = datetime(2026, 12, 2, 15, 0, 0, tzinfo=UTC)


def frozen_clock() -> datetime:
    return NOW


@pytest.fixture(scope="session")
def standard_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three campaigns (finished, running, crashed); tests only read it."""
    return build_database(tmp_path_factory.mktemp("std") / "r3.sqlite", STANDARD_CAMPAIGNS)


def make_app(db: Path, **options: object) -> R3App:
    defaults: dict[str, object] = {
        "clock": frozen_clock,
        "zone": UTC,
        "cursor_blink": False,
        "poll_interval_s": 0.1,
    }
    defaults.update(options)
    return R3App(db, **defaults)  # type: ignore[arg-type]


async def until(pilot: Pilot[Any], condition: Callable[[], object], timeout: float = 30.0) -> float:
    """Wait (letting the app run) until ``condition`` holds; returns the seconds it took.

    30 s by default: a loaded CI machine must not turn a slow idle into a failure; tests
    that assert a latency pass their own ``timeout``."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    while not condition():
        if loop.time() - start > timeout:
            raise AssertionError(f"condition not met within {timeout} s")
        await pilot.pause(0.02)
    return loop.time() - start


def visible_variants(app: R3App) -> list[int]:
    """Ids of the variant lines a user can see in the tree (every ancestor expanded)."""
    from r3tui.ui.widgets.variant_tree import VariantTree

    tree = app.screen.query_one(VariantTree)
    out: list[int] = []

    def walk(node: object) -> None:
        for child in node.children:  # type: ignore[attr-defined]
            if child.data is not None and child.data.node is not None:
                out.append(child.data.node.id)
                if child.is_expanded:
                    walk(child)

    walk(tree.root)
    return out


async def open_campaign(pilot: Pilot[Any], campaign_id: int) -> None:
    """From the list, open a campaign and wait for its tree and totals."""
    from r3tui.ui.screens.campaign import CampaignScreen
    from r3tui.ui.screens.campaign_list import CampaignListScreen

    app = pilot.app
    await until(pilot, lambda: isinstance(app.screen, CampaignListScreen) and app.screen.rows)
    table = app.screen.query_one("#campaigns")
    row = next(i for i, r in enumerate(table.rows_shown) if r.id == campaign_id)  # type: ignore[attr-defined]
    table.move_cursor(row=row)  # type: ignore[attr-defined]
    await pilot.press("enter")
    await until(pilot, lambda: isinstance(app.screen, CampaignScreen) and app.screen.tree_ready)
    screen = app.screen
    await until(pilot, lambda: screen.stats.n_trials > 0 and screen.detail is not None)  # type: ignore[attr-defined]
    # every worker finished; unlike workers.wait_for_complete(), a worker cancelled meanwhile
    # (the list's poll, once its screen is left) counts as done instead of raising
    await until(pilot, lambda: all(w.is_finished for w in app.workers))
    await pilot.pause()


def text_of(widget: object, width: int = 200) -> str:
    """The plain text a Static shows (its Rich renderable printed without styles)."""
    from rich.console import Console

    console = Console(width=width, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(widget.content)  # type: ignore[attr-defined]
    return console.export_text()


def screen_text(app: Any) -> list[str]:
    """The lines the terminal shows now, without styles (read from the app's SVG export:
    each run of text is one <text> element with its x and y)."""
    import html
    import re

    rows: dict[float, list[tuple[float, str]]] = {}
    for m in re.finditer(
        r'<text class="[^"]*" x="([\d.]+)" y="([\d.]+)"[^>]*>(.*?)</text>', app.export_screenshot()
    ):
        text = html.unescape(m.group(3)).replace("\xa0", " ")
        rows.setdefault(float(m.group(2)), []).append((float(m.group(1)), text))
    return ["".join(t for _, t in sorted(spans)) for _, spans in sorted(rows.items())]


def drawn_colours(app: Any, starting: str) -> list[tuple[str, str]]:
    """(foreground, background) as ``#rrggbb`` of every run of text on screen that starts
    with ``starting``, as the terminal gets them (the SVG export, after Textual's filters:
    NO_COLOR's monochrome included)."""
    import html
    import re

    svg = app.export_screenshot()
    fills = dict(re.findall(r"\.(terminal-[\w-]*?r\d+) \{ fill: (#[0-9a-f]{6})", svg))
    backgrounds = [
        (float(x), float(y), float(w), float(h), fill)
        for fill, x, y, w, h in re.findall(
            r'<rect fill="(#[0-9a-f]{6})" x="([\d.]+)" y="([\d.]+)" '
            r'width="([\d.]+)" height="([\d.]+)" shape-rendering',
            svg,
        )
    ]
    out: list[tuple[str, str]] = []
    for m in re.finditer(
        r'<text class="(terminal-[\w-]*?r\d+)" x="([\d.]+)" y="([\d.]+)"[^>]*>(.*?)</text>', svg
    ):
        text = html.unescape(m.group(4)).replace("\xa0", " ")
        if not text.startswith(starting):
            continue
        x, y = float(m.group(2)), float(m.group(3))
        # a text's y is its baseline, inside the cell's rectangle
        bg = next(f for bx, by, bw, bh, f in backgrounds if bx <= x < bx + bw and by <= y < by + bh)
        out.append((fills[m.group(1)], bg))
    return out


def contrast(a: str, b: str) -> float:
    """WCAG contrast ratio of two ``#rrggbb`` colours (1: the same, 21: black on white)."""

    def luminance(colour: str) -> float:
        channels = [int(colour[i : i + 2], 16) / 255 for i in (1, 3, 5)]
        r, g, b = (c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in channels)
        return 0.2126 * r + 0.7152 * g + 0.0722 * b

    hi, lo = sorted((luminance(a), luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)
