"""Every key binding, gathered from the classes that declare them."""

from __future__ import annotations

from typing import ClassVar

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

# Tree keys that Textual's Tree provides and this UI relies on.
TREE_KEYS = (
    ("up / down", "move in the tree (the details follow the cursor)"),
    ("enter / space", "expand or collapse a variant; on a “… more” line, load the next page"),
    ("shift+left", "go to the parent"),
)
# Keys of Textual's DataTable that the archive grid gives a meaning to.
ELITE_KEYS = (
    ("arrows", "move between the archive's cells"),
    ("enter", "open the cell's elite in the tree"),
)


def _shown_key(key: str) -> str:
    return " / ".join("?" if k == "question_mark" else k for k in key.split(","))


def binding_rows() -> list[tuple[str, str, str]]:
    """(where, key, what) for every binding of the app, its screens and widgets."""
    from r3tui.ui.app import R3App
    from r3tui.ui.screens.campaign import CampaignScreen
    from r3tui.ui.screens.campaign_list import CampaignListScreen
    from r3tui.ui.screens.database_error import DatabaseErrorScreen
    from r3tui.ui.screens.launch import LaunchScreen
    from r3tui.ui.widgets.convergence import ConvergencePanel
    from r3tui.ui.widgets.trials_table import TrialsTable
    from r3tui.ui.widgets.variant_tree import VariantTree

    places: tuple[tuple[str, list[BindingType]], ...] = (
        ("everywhere", R3App.BINDINGS),
        ("campaigns", CampaignListScreen.BINDINGS),
        ("new campaign", LaunchScreen.BINDINGS),
        ("campaign", CampaignScreen.BINDINGS),
        ("tree", VariantTree.BINDINGS),
        ("trials", TrialsTable.BINDINGS),
        ("plot", ConvergencePanel.BINDINGS),
        ("help", HelpScreen.BINDINGS),
        ("database error", DatabaseErrorScreen.BINDINGS),
    )
    rows: list[tuple[str, str, str]] = []
    for where, bindings in places:
        for b in bindings:
            binding = b if isinstance(b, Binding) else Binding(*b)
            key = binding.key_display or binding.key
            rows.append((where, _shown_key(key), binding.description))
        if where == "everywhere":
            # Textual's own key; the footers leave it out to fit 80 columns
            rows.append((where, "ctrl+p", "command palette (themes, keys, screenshot)"))
    rows += [("tree", key, what) for key, what in TREE_KEYS]
    rows += [("elites", key, what) for key, what in ELITE_KEYS]
    rows.append(
        (
            "campaign",
            "1 … 8",
            "show the Variant, Source, Diff, Trials, LLM, Plot, Elites, Events tab",
        )
    )
    return rows


class HelpScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,question_mark,q", "dismiss", "Close help"),
    ]

    def compose(self) -> ComposeResult:
        table = Table(title="R³ keys", expand=True, show_edge=False)
        table.add_column("where", style="dim", no_wrap=True)
        table.add_column("key", style="bold", no_wrap=True)
        table.add_column("does")
        seen: set[tuple[str, str]] = set()
        for where, key, what in binding_rows():
            if (where, key) in seen or not what:
                continue
            seen.add((where, key))
            table.add_row(where, key, what)
        with VerticalScroll(id="help-body"):
            yield Static(table)
            yield Static(Text("escape or ? closes this help", style="dim"))

    async def action_dismiss(self, result: None = None) -> None:
        self.dismiss(result)
