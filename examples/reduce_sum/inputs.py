"""Inputs of ``reduce_sum``: 2^26 - 77 floats (268 MB, 4.5x the H200's L2) summed into a double.

``n`` is deliberately not a multiple of any block size, so the last block is partial and a
variant that drops the tail (at least 179 elements with 256-thread blocks) is caught.
"""

from __future__ import annotations

import numpy as np

from r3tui.domain import Dim3, Norm, Tolerance
from r3tui.record.spec import Buffer, KernelInputs, Scalar

FULL_N = 2**26 - 77

# The kernel accumulates (*out += sum), as code that sums over several launches does.  Starting
# from a large non-zero value means a variant that stores its block sum instead of adding it,
# or that writes nothing, is off by ~1e7 and cannot pass.
INITIAL_OUT = 1.0e7

# The result depends on summation order: float block partials, then one double atomicAdd per
# block in whatever order blocks finish (so even the recorded kernel varies run to run in the
# last digits).  The legitimate spread is small: float partials of <= 1024 terms in [0.5, 1.5]
# err by ~1e-5 each, 3e-11 of the total (measured at full size); even an extreme variant with
# 1024 threads that each add 65536 floats serially is off by 5e-8.  rtol 1e-6 of the ~7.7e7
# total (an absolute ~77) accepts every such order yet catches a lost or doubled block of 256
# elements (~256, 3.3e-6).
TOLERANCE = Tolerance(rtol=1e-6, norm=Norm.MAX_ABS)


def n_for(scale: float) -> int:
    """Element count for ``scale`` (a fraction of the full problem)."""
    return max(1, round(FULL_N * scale))


def make_inputs(rng: np.random.Generator, scale: float = 1.0) -> KernelInputs:
    n = n_for(scale)
    x = rng.random(n, dtype=np.float32)
    x += np.float32(0.5)  # uniform in [0.5, 1.5)
    out = np.array([INITIAL_OUT], dtype=np.float64)
    return KernelInputs(
        args=[
            Buffer("x", x),
            Buffer("out", out, tolerance=TOLERANCE),
            Scalar("n", n, "int32"),
        ],
        block=Dim3(256),
        work=Dim3(n),
    )
