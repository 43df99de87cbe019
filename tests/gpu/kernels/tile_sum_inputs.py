"""Inputs of tests/gpu/kernels/tile_sum.cu: 4 M small ints in 256 chunks, exact verification.

Launched with the dynamic shared memory of the source's default tile (256 ints = 1024 bytes),
as ``// r3: shared TILE * 4`` says."""

from __future__ import annotations

import numpy as np

from r3tui.domain import Dim3
from r3tui.record.spec import Buffer, KernelInputs, Scalar

CHUNK = 16384
N = 256 * CHUNK
DEFAULT_TILE = 256


def make_inputs(rng: np.random.Generator, scale: float = 1.0) -> KernelInputs:
    n = N
    chunks = n // CHUNK
    return KernelInputs(
        args=[
            Buffer("x", rng.integers(0, 100, size=n, dtype=np.int32)),
            Buffer("out", np.full(chunks, -1, dtype=np.int32)),
            Scalar("n", n, "int32"),
        ],
        block=Dim3(128),
        grid=Dim3(chunks),
        shared_mem_bytes=DEFAULT_TILE * 4,
        block_tunable=False,
    )
