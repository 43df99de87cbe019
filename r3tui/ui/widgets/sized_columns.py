"""Fill a DataTable with column widths computed from its cells.

A DataTable sizes auto-width columns on a later idle, so a frame drawn before that (seen
under load) shows every column at its header's width.  Widths given up front make each
frame the same, however busy the machine is.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.cells import cell_len
from rich.text import Text
from textual.widgets import DataTable

Cell = str | Text


def cell_width(cell: Cell) -> int:
    return cell.cell_len if isinstance(cell, Text) else cell_len(cell)


def fill_sized(
    table: DataTable[object],
    columns: Sequence[tuple[str, str]],
    rows: Sequence[tuple[Sequence[Cell], str | None]],
) -> None:
    """Add ``columns`` ((label, key) pairs) sized to fit the label and every cell, then
    ``rows`` ((cells, key) pairs) in order."""
    for i, (label, key) in enumerate(columns):
        width = max([cell_len(label), *(cell_width(cells[i]) for cells, _ in rows)])
        table.add_column(label, key=key, width=width)
    for cells, row_key in rows:
        table.add_row(*cells, key=row_key)
