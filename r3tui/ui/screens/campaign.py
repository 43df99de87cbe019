"""One campaign: the evolutionary tree on the left, the selected variant and the campaign's
plots, archive and log on the right, a status line below.

Every query runs in a worker thread.  Polling is cheap when nothing changed: each tick
compares ``PRAGMA data_version`` and stops there; when it moved, the poll asks only for
rows above the ids already shown (variants, trials, events) and extends the totals and the
convergence series instead of recomputing them.
"""

from __future__ import annotations

import itertools
import time
from typing import TYPE_CHECKING, ClassVar, cast

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import Footer, Static, TabbedContent, TabPane
from textual.widgets.tabbed_content import ContentTabs
from textual.worker import Worker, get_current_worker

from db import browse, series
from db.browse import FAILED_STATUSES, CampaignHeader, VariantFilter
from db.repository import elites, events, get_llm_call
from db.series import CampaignStats, Convergence, TrialSort, VariantDetail
from r3tui.domain import VariantStatus
from r3tui.errors import R3Error
from r3tui.ui.export import export_variant, patch_of
from r3tui.ui.messages import (
    CampaignLive,
    CampaignRefreshed,
    ChildrenLoaded,
    ExportFinished,
    HeaderLoaded,
    PathLoaded,
    TreeChanged,
    TrialsLoaded,
    VariantLoaded,
)
from r3tui.ui.widgets.convergence import ConvergencePanel
from r3tui.ui.widgets.elite_grid import EliteGrid
from r3tui.ui.widgets.event_log import EventLog
from r3tui.ui.widgets.llm_call_view import LLMCallView
from r3tui.ui.widgets.source_view import SourceView
from r3tui.ui.widgets.status_bar import CampaignStatusBar, status_line
from r3tui.ui.widgets.trials_table import TrialsTable
from r3tui.ui.widgets.variant_summary import VariantSummary
from r3tui.ui.widgets.variant_tree import VariantTree

if TYPE_CHECKING:
    from r3tui.ui.app import R3App
    from r3tui.ui.launcher import CampaignProcess

TABS = ("variant", "source", "diff", "trials", "llm", "plot", "elites", "events")
TAB_TITLES = {name: "LLM" if name == "llm" else name.capitalize() for name in TABS}
SELECT_DELAY_S = 0.08
STATUS_FILTERS: tuple[tuple[str, frozenset[VariantStatus] | None], ...] = (
    ("all", None),
    ("improved", frozenset({VariantStatus.IMPROVED})),
    ("failed", FAILED_STATUSES),
)


class CampaignScreen(Screen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "back", "Back"),
        Binding("b", "jump_best", "Best"),
        Binding("f", "cycle_filter", "Filter"),
        Binding("i", "cycle_island", "Island"),
        Binding("e", "export", "Export"),
        # Only for a campaign this TUI started; listed in the help, left out of the footer
        # so that it fits 80 columns.
        Binding("P", "pause_resume", "Pause/resume", key_display="shift+p", show=False),
        Binding("X", "stop", "Stop", key_display="shift+x", show=False),
        # The screen's own action namespace has no focus_next: the app's moves the focus.
        Binding("tab", "app.focus_next", "Next pane", show=False),
        Binding("shift+tab", "app.focus_previous", "Previous pane", show=False),
        *(
            Binding(str(k), f"tab('{name}')", TAB_TITLES[name], show=False)
            for k, name in enumerate(TABS, start=1)
        ),
    ]

    def __init__(self, campaign_id: int) -> None:
        super().__init__()
        self.campaign_id = campaign_id
        self.header: CampaignHeader | None = None
        self.stats = CampaignStats()
        self.series = Convergence()
        self.detail: VariantDetail | None = None
        self.selected: int | None = None
        self.status_filter = 0
        self.island: int | None = None
        self.trial_sort = TrialSort.ID
        self.trial_descending = False
        self.tree_ready = False  # the first page of the tree is in the widget
        self.tree_shown_at: float | None = None  # perf_counter() once drawn (bench/tui_load.py)
        # ids already shown: polls ask for rows above them
        self._after_variant = 0
        self._after_trial = 0
        self._seen_version: int | None = None
        self._polling = False
        self._select_timer: Timer | None = None

    @property
    def r3(self) -> R3App:
        return cast("R3App", self.app)

    @property
    def flt(self) -> VariantFilter:
        return VariantFilter(STATUS_FILTERS[self.status_filter][1], self.island)

    @property
    def filter_text(self) -> str:
        parts = [STATUS_FILTERS[self.status_filter][0]] if self.status_filter else []
        if self.island is not None:
            parts.append(f"island {self.island}")
        return ", ".join(parts) or "all"

    def compose(self) -> ComposeResult:
        yield Static(id="campaign-title")
        with Horizontal(id="campaign-body"):
            with Vertical(id="tree-column"):
                yield Static(id="tree-empty")
                yield VariantTree(id="tree")
            with TabbedContent(id="panes", initial="variant"):
                with TabPane("Variant", id="variant"):
                    yield VariantSummary(id="summary")
                with TabPane("Source", id="source"):
                    yield SourceView("cuda", id="source-view")
                with TabPane("Diff", id="diff"):
                    yield SourceView("diff", id="diff-view")
                with TabPane("Trials", id="trials"):
                    yield TrialsTable(id="trials-table")
                with TabPane("LLM", id="llm"):
                    yield LLMCallView(id="llm-view")
                with TabPane("Plot", id="plot"):
                    yield ConvergencePanel(id="convergence")
                with TabPane("Elites", id="elites"):
                    yield EliteGrid(id="elite-grid")
                with TabPane("Events", id="events"):
                    yield EventLog(id="event-log")
        yield CampaignStatusBar(id="status-bar")
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        self.query_one(EventLog).zone = self.r3.zone
        self.query_one(VariantSummary).show(None, None)
        self.query_one(VariantTree).clear_variants()
        self.query_one(VariantTree).focus()
        self._open(self.flt, self.query_one(VariantTree).generation)
        self.set_interval(self.r3.poll_interval_s, self._tick)

    # ------------------------------------------------------------------- loading

    @work(thread=True, exclusive=True, exit_on_error=False, group="tree")
    def _open(self, flt: VariantFilter, generation: int) -> None:
        """Header, roots and the first root's children: what makes the tree usable."""
        db = self.r3.database
        with db.session_scope() as s:
            header = browse.campaign_header(s, self.campaign_id)
            if header is None:
                raise R3Error(f"no campaign #{self.campaign_id} in {db.path}")
            roots = browse.child_page(s, self.campaign_id, None, flt=flt)
            first = None
            if roots.nodes and roots.nodes[0].n_children:
                first = browse.child_page(s, self.campaign_id, roots.nodes[0].id, flt=flt)
        if get_current_worker().is_cancelled:
            return
        self.post_message(HeaderLoaded(header))
        self.post_message(ChildrenLoaded(roots, generation, 0))
        if first is not None:
            self.post_message(ChildrenLoaded(first, generation, 0))

    @work(thread=True, exit_on_error=False, group="pages")
    def _load_page(
        self, parent_id: int | None, after_id: int, flt: VariantFilter, generation: int
    ) -> None:
        with self.r3.database.session_scope() as s:
            page = browse.child_page(s, self.campaign_id, parent_id, flt=flt, after_id=after_id)
        self.post_message(ChildrenLoaded(page, generation, after_id))

    @work(thread=True, exclusive=True, exit_on_error=False, group="jump")
    def _load_path(self, target_id: int, flt: VariantFilter, generation: int) -> None:
        with self.r3.database.session_scope() as s:
            path = browse.ancestry(s, target_id)
            pages = [browse.child_page(s, self.campaign_id, None, flt=flt, through_id=path[0])]
            for parent, child in itertools.pairwise(path):
                pages.append(
                    browse.child_page(s, self.campaign_id, parent, flt=flt, through_id=child)
                )
        if not get_current_worker().is_cancelled:
            self.post_message(PathLoaded(pages, target_id, generation))

    @work(thread=True, exclusive=True, exit_on_error=False, group="detail")
    def _load_detail(self, variant_id: int) -> None:
        with self.r3.database.session_scope() as s:
            detail = series.variant_detail(s, variant_id)
            call = None
            if detail is not None and detail.llm_call_id is not None:
                call = get_llm_call(s, detail.llm_call_id)
        if detail is not None and not get_current_worker().is_cancelled:
            self.post_message(VariantLoaded(detail, call))

    @work(thread=True, exclusive=True, exit_on_error=False, group="trials")
    def _load_trials(self, variant_id: int, sort: TrialSort, descending: bool) -> None:
        with self.r3.database.session_scope() as s:
            page = series.trial_page(s, variant_id, sort=sort, descending=descending)
        if not get_current_worker().is_cancelled:
            self.post_message(TrialsLoaded(page))

    @property
    def _alive(self) -> bool:
        """False once the screen is being taken down: late answers are dropped."""
        return self.is_attached and bool(self.query("#status-bar"))

    def _tick(self) -> None:
        if self.header is None or not self.is_current or not self._alive:
            return
        if self._process() is not None:
            self._show_title()  # an engine that exits writes nothing: its state is ours to show
        if self._polling:
            return
        self._polling = True
        tree = self.query_one(VariantTree)
        self._poll(
            self.flt,
            tree.generation,
            self._after_variant,
            self._after_trial,
            tree.pending_ids(),
            self.stats,
            self.series,
            self.query_one(EventLog).last_id,
            self._islands(),
        )

    def _islands(self) -> tuple[int, ...]:
        known = set(self.header.islands if self.header else ())
        return tuple(sorted(known | self.query_one(VariantTree).islands_seen))

    @work(thread=True, exclusive=True, exit_on_error=False, group="poll")
    def _poll(
        self,
        flt: VariantFilter,
        generation: int,
        after_variant: int,
        after_trial: int,
        watch: list[int],
        stats: CampaignStats,
        curve: Convergence,
        after_event: int,
        islands: tuple[int, ...],
    ) -> None:
        try:
            db = self.r3.database
            version = db.data_version()
            if version == self._seen_version:
                return
            with db.session_scope() as s:
                header = browse.campaign_header(s, self.campaign_id, islands=islands)
                assert header is not None
                changes = browse.tree_changes(
                    s,
                    self.campaign_id,
                    after_variant_id=after_variant,
                    after_trial_id=after_trial,
                    watch_ids=watch,
                    flt=flt,
                )
                stats = series.campaign_stats(s, self.campaign_id, since=stats)
                curve = series.convergence(s, self.campaign_id, since=curve)
                cells = elites(s, self.campaign_id)
                new_events = (
                    events(s, self.campaign_id, after_id=after_event)
                    if after_event
                    else series.recent_events(s, self.campaign_id)
                )
            if get_current_worker().is_cancelled:
                return
            # only now: a poll that failed half-way is retried on the next tick
            self._seen_version = version
            self.post_message(TreeChanged(changes, generation))
            self.post_message(
                CampaignRefreshed(CampaignLive(header, stats, curve, cells, new_events))
            )
        finally:
            self._polling = False

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        self.r3.worker_changed(event)

    # ------------------------------------------------------------------ answers

    def on_header_loaded(self, message: HeaderLoaded) -> None:
        if not self._alive:
            return
        if self.header is None:
            # the tree shows what the header saw; polls ask for what came after it
            self._after_variant = message.header.last_variant_id
            self._after_trial = message.header.last_trial_id
            self.query_one(VariantTree).original_s = message.header.original_s
            self.header = message.header
        self._show_title()

    def on_campaign_refreshed(self, message: CampaignRefreshed) -> None:
        if not self._alive:
            return
        live = message.live
        self.header = live.header
        self.stats = live.stats
        self.series = live.convergence
        self.query_one(ConvergencePanel).show(live.convergence)
        self.query_one(EliteGrid).show(live.elites, live.header.original_s)
        self.query_one(EventLog).add_events(live.events)
        self._show_title()

    def _show_title(self) -> None:
        h = self.header
        if h is None:
            return
        title = Text.assemble(
            (f"#{h.id} {h.name}", "bold"),
            f"  {h.kernel_name} on {h.gpu or '?'}  {h.n_variants} "
            + ("variant" if h.n_variants == 1 else "variants"),
        )
        self.query_one("#campaign-title", Static).update(title)
        owned = self._owned_state()
        line = status_line(
            h, self.stats, self.r3.clock(), owned=owned, tree_filter=self.filter_text
        )
        self.query_one(CampaignStatusBar).update(line)

    def _owned_state(self) -> str | None:
        process = self._process()
        if process is None:
            return None
        if not process.running:
            return f"engine exited {process.returncode}"
        return "paused by you" if process.paused else f"engine pid {process.pid}"

    def _process(self) -> CampaignProcess | None:
        return self.r3.owned.get(self.campaign_id)

    def on_children_loaded(self, message: ChildrenLoaded) -> None:
        if not self._alive:
            return
        tree = self.query_one(VariantTree)
        if message.generation != tree.generation:
            return
        tree.add_page(message.page)
        if not self.tree_ready:
            self.tree_ready = True
            if message.page.nodes and self.selected is None:
                tree.reveal(message.page.nodes[0].id)
            self.call_after_refresh(self._tree_painted)
        self._show_if_empty()

    def _show_if_empty(self) -> None:
        """One line in place of an empty tree: what is missing and which key changes it."""
        tree = self.query_one(VariantTree)
        empty = self.tree_ready and not tree.root.children
        line = self.query_one("#tree-empty", Static)
        line.set_class(empty, "-shown")
        if empty:
            line.update(Text(self._empty_text(), style="italic"))

    def _empty_text(self) -> str:
        status = f"{STATUS_FILTERS[self.status_filter][0]} " if self.status_filter else ""
        where = "in this campaign" if self.island is None else f"on island {self.island}"
        filtering = (("f", bool(self.status_filter)), ("i", self.island is not None))
        keys = [key for key, active in filtering if active]
        if not keys:
            return "no variants yet: the engine has not written its seed"
        return f"no {status}variants {where}; press {' or '.join(keys)} to change the filter"

    def _tree_painted(self) -> None:
        self.tree_shown_at = time.perf_counter()
        # totals, plot, archive and log only now: on a big campaign their first load is
        # the heaviest query, and it must not hold back the tree
        self._tick()

    def on_path_loaded(self, message: PathLoaded) -> None:
        if not self._alive:
            return
        tree = self.query_one(VariantTree)
        if message.generation == tree.generation:
            tree.add_path(message.pages, message.target_id)

    def on_tree_changed(self, message: TreeChanged) -> None:
        if not self._alive:
            return
        tree = self.query_one(VariantTree)
        changes = message.changes
        self._after_variant = max(self._after_variant, changes.last_variant_id)
        self._after_trial = max(self._after_trial, changes.last_trial_id)
        if message.generation != tree.generation:
            return
        if changes.new_nodes and self.flt.active and self.tree_ready and not tree.root.children:
            # the first match of a filter that had none: its ancestors are not in the tree
            # to hang it under, so load the tree again (and the message goes)
            self._reload_tree()
            return
        tree.apply_changes(changes)
        self._show_if_empty()
        if self.selected is not None and any(
            n.id == self.selected for n in (*changes.changed, *changes.new_nodes)
        ):
            self._select(self.selected, force=True)

    def on_variant_loaded(self, message: VariantLoaded) -> None:
        if not self._alive:
            return
        if message.detail.node.id != self.selected:
            return
        detail = self.detail = message.detail
        original = self.header.original_s if self.header else None
        self.query_one(VariantSummary).show(detail, original)
        self.query_one("#source-view", SourceView).show(detail.source)
        self.query_one("#diff-view", SourceView).show(
            patch_of(detail), empty="the seed has no parent to differ from"
        )
        self.query_one(LLMCallView).show(detail, message.llm_call)
        self.query_one(TrialsTable).trial_sort = self.trial_sort

    def on_trials_loaded(self, message: TrialsLoaded) -> None:
        if not self._alive:
            return
        if message.page.variant_id == self.selected:
            self.query_one(TrialsTable).show(message.page)

    # ------------------------------------------------------------------ events

    @on(VariantTree.ChildrenWanted)
    def _children_wanted(self, event: VariantTree.ChildrenWanted) -> None:
        tree = self.query_one(VariantTree)
        self._load_page(event.parent_id, event.after_id, self.flt, tree.generation)

    @on(VariantTree.VariantChosen)
    def _variant_chosen(self, event: VariantTree.VariantChosen) -> None:
        # Wait until the cursor rests: holding a key down over the tree must not load and
        # draw the details of every line it passes.
        if self._select_timer is not None:
            self._select_timer.stop()
        if self.selected is None:
            self._select(event.variant_id)
            return
        self._select_timer = self.set_timer(SELECT_DELAY_S, lambda: self._select(event.variant_id))

    def _select(self, variant_id: int, *, force: bool = False) -> None:
        if variant_id == self.selected and not force:
            return
        self.selected = variant_id
        self._load_detail(variant_id)
        self._load_trials(variant_id, self.trial_sort, self.trial_descending)

    @on(TrialsTable.SortChanged)
    def _sort_changed(self, event: TrialsTable.SortChanged) -> None:
        self.trial_sort, self.trial_descending = event.sort, event.descending
        if self.selected is not None:
            self._load_trials(self.selected, event.sort, event.descending)

    @on(EliteGrid.EliteChosen)
    def _elite_chosen(self, event: EliteGrid.EliteChosen) -> None:
        self._jump(event.variant_id)
        self.query_one(VariantTree).focus()

    def _jump(self, variant_id: int) -> None:
        tree = self.query_one(VariantTree)
        if not tree.reveal(variant_id):
            self._load_path(variant_id, self.flt, tree.generation)

    # ----------------------------------------------------------------- actions

    def action_back(self) -> None:
        from r3tui.ui.screens.campaign_list import CampaignListScreen

        if any(isinstance(s, CampaignListScreen) for s in self.app.screen_stack):
            self.app.pop_screen()
        else:  # opened directly (--campaign): the list comes into being on the way back
            self.app.switch_screen(CampaignListScreen())

    def action_tab(self, name: str) -> None:
        panes = self.query_one(TabbedContent)
        focused = self.focused
        in_panes = focused is None or (
            not isinstance(focused, ContentTabs) and panes in focused.ancestors
        )
        panes.active = name
        if in_panes:
            # the focused pane is hidden now: the focus follows to the one shown
            self.call_after_refresh(self._focus_pane, name)

    def _focus_pane(self, name: str) -> None:
        pane = self.query_one(f"#{name}", TabPane)
        target = next((w for w in pane.query("*") if w.focusable), None)
        (target or self.query_one(ContentTabs)).focus()

    def action_jump_best(self) -> None:
        self._find_best(self.island)

    @work(thread=True, exclusive=True, exit_on_error=False, group="best")
    def _find_best(self, island: int | None) -> None:
        with self.r3.database.session_scope() as s:
            best = browse.best_variant(s, self.campaign_id, island=island)
        if best is None:
            self.app.call_from_thread(self.notify, "no successful trial yet")
        else:
            self.app.call_from_thread(self._jump, best)

    def _reload_tree(self) -> None:
        tree = self.query_one(VariantTree)
        tree.clear_variants()
        self.tree_ready = False
        self.selected = None
        self._show_if_empty()
        self._open(self.flt, tree.generation)
        self._show_title()

    def action_cycle_filter(self) -> None:
        self.status_filter = (self.status_filter + 1) % len(STATUS_FILTERS)
        self._reload_tree()

    def action_cycle_island(self) -> None:
        islands = list(self.header.islands) if self.header else []
        if not islands:
            return
        if self.island is None:
            self.island = islands[0]
        else:
            i = islands.index(self.island) if self.island in islands else -1
            self.island = islands[i + 1] if i + 1 < len(islands) else None
        self._reload_tree()

    def action_export(self) -> None:
        if self.detail is None or self.detail.node.id != self.selected:
            self.notify("choose a variant first (its details must have loaded)")
            return
        self._export(self.detail)

    @work(thread=True, exclusive=True, exit_on_error=False, group="export")
    def _export(self, detail: VariantDetail) -> None:
        folder = export_variant(
            self.r3.db_path, self.campaign_id, detail.node.id, self.r3.export_dir
        )
        self.post_message(ExportFinished(folder))

    def on_export_finished(self, message: ExportFinished) -> None:
        self.notify(f"exported to {message.folder}", title="export")

    def action_pause_resume(self) -> None:
        process = self._process()
        if process is None:
            self.notify("this campaign was not started by this TUI: it cannot be paused here")
            return
        try:
            if process.paused:
                process.resume()
                self.notify("resume requested: the engine goes on at its next batch")
            else:
                process.pause()
                self.notify("pause requested: the engine pauses at its next batch boundary")
        except R3Error as exc:
            self.notify(exc.one_line(), severity="error")
        self._show_title()

    def action_stop(self) -> None:
        process = self._process()
        if process is None:
            self.notify("this campaign was not started by this TUI: it cannot be stopped here")
            return
        try:
            process.stop()
            self.notify("stop requested: the engine stops at its next batch boundary")
        except R3Error as exc:
            self.notify(exc.one_line(), severity="error")
