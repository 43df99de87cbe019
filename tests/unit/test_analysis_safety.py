"""The static checks on candidates, on real sources: the example kernels, the CG application and
the GPU test applications, each against variants written here the way a model might write them
(adversarial ones that must be refused or reported, honest ones that must pass)."""

from __future__ import annotations

import gc
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from r3tui.analysis.cuda import parse_translation_unit
from r3tui.analysis.safety import FindingKind, SafetyReport, check_candidate, is_device_header

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(ROOT.glob("examples/*/kernel.cu"))
CG = ROOT / "examples/apps/cg/cg.cu"
APPS = ROOT / "tests/gpu/apps"
HEAT = APPS / "header_app/heat.cu"
REAL_SOURCES = [*EXAMPLES, CG, APPS / "record_app.cu", APPS / "graph_app.cu", HEAT,
                APPS / "header_app/heat.h"]


def read(path: Path) -> str:
    return path.read_text()


def sgemm() -> str:
    return read(ROOT / "examples/sgemm/kernel.cu")


def cg() -> str:
    return read(CG)


def edit(source: str, old: str, new: str) -> str:
    assert source.count(old) == 1, f"{old!r} must occur once"
    return source.replace(old, new)


def ids(path: Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.mark.parametrize("path", REAL_SOURCES, ids=ids)
def test_identical_sources_give_no_findings(path: Path) -> None:
    source = read(path)
    report = check_candidate(source, source)
    assert report == SafetyReport()
    assert not report.refused and report.reason is None


@pytest.mark.parametrize("path", REAL_SOURCES, ids=ids)
def test_comments_and_layout_are_not_changes(path: Path) -> None:
    source = read(path)
    relaid = "/* reformatted */\n" + re.sub(r"(?m)^[ \t]*//.*\n", "", source).replace(
        "    ", "\t")
    assert relaid != source
    assert check_candidate(source, relaid).findings == ()
    assert check_candidate(source, source.replace("\n", "\r\n")).findings == ()


@dataclass(frozen=True)
class Case:
    name: str
    original: Callable[[], str]
    candidate: Callable[[], str]
    kind: FindingKind
    refused: bool
    names: str  # the construct the message must name
    module_state: tuple[str, ...] = ()
    also: frozenset[FindingKind] = frozenset()  # other kinds the variant gives as well


KERNEL_LINE = "    float sum = 0.0f;\n"


SPY = 'void spy() { std::system("id"); }\nint blocks_for('


def in_sgemm(statement: str) -> Callable[[], str]:
    return lambda: edit(sgemm(), KERNEL_LINE, f"    {statement}\n{KERNEL_LINE}")


HELPER = "__host__ __device__ inline float scale(float x) { return 2.0f * x; }\n"

ADVERSARIAL = [
    Case("main added", sgemm, lambda: sgemm() + "\nint main() { return 0; }\n",
         FindingKind.HOST_CODE, True, "host function 'main'"),
    Case("system in a new host function", cg,
         lambda: edit(cg(), "int blocks_for(", SPY),
         FindingKind.HOST_CODE, True, "'(anonymous)::spy'"),
    Case("#include <cstdlib> added", sgemm, lambda: "#include <cstdlib>\n" + sgemm(),
         FindingKind.INCLUDE, True, "<cstdlib>"),
    Case("a host function's body changed", cg,
         lambda: edit(cg(), "return (n + block - 1) / block;", "return (n + block) / block;"),
         FindingKind.HOST_CODE, True, "host function '(anonymous)::blocks_for'"),
    Case("main of an application changed", lambda: read(HEAT),
         lambda: edit(read(HEAT), 'fopen(argv[1], "w")', 'fopen("/tmp/x", "w")'),
         FindingKind.HOST_CODE, True, "host function 'main' (line 20) differs"),
    Case("a host global initialized by system()", cg,
         lambda: edit(cg(), "namespace cg {", 'static int x = system("id");\nnamespace cg {'),
         FindingKind.HOST_CODE, True, "host global 'x'"),
    Case("a __host__ __device__ helper changed", lambda: HELPER + sgemm(),
         lambda: HELPER.replace("2.0f", "3.0f") + sgemm(),
         FindingKind.HOST_CODE, True, "__host__ __device__ function 'scale'"),
    Case("#define printf system", cg,
         lambda: edit(cg(), "namespace cg {", "#define printf system\nnamespace cg {"),
         FindingKind.HOST_CODE, True, "'printf'"),
    Case("a macro the host code uses redefined", lambda: read(APPS / "record_app.cu"),
         lambda: edit(read(APPS / "record_app.cu"), "#define CHECK(call) do {",
                      "#define CHECK(call) do { (void)0;"),
         FindingKind.HOST_CODE, True, "#define of 'CHECK'"),
    Case("a member initializer the host runs", cg,
         lambda: edit(cg(), "int n = CG_N;", "int n = atoi(getenv(\"N\"));"),
         FindingKind.HOST_CODE, True, "type '(anonymous)::Options'"),
    Case("a qualifier hidden in a comment", sgemm,
         lambda: "/* __device__ */ int helper(int x) { return x; }\n" + sgemm(),
         FindingKind.HOST_CODE, True, "host function 'helper'"),
    Case("a qualifier only one macro definition gives", sgemm,
         lambda: "#ifdef NEVER\n#define QUAL __device__\n#else\n#define QUAL\n#endif\n"
                 "QUAL int helper(int x) { return x; }\n" + sgemm(),
         FindingKind.HOST_CODE, True, "host function 'helper'",
         also=frozenset({FindingKind.PARSE})),  # the grammar cannot expand QUAL
    Case("a macro invoked at namespace scope", sgemm,
         lambda: "#define MAKE(n) int n() { return 0; }\nMAKE(main);\n" + sgemm(),
         FindingKind.HOST_CODE, True, "MAKE ( main )"),
    Case("asm at namespace scope", sgemm, lambda: '__asm__(".globl hook");\n' + sgemm(),
         FindingKind.HOST_CODE, True, "asm at namespace scope"),
    Case("an include path out of the include directories", sgemm,
         lambda: "#include <cub/../../../etc/evil.h>\n" + sgemm(),
         FindingKind.INCLUDE, True, "<cub/../../../etc/evil.h>"),
    Case('a device header included with "..."', sgemm,
         lambda: '#include "cuda_fp16.h"\n' + sgemm(),
         FindingKind.INCLUDE, True, '"cuda_fp16.h"'),
    Case("malloc in a kernel", sgemm, in_sgemm("float* scratch = (float*)malloc(64);"),
         FindingKind.HEAP, True, "'malloc'"),
    Case("new in a kernel", sgemm, in_sgemm("float* scratch = new float[16];"),
         FindingKind.HEAP, True, "'operator new'"),
    Case("clock64() in a kernel", sgemm, in_sgemm("long long t0 = clock64();"),
         FindingKind.CLOCK, True, "'clock64'"),
    Case("%globaltimer read by inline asm", sgemm,
         in_sgemm('unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));'),
         FindingKind.CLOCK, True, "'%globaltimer'"),
    Case("%smid read by inline asm", sgemm,
         in_sgemm('unsigned s; asm("mov.u32 %0, %%smid;" : "=r"(s));'),
         FindingKind.CLOCK, True, "'%smid'"),
    Case("a cuda::std::chrono clock", sgemm,
         in_sgemm("auto now = cuda::std::chrono::system_clock::now();"),
         FindingKind.CLOCK, True, "cuda::std::chrono::system_clock::now"),
    Case("a new __device__ array written by a kernel", sgemm,
         lambda: "__device__ int done[1024];\n"
                 + edit(sgemm(), KERNEL_LINE, f"    done[row % 1024] = 1;\n{KERNEL_LINE}"),
         FindingKind.MODULE_STATE, False, "__device__ variable 'done'", ("done",)),
    Case("a static __device__ counter", sgemm,
         lambda: "static __device__ int counter;\n"
                 + edit(sgemm(), KERNEL_LINE, f"    atomicAdd(&counter, 1);\n{KERNEL_LINE}"),
         FindingKind.MODULE_STATE, False, "'counter'", ("counter",)),
    Case("a function-scope static counter", sgemm, in_sgemm("static int calls; calls++;"),
         FindingKind.MODULE_STATE, False, "static 'sgemm::calls'", ("sgemm::calls",)),
    Case("a new __managed__ variable", sgemm, lambda: "__managed__ int flag;\n" + sgemm(),
         FindingKind.MODULE_STATE, True, "__managed__ variable 'flag'", ("flag",)),
    Case("a syntax error", sgemm, in_sgemm("float broken = ;"),
         FindingKind.PARSE, False, "line 21"),
    # a model's edit with a '}' too many leaves the kernel's last statements outside it:
    # plain code no macro can expand, so the compiler reports it and a repair turn gets that
    # error (Qwen2.5-Coder on nbody: 5 of 16 answers, refused as host code until session 31)
    Case("code left outside the kernel by a '}' too many", sgemm, in_sgemm("}"),
         FindingKind.PARSE, False, "at namespace scope (line 27): code outside any function"),
    Case("the same, with a statement that names a macro", sgemm,
         lambda: "#define HOOK(x) int main() { return 0; } int v##x\n" + edit(
             sgemm(), KERNEL_LINE, f"    }}\n    HOOK(x) = 1;\n{KERNEL_LINE}"),
         FindingKind.HOST_CODE, True, "a macro there can expand to host code",
         also=frozenset({FindingKind.PARSE})),
]


@pytest.mark.parametrize("case", ADVERSARIAL, ids=lambda c: c.name)
def test_adversarial_variants(case: Case) -> None:
    report = check_candidate(case.original(), case.candidate())
    assert {f.kind for f in report.findings} == {case.kind} | case.also
    assert report.refused is case.refused
    assert any(case.names in f.message for f in report.findings), report.findings
    assert report.module_state == case.module_state
    if case.refused:
        assert report.reason is not None and case.names in report.reason
    assert all("\n" not in f.message for f in report.findings)


def test_a_host_function_calling_system_gives_both_findings() -> None:
    candidate = edit(cg(), "int blocks_for(", SPY)
    report = check_candidate(cg(), candidate)
    messages = [f.message for f in report.findings]
    assert messages == [
        "host function '(anonymous)::spy' (line 211) is not in the original",
        "call to 'system' (line 211) in new code",
    ]
    assert report.reason == "; ".join(messages)
    assert [f.line for f in report.findings] == [211, 211]


def test_text_the_parser_cannot_read_still_refuses_host_code_in_it() -> None:
    candidate = sgemm() + '\nvoid broken( { int x = ; }\nint main() { return system("id"); }\n'
    report = check_candidate(sgemm(), candidate)
    assert report.refused
    assert FindingKind.PARSE in {f.kind for f in report.findings}
    refusing = [f for f in report.findings if f.refuses]
    assert refusing and all(f.kind is FindingKind.HOST_CODE for f in refusing)
    assert "'main'" in refusing[0].message


def test_clock_reads_the_original_already_has_are_not_new() -> None:
    original = in_sgemm("long long t0 = clock64();")()
    candidate = edit(original, "float sum = 0.0f;", "float sum = 0.0f; long long t1 = clock64();")
    assert check_candidate(original, candidate).findings == ()


TILED_SGEMM = """
#define TILE 16
template <typename T>
__device__ __forceinline__ T fma_acc(T a, T b, T c) { return a * b + c; }

extern "C" __global__ void sgemm(int M, int N, int K, float alpha,
                                 const float* __restrict__ A, const float* __restrict__ B,
                                 float beta, float* __restrict__ C)
{
    __shared__ float As[TILE][TILE];
    __shared__ float Bs[TILE][TILE];
    int col = blockIdx.x * TILE + threadIdx.x;
    int row = blockIdx.y * TILE + threadIdx.y;
    float sum = 0.0f;
    for (int t = 0; t < K; t += TILE) {
        As[threadIdx.y][threadIdx.x] = (row < M && t + threadIdx.x < K)
            ? A[(long long)row * K + t + threadIdx.x] : 0.0f;
        Bs[threadIdx.y][threadIdx.x] = (col < N && t + threadIdx.y < K)
            ? B[(long long)(t + threadIdx.y) * N + col] : 0.0f;
        __syncthreads();
        #pragma unroll 4
        for (int k = 0; k < TILE; ++k) sum = fma_acc(As[threadIdx.y][k], Bs[k][threadIdx.x], sum);
        __syncthreads();
    }
    if (row < M && col < N) {
        long long idx = (long long)row * N + col;
        C[idx] = alpha * sum + beta * C[idx];
    }
}
"""

SHUFFLE_REDUCE = """
#ifndef MAX_THREADS
#define MAX_THREADS 1024
#endif
#include <cuda_fp16.h>

__device__ __forceinline__ float warp_sum(float v)
{
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffffu, v, offset);
    return v;
}

extern "C" __global__ void reduce_sum(const float* __restrict__ x, double* out, int n)
{
    __shared__ float warp_totals[MAX_THREADS / 32];
    unsigned int nthreads = blockDim.x * blockDim.y * blockDim.z;
    unsigned int tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    unsigned long long block = blockIdx.x + (unsigned long long)gridDim.x
                             * (blockIdx.y + (unsigned long long)gridDim.y * blockIdx.z);
    unsigned long long i = block * nthreads + tid;
    float v = warp_sum((i < (unsigned long long)n) ? x[i] : 0.0f);
    if (tid % 32 == 0) warp_totals[tid / 32] = v;
    __syncthreads();
    if (tid < 32) {
        v = (tid < (nthreads + 31) / 32) ? warp_totals[tid] : 0.0f;
        v = warp_sum(v);
        if (tid == 0) atomicAdd(out, (double)v);
    }
}
"""

WARP_SPMV = """
__global__ void __launch_bounds__(CG_BLOCK_SPMV)
spmv_csr(CsrMatrix a, const double* __restrict__ x, double* __restrict__ y) {
    int lane = threadIdx.x % 32;
    int row = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
    if (row >= a.n) return;
    double sum = 0.0;
    for (int k = a.rowptr[row] + lane; k < a.rowptr[row + 1]; k += 32) {
        sum += a.values[k] * __ldg(&x[a.colidx[k]]);
    }
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_down_sync(~0u, sum, offset);
    if (lane == 0) y[row] = sum;
}
"""


def cg_with_warp_spmv() -> str:
    source = cg()
    start = source.index("__global__ void __launch_bounds__(CG_BLOCK_SPMV)")
    end = source.index("// partial[b]")
    return source[:start] + WARP_SPMV.lstrip() + "\n" + source[end:]


HONEST: list[tuple[str, Callable[[], str], Callable[[], str]]] = [
    ("__restrict__ and const added", sgemm,
     lambda: edit(sgemm(), "const float* A, const float* B,",
                  "const float* __restrict__ A, const float* __restrict__ B,")),
    ("a loop unrolled with #pragma unroll 4", sgemm,
     lambda: edit(sgemm(), "    for (int k = 0;", "    #pragma unroll 4\n    for (int k = 0;")),
    ("a new __device__ __forceinline__ helper", sgemm,
     lambda: "__device__ __forceinline__ float mul(float a, float b) { return a * b; }\n"
             + edit(sgemm(), "sum += A[", "sum += mul(1.0f, A[").replace(
                 "* B[(long long)k * N + col];", "* B[(long long)k * N + col]);")),
    ("a new #define TILE 16", sgemm, lambda: "#define TILE 16\n" + sgemm()),
    ("#include <cuda_fp16.h> added", sgemm, lambda: "#include <cuda_fp16.h>\n" + sgemm()),
    ("a kernel rewritten with __shared__ tiles and a template helper", sgemm,
     lambda: TILED_SGEMM),
    ("a reduction rewritten with __shfl_down_sync", lambda: read(ROOT / "examples/reduce_sum/"
                                                                 "kernel.cu"),
     lambda: SHUFFLE_REDUCE),
    ("an application's kernel rewritten warp-per-row", cg, cg_with_warp_spmv),
    ("a new __constant__ table and constexpr", sgemm,
     lambda: "__constant__ float kWeights[4] = {1.0f, 2.0f, 3.0f, 4.0f};\n"
             "constexpr int kUnroll = 4;\n" + sgemm()),
    ("a struct of device-only members", sgemm,
     lambda: "struct __align__(16) Acc { float v; __device__ void add(float x) { v += x; } };\n"
             + sgemm()),
]


@pytest.mark.parametrize(("name", "original", "candidate"), HONEST, ids=[h[0] for h in HONEST])
def test_honest_variants_pass_without_findings(
        name: str, original: Callable[[], str], candidate: Callable[[], str]) -> None:
    report = check_candidate(original(), candidate())
    assert report.findings == (), name
    assert not report.refused and report.module_state == ()


def test_device_headers() -> None:
    for header in ("cuda_fp16.h", "cooperative_groups/reduce.h", "cuda/std/atomic",
                   "cub/block/block_reduce.cuh", "sm_61_intrinsics.h", "cstdint", "cuda/barrier"):
        assert is_device_header(header), header
    for header in ("cstdlib", "stdlib.h", "cstdio", "unistd.h", "fstream", "cub/../../x.h",
                   "/usr/include/stdlib.h", "cuda/std/../../../stdlib.h"):
        assert not is_device_header(header), header


def test_a_two_thousand_line_unit_is_checked_quickly() -> None:
    kernel = read(ROOT / "examples/softmax/kernel.cu")
    copies = [kernel.replace("softmax(", f"softmax_{i}(").replace("MAX_THREADS", f"MAX_{i}")
              for i in range(40)]
    original = "\n".join(copies)
    candidate = original.replace("s += expf(", "s += __expf(")
    assert len(original.splitlines()) >= 2000
    # the best of three, each from a cold parse cache and with the collector held: in the whole
    # suite's process one run took 0.63 s on the CI machine (session 38) where it takes
    # 0.07-0.10 s alone, a collection of the suite's heap or another process's burst
    times = []
    for _ in range(3):
        parse_translation_unit.cache_clear()
        gc.collect()
        gc.disable()
        try:
            start = time.perf_counter()
            report = check_candidate(original, candidate)
            times.append(time.perf_counter() - start)
        finally:
            gc.enable()
        assert report.findings == ()
    assert min(times) < 0.5, ", ".join(f"{t:.3f} s" for t in times)


def test_an_include_inside_a_kernel_body_is_an_include() -> None:
    report = check_candidate(sgemm(), in_sgemm('\n#include "/etc/hostname"\n')())
    assert [f.kind for f in report.findings if f.refuses] == [FindingKind.INCLUDE]
    assert '"/etc/hostname"' in str(report.reason)
