"""Expected ``C`` of ``sgemm``, computed in double and rounded once to float32."""

from __future__ import annotations

import numpy as np

from r3tui.record.spec import Buffer, KernelInputs, Scalar


def reference(inputs: KernelInputs) -> dict[str, np.ndarray]:
    buffers = {a.name: a.data for a in inputs.args if isinstance(a, Buffer)}
    scalars = {a.name: a.value for a in inputs.args if isinstance(a, Scalar)}
    a = buffers["A"].astype(np.float64)
    b = buffers["B"].astype(np.float64)
    c = buffers["C"].astype(np.float64)
    alpha = float(np.float32(scalars["alpha"]))
    beta = float(np.float32(scalars["beta"]))
    return {"C": (alpha * (a @ b) + beta * c).astype(np.float32)}
