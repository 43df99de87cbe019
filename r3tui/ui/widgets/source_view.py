"""A variant's CUDA source, or its diff against the parent, with syntax highlighting."""

from __future__ import annotations

from rich.syntax import Syntax
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static


class SourceView(VerticalScroll):
    """Scrollable highlighted text; ``language`` is a Pygments lexer ("cuda", "diff")."""

    def __init__(self, language: str, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.language = language
        self._text = ""
        self.can_focus = True

    def compose(self) -> ComposeResult:
        yield Static(Text("choose a variant in the tree", style="dim"), classes="code")

    def show(self, text: str | None, empty: str = "nothing to show") -> None:
        self._text = text or ""
        body = self.query_one(".code", Static)
        if not text:
            body.update(Text(empty, style="dim"))
            return
        theme = "ansi_dark" if self.app.current_theme.dark else "ansi_light"
        body.update(
            Syntax(
                text,
                self.language,
                theme=theme,
                line_numbers=self.language != "diff",
                word_wrap=False,
                background_color="default",
            )
        )
        self.scroll_home(animate=False)

    def on_mount(self) -> None:
        # the highlighting theme follows the app's light/dark theme
        self.app.theme_changed_signal.subscribe(self, lambda _theme: self.show(self._text))
