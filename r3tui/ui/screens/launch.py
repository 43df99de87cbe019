"""Start a campaign from the TUI: bundle, budget, name and extra ``r3 tune`` arguments."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, cast

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label, Static

from r3tui.ui.launcher import LaunchRequest

if TYPE_CHECKING:
    from r3tui.ui.app import R3App


class LaunchScreen(ModalScreen[LaunchRequest | None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Cancel"),
        Binding("ctrl+s", "start", "Start"),
    ]

    def __init__(self, db_path: Path) -> None:
        super().__init__()
        self.db_path = db_path

    def compose(self) -> ComposeResult:
        blink = cast("R3App", self.app).cursor_blink
        with Vertical(id="launch-form"):
            yield Static(Text("new campaign (runs `r3 tune` in the background)", style="bold"))
            for label, ident, placeholder, value in (
                ("recording bundle", "bundle", "path/to/kernel.r3b", ""),
                ("budget", "budget", "trials (60) or time (10m)", "60"),
                ("name", "name", "default: <bundle>-tui-<time>", ""),
                ("more r3 tune arguments", "extra", "e.g. --inner-only --seed 3", ""),
            ):
                yield Label(label)
                box = Input(value=value, placeholder=placeholder, id=ident)
                box.cursor_blink = blink
                yield box
            yield Static(id="launch-error")
            yield Static(
                Text("enter on the last field or ctrl+s starts; escape cancels", style="dim")
            )

    def on_mount(self) -> None:
        self.query_one("#bundle", Input).focus()

    def _value(self, ident: str) -> str:
        return self.query_one(f"#{ident}", Input).value.strip()

    def action_cancel(self) -> None:
        self.dismiss(None)

    @on(Input.Submitted)
    def _submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "extra":
            self.action_start()
        else:
            self.focus_next()

    def action_start(self) -> None:
        error = self.query_one("#launch-error", Static)
        bundle = Path(self._value("bundle")).expanduser()
        if not self._value("bundle") or not bundle.exists():
            error.update(Text(f"no recording bundle at {bundle}", style="red"))
            return
        try:
            extra = tuple(shlex.split(self._value("extra")))
        except ValueError as exc:
            error.update(Text(f"cannot read the extra arguments: {exc}", style="red"))
            return
        request = LaunchRequest(
            bundle=bundle,
            db=self.db_path,
            budget=self._value("budget") or "60",
            name=self._value("name"),
            extra_args=extra,
        )
        self.dismiss(request)
