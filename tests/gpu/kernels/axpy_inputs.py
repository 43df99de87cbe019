"""Inputs of tests/gpu/kernels/axpy.cu: 1 M doubles, exact verification."""

from __future__ import annotations

import numpy as np

from r3tui.domain import Dim3
from r3tui.record.spec import Buffer, KernelInputs, Scalar

N = 1 << 20


def make_inputs(rng: np.random.Generator, scale: float = 1.0) -> KernelInputs:
    n = max(1, round(N * scale))
    return KernelInputs(
        args=[
            Buffer("x", rng.uniform(0.5, 1.5, size=n)),
            Buffer("y", rng.uniform(-1.5, -0.5, size=n)),
            Scalar("n", n, "int32"),
            Scalar("a", 0.5, "float64"),
        ],
        block=Dim3(256),
        work=Dim3(n),
    )
