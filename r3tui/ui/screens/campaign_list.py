"""The campaigns of the database: sort, filter, open one, launch a new one."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, cast

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Input, Static
from textual.worker import Worker, get_current_worker

from db.browse import CampaignListRow, campaign_rows
from r3tui.ui.messages import CampaignsLoaded
from r3tui.ui.widgets.campaign_table import COLUMNS, CampaignTable

if TYPE_CHECKING:
    from r3tui.ui.app import R3App
    from r3tui.ui.launcher import LaunchRequest


class CampaignListScreen(Screen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("enter", "open", "Open", show=True, priority=False),
        Binding("slash", "filter", "Filter", key_display="/"),
        Binding("s", "next_sort", "Sort"),
        Binding("r", "reverse_sort", "Reverse"),
        Binding("n", "new_campaign", "New campaign"),
        Binding("escape", "clear_filter", "Clear filter", show=False),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.sort = "id"
        self.descending = False
        self.rows: list[CampaignListRow] = []
        self._seen_version: int | None = None
        self._polling = False

    @property
    def r3(self) -> R3App:
        return cast("R3App", self.app)

    def compose(self) -> ComposeResult:
        yield Static(id="list-title")
        filter_box = Input(placeholder="filter: words in name, kernel, GPU or status", id="filter")
        filter_box.cursor_blink = self.r3.cursor_blink
        yield filter_box
        yield CampaignTable(id="campaigns")
        yield Static(id="list-empty")
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        target = self.r3.target
        title = Text.assemble(("R³ campaigns", "bold"), f"  {self.r3.db_path}")
        if target is not None and target.notice:
            title.append("  (migrated read-only copy)", style="yellow")
        self.query_one("#list-title", Static).update(title)
        self.query_one(CampaignTable).zone = self.r3.zone
        self.query_one(CampaignTable).focus()
        self.set_interval(self.r3.poll_interval_s, self._tick)
        self.call_after_refresh(self._tick)

    def on_screen_resume(self) -> None:
        # back from a campaign: counts may have moved while this screen did not poll
        self._tick()

    def _tick(self) -> None:
        # only the screen on top polls (a campaign screen above has its own), one at a time
        if self.is_current and not self._polling:
            self._poll()

    @work(thread=True, exclusive=True, exit_on_error=False, group="list-poll")
    def _poll(self, force: bool = False) -> None:
        self._polling = True
        try:
            db = self.r3.database
            version = db.data_version()
            if not force and version == self._seen_version:
                return
            with db.session_scope() as s:
                rows = campaign_rows(s)
            if not get_current_worker().is_cancelled:
                self._seen_version = version
                self.post_message(CampaignsLoaded(rows))
        finally:
            self._polling = False

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        self.r3.worker_changed(event)

    def on_campaigns_loaded(self, message: CampaignsLoaded) -> None:
        if not self.is_attached or not self.query("#campaigns"):
            return  # the screen is being taken down
        self.rows = message.rows
        self._show()

    def _show(self) -> None:
        table = self.query_one(CampaignTable)
        table.owned = set(self.r3.owned)
        text = self.query_one("#filter", Input).value
        table.show(self.rows, sort=self.sort, descending=self.descending, text=text)
        empty = self.query_one("#list-empty", Static)
        if not self.rows:
            empty.update(
                Text("no campaigns in this database yet: press n to start one", style="dim")
            )
        elif not table.rows_shown:
            empty.update(Text(f"no campaign matches {text!r} (escape clears)", style="dim"))
        else:
            empty.update("")

    # ------------------------------------------------------------------- actions

    def action_open(self) -> None:
        cid = self.query_one(CampaignTable).cursor_row_key()
        if cid is not None:
            from r3tui.ui.screens.campaign import CampaignScreen

            self.app.push_screen(CampaignScreen(cid))

    @on(DataTable.RowSelected, "#campaigns")
    def _row_chosen(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.action_open()

    def action_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.add_class("-shown")
        box.focus()

    def action_clear_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.value = ""
        box.remove_class("-shown")
        self.query_one(CampaignTable).focus()
        self._show()

    @on(Input.Changed, "#filter")
    def _filter_changed(self) -> None:
        self._show()

    @on(Input.Submitted, "#filter")
    def _filter_done(self) -> None:
        self.query_one(CampaignTable).focus()

    def action_next_sort(self) -> None:
        self.sort = COLUMNS[(COLUMNS.index(self.sort) + 1) % len(COLUMNS)]
        self.descending = self.sort in ("speedup", "started", "variants")
        self._show()

    def action_reverse_sort(self) -> None:
        self.descending = not self.descending
        self._show()

    def action_new_campaign(self) -> None:
        from r3tui.ui.screens.launch import LaunchScreen

        def launched(request: LaunchRequest | None) -> None:
            if request is not None:
                self.r3.launch(request)

        self.app.push_screen(LaunchScreen(self.r3.db_path), launched)
