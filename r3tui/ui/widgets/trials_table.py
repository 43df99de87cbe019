"""A variant's Bayesian-optimization trials, sorted by the database.

``s`` cycles the sort column and ``r`` reverses it (or choose a column header); the table
asks its screen for a sorted page instead of sorting rows itself, so a variant with many
trials costs one page.
"""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.widgets import DataTable

from db.series import TrialPage, TrialSort
from r3tui.domain import MeasurementStatus
from r3tui.ui.quantities import kernel_time
from r3tui.ui.widgets.sized_columns import fill_sized
from r3tui.ui.widgets.variant_tree import failure_style

COLUMNS: tuple[tuple[str, TrialSort | None], ...] = (
    ("trial", TrialSort.ID),
    ("time", TrialSort.TIME),
    ("status", TrialSort.STATUS),
    ("verified", TrialSort.VERIFIED),
    ("regs", TrialSort.REGISTERS),
    ("block", None),
    ("bounds", None),
    ("options", TrialSort.CONFIG),
)
SORT_ORDER = [s for _, s in COLUMNS if s is not None]


class TrialsTable(DataTable[object]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("s", "next_sort", "Sort"),
        Binding("r", "reverse_sort", "Reverse"),
    ]

    class SortChanged(Message):
        def __init__(self, sort: TrialSort, descending: bool) -> None:
            super().__init__()
            self.sort = sort
            self.descending = descending

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=True)
        self.trial_sort = TrialSort.ID
        self.descending = False
        self.total = 0

    def on_mount(self) -> None:
        self.show(None)

    def _labels(self) -> list[tuple[str, str]]:
        out = []
        for title, sort in COLUMNS:
            mark = (" ▼" if self.descending else " ▲") if sort is self.trial_sort else ""
            out.append((title + mark, title))
        return out

    def show(self, page: TrialPage | None) -> None:
        self.trial_sort = page.sort if page else self.trial_sort
        self.descending = page.descending if page else self.descending
        self.clear(columns=True)
        self.total = page.total if page else self.total
        rows: list[tuple[list[str | Text], str | None]] = []
        for trial in page.rows if page else ():
            m, c = trial.measurement, trial.config
            ok = m.status is MeasurementStatus.OK
            block = "rec" if c.block is None else "×".join(map(str, c.block.as_tuple()))
            bounds = (
                "-" if c.launch_bounds is None else f"{c.launch_bounds[0]},{c.launch_bounds[1]}"
            )
            verified = {True: "yes", False: "NO", None: "-"}[m.verified]
            cells: list[str | Text] = [
                str(trial.id),
                kernel_time(m.time.median_s if m.time else None),
                Text(m.status.value, style="" if ok else failure_style(self.app.no_color)),
                verified,
                str(m.resources.registers or "-"),
                block,
                bounds,
                " ".join(c.options) or "-",
            ]
            rows.append((cells, str(trial.id)))
        fill_sized(self, self._labels(), rows)

    def action_next_sort(self) -> None:
        i = SORT_ORDER.index(self.trial_sort)
        self.post_message(self.SortChanged(SORT_ORDER[(i + 1) % len(SORT_ORDER)], False))

    def action_reverse_sort(self) -> None:
        self.post_message(self.SortChanged(self.trial_sort, not self.descending))

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        event.stop()
        sort = dict(COLUMNS).get(str(event.column_key.value))
        if sort is None:
            return
        descending = not self.descending if sort is self.trial_sort else False
        self.post_message(self.SortChanged(sort, descending))
