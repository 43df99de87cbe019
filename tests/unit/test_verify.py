"""Verification policies on numpy data (the host reference the GPU comparison must match)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from r3tui.domain import Norm, Tolerance
from r3tui.replay.verify import Comparison, compare_host, decide, host_stats, worst


def test_exact_equal_and_one_ulp_off() -> None:
    a = np.random.default_rng(0).random(1000)
    assert compare_host(a.tobytes(), a.copy().tobytes(), None, "float64") == \
        Comparison(True, 0.0, None)
    b = a.copy()
    b[321] = np.nextafter(b[321], 2.0)
    result = compare_host(b, a, None, "float64")
    assert not result.passed and result.first_bad_index == 321
    assert 0 < result.max_error < 1e-15


def test_exact_untyped_reports_byte_index_and_byte_difference() -> None:
    a = bytes(range(200))
    b = bytearray(a)
    b[77] += 5
    result = compare_host(bytes(b), a, None, None)
    assert result == Comparison(False, 5.0, 77)


def test_exact_different_sizes_fail() -> None:
    assert not compare_host(b"abc", b"abcd", None, None).passed


def test_max_abs_uses_the_largest_reference_value() -> None:
    b = np.array([1000.0, 1.0, 1.0])
    a = b + np.array([0.0, 0.5, 0.0])  # 0.5 <= 1e-3 * 1000
    assert compare_host(a, b, Tolerance(rtol=1e-3), "float64").passed
    a[2] += 2.0
    result = compare_host(a, b, Tolerance(rtol=1e-3), "float64")
    assert not result.passed and result.max_error == pytest.approx(2.0)
    assert result.first_bad_index == 2  # 0.5 at index 1 is under the 1.0 bound


def test_linf_is_elementwise() -> None:
    b = np.array([1000.0, 1.0])
    a = b + np.array([0.0, 0.5])  # fine for max-abs, not elementwise
    assert compare_host(a, b, Tolerance(rtol=1e-3), "float64").passed
    result = compare_host(a, b, Tolerance(rtol=1e-3, norm=Norm.LINF), "float64")
    assert not result.passed and result.first_bad_index == 1 and result.max_error == 0.5


def test_l2_norm_of_the_difference() -> None:
    b = np.ones(100, dtype=np.float32)
    a = b.copy()
    a[:4] += np.float32(0.01)  # ||a-b|| = 0.02, ||b|| = 10
    assert compare_host(a, b, Tolerance(rtol=3e-3, norm=Norm.L2), "float32").passed
    result = compare_host(a, b, Tolerance(rtol=1e-3, norm=Norm.L2), "float32")
    assert not result.passed and result.max_error == pytest.approx(0.02, rel=1e-4)


def test_atol_alone() -> None:
    b = np.zeros(10)
    a = b + 1e-9
    assert compare_host(a, b, Tolerance(atol=1e-8), "float64").passed
    assert not compare_host(a, b, Tolerance(atol=1e-10), "float64").passed


@pytest.mark.parametrize("norm", list(Norm))
def test_nan_where_the_epilogue_has_a_number_is_wrong(norm: Norm) -> None:
    b = np.arange(10, dtype=np.float64)
    a = b.copy()
    a[4] = np.nan
    result = compare_host(a, b, Tolerance(rtol=1.0, norm=norm), "float64")
    assert not result.passed and math.isinf(result.max_error) and result.first_bad_index == 4


@pytest.mark.parametrize("norm", list(Norm))
def test_nan_matching_nan_and_infinities_pass(norm: Norm) -> None:
    b = np.array([1.0, np.nan, np.inf, -np.inf])
    a = b.copy()
    assert compare_host(a, b, Tolerance(rtol=1e-9, norm=norm), "float64").passed
    a[2] = -np.inf
    result = compare_host(a, b, Tolerance(rtol=1e-9, norm=norm), "float64")
    assert not result.passed and result.first_bad_index == 2


def test_a_number_where_the_epilogue_has_nan_is_wrong() -> None:
    b = np.array([np.nan, 1.0])
    a = np.array([0.0, 1.0])
    assert not compare_host(a, b, Tolerance(rtol=1.0), "float64").passed


def test_integer_buffers_compare_as_numbers() -> None:
    b = np.arange(100, dtype=np.int32)
    a = b.copy()
    a[50] += 3
    assert compare_host(a, b, Tolerance(atol=3), "int32").passed
    result = compare_host(a, b, Tolerance(atol=2), "int32")
    assert not result.passed and result.max_error == 3.0


def test_tolerance_needs_a_dtype() -> None:
    with pytest.raises(ValueError, match="needs a dtype"):
        compare_host(b"\0" * 8, b"\0" * 8, Tolerance(rtol=1e-3), None)


def test_trailing_pad_bytes_do_not_break_typed_comparison() -> None:
    b = np.arange(5, dtype=np.float64).tobytes() + b"\0\0\0"
    assert compare_host(b, b, Tolerance(rtol=1e-9), "float64").passed


def test_decide_and_worst() -> None:
    stats = host_stats(np.array([1.0, 2.5]), np.array([1.0, 2.0]), 0.0, 0.0)
    assert stats.max_abs_diff == 0.5 and stats.max_abs_ref == 2.0 and stats.sum_sq_diff == 0.25
    assert decide(stats, Tolerance(rtol=0.25)) == (True, 0.5)
    assert decide(stats, Tolerance(rtol=0.2)) == (False, 0.5)
    ok, bad = Comparison(True, 1e-9, None, "a"), Comparison(False, 3.0, 1, "b")
    assert worst([ok, bad]) is bad and worst([ok]) is ok and worst([]) is None
    assert "b: mismatch at element 1" in bad.describe()
