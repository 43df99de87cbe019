"""Expected y arrays of ``ptr_struct``: y += a*x for every pair the table names."""

from __future__ import annotations

import numpy as np

from r3tui.record.spec import Buffer, KernelInputs, PointerTable, Scalar


def reference(inputs: KernelInputs) -> dict[str, np.ndarray]:
    buffers = {a.name: a.data for a in inputs.args if isinstance(a, Buffer)}
    scalars = {a.name: a.value for a in inputs.args if isinstance(a, Scalar)}
    table = next(a for a in inputs.args if isinstance(a, PointerTable))
    a = float(scalars["a"])
    out: dict[str, np.ndarray] = {}
    for x_name, y_name in zip(table.targets[0::2], table.targets[1::2], strict=True):
        out[y_name] = a * buffers[x_name] + buffers[y_name]
    return out
