"""Verification policies: does a replayed buffer match its recorded epilogue?

``exact``: byte equality.  A :class:`~r3tui.domain.Tolerance` compares as the buffer's
dtype, per its norm (``domain.Norm``):

- ``max-abs``: ``max|a-b| <= atol + rtol*max|b|``
- ``l2``:      ``||a-b||_2 <= atol + rtol*||b||_2``
- ``linf``:    ``|a-b| <= atol + rtol*|b|`` for every element

Non-finite values must agree exactly: NaN where the epilogue has NaN passes, NaN (or an
infinity) anywhere the epilogue has something else fails with an infinite error.  The
reported ``first_bad_index`` is an element index: the first element over the elementwise
bound (``atol + rtol*max|b|`` for max-abs, ``atol + rtol*|b_i|`` otherwise), or for exact
the first element whose bytes differ.

:func:`compare_host` is the numpy reference; :mod:`r3tui.replay.device_verify` does the
same comparison on the GPU without copying buffers to the host.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from r3tui.domain import Norm, Tolerance


@dataclass(frozen=True)
class Comparison:
    passed: bool
    max_error: float  # 0.0 when identical; inf for a non-finite mismatch
    first_bad_index: int | None = None  # element index (byte index for untyped exact)
    buffer: str | None = None

    def describe(self) -> str:
        where = f" at element {self.first_bad_index}" if self.first_bad_index is not None else ""
        name = f"{self.buffer}: " if self.buffer else ""
        if self.passed:
            return f"{name}ok (max error {self.max_error:.3g})"
        return f"{name}mismatch{where}, max error {self.max_error:.3g}"


@dataclass(frozen=True)
class ErrorStats:
    """The reductions every policy is decided from (computed on host or on the device)."""

    n: int
    max_abs_diff: float  # over elements where both are finite; inf if non-finite mismatch
    max_abs_ref: float  # over finite reference elements
    sum_sq_diff: float
    sum_sq_ref: float
    nonfinite_mismatches: int
    first_elementwise_bad: int | None  # first i with |a-b| > atol + rtol*|b_i| (or non-finite)


def decide(stats: ErrorStats, tolerance: Tolerance) -> tuple[bool, float]:
    """Apply a tolerance policy to the reductions: ``(passed, max_error)``."""
    if stats.nonfinite_mismatches:
        return False, math.inf
    if tolerance.norm is Norm.MAX_ABS:
        err = stats.max_abs_diff
        return err <= tolerance.atol + tolerance.rtol * stats.max_abs_ref, err
    if tolerance.norm is Norm.L2:
        err = math.sqrt(stats.sum_sq_diff)
        return err <= tolerance.atol + tolerance.rtol * math.sqrt(stats.sum_sq_ref), err
    return stats.first_elementwise_bad is None, stats.max_abs_diff


def element_dtype(dtype: str | None) -> np.dtype:
    return np.dtype(dtype) if dtype else np.dtype(np.uint8)


def as_elements(data: bytes | np.ndarray, dtype: str | None) -> np.ndarray:
    """A flat array of ``dtype`` over ``data``; trailing bytes that make no element are dropped."""
    raw = np.frombuffer(data, dtype=np.uint8) if isinstance(data, (bytes, bytearray, memoryview)) \
        else np.ascontiguousarray(data).view(np.uint8).reshape(-1)
    dt = element_dtype(dtype)
    usable = raw.size - raw.size % dt.itemsize
    return raw[:usable].view(dt)


def host_stats(actual: np.ndarray, expected: np.ndarray, atol: float, rtol: float) -> ErrorStats:
    """:class:`ErrorStats` of two same-shape arrays, in float64."""
    a = actual.astype(np.float64, copy=False).reshape(-1)
    b = expected.astype(np.float64, copy=False).reshape(-1)
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {a.shape} vs {b.shape}")
    fin_a, fin_b = np.isfinite(a), np.isfinite(b)
    both = fin_a & fin_b
    with np.errstate(invalid="ignore", over="ignore"):
        same_nonfinite = (np.isnan(a) & np.isnan(b)) | (a == b)
        diff = np.where(both, np.abs(a - b), 0.0)
    bad_nonfinite = ~both & ~same_nonfinite
    ref = np.where(fin_b, np.abs(b), 0.0)
    elem_bad = bad_nonfinite | (diff > atol + rtol * ref)
    n_bad_nf = int(bad_nonfinite.sum())
    first = int(np.argmax(elem_bad)) if elem_bad.any() else None
    return ErrorStats(
        n=int(a.size),
        max_abs_diff=math.inf if n_bad_nf else float(diff.max(initial=0.0)),
        max_abs_ref=float(ref.max(initial=0.0)),
        sum_sq_diff=float(np.dot(diff, diff)),
        sum_sq_ref=float(np.dot(ref, ref)),
        nonfinite_mismatches=n_bad_nf,
        first_elementwise_bad=first,
    )


def first_over(actual: np.ndarray, expected: np.ndarray, bound: float) -> int | None:
    """First element whose |a-b| exceeds a constant bound (or whose non-finite values differ)."""
    a = actual.astype(np.float64, copy=False).reshape(-1)
    b = expected.astype(np.float64, copy=False).reshape(-1)
    with np.errstate(invalid="ignore", over="ignore"):
        both = np.isfinite(a) & np.isfinite(b)
        same = (np.isnan(a) & np.isnan(b)) | (a == b)
        bad = np.where(both, np.abs(a - b) > bound, ~same)
    return int(np.argmax(bad)) if bad.any() else None


def compare_host(
    actual: bytes | np.ndarray,
    expected: bytes | np.ndarray,
    tolerance: Tolerance | None,
    dtype: str | None = None,
    *,
    buffer: str | None = None,
) -> Comparison:
    """Compare a replayed buffer with its epilogue under ``tolerance`` (None: exact)."""
    a_bytes = np.frombuffer(actual, dtype=np.uint8) if isinstance(actual, (bytes, bytearray)) \
        else np.ascontiguousarray(actual).view(np.uint8).reshape(-1)
    b_bytes = np.frombuffer(expected, dtype=np.uint8) if isinstance(expected, (bytes, bytearray)) \
        else np.ascontiguousarray(expected).view(np.uint8).reshape(-1)
    if a_bytes.size != b_bytes.size:
        return Comparison(False, math.inf, 0, buffer)
    if tolerance is None:
        return _compare_exact(a_bytes, b_bytes, dtype, buffer)
    if dtype is None:
        raise ValueError(f"buffer {buffer!r}: a tolerance needs a dtype")
    a, b = as_elements(a_bytes, dtype), as_elements(b_bytes, dtype)
    stats = host_stats(a, b, tolerance.atol, tolerance.rtol)
    passed, err = decide(stats, tolerance)
    if passed:
        return Comparison(True, err, None, buffer)
    first = stats.first_elementwise_bad
    if tolerance.norm is Norm.MAX_ABS and not stats.nonfinite_mismatches:
        first = first_over(a, b, tolerance.atol + tolerance.rtol * stats.max_abs_ref)
    return Comparison(False, err, first, buffer)


def _compare_exact(a: np.ndarray, b: np.ndarray, dtype: str | None, buffer: str | None
                   ) -> Comparison:
    differ = a != b
    if not differ.any():
        return Comparison(True, 0.0, None, buffer)
    first_byte = int(np.argmax(differ))
    itemsize = element_dtype(dtype).itemsize
    if dtype is None:
        return Comparison(False, float(np.abs(a.astype(np.int16) - b.astype(np.int16)).max()),
                          first_byte, buffer)
    ea, eb = as_elements(a, dtype), as_elements(b, dtype)
    stats = host_stats(ea, eb, 0.0, 0.0)
    return Comparison(False, stats.max_abs_diff, first_byte // itemsize, buffer)


def worst(comparisons: list[Comparison]) -> Comparison | None:
    """The failing comparison with the largest error, else the passing one with the largest."""
    if not comparisons:
        return None
    failing = [c for c in comparisons if not c.passed]
    pool = failing or comparisons
    return max(pool, key=lambda c: c.max_error)


@dataclass(frozen=True)
class CheckPolicy:
    """Which defences against candidates that game the benchmark are on (docs/verification.md).

    All are on by default; turning one off is for measuring what it costs
    (``bench/verification.py``) or for showing what it catches (the GPU tests), never for a
    search.
    """

    # Verify the state the last timed launch left, besides the first launch: the result that
    # passes is then one that was timed.
    verify_timed: bool = True
    # Put every variable of the candidate's module back to its load-time value before every
    # launch, so nothing it keeps there survives from one launch to the next.
    reset_module_state: bool = True
    # Verify on the recording's check launches (other sizes, scalars and data) too.
    check_launches: bool = True
    # When the timing spread (IQR over median) exceeds this, verify this many more launches:
    # a kernel that computes on some launches only times as a spread-out mixture.
    unsettled_iqr: float = 0.10
    unsettled_verifications: int = 4

    @classmethod
    def off(cls) -> CheckPolicy:
        """Only the first launch verified: what R³ did before these defences."""
        return cls(verify_timed=False, reset_module_state=False, check_launches=False,
                   unsettled_verifications=0)


# -- order-dependent float results -----------------------------------------------------------
# A kernel that adds floats with atomics (a residual, a histogram of weights) writes a sum
# whose last bits depend on the order the blocks ran in: two runs of the same binary on the
# same inputs differ, so no replay matches the recording byte for byte.  Such a buffer is
# verified with a relative L2 tolerance sized from the spread actually seen between the
# recording and replays of its own binary: ORDER_MARGIN times that spread, at least
# ORDER_FLOOR; a spread beyond ORDER_CAP is not rounding but a wrong replay.
ORDER_MARGIN = 16.0
ORDER_FLOOR = {"float16": 1e-3, "float32": 1e-6, "float64": 1e-14}
ORDER_CAP = {"float16": 1e-2, "float32": 1e-4, "float64": 1e-10}


@dataclass(frozen=True)
class OrderDependence:
    """What the recording and replays of the recorded binary showed of one buffer."""

    buffer: str
    dtype: str
    spread: float  # the largest relative L2 difference between any two of them
    tolerance: Tolerance | None  # None: beyond ORDER_CAP (or non-finite), a wrong replay

    def describe(self) -> str:
        seen = (f"{self.buffer} ({self.dtype}) differs between runs of the recorded kernel "
                f"by {self.spread:.2g} relative (L2)")
        if self.tolerance is None:
            return f"{seen}: more than floating-point order explains"
        return (f"{seen}: an order-dependent floating-point result, verified with "
                f"{self.tolerance.norm.value} rtol {self.tolerance.rtol:.2g}")


def order_dependence(buffer: str, dtype: str, epilogue: bytes | np.ndarray,
                     replays: Sequence[bytes | np.ndarray]) -> OrderDependence | None:
    """How one float buffer varies between the recording (``epilogue``) and ``replays`` of
    the same binary from the same prologue; None when it does not vary or is not float."""
    if dtype not in ORDER_CAP:
        return None
    runs = [as_elements(r, dtype).astype(np.float64) for r in (epilogue, *replays)]
    if all(np.array_equal(runs[0], r, equal_nan=True) for r in runs[1:]):
        return None
    reference = float(np.linalg.norm(np.nan_to_num(runs[0], posinf=0.0, neginf=0.0)))
    spread = 0.0
    for i, a in enumerate(runs):
        for b in runs[i + 1:]:
            if a.shape != b.shape or not np.array_equal(np.isfinite(a), np.isfinite(b)) \
                    or not np.array_equal(a[~np.isfinite(a)], b[~np.isfinite(b)], equal_nan=True):
                return OrderDependence(buffer, dtype, math.inf, None)
            finite = np.isfinite(a)
            diff = float(np.linalg.norm(a[finite] - b[finite]))
            spread = max(spread, diff / reference if reference else math.inf if diff else 0.0)
    if spread > ORDER_CAP[dtype]:
        return OrderDependence(buffer, dtype, spread, None)
    rtol = min(ORDER_CAP[dtype], max(ORDER_FLOOR[dtype], ORDER_MARGIN * spread))
    return OrderDependence(buffer, dtype, spread, Tolerance(rtol=rtol, norm=Norm.L2))
