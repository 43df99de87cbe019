"""The verification policies of :mod:`r3tui.replay.verify`, computed on the GPU.

Two small kernels compiled once per worker with NVRTC (through ``r3tui.compile``): a byte
comparison (16-byte loads, warp-aggregated first-mismatch and count) and, per element type,
the reductions of :class:`~r3tui.replay.verify.ErrorStats`.  Only 64 bytes of results come
back to the host per buffer; buffers are never copied out, except for element types the
kernels do not cover (float16), which fall back to :func:`~r3tui.replay.verify.compare_host`.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from r3tui.cuda import driver as cu
from r3tui.domain import Norm, Tolerance
from r3tui.replay.verify import Comparison, ErrorStats, compare_host, decide

_TYPES = {
    "float32": ("f32", "float"),
    "float64": ("f64", "double"),
    "int8": ("i8", "signed char"),
    "uint8": ("u8", "unsigned char"),
    "int16": ("i16", "short"),
    "uint16": ("u16", "unsigned short"),
    "int32": ("i32", "int"),
    "uint32": ("u32", "unsigned int"),
    "int64": ("i64", "long long"),
    "uint64": ("u64", "unsigned long long"),
}

COMPARE_SOURCE = r"""
typedef unsigned long long u64;
struct Acc { u64 first_bad; u64 n_bad; u64 max_abs_diff; u64 max_abs_ref;
             double sum_sq_diff; double sum_sq_ref; u64 nonfinite_bad; u64 pad; };

__device__ __forceinline__ bool r3_finite(double x) {
  return ((__double_as_longlong(x) >> 52) & 0x7ff) != 0x7ff;
}
__device__ __forceinline__ bool r3_nan(double x) {
  long long b = __double_as_longlong(x);
  return ((b >> 52) & 0x7ff) == 0x7ff && (b & 0xfffffffffffffLL) != 0;
}
__device__ __forceinline__ u64 warp_min(u64 v) {
  for (int o = 16; o > 0; o >>= 1) {
    u64 w = __shfl_down_sync(0xffffffffu, v, o);
    v = w < v ? w : v;
  }
  return v;
}
__device__ __forceinline__ u64 warp_sum(u64 v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double warp_maxd(double v) {
  for (int o = 16; o > 0; o >>= 1) v = fmax(v, __shfl_down_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ double warp_sumd(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  return v;
}

// Every thread runs the loops (no early return) so that the full-mask shuffles are legal.
extern "C" __global__ void r3_cmp_bytes(const unsigned char* a, const unsigned char* b,
                                        u64 n, Acc* acc) {
  u64 first = ~0ull, bad = 0;
  const u64 stride = (u64)gridDim.x * blockDim.x;
  const u64 tid = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  const u64 nvec = n / 16;
  const uint4* va = reinterpret_cast<const uint4*>(a);
  const uint4* vb = reinterpret_cast<const uint4*>(b);
  for (u64 i = tid; i < nvec; i += stride) {
    uint4 x = va[i], y = vb[i];
    if (x.x != y.x || x.y != y.y || x.z != y.z || x.w != y.w) {
      ++bad;
      for (int k = 0; k < 16; ++k)
        if (a[i * 16 + k] != b[i * 16 + k]) { if (i * 16 + k < first) first = i * 16 + k; break; }
    }
  }
  for (u64 j = nvec * 16 + tid; j < n; j += stride)
    if (a[j] != b[j]) { ++bad; if (j < first) first = j; }
  first = warp_min(first);
  bad = warp_sum(bad);
  if ((threadIdx.x & 31) == 0) {
    if (first != ~0ull) atomicMin(&acc->first_bad, first);
    if (bad) atomicAdd(&acc->n_bad, bad);
  }
}

template <typename T>
__device__ void r3_stats(const T* a, const T* b, u64 n, double atol, double rtol, Acc* acc) {
  u64 first = ~0ull, nf_bad = 0;
  double mad = 0.0, mar = 0.0, ssd = 0.0, ssr = 0.0;
  const u64 stride = (u64)gridDim.x * blockDim.x;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    double x = (double)a[i], y = (double)b[i];
    bool fx = r3_finite(x), fy = r3_finite(y), bad;
    double d = 0.0;
    if (fx && fy) {
      d = fabs(x - y);
      bad = d > atol + rtol * fabs(y);
    } else {
      bad = !((r3_nan(x) && r3_nan(y)) || x == y);
      if (bad) ++nf_bad;
    }
    if (fy) { double r = fabs(y); mar = fmax(mar, r); ssr += r * r; }
    mad = fmax(mad, d);
    ssd += d * d;
    if (bad && i < first) first = i;
  }
  first = warp_min(first);
  nf_bad = warp_sum(nf_bad);
  mad = warp_maxd(mad); mar = warp_maxd(mar);
  ssd = warp_sumd(ssd); ssr = warp_sumd(ssr);
  if ((threadIdx.x & 31) == 0) {
    if (first != ~0ull) { atomicMin(&acc->first_bad, first); }
    if (nf_bad) atomicAdd(&acc->nonfinite_bad, nf_bad);
    // Non-negative doubles order like their bit patterns, so an integer max is a float max.
    atomicMax(&acc->max_abs_diff, (u64)__double_as_longlong(mad));
    atomicMax(&acc->max_abs_ref, (u64)__double_as_longlong(mar));
    atomicAdd(&acc->sum_sq_diff, ssd);
    atomicAdd(&acc->sum_sq_ref, ssr);
  }
}
"""


def _stats_kernels() -> str:
    return "".join(
        f'extern "C" __global__ void r3_stats_{short}(const {ctype}* a, const {ctype}* b, '
        f"u64 n, double atol, double rtol, Acc* acc) {{ r3_stats<{ctype}>(a, b, n, atol, rtol, "
        "acc); }\n"
        for short, ctype in _TYPES.values()
    )


_ACC_BYTES = 64
_THREADS = 256


class DeviceComparator:
    """Compares device buffers in place; one per context (it owns a module and a scratch)."""

    def __init__(self, arch: str, sm_count: int, stream: Any = 0) -> None:
        from r3tui.compile.base import CompileRequest, get_toolchain

        result = get_toolchain("nvrtc").compile(CompileRequest(
            source=COMPARE_SOURCE + _stats_kernels(), kernel_name="r3_cmp_bytes", arch=arch,
            options=("-O3",), source_name="r3_compare.cu",
        ))
        if not result.ok or result.binary is None:
            raise RuntimeError(f"the comparison kernels do not compile:\n{result.log}")
        drv = cu.driver()
        self._module = cu.load_module(result.binary)
        self._bytes_fn = cu.get_function(self._module, "r3_cmp_bytes")
        self._stats_fn = {dt: cu.get_function(self._module, f"r3_stats_{short}")
                          for dt, (short, _) in _TYPES.items()}
        self._acc = int(cu.check(drv.cuMemAlloc(_ACC_BYTES), "cuMemAlloc"))
        self._host = np.zeros(_ACC_BYTES // 8, dtype=np.uint64)
        self._max_blocks = max(1, sm_count * 8)
        self.stream = stream

    def close(self) -> None:
        drv = cu.driver()
        drv.cuMemFree(self._acc)
        drv.cuModuleUnload(self._module)

    def _run(self, fn: Any, n_items: int, args: bytes, layout: list[tuple[int, int]]) -> np.ndarray:
        drv = cu.driver()
        cu.check(drv.cuMemsetD8Async(self._acc, 0, _ACC_BYTES, self.stream), "cuMemsetD8Async")
        cu.check(drv.cuMemsetD32Async(self._acc, 0xFFFFFFFF, 2, self.stream), "cuMemsetD32Async")
        blocks = max(1, min(self._max_blocks, (n_items + _THREADS - 1) // _THREADS))
        params = cu.KernelParams(args, layout)
        cu.launch(fn, (blocks, 1, 1), (_THREADS, 1, 1), 0, self.stream, params)
        cu.check(drv.cuMemcpyDtoHAsync(self._host.ctypes.data, self._acc, _ACC_BYTES, self.stream),
                 "cuMemcpyDtoHAsync")
        cu.check(drv.cuStreamSynchronize(self.stream), "cuStreamSynchronize")
        return self._host.copy()

    def touch(self, address: int, size: int) -> None:
        """Read ``size`` bytes at ``address`` once on the device, writing none of them, so
        that as much of the range as fits is in L2 afterwards (the comparison of the range
        with itself: its second read of each word hits the line the first brought in)."""
        if size:
            self._bytes(address, address, size)

    def first_difference(self, a: int, b: int, size: int) -> tuple[int | None, int]:
        """The first byte offset at which ``size`` bytes at ``a`` and ``b`` differ (None:
        they are equal), and how many bytes differ."""
        return self._bytes(a, b, size)

    def _bytes(self, a: int, b: int, size: int) -> tuple[int | None, int]:
        args = struct.pack("<QQQQ", a, b, size, self._acc)
        acc = self._run(self._bytes_fn, max(size // 16, 1), args,
                        [(0, 8), (8, 8), (16, 8), (24, 8)])
        first = int(acc[0])
        return (None if first == 0xFFFFFFFFFFFFFFFF else first), int(acc[1])

    def _stats(self, a: int, b: int, n: int, dtype: str, atol: float, rtol: float) -> ErrorStats:
        args = struct.pack("<QQQddQ", a, b, n, atol, rtol, self._acc)
        acc = self._run(self._stats_fn[dtype], n, args,
                        [(0, 8), (8, 8), (16, 8), (24, 8), (32, 8), (40, 8)])
        f = acc.view(np.float64)
        first = int(acc[0])
        nf_bad = int(acc[6])
        return ErrorStats(
            n=n,
            max_abs_diff=float("inf") if nf_bad else float(f[2]),
            max_abs_ref=float(f[3]),
            sum_sq_diff=float(f[4]),
            sum_sq_ref=float(f[5]),
            nonfinite_mismatches=nf_bad,
            first_elementwise_bad=None if first == 0xFFFFFFFFFFFFFFFF else first,
        )

    def compare(self, actual: int, expected: int, size: int, tolerance: Tolerance | None,
                dtype: str | None, *, buffer: str | None = None) -> Comparison:
        """Compare ``size`` bytes at device address ``actual`` with those at ``expected``."""
        kind = dtype or "uint8"
        if kind not in _TYPES:
            return compare_host(cu.copy_to_host(actual, size), cu.copy_to_host(expected, size),
                                tolerance, dtype, buffer=buffer)
        itemsize = np.dtype(kind).itemsize
        n = size // itemsize
        if tolerance is None:
            first_byte, n_bad = self._bytes(actual, expected, size)
            if not n_bad:
                return Comparison(True, 0.0, None, buffer)
            stats = self._stats(actual, expected, n, kind, 0.0, 0.0)
            assert first_byte is not None
            return Comparison(False, stats.max_abs_diff, first_byte // itemsize, buffer)
        stats = self._stats(actual, expected, n, kind, tolerance.atol, tolerance.rtol)
        passed, err = decide(stats, tolerance)
        if passed:
            return Comparison(True, err, None, buffer)
        first = stats.first_elementwise_bad
        if tolerance.norm is Norm.MAX_ABS and not stats.nonfinite_mismatches:
            bound = tolerance.atol + tolerance.rtol * stats.max_abs_ref
            first = self._stats(actual, expected, n, kind, bound, 0.0).first_elementwise_bad
        return Comparison(False, err, first, buffer)
