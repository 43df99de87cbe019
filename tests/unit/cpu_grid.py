"""Run a CUDA kernel on this CPU, for tests without a GPU.

The kernel's source is compiled as C++ by the machine's g++ with a prelude that defines the
built-in indices and the few CUDA names the examples use.  :func:`launch` (``launch(grid,
block, [&] { k(...); })``) calls the kernel once per thread of the grid, one after another:
exact for a kernel whose threads neither synchronize nor share memory (the kernels the
coarsening rule accepts).  ``launch_threads`` runs each block's threads at once, one system
thread each, so ``__syncthreads()`` (a barrier a thread that returned no longer waits for) and
``__shfl_xor_sync`` (lanes exchange through a barrier over the lanes of its mask; a lane
outside the mask, reading or read, aborts the run, and a lane of the mask that never comes
stops it by an alarm) behave as the GPU's do for such code.  Both are real compiles and real
runs: what a rewrite changes in what a kernel computes shows in its output.  Not a stand-in
for the GPU's timing or memory model.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

PRELUDE = r"""
#include <barrier>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <unistd.h>
#include <vector>
struct uint3 { unsigned x, y, z; };
struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
static thread_local uint3 threadIdx, blockIdx;
static thread_local unsigned r3_linear;  // the thread's place in its block
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

// __syncthreads: one barrier a block; a thread that returns drops out of it
static std::barrier<>* r3_block_barrier = nullptr;
static void __syncthreads() { r3_block_barrier->arrive_and_wait(); }

// warp shuffles: the lanes of one mask of one warp meet at a barrier of their own
struct r3_exchange {
    std::barrier<> meet;
    unsigned long long slot[32];
    explicit r3_exchange(int lanes) : meet(lanes) {}
};
static std::mutex r3_exchanges_lock;
static std::map<std::pair<unsigned, unsigned>, std::unique_ptr<r3_exchange>> r3_exchanges;

template <class T>
static T __shfl_xor_sync(unsigned mask, T value, int offset, int width = 32) {
    static_assert(sizeof(T) <= sizeof(unsigned long long), "one lane's slot");
    unsigned lane = r3_linear % 32, warp = r3_linear / 32;
    unsigned from = (lane & ~(unsigned)(width - 1)) | ((lane ^ (unsigned)offset) & (width - 1));
    if (!((mask >> lane) & 1u) || !((mask >> from) & 1u)) {
        fprintf(stderr, "lane %u of warp %u shuffles with lane %u outside mask %#x\n", lane,
                warp, from, mask);
        std::abort();
    }
    r3_exchange* ex;
    {
        std::lock_guard<std::mutex> hold(r3_exchanges_lock);
        auto& made = r3_exchanges[{warp, mask}];
        if (!made) made = std::make_unique<r3_exchange>(__builtin_popcount(mask));
        ex = made.get();
    }
    std::memcpy(&ex->slot[lane], &value, sizeof(T));
    ex->meet.arrive_and_wait();
    T out;
    std::memcpy(&out, &ex->slot[from], sizeof(T));
    ex->meet.arrive_and_wait();  // every lane has read before any writes again
    return out;
}

template <class F>
static void launch_threads(dim3 grid, dim3 block, F kernel) {
    alarm(60);  // a lane that never meets its mask's others: the run stops, not the suite
    gridDim = grid;
    blockDim = block;
    unsigned volume = block.x * block.y * block.z;
    for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
    for (unsigned bx = 0; bx < grid.x; ++bx) {
        std::barrier<> sync((std::ptrdiff_t)volume);
        r3_block_barrier = &sync;
        std::vector<std::thread> threads;
        for (unsigned t = 0; t < volume; ++t) {
            threads.emplace_back([&, t] {
                blockIdx = {bx, by, bz};
                threadIdx = {t % block.x, t / block.x % block.y, t / (block.x * block.y)};
                r3_linear = t;
                kernel();
                sync.arrive_and_drop();
            });
        }
        for (auto& thread : threads) thread.join();
        r3_exchanges.clear();
    }
    alarm(0);
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
    built = subprocess.run([compiler(), "-std=c++20", "-pthread", "-O1", "-w",
                            "-ffp-contract=off",
                            *flags, str(unit), "-o", str(exe)],
                           capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr[-4000:] + "\n" + source
    ran = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr[-2000:]
    return ran.stdout
