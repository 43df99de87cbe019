"""Run a CUDA kernel on this CPU, for tests without a GPU.

The kernel's source is compiled as C++ by the machine's g++ with a prelude that defines the
built-in indices and the few CUDA names the examples use.  :func:`launch` (``launch(grid,
block, [&] { k(...); })``) calls the kernel once per thread of the grid, one after another:
exact for a kernel whose threads neither synchronize nor share memory (the kernels the
coarsening rule accepts).  ``launch_threads`` runs each block's threads at once, one system
thread each, so ``__syncthreads()`` (a barrier a thread that returned no longer waits for; a
block whose threads reach different numbers of barriers aborts the run), shared memory (one
buffer for the dynamic shared memory, the blocks running one after another) and
``__shfl_xor_sync`` (lanes exchange through a barrier over the lanes of its mask; a lane
outside the mask, reading or read, aborts the run, and a lane of the mask that never comes
stops it by an alarm) behave as the GPU's do for such code.  Both are real compiles and real
runs: what a rewrite changes in what a kernel computes shows in its output.  Not a stand-in
for the GPU's timing or memory model.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Mapping
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
#define __shared__
#define __align__(n)
// a block's dynamic shared memory: every `extern __shared__ T name[];` names it (run() makes
// such a declaration a pointer to it); the blocks run one after another, so one buffer serves
alignas(16) unsigned char r3_dynamic_shared[1 << 20];

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

// __syncthreads: one barrier a block; a thread that returns drops out of it.  Each thread
// counts the barriers it reaches: a block whose threads reach different numbers of them aborts
// the run (on the GPU a barrier not every thread of the block reaches is undefined)
static std::barrier<>* r3_block_barrier = nullptr;
static thread_local unsigned long r3_barriers;
static void __syncthreads() { ++r3_barriers; r3_block_barrier->arrive_and_wait(); }
// the rewrites' barrier for threads at different places of the code (PTX's barrier.sync
// without .aligned): here the same as __syncthreads, which meets threads wherever they are
#define R3_BARRIER() __syncthreads()

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
        // what no thread of the block wrote reads as NaN
        std::memset(r3_dynamic_shared, 0xff, sizeof r3_dynamic_shared);
        std::barrier<> sync((std::ptrdiff_t)volume);
        r3_block_barrier = &sync;
        std::vector<std::thread> threads;
        std::vector<unsigned long> reached(volume);
        for (unsigned t = 0; t < volume; ++t) {
            threads.emplace_back([&, t] {
                blockIdx = {bx, by, bz};
                threadIdx = {t % block.x, t / block.x % block.y, t / (block.x * block.y)};
                r3_linear = t;
                r3_barriers = 0;
                kernel();
                reached[t] = r3_barriers;
                sync.arrive_and_drop();
            });
        }
        for (auto& thread : threads) thread.join();
        for (unsigned t = 1; t < volume; ++t) {
            if (reached[t] != reached[0]) {
                fprintf(stderr, "block (%u,%u,%u): thread %u reached %lu barriers, thread 0 %lu\n",
                        bx, by, bz, t, reached[t], reached[0]);
                std::abort();
            }
        }
        r3_exchanges.clear();
    }
    alarm(0);
}

static unsigned r3_cover(unsigned work, unsigned divisor, unsigned block) {
    unsigned threads = (work + divisor - 1) / divisor;
    return (threads + block - 1) / block;
}
"""


# `extern __shared__ [__align__(n)] T name[];`: the block's dynamic shared memory
_EXTERN_SHARED = re.compile(r"\bextern\s+__shared__\s+(?:__align__\s*\(\s*\d+\s*\)\s+)?"
                            r"(?P<type>[A-Za-z_][\w\s]*?)\s+(?P<name>\w+)\s*\[\s*\]\s*;")


def compiler() -> str:
    found = shutil.which("g++")
    if found is None:
        pytest.skip("no g++ on this machine to run kernels on the CPU")
    return found


def build(source: str, driver: str, tmp: Path, defines: Mapping[str, int | str] | None = None,
          name: str = "kernel", sanitize: bool = False) -> Path:
    """Compile ``source`` (the kernel) with ``driver`` (C++ that defines ``main``, launches
    through ``launch(grid, block, [&] { k(...); })`` and prints what it checks): the
    executable.  ``sanitize``: built with AddressSanitizer, so a read or write outside the
    driver's arrays stops the run.  A define may be an expression the driver evaluates when it
    runs (``{"BX": RUNTIME.format("BX")}`` takes the block's x extent from the environment,
    one build for every block)."""
    unit = tmp / f"{name}.cpp"
    source = _EXTERN_SHARED.sub(
        lambda m: f"{m['type']}* const {m['name']} = reinterpret_cast<{m['type']}*>("
                  "r3_dynamic_shared);", source)
    unit.write_text(PRELUDE + "\n" + source + "\n" + driver)
    exe = tmp / name
    flags = [f"-D{k}={v}" for k, v in (defines or {}).items()]
    if sanitize:
        flags += ["-fsanitize=address", "-fno-omit-frame-pointer"]
    built = subprocess.run([compiler(), "-std=c++20", "-pthread", "-O1", "-w",
                            "-ffp-contract=off",
                            *flags, str(unit), "-o", str(exe)],
                           capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr[-4000:] + "\n" + source
    return exe


# a define read from the environment when the program runs: RUNTIME.format("BX")
RUNTIME = "atoi(getenv(\"R3_{}\"))"


def execute(exe: Path, env: dict[str, int] | None = None) -> str:
    """Run a built kernel (``env``: the values of its RUNTIME defines): its standard output."""
    import os

    extra = {f"R3_{k}": str(v) for k, v in (env or {}).items()}
    ran = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120,
                         env={**os.environ, **extra})
    assert ran.returncode == 0, ran.stderr[-2000:]
    return ran.stdout


def run(source: str, driver: str, tmp: Path, defines: dict[str, int] | None = None,
        name: str = "kernel", sanitize: bool = False) -> str:
    """:func:`build` and :func:`execute` at once: the program's standard output."""
    return execute(build(source, driver, tmp, dict(defines or {}), name, sanitize))
