"""The MAP-Elites archive as a grid: one table per island, a cell per occupied niche.

Cell keys look like ``regs=1|smem=0|family=tiling``: the last dimension (the transformation
family) makes the rows, the others the columns.  A cell shows the elite's speedup over the
original, shaded from the slowest to the fastest elite (the number is there for NO_COLOR);
choosing a cell opens its elite in the tree.
"""

from __future__ import annotations

from rich.text import Text
from textual.message import Message
from textual.widgets import DataTable

from r3tui.domain import EliteCell
from r3tui.ui.quantities import ratio
from r3tui.ui.widgets.sized_columns import fill_sized

SHADES = ("red", "yellow", "green", "bold green")


def split_key(key: str) -> tuple[str, str]:
    """(column, row) labels of a cell key."""
    parts = key.split("|")
    if len(parts) == 1:
        return "-", parts[0]
    return " ".join(parts[:-1]), parts[-1].partition("=")[2] or parts[-1]


class EliteGrid(DataTable[object]):
    class EliteChosen(Message):
        def __init__(self, variant_id: int) -> None:
            super().__init__()
            self.variant_id = variant_id

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="cell")
        self._cells: dict[tuple[int, int], int] = {}
        self._shown: tuple[tuple[int, str, int, float], ...] = ()

    def show(self, cells: list[EliteCell], original_s: float | None) -> None:
        key = tuple((c.island, c.cell_key, c.variant_id, c.fitness_s) for c in cells)
        if key == self._shown:
            return  # unchanged: keep the cursor where the user left it
        self._shown = key
        cursor = self.cursor_coordinate
        self.clear(columns=True)
        self._cells.clear()
        if not cells:
            empty = Text("no elites yet (the outer loop fills the archive)", style="dim")
            fill_sized(self, [("archive", "archive")], [([empty], None)])
            return
        columns = sorted({split_key(c.cell_key)[0] for c in cells})
        table: list[tuple[list[Text | str], str | None]] = []
        fitness = sorted(c.fitness_s for c in cells)
        lo, hi = fitness[0], fitness[-1]
        rows: dict[tuple[int, str], dict[str, EliteCell]] = {}
        for c in cells:
            col, row = split_key(c.cell_key)
            rows.setdefault((c.island, row), {})[col] = c
        for r, ((island, family), by_col) in enumerate(sorted(rows.items())):
            values: list[Text | str] = [f"{island} {family}"]
            for k, col in enumerate(columns, start=1):
                cell = by_col.get(col)
                if cell is None:
                    values.append("")
                    continue
                # fastest elite gets the last shade
                share = 0.0 if hi == lo else (hi - cell.fitness_s) / (hi - lo)
                shade = SHADES[min(len(SHADES) - 1, int(share * len(SHADES)))]
                gain = ratio(original_s, cell.fitness_s)
                text = f"{gain:.2f}× #{cell.variant_id}" if gain else f"#{cell.variant_id}"
                values.append(Text(text, style=shade))
                self._cells[(r, k)] = cell.variant_id
            table.append((values, None))
        fill_sized(self, [("island / family", "row"), *((c, c) for c in columns)], table)
        if cursor.row < self.row_count and cursor.column < len(self.columns):
            self.move_cursor(row=cursor.row, column=cursor.column)

    def on_data_table_cell_selected(self, event: DataTable.CellSelected) -> None:
        event.stop()
        variant = self._cells.get((event.coordinate.row, event.coordinate.column))
        if variant is not None:
            self.post_message(self.EliteChosen(variant))
