"""``r3 tui``: the Textual app that shows an experiment database, live.

The app only reads the database, always from worker threads; results come back as messages
(``r3tui.ui.messages``).  It owns the engine processes it launched (``r3tui.ui.launcher``)
and finds each one's campaign by name once the engine has written it.  Worker failures end
in one place, ``on_worker_state_changed``, as a one-line notification.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from datetime import tzinfo
from pathlib import Path
from typing import ClassVar

from textual import on, work
from textual.app import App
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.worker import (
    Worker,
    WorkerCancelled,
    WorkerError,
    WorkerFailed,
    WorkerState,
    get_current_worker,
)

from db.browse import find_campaign
from db.session import Database
from r3tui.errors import R3Error
from r3tui.ui.launcher import CampaignProcess, LaunchRequest
from r3tui.ui.messages import DatabaseFailed, DatabaseOpened
from r3tui.ui.opening import BrowseTarget, open_for_browsing
from r3tui.ui.quantities import Clock, system_clock
from r3tui.ui.screens.campaign import CampaignScreen
from r3tui.ui.screens.campaign_list import CampaignListScreen
from r3tui.ui.screens.database_error import DatabaseErrorScreen
from r3tui.ui.screens.help import HelpScreen

THEMES = ("textual-dark", "textual-light")
# How long quitting waits for database queries still running in worker threads.
WORKERS_DRAIN_S = 3.0


class OwnedCampaignFound(Message):
    def __init__(self, name: str, campaign_id: int) -> None:
        super().__init__()
        self.name = name
        self.campaign_id = campaign_id


def one_line(error: BaseException) -> str:
    if isinstance(error, R3Error):
        return error.one_line()
    return " ".join(f"{type(error).__name__}: {error}".split())


class R3App(App[int]):
    """Campaign list → campaign screen, over one database opened read-only."""

    CSS_PATH = "app.tcss"
    TITLE = "R³"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit", "Quit"),
        Binding("question_mark", "help", "Help", key_display="?"),
        # shown in the help only: the footer must fit 80 columns
        Binding("t", "toggle_theme", "Light/dark", show=False),
    ]

    def __init__(
        self,
        db_path: Path,
        *,
        campaign_id: int | None = None,
        launch: LaunchRequest | None = None,
        clock: Clock = system_clock,
        zone: tzinfo | None = None,
        poll_interval_s: float = 0.25,
        cursor_blink: bool = True,
        export_dir: Path = Path("r3-export"),
        engine_argv: Sequence[str] | None = None,
    ) -> None:
        super().__init__()
        self.db_path = db_path
        self.initial_campaign = campaign_id
        self.initial_launch = launch
        self.clock = clock
        self.zone = zone  # None: the system's time zone
        self.poll_interval_s = poll_interval_s
        self.cursor_blink = cursor_blink
        self.export_dir = export_dir
        self.engine_argv = engine_argv  # replaces `r3 tune ...` (tests run a fake engine)
        self.target: BrowseTarget | None = None
        self.failure: str | None = None  # why the database could not be shown
        self.processes: dict[str, CampaignProcess] = {}  # by campaign name
        self.owned: dict[int, CampaignProcess] = {}  # by campaign id, once found
        self._reported: set[str] = set()
        self._open_on_find: set[str] = set()
        self.theme = THEMES[0]

    @property
    def database(self) -> Database:
        assert self.target is not None, "the database is opened before any screen asks"
        return self.target.database

    # --------------------------------------------------------------------- opening

    def on_mount(self) -> None:
        self._open()
        self.set_interval(0.5, self._watch_processes)

    @work(thread=True, exclusive=True, exit_on_error=False, group="open")
    def _open(self) -> None:
        try:
            target = open_for_browsing(self.db_path)
        except R3Error as exc:
            self.post_message(DatabaseFailed(exc.one_line()))
            return
        self.post_message(DatabaseOpened(target))

    def on_database_opened(self, message: DatabaseOpened) -> None:
        self.target = message.target
        if self.initial_campaign is not None:
            # straight to the campaign: composing the list below it would delay the tree
            self.push_screen(CampaignScreen(self.initial_campaign))
        else:
            self.push_screen(CampaignListScreen())
        if message.target.notice:
            self.notify(message.target.notice, title="read-only copy", timeout=15)
        if self.initial_launch is not None:
            self.launch(self.initial_launch, open_when_found=True)

    def on_database_failed(self, message: DatabaseFailed) -> None:
        self.failure = message.text
        self.push_screen(DatabaseErrorScreen(message.text))

    # --------------------------------------------------------------- owned engines

    def launch(self, request: LaunchRequest, *, open_when_found: bool = True) -> CampaignProcess:
        """Start ``r3 tune`` for ``request``; its campaign opens once the engine wrote it."""
        try:
            process = CampaignProcess.start(request, argv=self.engine_argv)
        except R3Error as exc:
            self.notify(exc.one_line(), severity="error", timeout=20)
            raise
        self.processes[process.name] = process
        if open_when_found:
            self._open_on_find.add(process.name)
        self.notify(f"started the engine for campaign {process.name} (pid {process.pid})")
        return process

    def _watch_processes(self) -> None:
        if self.target is None:
            return
        unknown = [p.name for p in self.processes.values() if p not in self.owned.values()]
        if unknown:
            self._find_owned(unknown)
        for process in self.processes.values():
            failure = process.failure()
            if failure and process.name not in self._reported:
                self._reported.add(process.name)
                self.notify(failure, severity="error", timeout=30)

    @work(thread=True, exclusive=True, exit_on_error=False, group="owned")
    def _find_owned(self, names: list[str]) -> None:
        with self.database.session_scope() as s:
            found = [(n, find_campaign(s, n)) for n in names]
        for name, cid in found:
            if cid is not None and not get_current_worker().is_cancelled:
                self.post_message(OwnedCampaignFound(name, cid))

    @on(OwnedCampaignFound)
    def _owned_found(self, message: OwnedCampaignFound) -> None:
        process = self.processes.get(message.name)
        if process is None or message.campaign_id in self.owned:
            return
        self.owned[message.campaign_id] = process
        if message.name in self._open_on_find:
            self._open_on_find.discard(message.name)
            self.push_screen(CampaignScreen(message.campaign_id))

    def shutdown_engines(self) -> None:
        """Ask every engine we started to stop at its next batch boundary."""
        for process in self.processes.values():
            if process.running:
                process.stop()

    # -------------------------------------------------------------------- actions

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def action_toggle_theme(self) -> None:
        self.theme = THEMES[1] if self.theme == THEMES[0] else THEMES[0]

    async def action_quit(self) -> None:
        self.shutdown_engines()
        self.exit(return_code=2 if self.failure else 0)

    async def on_unmount(self) -> None:
        self.shutdown_engines()
        # A query still running in a thread worker would reopen the database after close and
        # leave -wal/-shm files in a migrated copy's folder while it is being removed; the
        # queries are short (busy timeout included), so wait for them, within a bound.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._drain_workers(), WORKERS_DRAIN_S)
        if self.target is not None:
            self.target.close()

    async def _drain_workers(self) -> None:
        """Wait for every worker to end, however it ends (its failure was already shown)."""
        for worker in list(self.workers):
            with contextlib.suppress(WorkerCancelled, WorkerFailed, WorkerError):
                await worker.wait()

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        self.worker_changed(event)

    def worker_changed(self, event: Worker.StateChanged) -> None:
        """Every worker's failure ends here (screens forward theirs: the message does not
        bubble): one line, and the app goes on."""
        if event.state is WorkerState.ERROR and event.worker.error is not None:
            self.notify(one_line(event.worker.error), severity="error", timeout=10)
