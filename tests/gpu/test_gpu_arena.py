"""The fixed-address arena and the device comparison kernels on a real GPU."""

from __future__ import annotations

import math

import numpy as np
import pytest

from r3tui.domain import Norm, Tolerance
from r3tui.errors import ArenaUnavailable
from r3tui.replay.verify import compare_host

pytestmark = pytest.mark.gpu


def test_arena_reserves_the_fixed_address_and_refuses_a_second_reservation() -> None:
    from r3tui.cuda import driver as cu
    from r3tui.cuda.arena import ARENA_BASE, Arena

    ctx = cu.PrimaryContext(0)
    try:
        with Arena(1 << 30) as arena:
            assert arena.base == ARENA_BASE
            a = arena.allocate(1000, "a")
            b = arena.allocate(8, "b")
            assert a.address == ARENA_BASE and b.address % 256 == 0 and b.address >= a.end
            data = np.arange(125, dtype=np.float64)
            cu.copy_to_device(a.address, data)
            assert cu.copy_to_host(a.address, 1000) == data.tobytes()
            with pytest.raises(ArenaUnavailable, match="0x153940000000 is already in use"):
                Arena(1 << 30)
        # Closed: the range serves the next recording in this process, at the same base.
        with Arena(1 << 21) as again:
            assert again.base == ARENA_BASE
            block = again.allocate(64)
            assert block.address == ARENA_BASE
            cu.copy_to_device(block.address, bytes(range(64)))
            assert cu.copy_to_host(block.address, 64) == bytes(range(64))
    finally:
        ctx.release()


CASES = [
    ("exact-equal", None, "float64", lambda r: (r.random(10_001), None)),
    ("exact-one-ulp", None, "float64", lambda r: _bump(r.random(10_001), 4321, ulp=True)),
    ("exact-bytes", None, None, lambda r: _bump(r.random(333).astype(np.float32), 17)),
    ("maxabs-pass", Tolerance(rtol=1e-6), "float32",
     lambda r: _noise(r.random(50_000).astype(np.float32), 1e-8)),
    ("maxabs-fail", Tolerance(rtol=1e-9), "float64", lambda r: _bump(r.random(50_000), 999)),
    ("l2-pass", Tolerance(rtol=1e-6, norm=Norm.L2), "float64",
     lambda r: _noise(r.random(70_000), 1e-9)),
    ("l2-fail", Tolerance(rtol=1e-9, norm=Norm.L2), "float64",
     lambda r: _noise(r.random(70_000), 1e-3)),
    ("linf-fail", Tolerance(rtol=1e-6, norm=Norm.LINF), "float32",
     lambda r: _bump(r.random(4096).astype(np.float32), 4000)),
    ("nan-matching", Tolerance(rtol=1e-6, norm=Norm.LINF), "float64",
     lambda r: _nan(r.random(1000), both=True)),
    ("nan-in-replay", Tolerance(rtol=1e-6), "float64", lambda r: _nan(r.random(1000), both=False)),
    ("int32-exact-fail", None, "int32", lambda r: _bump(r.integers(0, 9, 5000, dtype=np.int32), 1)),
]


def _bump(a: np.ndarray, i: int, ulp: bool = False) -> tuple[np.ndarray, np.ndarray]:
    b = a.copy()
    b[i] = np.nextafter(b[i], np.inf) if ulp else b[i] + 1
    return a, b


def _noise(a: np.ndarray, scale: float) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(9)
    return a, (a + (rng.standard_normal(a.shape) * scale).astype(a.dtype)).astype(a.dtype)


def _nan(a: np.ndarray, both: bool) -> tuple[np.ndarray, np.ndarray]:
    b = a.copy()
    b[10] = np.nan
    if both:
        a = a.copy()
        a[10] = np.nan
    return a, b


@pytest.mark.parametrize("name,tolerance,dtype,make", CASES, ids=[c[0] for c in CASES])
def test_device_comparison_agrees_with_numpy(name: str, tolerance: Tolerance | None,
                                             dtype: str | None, make: object) -> None:
    from r3tui.cuda import driver as cu
    from r3tui.replay.device_verify import DeviceComparator

    expected, actual = make(np.random.default_rng(1))  # type: ignore[operator]
    if actual is None:
        actual = expected.copy()
    ctx = cu.PrimaryContext(0)
    drv = cu.driver()
    try:
        info = cu.device_info(ctx.device)
        comparator = DeviceComparator(info.arch, info.sm_count)
        a = int(cu.check(drv.cuMemAlloc(actual.nbytes), "cuMemAlloc"))
        b = int(cu.check(drv.cuMemAlloc(expected.nbytes), "cuMemAlloc"))
        cu.copy_to_device(a, actual)
        cu.copy_to_device(b, expected)
        on_gpu = comparator.compare(a, b, actual.nbytes, tolerance, dtype, buffer=name)
        drv.cuMemFree(a)
        drv.cuMemFree(b)
        comparator.close()
    finally:
        ctx.release()
    on_host = compare_host(actual.tobytes(), expected.tobytes(), tolerance, dtype, buffer=name)
    assert on_gpu.passed == on_host.passed
    assert on_gpu.first_bad_index == on_host.first_bad_index
    assert math.isclose(on_gpu.max_error, on_host.max_error, rel_tol=1e-9, abs_tol=1e-300) or \
        (math.isinf(on_gpu.max_error) and math.isinf(on_host.max_error))
