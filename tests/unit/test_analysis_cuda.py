"""Facts read by tree-sitter from real CUDA sources: the example kernels, the CG application,
the GPU test applications and their headers, and small units written here for one construct."""

from __future__ import annotations

from pathlib import Path

import pytest

from r3tui.analysis.cuda import (
    ExecutionSpace,
    Item,
    ItemKind,
    MemorySpace,
    TranslationUnit,
    parse_translation_unit,
)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(ROOT.glob("examples/*/kernel.cu"))
CG = ROOT / "examples/apps/cg/cg.cu"
APPS = ROOT / "tests/gpu/apps"
HEADER_APP = APPS / "header_app"
REAL_SOURCES = [
    *EXAMPLES,
    CG,
    APPS / "record_app.cu",
    APPS / "graph_app.cu",
    HEADER_APP / "heat.cu",
    HEADER_APP / "heat.h",
    HEADER_APP / "include/heat/params.h",
]


def unit_of(path: Path) -> TranslationUnit:
    return parse_translation_unit(path.read_text())


def functions_by_name(unit: TranslationUnit) -> dict[str, Item]:
    return {str(f.qualified_name): f for f in unit.functions}


def test_the_real_sources_are_all_here() -> None:
    assert len(EXAMPLES) == 7
    assert all(path.is_file() for path in REAL_SOURCES)


@pytest.mark.parametrize("path", REAL_SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_real_sources_parse_without_errors(path: Path) -> None:
    unit = unit_of(path)
    assert unit.parse_errors == ()
    assert not unit.has_errors
    assert unit.items


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.parent.name)
def test_each_example_is_one_extern_c_kernel(path: Path) -> None:
    unit = unit_of(path)
    (kernel,) = unit.functions
    assert kernel.name == path.parent.name
    assert kernel.space is ExecutionSpace.GLOBAL
    assert kernel.scope == ""
    assert kernel.text.startswith('extern "C" __global__ void')
    assert not unit.defines_main
    assert unit.variables == () and unit.statics == () and unit.asm == ()
    assert all(call.space is ExecutionSpace.GLOBAL for call in unit.calls)


def test_reduce_sum_keeps_its_conditional_default_and_calls() -> None:
    unit = unit_of(ROOT / "examples/reduce_sum/kernel.cu")
    kinds = [(i.kind, i.name) for i in unit.items]
    assert kinds == [
        (ItemKind.CONDITIONAL, "MAX_THREADS"),
        (ItemKind.DEFINE, "MAX_THREADS"),
        (ItemKind.FUNCTION, "reduce_sum"),
    ]
    assert [c.name for c in unit.calls] == ["__syncthreads", "__syncthreads", "atomicAdd"]
    assert unit.macros[0].body == "1024"


def test_cg_application_kernels_host_code_and_includes() -> None:
    unit = unit_of(CG)
    functions = functions_by_name(unit)
    for kernel in ("cg::spmv_csr", "cg::dot_partial", "cg::reduce_final", "cg::update_xr",
                   "cg::detail::xpay"):
        assert functions[kernel].space is ExecutionSpace.GLOBAL, kernel
    for host in ("(anonymous)::parse", "(anonymous)::assemble", "(anonymous)::rhs",
                 "(anonymous)::blocks_for", "main"):
        assert functions[host].space is ExecutionSpace.HOST, host
    assert functions["main"].defines_main and unit.defines_main
    assert functions["cg::dot_partial"].text.startswith("template < int BLOCK > __global__")
    assert functions["cg::spmv_csr"].line == 76
    types = [i.qualified_name for i in unit.items if i.kind is ItemKind.TYPE]
    assert types == ["cg::CsrMatrix", "cg::CgVectors", "(anonymous)::Options"]
    assert [(i.target, i.system) for i in unit.includes] == [
        ("cuda_runtime.h", True), ("chrono", True), ("cmath", True), ("cstdint", True),
        ("cstdio", True), ("cstdlib", True), ("cstring", True), ("vector", True),
    ]
    conditionals = [i.name for i in unit.items if i.kind is ItemKind.CONDITIONAL]
    assert conditionals == ["CG_N", "CG_BLOCK_SPMV", "CG_BLOCK_DOT", "CG_BLOCK_UPDATE",
                            "CG_BLOCK_XPAY", "CG_DOT_BLOCKS"]
    check = next(m for m in unit.macros if m.name == "CUDA_CHECK")
    assert check.params == ("call",) and "std :: exit" in check.body
    host_calls = {c.name for c in functions["main"].calls}
    assert {"cudaMalloc", "cudaMemcpy", "cudaFree", "CUDA_CHECK", "spmv_csr"} <= host_calls
    assert all(c.space is ExecutionSpace.HOST for c in functions["main"].calls)
    device_calls = {c.name for c in unit.calls if c.space is ExecutionSpace.GLOBAL}
    assert device_calls == {"__syncthreads"}
    assert unit.variables == () and unit.statics == ()


def test_record_app_has_a_device_global_and_managed_memory_only_on_the_host() -> None:
    unit = unit_of(APPS / "record_app.cu")
    (bias,) = unit.variables
    assert (bias.name, bias.memory_space, bias.mutable, bias.line) == (
        "g_bias", MemorySpace.DEVICE, True, 15)
    functions = functions_by_name(unit)
    assert {name for name, f in functions.items() if f.space is ExecutionSpace.GLOBAL} == {
        "follow_pairs", "by_value", "with_global", "on_managed"}
    assert {"cudaMemcpyToSymbol", "cudaMallocManaged", "malloc"} <= {
        c.name for c in functions["main"].calls}


def test_graph_app_launches_are_calls_in_main() -> None:
    unit = unit_of(APPS / "graph_app.cu")
    main = functions_by_name(unit)["main"]
    names = [c.name for c in main.calls]
    assert names.count("step") == 3 and names.count("mix") == 2
    assert {"cudaGraphLaunch", "cudaStreamBeginCapture", "fopen"} <= set(names)


def test_header_app_unit_and_headers() -> None:
    heat = unit_of(HEADER_APP / "heat.cu")
    assert [(i.target, i.system) for i in heat.includes] == [
        ("cstdio", True), ("cstdlib", True), ("cuda_runtime.h", True), ("heat.h", False)]
    diffuse = functions_by_name(heat)["heat::diffuse"]
    assert diffuse.space is ExecutionSpace.GLOBAL
    assert [c.name for c in diffuse.calls] == ["relax"]

    header = unit_of(HEADER_APP / "heat.h")
    assert [(i.kind, i.name) for i in header.items][:3] == [
        (ItemKind.CONDITIONAL, "HEAT_H"), (ItemKind.DEFINE, "HEAT_H"),
        (ItemKind.INCLUDE, "<heat/params.h>")]
    relax = functions_by_name(header)["heat::relax"]
    assert relax.space is ExecutionSpace.DEVICE
    assert [i.qualified_name for i in header.items if i.kind is ItemKind.TYPE] == ["heat::Field"]

    params = unit_of(HEADER_APP / "include/heat/params.h")
    assert [(i.kind, i.name) for i in params.items if i.kind is not ItemKind.CONDITIONAL] == [
        (ItemKind.PRAGMA, "once"), (ItemKind.DEFINE, "HEAT_ALPHA"),
        (ItemKind.DEFINE, "HEAT_BLOCK")]


SPACES = """
int host_plain(int x) { return x; }
__host__ int host_marked(int x) { return x; }
__host__ __device__ int both(int x) { return x; }
__device__ __host__ int both_reversed(int x) { return x; }
__device__ int device_only(int x) { return x; }
static __device__ __forceinline__ int inlined(int x) { return x; }
#define DEV __device__ __forceinline__
DEV int through_macro(int x) { return x; }
/* __device__ */ int commented(int x) { return x; }
#ifdef SOMETIMES
#define QUAL __device__
#else
#define QUAL
#endif
QUAL int doubtful(int x) { return x; }
extern "C" { __global__ void in_block(float* y) { y[0] = 1.0f; } }
extern "C" __global__ void __launch_bounds__(256, 2) bounded(float* y) { y[0] = 2.0f; }
template <typename T> __device__ T square(T x) { return x * x; }
struct Vec {
    float x;
    Vec() = default;
    __device__ float get() const { return x; }
    __host__ __device__ float both_member() const { return x; }
    float host_member() const { return x; }
};
"""


def test_execution_spaces_from_qualifiers_macros_and_scopes() -> None:
    functions = functions_by_name(parse_translation_unit(SPACES))
    expected = {
        "host_plain": ExecutionSpace.HOST,
        "host_marked": ExecutionSpace.HOST,
        "both": ExecutionSpace.HOST_DEVICE,
        "both_reversed": ExecutionSpace.HOST_DEVICE,
        "device_only": ExecutionSpace.DEVICE,
        "inlined": ExecutionSpace.DEVICE,
        "through_macro": ExecutionSpace.DEVICE,
        "commented": ExecutionSpace.HOST,  # a qualifier in a comment is no qualifier
        "doubtful": ExecutionSpace.HOST,  # only one of the macro's definitions says device
        "in_block": ExecutionSpace.GLOBAL,
        "bounded": ExecutionSpace.GLOBAL,
        "square": ExecutionSpace.DEVICE,
        "Vec::get": ExecutionSpace.DEVICE,
        "Vec::both_member": ExecutionSpace.HOST_DEVICE,
        "Vec::host_member": ExecutionSpace.HOST,
    }
    assert {name: f.space for name, f in functions.items()} == expected  # `= default`: no code
    assert ExecutionSpace.HOST_DEVICE.on_host and ExecutionSpace.HOST_DEVICE.on_device
    assert not ExecutionSpace.GLOBAL.on_host and not ExecutionSpace.HOST.on_device


STATE = """
__device__ int done[1024];
__constant__ float coef[4];
__managed__ int flag;
extern __shared__ float dynamic_smem[];
static __device__ int counter;
__device__ const int limit = 3;
__device__ const float* table;
namespace ns { __device__ float total; }
constexpr int kTile = 16;
__global__ void k(float* y) {
    static int calls;
    static const int k_fixed = 3;
    static __shared__ float tile[32];
    extern __shared__ float more[];
    int local = 0;
    y[calls++] = tile[0] + local + more[0];
}
"""


def test_module_scope_variables_and_function_scope_statics() -> None:
    unit = parse_translation_unit(STATE)
    assert [(v.qualified_name, v.memory_space, v.mutable) for v in unit.variables] == [
        ("done", MemorySpace.DEVICE, True),
        ("coef", MemorySpace.CONSTANT, False),
        ("flag", MemorySpace.MANAGED, True),
        ("dynamic_smem", MemorySpace.SHARED, True),
        ("counter", MemorySpace.DEVICE, True),
        ("limit", MemorySpace.DEVICE, False),
        ("table", MemorySpace.DEVICE, True),  # a pointer to const is itself mutable
        ("ns::total", MemorySpace.DEVICE, True),
    ]
    assert [(s.qualified_name, s.memory_space, s.const) for s in unit.statics] == [
        ("k::calls", None, False),
        ("k::k_fixed", None, True),
        ("k::tile", MemorySpace.SHARED, False),
    ]
    host_constant = next(i for i in unit.items if i.name == "kTile")
    assert host_constant.memory_space is None and host_constant.dynamic_init is None


CALLS = """
#define TIMER "%%globaltimer"
__global__ void k(float* y) {
    float* p = (float*)malloc(16);
    int* q = new int[4];
    float* r = new (p) float(1.0f);
    delete[] q;
    long long t = clock64();
    unsigned long long g;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g));
    asm("mov.u64 %0, " TIMER ";" : "=l"(g));
    std::system("id");
    y[0] = __shfl_down_sync(0xffffffffu, y[0], 1) + *r;
}
"""


def test_calls_new_delete_and_inline_asm_in_a_body() -> None:
    unit = parse_translation_unit(CALLS)
    assert [c.name for c in unit.calls] == [
        "malloc", "operator new", "placement new", "operator delete", "clock64", "system",
        "__shfl_down_sync"]
    system = next(c for c in unit.calls if c.name == "system")
    assert (system.callee, system.function, system.line) == ("std::system", "k", 12)
    assert [a.text for a in unit.asm] == ["mov.u64 %0, %%globaltimer;"] * 2
    assert all(a.space is ExecutionSpace.GLOBAL for a in unit.asm)


def test_namespace_scope_initializers_that_run_code_are_named() -> None:
    unit = parse_translation_unit(
        'static int a = system("id");\n'
        "auto b = [] { return 1; }();\n"
        "std::vector<int> c(10);\n"
        "int* d = new int[3];\n"
        "const float e = 1.0f / 3.0f;\n"
        "constexpr int f = square(4);\n"
        "int g(int, char**);\n"
    )
    declarations = {i.name: i for i in unit.items}
    assert declarations["a"].dynamic_init == "a call to 'system'"
    assert declarations["b"].dynamic_init == "a call"  # an immediately invoked lambda
    assert declarations["c"].dynamic_init == "a constructor call"
    assert declarations["d"].dynamic_init == "a new expression"
    assert declarations["e"].dynamic_init is None
    assert declarations["f"].dynamic_init is None  # constexpr: the compiler evaluates it
    assert declarations["g"].prototype and declarations["g"].dynamic_init is None


def test_both_branches_of_preprocessor_conditionals_are_read() -> None:
    unit = parse_translation_unit(
        "#ifdef __CUDA_ARCH__\n"
        "__device__ int arch(int x) { return x; }\n"
        "#elif defined(OTHER)\n"
        "int other(int x) { return x; }\n"
        "#else\n"
        "int main() { return 0; }\n"
        "#endif\n"
    )
    assert [(i.kind, i.name) for i in unit.items] == [
        (ItemKind.CONDITIONAL, "__CUDA_ARCH__"), (ItemKind.FUNCTION, "arch"),
        (ItemKind.CONDITIONAL, "defined ( OTHER )"), (ItemKind.FUNCTION, "other"),
        (ItemKind.CONDITIONAL, None), (ItemKind.FUNCTION, "main"),
    ]
    assert unit.defines_main


def test_parse_errors_are_reported_and_the_rest_is_still_read() -> None:
    unit = parse_translation_unit(
        "__global__ void broken(float* y) {\n"
        "    y[0] = ;\n"
        "}\n"
        "__global__ void fine(float* y) { y[0] = 1.0f; }\n"
    )
    assert unit.has_errors and unit.error_lines == (2,)
    assert [f.name for f in unit.functions] == ["broken", "fine"]


def test_cuda_spellings_the_grammar_lacks_do_not_derail_the_parse() -> None:
    unit = parse_translation_unit(
        "struct __align__(16) Params { float a; int n; };\n"
        "__global__ void k(Params p, float* y) {\n"
        "    __shared__ __align__(16) float tile[32];\n"
        "    auto twice = [=] __device__ (float v) { return 2.0f * v; };\n"
        "    y[0] = twice(p.a) + tile[0];\n"
        "}\n"
    )
    assert unit.parse_errors == ()
    assert [(i.kind, i.name) for i in unit.items] == [
        (ItemKind.TYPE, "Params"), (ItemKind.FUNCTION, "k")]
    assert unit.items[0].text.startswith("struct __align__ ( 16 ) Params")


def test_normalized_text_ignores_comments_and_layout() -> None:
    source = (ROOT / "examples/sgemm/kernel.cu").read_text()
    relaid = "/* header */\n" + source.replace("    ", "\t\t").replace(
        "float sum = 0.0f;", "float   sum=0.0f;  // accumulates")
    assert [i.text for i in parse_translation_unit(relaid).items] == [
        i.text for i in parse_translation_unit(source).items]


def test_the_same_unit_parsed_twice_gives_equal_facts() -> None:
    source = CG.read_text()
    first = parse_translation_unit(source)
    parse_translation_unit.cache_clear()
    second = parse_translation_unit(source)
    assert first is not second
    assert first == second
