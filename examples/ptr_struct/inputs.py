"""Inputs of ``ptr_struct``: three (x, y) pairs of 1000 doubles reached through a pointer table.

``pairs`` is a PointerTable whose six addresses, in order, form ``struct Pair { const double* x;
double* y; } pairs[3]``.  The pairs are listed in a different order from the trailing parameters
(pair 0 uses the third arrays) so that a replay which confused table entries with parameters
would produce wrong bytes.  Small on purpose: it tests pointer following, not speed.
"""

from __future__ import annotations

import numpy as np

from r3tui.domain import Dim3
from r3tui.record.spec import Buffer, KernelInputs, PointerTable, Scalar

FULL_N = 1000
NPAIRS = 3
A = 0.5  # a power of two: a*x is exact, so FMA contraction cannot change the result

# Table order of the pairs: pair p uses arrays x{PAIR_ORDER[p]}, y{PAIR_ORDER[p]}.
PAIR_ORDER = (2, 0, 1)


def make_inputs(rng: np.random.Generator, scale: float = 1.0) -> KernelInputs:
    n = max(1, round(FULL_N * scale))
    arrays: list[Buffer] = []
    for p in range(NPAIRS):
        arrays.append(Buffer(f"x{p}", rng.uniform(0.5, 1.5, size=n)))
        arrays.append(Buffer(f"y{p}", rng.uniform(-1.5, -0.5, size=n)))
    targets = [name for p in PAIR_ORDER for name in (f"x{p}", f"y{p}")]
    return KernelInputs(
        args=[
            PointerTable("pairs", targets),
            Scalar("npairs", NPAIRS, "int32"),
            Scalar("n", n, "int32"),
            Scalar("a", A, "float64"),
            *arrays,
        ],
        block=Dim3(128, 1),
        work=Dim3(n, NPAIRS),
    )
