"""Inputs of ``spmv_csr``: a shifted 2-D Laplacian with heavy-tailed random extra entries.

The 5-point Laplacian of a side x side grid (side 1024 at full size: 1,048,576 rows) gets, per
row, a Zipf-distributed number of extra entries in random columns (61% of rows none, a few up to
``MAX_EXTRA``), so row lengths range from 3 to a few hundred as in meshes with contact or
coupling terms.  The diagonal is 1 + 3 x the row's sum of |off-diagonal|, so with x in
[0.5, 1.5] every y[row] >= 0.5: A is strictly diagonally dominant and no entry of y = A*x is a
near-cancellation.  About 8 M nonzeros; one
launch moves ~118 MB (values, column indices, row pointers, x once, y), twice the L2.
"""

from __future__ import annotations

import math

import numpy as np

from r3tui.domain import Dim3, Norm, Tolerance
from r3tui.record.spec import Buffer, KernelInputs, Scalar

FULL_SIDE = 1024
MAX_EXTRA = 256
ZIPF_EXPONENT = 2.0
SENTINEL = -999.0  # initial contents of y; every row of A*x is positive here

# Each y[row] is a double sum of 3..~260 terms in column order, contracted into FMAs by default.
# Variants that split a row over a warp and reduce with shuffles add in another order; with the
# matrix diagonally dominant and x in [0.5, 1.5], every y >= 0.5 and the sum of |terms| of a
# row is typically < 2x |y|, so reordering moves a row by ~1e-15 relative (ulp x sqrt(260));
# 1e-11 elementwise accepts any order while a dropped or doubled term (|v*x| >= 0.05 against
# |y| <= ~1000) is off by > 5e-5.
TOLERANCE = Tolerance(rtol=1e-11, norm=Norm.LINF)


def side_for(scale: float) -> int:
    """Grid side for ``scale`` (a fraction of the full problem's number of rows)."""
    return max(3, round(FULL_SIDE * math.sqrt(scale)))


def make_csr(rng: np.random.Generator, side: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rowptr int32, cols int32, vals float64) with sorted, unique columns in every row."""
    nrows = side * side
    idx = np.arange(nrows, dtype=np.int64)
    gx = idx % side
    gy = idx // side
    rows = []
    cols = []
    for valid, offset in (
        (gy > 0, -side),
        (gx > 0, -1),
        (gx < side - 1, 1),
        (gy < side - 1, side),
    ):
        rows.append(idx[valid])
        cols.append(idx[valid] + offset)
    lap_rows = np.concatenate(rows)
    lap_vals = np.full(lap_rows.size, -1.0)

    extra = np.minimum(rng.zipf(ZIPF_EXPONENT, nrows) - 1, MAX_EXTRA)
    extra_rows = np.repeat(idx, extra)
    extra_cols = rng.integers(0, nrows, size=extra_rows.size)
    extra_vals = rng.uniform(0.1, 0.5, size=extra_rows.size)
    extra_vals *= rng.choice(np.array([-1.0, 1.0]), size=extra_rows.size)

    off_rows = np.concatenate([lap_rows, extra_rows])
    off_cols = np.concatenate([*cols, extra_cols])
    off_vals = np.concatenate([lap_vals, extra_vals])
    off_diag = off_rows != off_cols
    keys = off_rows[off_diag] * nrows + off_cols[off_diag]
    keys, first = np.unique(keys, return_index=True)  # sorted by (row, col), duplicates dropped
    vals = off_vals[off_diag][first]
    off_rows = keys // nrows

    diag = 1.0 + 3.0 * np.bincount(off_rows, weights=np.abs(vals), minlength=nrows)
    diag_keys = idx * nrows + idx
    at = np.searchsorted(keys, diag_keys)
    keys = np.insert(keys, at, diag_keys)
    vals = np.insert(vals, at, diag)
    all_rows = keys // nrows
    counts = np.bincount(all_rows, minlength=nrows)
    rowptr = np.zeros(nrows + 1, dtype=np.int32)
    np.cumsum(counts, out=rowptr[1:])
    return rowptr, (keys % nrows).astype(np.int32), vals


def make_inputs(rng: np.random.Generator, scale: float = 1.0) -> KernelInputs:
    side = side_for(scale)
    nrows = side * side
    rowptr, cols, vals = make_csr(rng, side)
    x = rng.uniform(0.5, 1.5, size=nrows)
    y = np.full(nrows, SENTINEL)
    return KernelInputs(
        args=[
            Scalar("nrows", nrows, "int32"),
            Buffer("rowptr", rowptr),
            Buffer("cols", cols),
            Buffer("vals", vals),
            Buffer("x", x),
            Buffer("y", y, tolerance=TOLERANCE),
        ],
        block=Dim3(64),
        work=Dim3(nrows),
    )


def problem_size(inputs: KernelInputs) -> dict[str, int]:
    """Sizes the bytes/FLOPs formulas of example.toml use."""
    buffers = {a.name: a.data for a in inputs.args if isinstance(a, Buffer)}
    return {
        "nrows": int(buffers["y"].size),
        "ncols": int(buffers["x"].size),
        "nnz": int(buffers["cols"].size),
    }
