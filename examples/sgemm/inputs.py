"""Inputs of ``sgemm``: C = 1.5*A*B - 0.5*C with 2048x2048 float32 matrices.

A, B and C are standard normal (weights and activations of a layer look like that); one launch
is 17.2 GFLOP on 67 MB of compulsory traffic (A, B read, C read and written).
"""

from __future__ import annotations

import numpy as np

from r3tui.domain import Dim3, Norm, Tolerance
from r3tui.record.spec import Buffer, KernelInputs, Scalar

FULL_DIM = 2048
ALPHA = 1.5
BETA = -0.5

# Every element is a float32 dot product of K = 2048 terms; tiling, register blocking or a
# split-K variant adds them in another order.  Entries of C have magnitude ~sqrt(K) = 45 with
# random signs, so elementwise relative bounds are meaningless near zero crossings; the bound is
# relative to the largest |C| (~400) instead.  Measured at full size (CPU emulation): the naive
# sequential FMA order is off the exact result by up to 1.5e-6 of max|C|, a blocked BLAS order
# by 3.4e-7, the two differ by 1.6e-6; 2e-5 leaves > 6x headroom over any pair of orders while
# one dropped k term is off by ~1.3e-3 (median element).  It rejects TF32 tensor-core variants
# (6.5e-4), which change the arithmetic, not just the order.
TOLERANCE = Tolerance(rtol=2e-5, norm=Norm.MAX_ABS)


def dims_for(scale: float) -> tuple[int, int, int]:
    """(M, N, K) for ``scale`` (a fraction of the full problem's multiply-adds)."""
    factor: float = scale ** (1.0 / 3.0)
    edge = max(1, round(FULL_DIM * factor))
    return edge, edge, edge


def make_inputs(
    rng: np.random.Generator, scale: float = 1.0, dims: tuple[int, int, int] | None = None
) -> KernelInputs:
    m, n, k = dims or dims_for(scale)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    c = rng.standard_normal((m, n), dtype=np.float32)
    return KernelInputs(
        args=[
            Scalar("M", m, "int32"),
            Scalar("N", n, "int32"),
            Scalar("K", k, "int32"),
            Scalar("alpha", ALPHA, "float32"),
            Buffer("A", a),
            Buffer("B", b),
            Scalar("beta", BETA, "float32"),
            Buffer("C", c, tolerance=TOLERANCE),  # read and written: its input is C itself
        ],
        block=Dim3(16, 16),
        work=Dim3(n, m),  # x runs over columns of C, y over rows
    )
