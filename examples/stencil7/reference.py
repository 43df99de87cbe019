"""Expected ``out`` of ``stencil7``, in the kernel's own order of operations."""

from __future__ import annotations

import numpy as np

from r3tui.record.spec import Buffer, KernelInputs, Scalar


def reference(inputs: KernelInputs) -> dict[str, np.ndarray]:
    buffers = {a.name: a.data for a in inputs.args if isinstance(a, Buffer)}
    scalars = {a.name: a.value for a in inputs.args if isinstance(a, Scalar)}
    src = buffers["in"]
    c0 = float(scalars["c0"])
    c1 = float(scalars["c1"])
    out = src.copy()  # boundary points copy the input
    centre = src[1:-1, 1:-1, 1:-1]
    # Left to right as the kernel writes it: x-1, x+1, y-1, y+1, z-1, z+1.
    neighbours = src[1:-1, 1:-1, :-2] + src[1:-1, 1:-1, 2:]
    neighbours += src[1:-1, :-2, 1:-1]
    neighbours += src[1:-1, 2:, 1:-1]
    neighbours += src[:-2, 1:-1, 1:-1]
    neighbours += src[2:, 1:-1, 1:-1]
    out[1:-1, 1:-1, 1:-1] = c0 * centre + c1 * neighbours
    return {"out": out}
