"""Order-dependent float results: the element types of an application's buffers, and the
tolerance a buffer gets when runs of the recorded kernel differ only by float order.

HeCBench jacobi on the H200 (2026-12-04): its kernel adds each block's squared error into one
float with atomicAdd, so no replay matched the recording byte for byte ("alloc2: mismatch at
element 0") and tune-app had nothing to search from.  The GPU side (the probe in
ResidentBundle) runs in tests/gpu/test_gpu_order.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from r3tui.domain import Norm
from r3tui.record.layout import allocation_dtypes, pointee_dtypes
from r3tui.record.manifest import ParamInfo, ParamKind
from r3tui.replay.verify import ORDER_CAP, ORDER_FLOOR, compare_host, order_dependence


@pytest.mark.parametrize(("signature", "expected"), [
    ("jacobi_step(float*, float const*, float*)", ["float32"] * 3),
    ("k(int, double const* __restrict__, float**, Foo*, __half*, unsigned int*)",
     [None, "float64", None, None, "float16", "uint32"]),
    ("dot<(int)256>(float*, int)", ["float32", None]),
    ("ns::k(void)", []),
    ("ns::k()", []),
    ("apply(std::pair<int, float>*, long long*)", [None, "int64"]),
])
def test_pointer_parameters_name_their_element_types(signature: str,
                                                     expected: list[str | None]) -> None:
    assert pointee_dtypes(signature) == expected


def _pointer(i: int, allocation: str, offset: int = 0) -> ParamInfo:
    return ParamInfo(i, 8 * i, 8, ParamKind.POINTER, bytes(8), allocation=allocation,
                     alloc_offset=offset)


def test_an_allocation_takes_the_type_its_pointers_agree_on() -> None:
    params = (_pointer(0, "alloc0"), _pointer(1, "alloc1"), _pointer(2, "alloc1", 8),
              _pointer(3, "alloc2"), _pointer(4, "alloc3", 2))
    found = allocation_dtypes(params, "k(float*, double*, double const*, int*, float*)")
    # alloc3 is entered 2 bytes into a float: not an array of floats from there
    assert found == {"alloc0": "float32", "alloc1": "float64", "alloc2": "int32"}
    # two parameters disagree: no type
    assert allocation_dtypes((_pointer(0, "a"), _pointer(1, "a")), "k(float*, int*)") == {}
    # a signature that does not match the parameters says nothing
    assert allocation_dtypes(params, "k(float*)") == {}


def _sum_in_order(values: np.ndarray, order: np.ndarray, blocks: int) -> np.float32:
    """What an atomicAdd of per-block partial sums leaves, with the blocks in ``order``."""
    partial = values.reshape(blocks, -1).sum(axis=1, dtype=np.float32)
    total = np.float32(0)
    for b in order:
        total = np.float32(total + partial[b])
    return total


def test_a_float_sum_in_another_block_order_gets_a_tolerance_that_catches_a_wrong_sum() -> None:
    rng = np.random.default_rng(7)
    values = (rng.standard_normal(1 << 16) ** 2).astype(np.float32)
    blocks = 256
    runs = [np.array([_sum_in_order(values, rng.permutation(blocks), blocks)])
            for _ in range(4)]
    recorded, *replays = runs
    assert len({r.tobytes() for r in runs}) > 1  # the order shows in the last bits
    found = order_dependence("alloc2", "float32", recorded.tobytes(), replays[:2])
    assert found is not None and found.tolerance is not None
    assert 0 < found.spread < 1e-5
    assert found.tolerance.norm is Norm.L2
    assert ORDER_FLOOR["float32"] <= found.tolerance.rtol <= ORDER_CAP["float32"]
    assert "order-dependent floating-point result, verified with l2 rtol" in found.describe()
    # another order passes; the sum without one block's share fails
    assert compare_host(replays[2].tobytes(), recorded.tobytes(), found.tolerance,
                        "float32").passed
    partial = values.reshape(blocks, -1).sum(axis=1, dtype=np.float32)
    wrong = np.array([recorded[0] - partial.max()], dtype=np.float32)
    assert not compare_host(wrong.tobytes(), recorded.tobytes(), found.tolerance,
                            "float32").passed


def test_what_is_not_float_order_gets_no_tolerance() -> None:
    recorded = np.linspace(1, 2, 1000, dtype=np.float32)
    # identical runs: nothing to say
    assert order_dependence("a", "float32", recorded.tobytes(), [recorded.tobytes()]) is None
    # integers are exact whatever the order
    ints = np.arange(10, dtype=np.int32)
    assert order_dependence("a", "int32", ints.tobytes(), [(ints + 1).tobytes()]) is None
    # a difference of 1% is a wrong replay, not rounding
    off = recorded * np.float32(1.01)
    found = order_dependence("a", "float32", recorded.tobytes(), [off.tobytes()])
    assert found is not None and found.tolerance is None
    assert "more than floating-point order explains" in found.describe()
    # a NaN where the recording had a number
    nan = recorded.copy()
    nan[3] = np.nan
    found = order_dependence("a", "float32", recorded.tobytes(), [nan.tobytes()])
    assert found is not None and found.tolerance is None and math.isinf(found.spread)
