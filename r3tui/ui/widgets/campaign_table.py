"""The campaigns of a database as a sortable, filterable table."""

from __future__ import annotations

from datetime import tzinfo

from rich.text import Text
from textual.widgets import DataTable

from db.browse import CampaignListRow
from r3tui.ui.quantities import kernel_time, moment
from r3tui.ui.widgets.sized_columns import fill_sized
from r3tui.ui.widgets.status_bar import STATUS_STYLES

# (column title, sort key of a row)
SORTS = {
    "id": lambda r: r.id,
    "name": lambda r: r.name.lower(),
    "kernel": lambda r: r.kernel_name.lower(),
    "gpu": lambda r: (r.gpu or "").lower(),
    "status": lambda r: r.status.value,
    "variants": lambda r: r.n_variants,
    "best": lambda r: r.best_time_s if r.best_time_s is not None else float("inf"),
    "speedup": lambda r: r.best_speedup.value if r.best_speedup else 0.0,
    "started": lambda r: r.started_at,
}
COLUMNS = tuple(SORTS)


def matches(row: CampaignListRow, text: str) -> bool:
    """Every word of the filter appears in the name, kernel, GPU or status."""
    hay = f"{row.id} {row.name} {row.kernel_name} {row.gpu or ''} {row.status.value}".lower()
    return all(word in hay for word in text.lower().split())


class CampaignTable(DataTable[object]):
    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=True)
        self.rows_shown: list[CampaignListRow] = []
        self.zone: tzinfo | None = None
        self.owned: set[int] = set()

    def show(self, rows: list[CampaignListRow], *, sort: str, descending: bool, text: str) -> None:
        keep = self.cursor_row_key()
        shown = sorted((r for r in rows if matches(r, text)), key=SORTS[sort], reverse=descending)
        self.rows_shown = shown
        self.clear(columns=True)
        cells = [
            (
                str(r.id),
                r.name + (" ◆" if r.id in self.owned else ""),
                r.kernel_name,
                (r.gpu or "-").removeprefix("NVIDIA "),
                Text(r.status.value, style=STATUS_STYLES[r.status]),
                str(r.n_variants),
                kernel_time(r.best_time_s),
                r.figures.best_speedup_text,  # "1.10× re-timed": as r3 runs, r3 report
                moment(r.started_at, self.zone),
            )
            for r in shown
        ]
        labels = [
            (title + ((" ▼" if descending else " ▲") if title == sort else ""), title)
            for title in COLUMNS
        ]
        fill_sized(self, labels, [(row, str(r.id)) for r, row in zip(shown, cells, strict=True)])
        if keep is not None:
            for i, r in enumerate(shown):
                if r.id == keep:
                    self.move_cursor(row=i)

    def cursor_row_key(self) -> int | None:
        if not self.rows_shown or self.cursor_row >= len(self.rows_shown):
            return None
        return self.rows_shown[self.cursor_row].id
