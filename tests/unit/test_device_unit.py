"""The device unit of an application's kernel: headers inlined, host code left out, origins kept.

The units are small C++ programs written here with the structures real applications have: the
kernel in a header, a template in a namespace, host code and standard headers in the unit,
cooperative groups, a type with host-only members.  Each device unit is compiled by real NVRTC.
"""

from __future__ import annotations

import pytest

from r3tui.analysis.device_unit import DeviceUnitError, device_unit
from r3tui.compile.base import CompileRequest, get_toolchain
from r3tui.compile.nvrtc import default_include_dirs
from r3tui.engine.unit_source import needs_device_unit

PARAMS_H = """\
#ifndef PARAMS_H
#define PARAMS_H
#include <vector>
constexpr float kScale = 0.5f;
static const int kIters = 10;
inline void print_params() { std::printf("%d\\n", kIters); }
#endif
"""

KERNELS_CUH = """\
#pragma once
#include <cmath>
#include <cstdint>
#include "params.h"
#define TILE 16

namespace app {
namespace detail {
template <typename T>
__device__ __forceinline__ T square(T x) { return x * x; }
}  // namespace detail

struct Grid {
  int nx, ny;
  __host__ __device__ int index(int x, int y) const { return y * nx + x; }
  std::vector<float> host_copy() const { return std::vector<float>(nx * ny); }
};

// the kernel the application launches
template <typename T, int R>
__global__ void stencil(const T* __restrict__ in, T* out, Grid g, uint32_t n) {
  int x = blockIdx.x * TILE + threadIdx.x;
  int y = blockIdx.y * TILE + threadIdx.y;
  if (x >= g.nx || y >= g.ny) return;
  T acc = 0;
  for (int d = -R; d <= R; ++d)
    acc += detail::square(in[g.index(min(max(x + d, 0), g.nx - 1), y)]);
  out[g.index(x, y)] = acc * kScale + std::sqrt(T(1)) + T(M_PI) * 0;
}

__global__ void unused_kernel(float* p) { p[0] = 1; }
}  // namespace app

namespace other {
__global__ void stencil(float* p) { p[0] = 2; }
}
"""

MAIN_CU = """\
#include <chrono>
#include <cstdio>
#include <vector>
#include <cuda_runtime.h>
#include "kernels.cuh"
#include "params.h"
#include "missing_optional.h"

static void reference(const std::vector<float>& in, std::vector<float>& out) {
  for (size_t i = 0; i < in.size(); ++i) out[i] = in[i];
}

int main(int argc, char** argv) {
  auto t0 = std::chrono::steady_clock::now();
  app::Grid g{256, 256};
  std::vector<float> h(g.nx * g.ny, 1.f), r(h.size());
  float *d_in, *d_out;
  cudaMalloc(&d_in, h.size() * 4);
  cudaMalloc(&d_out, h.size() * 4);
  dim3 block(TILE, TILE), grid(g.nx / TILE, g.ny / TILE);
  for (int i = 0; i < kIters; ++i)
    app::stencil<float, 2><<<grid, block>>>(d_in, d_out, g, h.size());
  reference(h, r);
  printf("time %f\\n",
         std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}
"""

HEADERS = {"src/kernels.cuh": KERNELS_CUH, "src/params.h": PARAMS_H}


def _compile(text: str, kernel: str) -> None:
    result = get_toolchain("nvrtc").compile(CompileRequest(text, kernel))
    assert result.ok, result.log


def test_a_kernel_in_a_header_becomes_a_device_unit_that_nvrtc_compiles() -> None:
    unit = device_unit(MAIN_CU, "stencil", HEADERS, ["src"],
                       cuda_include_dirs=default_include_dirs(), scopes=["app"])
    _compile(unit.text, "app::stencil<float, 2>")
    # host code and host headers are gone; the device code the kernel reaches is there
    for gone in ("int main", "reference(", "std::chrono", "print_params", "host_copy",
                 "unused_kernel", "<vector>", "kIters"):
        assert gone not in unit.text
    for kept in ("square(T x)", "int index(int x, int y)", "kScale", "#define TILE 16"):
        assert kept in unit.text
    assert "host function main" in unit.dropped and "host function reference" in unit.dropped
    assert any("missing_optional.h" in d for d in unit.dropped)
    assert "#include <cuda/std/cmath>" in unit.text and "#include <cuda_runtime.h>" in unit.text
    # the definition maps back to the header that defines it, character for character
    assert unit.file == "src/kernels.cuh"
    start, end = unit.kernel_span
    file_start, file_end = unit.file_span
    assert unit.text[start:end] == KERNELS_CUH[file_start:file_end]
    assert unit.text[start:end].startswith("template <typename T, int R>\n__global__ void stencil")
    assert unit.text[start:end].endswith("}")


def test_the_namespace_of_the_entry_point_picks_the_definition() -> None:
    unit = device_unit(MAIN_CU, "stencil", HEADERS, ["src"],
                       cuda_include_dirs=default_include_dirs(), scopes=["other"])
    assert unit.text[unit.kernel_span[0]:unit.kernel_span[1]].endswith("p[0] = 2; }")
    _compile(unit.text, "other::stencil")
    with pytest.raises(DeviceUnitError, match="no __global__ function 'stencil' in namespace x"):
        device_unit(MAIN_CU, "stencil", HEADERS, ["src"], scopes=["x"])
    with pytest.raises(DeviceUnitError, match="'nothing'"):
        device_unit(MAIN_CU, "nothing", HEADERS, ["src"])


COOPERATIVE_CU = """\
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
#include <iostream>
namespace cg = cooperative_groups;

template <int BLOCK>
__global__ void block_sum(const float* x, float* out, int n) {
  cg::thread_block block = cg::this_thread_block();
  cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
  float v = 0;
  for (int i = block.thread_rank() + blockIdx.x * BLOCK; i < n; i += gridDim.x * BLOCK) v += x[i];
  v = cg::reduce(warp, v, cg::plus<float>());
  if (warp.thread_rank() == 0) atomicAdd(out, v);
}

int main() {
  std::cout << "launch" << std::endl;
  block_sum<256><<<1, 256>>>(nullptr, nullptr, 0);
}
"""


def test_a_unit_with_cooperative_groups_and_iostream_keeps_the_device_headers() -> None:
    assert needs_device_unit(COOPERATIVE_CU, has_headers=False)
    unit = device_unit(COOPERATIVE_CU, "block_sum", {}, ["."],
                       cuda_include_dirs=default_include_dirs(), scopes=[])
    assert unit.file is None  # defined in the unit itself
    assert "#include <cooperative_groups/reduce.h>" in unit.text
    assert "iostream" not in unit.text.split("#include <cooperative_groups/reduce.h>")[1]
    assert "std::cout" not in unit.text
    assert COOPERATIVE_CU[unit.file_span[0]:unit.file_span[1]] == \
        unit.text[unit.kernel_span[0]:unit.kernel_span[1]]
    _compile(unit.text, "block_sum<256>")


def test_a_standalone_kernel_needs_no_device_unit() -> None:
    pure = '#include <cuda_fp16.h>\nextern "C" __global__ void k(float* x) { x[0] = 1; }\n'
    assert not needs_device_unit(pure, has_headers=False)
    assert needs_device_unit(pure, has_headers=True)
    assert needs_device_unit(pure + "int main() { return 0; }\n", has_headers=False)


def test_fixed_width_integers_a_host_header_brought_in_are_declared() -> None:
    # rmsnorm in the corpus: int64_t reaches the unit through <cstdio>/<chrono> on the host;
    # the device unit drops those headers, so it must name <cuda/std/cstdint> itself
    unit_text = ('#include <cstdio>\n#include <chrono>\n'
                 '__global__ void scan(float* y, const int64_t n) {\n'
                 '  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) y[i] *= 2.f;\n}\n'
                 'int main() { std::printf("%d", 1); }\n')
    unit = device_unit(unit_text, "scan", {}, ["."], cuda_include_dirs=default_include_dirs())
    assert "#include <cuda/std/cstdint>" in unit.text and "int main" not in unit.text
    _compile(unit.text, "scan")


def test_fixed_width_integers_keep_the_host_build_types_under_nvrtc() -> None:
    # xsbench in the corpus: the host build (glibc, LP64) has uint64_t = unsigned long and
    # passes a uint64_t* where a function takes unsigned long*; CCCL under NVRTC would make it
    # unsigned long long and the original would not compile
    unit_text = ('#include <stdint.h>\n#include <cstdio>\n'
                 '__device__ int pick(unsigned long* seed) { return int(*seed % 7); }\n'
                 '__global__ void lookup(int* out, std::uint64_t n) {\n'
                 '  uint64_t seed = n; intptr_t i = threadIdx.x; out[i] = pick(&seed);\n}\n')
    unit = device_unit(unit_text, "lookup", {}, ["."], cuda_include_dirs=default_include_dirs())
    _compile(unit.text, "lookup")
    result = get_toolchain("nvcc").compile(CompileRequest(unit.text, "lookup"))
    assert result.ok or "not installed" in result.log, result.log
