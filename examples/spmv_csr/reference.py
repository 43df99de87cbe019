"""Expected ``y`` of ``spmv_csr``: the row sums of vals * x[cols], added in column order."""

from __future__ import annotations

import numpy as np

from r3tui.record.spec import Buffer, KernelInputs


def reference(inputs: KernelInputs) -> dict[str, np.ndarray]:
    buffers = {a.name: a.data for a in inputs.args if isinstance(a, Buffer)}
    rowptr = buffers["rowptr"].astype(np.int64)
    nrows = rowptr.size - 1
    products = buffers["vals"] * buffers["x"][buffers["cols"]]
    row_of = np.repeat(np.arange(nrows), np.diff(rowptr))
    # bincount adds each bin's weights in array order, i.e. the kernel's k order.
    y = np.bincount(row_of, weights=products, minlength=nrows)
    return {"y": y}
