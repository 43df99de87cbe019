"""The campaign's event log, newest at the bottom, appended to as the engine writes."""

from __future__ import annotations

from datetime import tzinfo

from rich.text import Text
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
        if events and self.auto_scroll:
            # write() scrolls to the end before the horizontal scrollbar a long line brings
            # is laid out, which could leave the newest line under it; scroll again after
            # the refresh so the newest event is always in view.
            self.call_after_refresh(self.scroll_end, animate=False)
