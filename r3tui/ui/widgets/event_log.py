"""The campaign's event log, newest at the bottom, appended to as the engine writes."""

from __future__ import annotations

from datetime import tzinfo

from rich.text import Text
from textual.events import Resize
from textual.widgets import RichLog

from db.repository import EventRecord
from r3tui.ui.quantities import clock_time

KIND_STYLES = {
    "start": "bold",
    "resume": "bold",
    "finish": "bold green",
    "stop": "bold yellow",
    "pause": "yellow",
    "crash": "bold red",
    "migration": "cyan",
    "generation": "blue",
}


class EventLog(RichLog):
    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, max_lines=2000, wrap=False, markup=False, highlight=False)
        self.last_id = 0
        self.zone: tzinfo | None = None

    def add_events(self, events: list[EventRecord]) -> None:
        for e in events:
            if e.id <= self.last_id:
                continue
            self.last_id = e.id
            line = Text(f"{clock_time(e.created_at, self.zone)} ", style="dim")
            line.append(f"{e.kind:<10} ", style=KIND_STYLES.get(e.kind, ""))
            line.append(e.message)
            self.write(line)
        if events:
            self._keep_at_end()

    def on_resize(self, event: Resize) -> None:
        # Lines written while the log was hidden (another tab) are written now, when its size
        # is first known, and scrolled to before their layout is done.
        super().on_resize(event)
        self._keep_at_end()

    def watch_show_horizontal_scrollbar(self, shown: bool) -> None:
        if shown:  # the bar a long line brings takes the last row of the view
            self._keep_at_end()

    def _keep_at_end(self) -> None:
        """Scroll to the newest line once the pending layout is done, unless the reader has
        scrolled up (then the view stays where they put it)."""
        if self.auto_scroll and self.max_scroll_y - self.scroll_y <= 2:
            self.call_after_refresh(self.scroll_end, animate=False)
