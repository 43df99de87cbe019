"""Shown instead of the campaigns when the database cannot be opened: the reason, in one line."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Center, Middle
from textual.screen import Screen
from textual.widgets import Footer, Static


class DatabaseErrorScreen(Screen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("q,escape", "app.quit", "Quit")]

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def compose(self) -> ComposeResult:
        with Middle(), Center():
            yield Static(
                Text.assemble(("cannot show this database\n\n", "bold red"), self.text),
                id="error-text",
            )
        yield Footer(compact=True, show_command_palette=False)
