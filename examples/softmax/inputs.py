"""Inputs of ``softmax``: 8192 rows x 2048 columns of float32 logits (67 MB in, 67 MB out).

Logits are normal with standard deviation 2, so rows have a clear maximum and exponentials
spanning ~1e-12..1 relative to it.  The brief's 8192 x 4096 would make a 400 MB recording
(input, sentinel output, recorded output); 2048 columns keep it at 200 MB while in + out is still
more than twice the H200's 60 MB L2.
"""

from __future__ import annotations

import math

import numpy as np

from r3tui.domain import Dim3, Norm, Tolerance
from r3tui.record.spec import Buffer, KernelInputs, Scalar

FULL_ROWS = 8192
FULL_COLS = 2048
LOGIT_STD = 2.0
SENTINEL = -1.0  # softmax outputs lie in (0, 1]

# Outputs depend on the order of the row sum (2048 float terms) and on how exp and the division
# are evaluated.  Measured on the CPU at full size (worst element of 1024 rows, relative): the
# naive order against the exact result 1.1e-6; fast-math's __expf (ex2.approx of x*log2(e),
# whose rounding grows with |x - max| up to ~17 here) 1.7e-6, i.e. 1.1e-6 from the naive
# result; approximate division adds ~2 ulp.  1e-5 elementwise accepts all of them with ~5x
# margin (1e-12 absolute covers outputs near float32's denormal range, none at this logit
# spread); a wrong max, a missing normalisation or a shifted column is off by far more.
TOLERANCE = Tolerance(rtol=1e-5, atol=1e-12, norm=Norm.LINF)


def shape_for(scale: float) -> tuple[int, int]:
    """(rows, cols) for ``scale`` (a fraction of the full problem's elements)."""
    factor = math.sqrt(scale)
    return max(1, round(FULL_ROWS * factor)), max(1, round(FULL_COLS * factor))


def make_inputs(
    rng: np.random.Generator, scale: float = 1.0, shape: tuple[int, int] | None = None
) -> KernelInputs:
    rows, cols = shape or shape_for(scale)
    logits = rng.standard_normal((rows, cols), dtype=np.float32)
    logits *= np.float32(LOGIT_STD)
    out = np.full((rows, cols), SENTINEL, dtype=np.float32)
    return KernelInputs(
        args=[
            Buffer("x", logits),
            Buffer("y", out, tolerance=TOLERANCE),
            Scalar("rows", rows, "int32"),
            Scalar("cols", cols, "int32"),
        ],
        block=Dim3(128),
        grid=Dim3(rows),  # one block per row, whatever the block shape
    )
