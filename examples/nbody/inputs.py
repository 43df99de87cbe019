"""Inputs of ``nbody``: 32768 bodies of a Gaussian cluster (total mass ~1) with softening 0.05.

Positions are standard normal in 3-D, masses uniform in [0.5, 1.5] / n.  The working set is
only 512 KB, so the kernel is bound by arithmetic (1.07 G pair interactions per launch), not by
memory; with one thread per body, 32768 threads fill a fraction of the H200's 270 K thread slots.
"""

from __future__ import annotations

import math

import numpy as np

from r3tui.domain import Dim3, Norm, Tolerance
from r3tui.record.spec import Buffer, KernelInputs, Scalar

FULL_N = 32768
EPS2 = 0.0025  # softening length 0.05, squared
SENTINEL = -999.0

# Each component is a float32 sum of n terms of both signs (accelerations cancel towards the
# cluster centre), so an elementwise bound would fail on legitimate variants; the bound is on
# the whole buffer in L2 instead.  Legitimate variants change the order of the j sum (split
# over threads, tiles) and use rsqrtf / fast-math (~2 ulp per term); the measured spread of such
# variants against the recorded naive result is ~1e-6 of ||acc||; 2e-5 leaves ~20x margin,
# while dropping or doubling one 256-body tile moves ||acc|| by ~1e-2 and a wrong softening
# (eps2 off by 10%) by ~1e-3.
TOLERANCE = Tolerance(rtol=2e-5, norm=Norm.L2)


def n_for(scale: float) -> int:
    """Body count for ``scale`` (a fraction of the full problem's pair interactions)."""
    return max(2, round(FULL_N * math.sqrt(scale)))


def make_inputs(rng: np.random.Generator, scale: float = 1.0) -> KernelInputs:
    n = n_for(scale)
    bodies = np.empty((n, 4), dtype=np.float32)  # float4: x, y, z, mass
    bodies[:, :3] = rng.standard_normal((n, 3))
    bodies[:, 3] = rng.uniform(0.5, 1.5, size=n) / n
    acc = np.full((n, 4), SENTINEL, dtype=np.float32)  # float4: ax, ay, az, potential
    return KernelInputs(
        args=[
            Buffer("pos", bodies),
            Buffer("acc", acc, tolerance=TOLERANCE),
            Scalar("n", n, "int32"),
            Scalar("eps2", EPS2, "float32"),
        ],
        block=Dim3(256),
        work=Dim3(n),
    )
