"""Run a CUDA kernel whose threads each work alone on this CPU, for tests without a GPU.

The kernel's source is compiled as C++ by the machine's g++ with a prelude that defines the
built-in indices and the few CUDA names the examples use; :func:`launch` calls the kernel once
per thread of the grid, one after another.  That is exact for a kernel whose threads neither
synchronize nor share memory (the kernels the coarsening rule accepts), and it is a real
compile and a real run: what a rewrite changes in what a kernel computes shows in its output.
Not a stand-in for the GPU's timing or memory model.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

PRELUDE = r"""
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <vector>
struct uint3 { unsigned x, y, z; };
struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
static uint3 threadIdx, blockIdx;
static dim3 blockDim, gridDim;
struct float4 { float x, y, z, w; };
static inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
template <class T> static inline T __ldg(const T* p) { return *p; }
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __launch_bounds__(...)

template <class F>
static void launch(dim3 grid, dim3 block, F kernel) {
    gridDim = grid;
    blockDim = block;
    for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
    for (unsigned bx = 0; bx < grid.x; ++bx)
    for (unsigned tz = 0; tz < block.z; ++tz)
    for (unsigned ty = 0; ty < block.y; ++ty)
    for (unsigned tx = 0; tx < block.x; ++tx) {
        blockIdx = {bx, by, bz};
        threadIdx = {tx, ty, tz};
        kernel();
    }
}

static unsigned r3_cover(unsigned work, unsigned divisor, unsigned block) {
    unsigned threads = (work + divisor - 1) / divisor;
    return (threads + block - 1) / block;
}
"""


def compiler() -> str:
    found = shutil.which("g++")
    if found is None:
        pytest.skip("no g++ on this machine to run kernels on the CPU")
    return found


def run(source: str, driver: str, tmp: Path, defines: dict[str, int] | None = None,
        name: str = "kernel") -> str:
    """Compile ``source`` (the kernel) with ``driver`` (C++ that defines ``main``, launches
    through ``launch(grid, block, [&] { k(...); })`` and prints what it checks), run it, and
    give its standard output."""
    unit = tmp / f"{name}.cpp"
    unit.write_text(PRELUDE + "\n" + source + "\n" + driver)
    exe = tmp / name
    flags = [f"-D{k}={v}" for k, v in (defines or {}).items()]
    built = subprocess.run([compiler(), "-std=c++17", "-O1", "-w", "-ffp-contract=off",
                            *flags, str(unit), "-o", str(exe)],
                           capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr[-4000:] + "\n" + source
    ran = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr[-2000:]
    return ran.stdout
