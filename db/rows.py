"""How domain values become rows and rows become domain values.

The tables name their columns after the fields of the ``r3tui.domain`` values they store, so
one generic mapping serves every table; the query modules (``db.recordings``,
``db.campaigns``, ``db.variants``, ...) add only what differs for their table.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

_D = TypeVar("_D", bound="DataclassInstance")


def require_one(result: Any, what: str, id_: int) -> None:
    """Raise ``KeyError`` unless an UPDATE touched exactly one row: an unknown id is a
    caller bug, not something a user can cause."""
    # Typed as Any: Session.execute's declared result type does not carry rowcount.
    if int(result.rowcount) != 1:
        raise KeyError(f"no {what} with id {id_}")


def from_row(cls: type[_D], row: object) -> _D:
    """Build a domain value from a row whose columns carry the same names as its fields.

    Naming columns after the domain fields is deliberate: the conversion cannot drift, and
    the round-trip tests fail at once if a name ever differs.
    """
    return cls(**{f.name: getattr(row, f.name) for f in dataclasses.fields(cls)})


def column_values(value: DataclassInstance, *, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """A domain value's fields as column values (mappings copied into plain dicts for JSON)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(value):
        if f.name in skip:
            continue
        v = getattr(value, f.name)
        out[f.name] = dict(v) if isinstance(v, Mapping) else v
    return out
