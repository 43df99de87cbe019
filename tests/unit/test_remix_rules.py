"""Every rule on every example kernel: it declines with a reason, or its source compiles with
real NVRTC for sm_90 and keeps the entry point; and what each rule does, on real kernels."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from r3tui.compile import CompileRequest, get_toolchain
from r3tui.remix.catalogue import CATALOGUE, FAMILIES, mechanical, transformation
from r3tui.remix.edits import entry_point_problem, find_kernel
from r3tui.remix.rules import RULES, apply_rule, read_only_pointers
from r3tui.search.source import parse_relations, parse_tunables

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
KERNELS = {p.parent.name: p.read_text() for p in sorted(EXAMPLES.glob("*/kernel.cu"))}


def test_all_seven_examples_are_here() -> None:
    assert len(KERNELS) == 7


@pytest.mark.parametrize("rule", sorted(RULES))
@pytest.mark.parametrize("example", sorted(KERNELS))
def test_rule_declines_or_compiles_keeping_the_entry_point(rule: str, example: str) -> None:
    source = KERNELS[example]
    for seed in (0, 1):
        result = apply_rule(rule, source, example, random.Random(seed))
        if not result.ok:
            assert result.source is None and result.reason, result
            continue
        assert result.source is not None and result.source != source
        assert result.detail
        assert entry_point_problem(source, result.source, example) is None
        parse_tunables(result.source)
        parse_relations(result.source)
        compiled = get_toolchain("nvrtc").compile(
            CompileRequest(result.source, example, arch="sm_90")
        )
        assert compiled.ok, f"{rule} on {example}:\n{result.source}\n{compiled.log}"
        assert compiled.lowered_name == example  # extern "C" entry point kept


def test_rules_apply_to_the_kernels_they_are_for() -> None:
    """Which rule applies where, so a rule that silently stops applying is caught."""
    applies = {
        (rule, example)
        for rule in RULES
        for example, source in KERNELS.items()
        if apply_rule(rule, source, example, random.Random(0)).ok
    }
    for example in ("nbody", "reduce_sum", "sgemm", "softmax", "spmv_csr", "stencil7"):
        assert ("restrict_const", example) in applies
    for example in ("nbody", "reduce_sum", "sgemm", "spmv_csr", "stencil7"):
        assert ("ldg_loads", example) in applies
    for example in ("nbody", "reduce_sum", "sgemm", "softmax", "spmv_csr"):
        assert ("unroll_pragma", example) in applies
    assert {e for r, e in applies if r == "expose_tunable"} == {"reduce_sum", "softmax"}
    assert {e for r, e in applies if r == "warp_shuffle_reduction"} == {"reduce_sum", "softmax"}
    assert ("unroll_pragma", "stencil7") not in applies  # it has no loop
    assert {e for r, e in applies if r == "grid_stride"} == {"nbody", "spmv_csr"}
    assert {e for r, e in applies if r == "strided_accumulate"} == {"reduce_sum"}
    assert {e for r, e in applies if r == "vector_access"} == {"softmax"}
    assert {e for r, e in applies if r == "coarsen"} == {
        "nbody", "ptr_struct", "sgemm", "spmv_csr", "stencil7"}  # not the block reductions
    # the 2-D grids; not the 1-D kernels nor the reductions that flatten their block
    assert {e for r, e in applies if r == "swap_xy"} == {"ptr_struct", "sgemm", "stencil7"}


def test_read_only_analysis_on_real_kernels() -> None:
    def read_only(example: str) -> list[str]:
        span = find_kernel(KERNELS[example], example)
        assert span is not None
        return read_only_pointers(KERNELS[example], span)

    assert read_only("sgemm") == ["A", "B"]  # C is read and written in place
    assert read_only("spmv_csr") == ["rowptr", "cols", "vals", "x"]
    assert read_only("softmax") == ["x"]  # read through `const float* xr = x + ...`
    assert read_only("reduce_sum") == ["x"]  # out goes to atomicAdd
    assert read_only("ptr_struct") == ["pairs"]  # x0..y2 are never used


def test_restrict_const_qualifies_only_read_pointers() -> None:
    result = apply_rule("restrict_const", KERNELS["spmv_csr"], "spmv_csr", random.Random(0))
    assert result.ok and result.source is not None
    assert "const int* __restrict__ rowptr" in result.source
    assert "const double* __restrict__ x" in result.source
    assert "double* y)" in result.source  # written: untouched
    again = apply_rule("restrict_const", result.source, "spmv_csr", random.Random(0))
    assert not again.ok and "already" in (again.reason or "")


def test_restrict_const_declines_when_the_kernel_is_also_declared() -> None:
    source = (
        'extern "C" __global__ void k(const float* x, float* y);\n'
        'extern "C" __global__ void k(const float* x, float* y) { y[0] = x[0]; }\n'
    )
    result = apply_rule("restrict_const", source, "k", random.Random(0))
    assert not result.ok and "declared elsewhere" in (result.reason or "")


def test_ldg_wraps_nested_reads_and_leaves_writes() -> None:
    rng = random.Random(0)
    while True:  # the rng picks "all eligible parameters" about half the time
        result = apply_rule("ldg_loads", KERNELS["spmv_csr"], "spmv_csr", rng)
        assert result.ok and result.source is not None
        if "rowptr, cols, vals, x" in (result.detail or ""):
            break
    assert "__ldg(&x[__ldg(&cols[k])])" in result.source
    assert "__ldg(&rowptr[row + 1])" in result.source
    assert "y[row] = sum;" in result.source


def test_ldg_skips_pointers_that_are_written_or_address_taken() -> None:
    source = (
        'extern "C" __global__ void k(const float* a, float* b, float* c, double* d) {\n'
        "    int i = threadIdx.x;\n"
        "    b[i] += a[i];\n"
        "    atomicAdd(&d[0], (double)c[i]);\n"
        "    c[i]++;\n"
        "}\n"
    )
    result = apply_rule("ldg_loads", source, "k", random.Random(0))
    assert result.ok and result.source is not None
    assert "b[i] += __ldg(&a[i]);" in result.source
    assert "atomicAdd(&d[0], (double)c[i]);" in result.source
    compiled = get_toolchain("nvrtc").compile(CompileRequest(result.source, "k"))
    assert compiled.ok, compiled.log


def test_unroll_factor_and_loop_come_from_the_rng() -> None:
    seen = set()
    for seed in range(12):
        result = apply_rule("unroll_pragma", KERNELS["softmax"], "softmax", random.Random(seed))
        assert result.ok and result.source is not None
        assert result.source.count("#pragma unroll") == 1
        seen.add(result.detail)
    assert len(seen) > 3  # several loops x factors 2, 4, 8
    one = apply_rule("unroll_pragma", KERNELS["sgemm"], "sgemm", random.Random(3)).source
    assert one == apply_rule("unroll_pragma", KERNELS["sgemm"], "sgemm", random.Random(3)).source
    assert one is not None
    done = apply_rule("unroll_pragma", one, "sgemm", random.Random(3))
    assert not done.ok  # its only loop already has a pragma


def test_the_unroll_factor_is_a_tunable_that_reaches_the_compiled_loop() -> None:
    result = apply_rule("unroll_pragma", KERNELS["sgemm"], "sgemm", random.Random(0))
    assert result.ok and result.source is not None
    (tunable,) = parse_tunables(result.source)
    assert tunable.name.startswith("R3_UNROLL_") and tunable.values == (1, 2, 4, 8, 16)
    assert tunable.default == 4
    # the pragma names a constant: a macro is not expanded in `#pragma unroll`
    lines = result.source.splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().startswith("for ("))
    assert lines[at - 1].strip() == f"#pragma unroll r3_unroll_{tunable.name[10:]}"
    nvrtc = get_toolchain("nvrtc")

    def binary(value: int | None) -> bytes:
        defines = () if value is None else ((tunable.name, str(value)),)
        compiled = nvrtc.compile(CompileRequest(result.source, "sgemm", defines=defines))
        assert compiled.ok, compiled.log
        return compiled.binary

    rolled, default, eight = binary(1), binary(None), binary(8)
    assert default == binary(4) and len({rolled, default, eight}) == 3


def test_unroll_leaves_a_loop_that_is_the_single_statement_of_an_if() -> None:
    source = ('extern "C" __global__ void k(float* x, int n) {\n'
              "    if (n > 4)\n"
              "        for (int i = 0; i < n; i++) x[i] *= 2.0f;\n"
              "}\n")
    result = apply_rule("unroll_pragma", source, "k", random.Random(0))
    assert not result.ok and "in a { } block" in (result.reason or "")


def test_a_tree_reduction_becomes_warp_shuffles_for_blocks_of_whole_warps() -> None:
    from r3tui.search.expressions import Relation

    seen = set()
    for seed in range(6):  # softmax has two reductions: max and sum
        result = apply_rule("warp_shuffle_reduction", KERNELS["softmax"], "softmax",
                            random.Random(seed))
        assert result.ok and result.source is not None
        seen.add(result.detail)
        assert result.source.count("__shfl_down_sync") == 2
        assert result.source.count("stride *= 2") == 1  # the other reduction is left
        (relation,) = parse_relations(result.source)
        assert relation == Relation.parse("BLOCK_THREADS % 32 == 0")
    assert len(seen) == 2
    assert any("fmaxf(r3_v, __shfl_down_sync(" in apply_rule(
        "warp_shuffle_reduction", KERNELS["softmax"], "softmax", random.Random(s)).source or ""
        for s in range(6))
    # done once on reduce_sum, nothing is left to do
    once = apply_rule("warp_shuffle_reduction", KERNELS["reduce_sum"], "reduce_sum",
                      random.Random(0)).source
    assert once is not None and "r3_v = r3_v + __shfl_down_sync(" in once
    assert not apply_rule("warp_shuffle_reduction", once, "reduce_sum", random.Random(0)).ok


def test_a_tree_reduction_takes_the_unroll_factor_declared_for_its_loop_with_it() -> None:
    unrolled = apply_rule("unroll_pragma", KERNELS["reduce_sum"], "reduce_sum",
                          random.Random(0)).source
    assert unrolled is not None and [t.name for t in parse_tunables(unrolled)] == ["R3_UNROLL_28"]
    shuffled = apply_rule("warp_shuffle_reduction", unrolled, "reduce_sum", random.Random(0))
    assert shuffled.ok and shuffled.source is not None
    assert parse_tunables(shuffled.source) == () and "unroll" not in shuffled.source
    compiled = get_toolchain("nvrtc").compile(CompileRequest(shuffled.source, "reduce_sum"))
    assert compiled.ok, compiled.log


def test_a_tree_reduction_over_a_2d_index_or_threadidx_alone_is_handled_as_it_must_be() -> None:
    template = (
        'extern "C" __global__ void k(const float* x, float* out) {{\n'
        "    __shared__ float s[256];\n"
        "    int tid = {tid};\n"
        "    s[tid] = x[blockIdx.x * 256 + tid];\n"
        "    __syncthreads();\n"
        "    for (int step = blockDim.x / 2; step > 0; step >>= 1) {{\n"
        "        if (tid < step) s[tid] += s[tid + step];\n"
        "        __syncthreads();\n"
        "    }}\n"
        "    if (tid == 0) out[blockIdx.x] = s[0];\n"
        "}}\n")
    one_d = apply_rule("warp_shuffle_reduction", template.format(tid="threadIdx.x"), "k",
                       random.Random(0))
    assert one_d.ok and one_d.source is not None
    assert "// r3: require BLOCK_Y == 1 && BLOCK_Z == 1" in one_d.source
    compiled = get_toolchain("nvrtc").compile(CompileRequest(one_d.source, "k"))
    assert compiled.ok, compiled.log
    # lanes are the linear index: a reduction over threadIdx.y is not one of whole warps
    other = apply_rule("warp_shuffle_reduction", template.format(tid="threadIdx.y"), "k",
                       random.Random(0))
    assert not other.ok and "linear index" in (other.reason or "")


def test_expose_tunable_declares_a_parseable_tunable_with_its_relation() -> None:
    result = apply_rule("expose_tunable", KERNELS["reduce_sum"], "reduce_sum", random.Random(0))
    assert result.ok and result.source is not None
    (tunable,) = parse_tunables(result.source)
    assert tunable.name == "MAX_THREADS" and tunable.values == (256, 512, 1024)
    assert tunable.default == 1024
    (relation,) = parse_relations(result.source)
    assert relation.names == {"BLOCK_THREADS", "MAX_THREADS"}
    assert not relation.holds({"BLOCK_THREADS": 512, "MAX_THREADS": 256})
    assert relation.holds({"BLOCK_THREADS": 256, "MAX_THREADS": 256})
    # the declaration opens the kernel's body (inside its definition, where an application
    # kernel's edits must stay); the #ifndef guard stays intact
    span = find_kernel(result.source, "reduce_sum")
    assert span is not None
    body = result.source[span.body_open : span.body_end]
    assert body.startswith("{\n    // r3: tune MAX_THREADS 256 512 1024\n"
                           "    // r3: require BLOCK_THREADS <= MAX_THREADS\n")
    assert "#ifndef MAX_THREADS\n#define MAX_THREADS 1024" in result.source
    # an unguarded #define is not offered: a -D would not reach the code through it
    unguarded = KERNELS["reduce_sum"].replace("#ifndef MAX_THREADS\n", "", 1).replace(
        "#define MAX_THREADS 1024\n#endif\n", "#define MAX_THREADS 1024\n", 1)
    assert unguarded != KERNELS["reduce_sum"]
    declined = apply_rule("expose_tunable", unguarded, "reduce_sum", random.Random(0))
    assert not declined.ok and "#ifndef-guarded" in (declined.reason or "")
    small = get_toolchain("nvrtc").compile(
        CompileRequest(result.source, "reduce_sum", defines=(("MAX_THREADS", "256"),))
    )
    assert small.ok, small.log
    assert small.resources.shared_mem_bytes == 256 * 4
    again = apply_rule("expose_tunable", result.source, "reduce_sum", random.Random(0))
    assert not again.ok


def test_rules_decline_a_missing_kernel_and_unknown_rules_raise() -> None:
    result = apply_rule("restrict_const", KERNELS["sgemm"], "not_here", random.Random(0))
    assert not result.ok and "not_here" in (result.reason or "")
    with pytest.raises(Exception, match="unknown rule"):
        apply_rule("make_it_fast", KERNELS["sgemm"], "sgemm", random.Random(0))


def test_catalogue_families_and_rules() -> None:
    assert 10 <= len(CATALOGUE) <= 16
    assert {t.family for t in CATALOGUE} == set(FAMILIES)
    assert len({t.name for t in CATALOGUE}) == len(CATALOGUE)
    assert {t.rule for t in mechanical()} == set(RULES)
    assert transformation("restrict_const").rule == "restrict_const"
    with pytest.raises(Exception, match="unknown transformation"):
        transformation("launch_bounds")


PREAMBLE = """
__device__ float f(float a, float b) { return a * b; }
extern "C" __global__ void k(float* y, const float* x, float* out, const float* in,
                             const float* A, const float* B, float* C, const float* w,
                             const float* scale, const float* p, int n, int K, int N, int m,
                             float a) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    int stride = gridDim.x * blockDim.x;
    int i = t, r = blockIdx.y, row = r, col = t, tid = threadIdx.x;
    float acc = 0.0f, mx = 0.0f, sum = 0.0f;
    __shared__ float buf[256];
    {
%s
    }
    out[0] = acc + mx + sum + buf[0];
}
"""


@pytest.mark.parametrize("name", [t.name for t in CATALOGUE])
def test_each_worked_example_compiles_before_and_after(name: str) -> None:
    """The example the model is shown for each transformation is real CUDA, both sides."""
    example = transformation(name).example
    assert example is not None
    for side in example:
        if side.lstrip().startswith("__global__"):  # a kernel's head
            source = side + "\n    if (n > 0) out[0] = in[0] * a;\n}\n"
            kernel = "scale"
        elif side.lstrip().startswith("#define") or "TILE" in side:  # a file-scope macro
            source = side + "\n" + PREAMBLE % "        acc = TILE;"
            kernel = "k"
        else:
            source = PREAMBLE % side
            kernel = "k"
        source = source.replace("__global__ void scale", 'extern "C" __global__ void scale')
        compiled = get_toolchain("nvrtc").compile(CompileRequest(source, kernel))
        assert compiled.ok, f"{name}:\n{source}\n{compiled.log}"


def test_the_prompt_shows_the_transformations_own_example_as_an_edit_block() -> None:
    from r3tui.remix.prompt import MutationContext, build_messages

    wanted = transformation("warp_shuffle_reduction")
    assert wanted.example is not None
    ctx = MutationContext("reduce_sum", KERNELS["reduce_sum"], transformation=wanted)
    user = build_messages(ctx)[1].content
    before, after = wanted.example
    assert f"for example this change in another kernel:\n<<<<<<< SEARCH\n{before}\n=======\n" \
           f"{after}\n>>>>>>> REPLACE" in user
    whole = build_messages(MutationContext("reduce_sum", KERNELS["reduce_sum"],
                                           transformation=wanted, edit_format="whole"))[1]
    assert f"```cuda\n{after}\n```" in whole.content


GRID_STRIDE_CASES = {
    # the early-return spelling of each usual index form, and what the rule must refuse
    "saxpy": ("    int i = threadIdx.x + blockIdx.x * blockDim.x;\n"
              "    if (i >= n) { return; }\n"
              "    if (x[i] < 0.0f) return;  // one element's early exit\n"
              "    y[i] = a * x[i] + y[i];\n", True),
    "enclosing": ("    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
                  "    if (i < n) {\n"
                  "        if (x[i] < 0.0f) return;\n"
                  "        y[i] = a * x[i] + y[i];\n"
                  "    }\n", True),
    "enclosing_then_more": ("    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
                            "    if (i < n) {\n        y[i] = x[i];\n    }\n"
                            "    if (i == 0) y[0] = 0.0f;\n", False),
    "barrier": ("    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
                "    if (i >= n) return;\n"
                "    __syncthreads();\n    y[i] = x[i];\n", False),
    "assigns": ("    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
                "    if (i >= n) return;\n"
                "    i += 1;\n    y[i] = x[i];\n", False),
    "bound_of_i": ("    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
                   "    if (i >= n - i) return;\n    y[i] = x[i];\n", False),
    "no_guard": ("    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
                 "    y[i % n] = x[i % n];\n", False),
}


def _applied(rule: str, source: str, kernel: str, applies: bool):  # type: ignore[no-untyped-def]
    """The rule's result where it should apply (its source set), None where it should decline
    (and did, with a reason)."""
    result = apply_rule(rule, source, kernel, random.Random(0))
    assert result.ok is applies, result.reason
    if not applies:
        assert result.reason
        return None
    assert result.source is not None
    return result


@pytest.mark.parametrize("case", sorted(GRID_STRIDE_CASES))
def test_grid_stride_makes_a_loop_whose_elements_per_thread_divide_the_grid(case: str) -> None:
    from r3tui.search.source import parse_work_per_thread, work_divisor

    body, applies = GRID_STRIDE_CASES[case]
    source = ('extern "C" __global__ void saxpy(float* y, const float* x, float a, int n) {\n'
              + body + "}\n")
    result = _applied("grid_stride", source, "saxpy", applies)
    if result is None:
        return
    assert parse_work_per_thread(result.source) == {"x": "R3_WPT_2"}
    name = "R3_WPT_2"
    (tunable,) = parse_tunables(result.source)
    assert tunable.values == (1, 2, 4, 8, 16) and tunable.default == 1
    assert work_divisor(result.source, {name: 8}) == 8 and work_divisor(result.source, {}) == 1
    assert work_divisor(result.source, {name: "16"}) == 16  # a -D value
    # declarations that do not parse divide nothing (no space could be built on them)
    assert work_divisor(result.source.replace("R3_WPT_2 1 2", "R3_WPT_2 0 2", 1),
                        {name: 8}) == 1
    # the element's own early exit stays an early exit of that element (a lambda's return)
    assert "auto r3_element_2 = [&](int i)" in result.source
    assert "i < (n); i += (int)blockDim.x * gridDim.x" in result.source
    for value in ("1", "4"):
        compiled = get_toolchain("nvrtc").compile(
            CompileRequest(result.source, "saxpy", defines=((name, value),)))
        assert compiled.ok, compiled.log


ACCUMULATE_CASES = {
    "flat": ("    __shared__ float buf[256];\n"
             "    unsigned int tid = threadIdx.x;\n"
             "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
             "    buf[tid] = (i < n) ? x[i] * x[i] : 0.0f;\n", True),
    "through_variables": ("    __shared__ double buf[256];\n"
                          "    unsigned int tid = threadIdx.x;\n"
                          "    long long b = blockIdx.x;\n"
                          "    long long i = b * blockDim.x + tid;\n"
                          "    buf[tid] = (i < (long long)n) ? (double)x[i] : 0.0;\n", True),
    # the index used outside the array's read: summed one element at a time only
    "index_outside_the_read": ("    __shared__ float buf[256];\n"
                               "    unsigned int tid = threadIdx.x;\n"
                               "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
                               "    buf[tid] = (i < n) ? x[i] * (float)i : 0.0f;\n", True),
    "not_shared": ("    float buf[4];\n    unsigned int tid = threadIdx.x & 3;\n"
                   "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
                   "    buf[tid] = (i < n) ? x[i] : 0.0f;\n", False),
    "not_from_the_block": ("    __shared__ float buf[256];\n    unsigned int tid = threadIdx.x;\n"
                           "    int i = tid;\n    buf[tid] = (i < n) ? x[i] : 0.0f;\n", False),
    "assigned_after": ("    __shared__ float buf[256];\n    unsigned int tid = threadIdx.x;\n"
                       "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
                       "    buf[tid] = (i < n) ? x[i] : 0.0f;\n    i += 1;\n", False),
}
# the cases whose summed value reads one array of floats at the index and nothing else of it:
# their first elements loaded 4 at a time (the value computed per lane)
VECTOR_LANES = {"flat": "{v}.x * {v}.x", "through_variables": "(double){v}.x"}
REDUCE_TAIL = ("    __syncthreads();\n"
               "    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {\n"
               "        if (tid < s) buf[tid] += buf[tid + s];\n        __syncthreads();\n    }\n"
               "    if (tid == 0) atomicAdd(out, (float)buf[0]);\n")


@pytest.mark.parametrize("case", sorted(ACCUMULATE_CASES))
def test_strided_accumulate_sums_several_elements_a_thread_before_the_tree(case: str) -> None:
    from r3tui.search.source import parse_work_per_thread, work_divisor

    body, applies = ACCUMULATE_CASES[case]
    source = ('extern "C" __global__ void total(const float* x, float* out, int n) {\n'
              + body + REDUCE_TAIL + "}\n")
    result = _applied("strided_accumulate", source, "total", applies)
    if result is None:
        return
    (name,) = parse_work_per_thread(result.source).values()
    assert name.startswith("R3_WPT_")
    tunables = {t.name: t for t in parse_tunables(result.source)}
    tunable = tunables.pop(name)
    assert tunable.values == (1, 2, 4, 8, 16, 32, 64, 128, 256) and tunable.default == 1
    assert work_divisor(result.source, {name: 4}) == 4
    lane = VECTOR_LANES.get(case)
    if lane is None:
        assert not tunables and "float4" not in result.source
    else:
        (vector,) = tunables.values()
        assert vector.name == name.replace("WPT", "VEC")
        assert vector.values == (1, 4) and vector.default == 1
        lane = lane.format(v=name.replace("R3_WPT", "r3_v"))
        assert f"+= {lane};" in result.source and "reinterpret_cast<const float4*>(x)" in \
            result.source
    # the loop starts at the thread's element and strides over the grid's threads; the
    # accumulator has the shared array's type and takes the value the load took
    loop = next(line for line in result.source.splitlines() if "for (auto r3_k_" in line)
    assert "gridDim.x * gridDim.y * gridDim.z * blockDim.x * blockDim.y * blockDim.z" in loop
    acc = "double r3_acc_" if "double buf" in body else "float r3_acc_"
    assert acc in result.source and "buf[tid] = r3_acc_" in result.source
    settings = [((name, "1"),), ((name, "256"),)]
    if lane is not None:
        settings.append(((name, "4"), (name.replace("WPT", "VEC"), "4")))
    for defines in settings:
        compiled = get_toolchain("nvrtc").compile(
            CompileRequest(result.source, "total", defines=defines))
        assert compiled.ok, compiled.log


VECTOR_CASES = {
    "scale": ("float* y, const float* x, int n",
              "    for (int c = threadIdx.x; c < n; c += blockDim.x) y[c] = 2.0f * x[c];\n",
              "float4"),
    "doubles": ("double* y, const double* __restrict__ x, int n",
                "    int t = blockIdx.x * blockDim.x + threadIdx.x;\n"
                "    for (int c = t; c < n; c += gridDim.x * blockDim.x) {\n"
                "        y[c] += x[c] * c;\n    }\n", "double2"),
    "spelled_out_step": ("float* y, const float* x, int n",
                         "    for (int c = threadIdx.x; c < n; c = c + blockDim.x) y[c] = x[c];\n",
                         "float4"),
    "jump": ("float* y, const float* x, int n",
             "    for (int c = threadIdx.x; c < n; c += blockDim.x) {\n"
             "        if (x[c] < 0.0f) break;\n        y[c] = x[c];\n    }\n", None),
    "neighbour": ("float* y, const float* x, int n",
                  "    for (int c = threadIdx.x; c < n; c += blockDim.x) y[c] = x[c] + x[c + 1];\n",
                  None),
    "sequential": ("float* y, const float* x, int n",
                   "    for (int c = 0; c < n; c += 1) y[c] = x[c];\n", None),
    "mixed_widths": ("double* y, const float* x, int n",
                     "    for (int c = threadIdx.x; c < n; c += blockDim.x) y[c] = x[c];\n", None),
}


@pytest.mark.parametrize("case", sorted(VECTOR_CASES))
def test_vector_access_touches_a_threads_elements_a_vector_at_a_time(case: str) -> None:
    params, body, vector = VECTOR_CASES[case]
    source = f'extern "C" __global__ void k({params}) {{\n{body}}}\n'
    result = apply_rule("vector_access", source, "k", random.Random(0))
    assert result.ok is (vector is not None), result.reason
    if vector is None:
        assert result.reason
        return
    assert result.source is not None
    text = result.source
    lanes = 4 if vector == "float4" else 2
    assert f"% {lanes}) == 0 && ((unsigned long long)(x) % sizeof({vector})) == 0" in text
    assert f"reinterpret_cast<const {vector}*>(x)[" in text  # read-only: a const load
    assert f"reinterpret_cast<{vector}*>(y)[" in text  # the store
    if case in ("scale", "spelled_out_step"):  # y is only written: no load before the store
        assert f"{vector} r3_y_2;" in text
    else:  # y += ...: read, modified, written back
        assert f"{vector} r3_y_3 = reinterpret_cast<{vector}*>(y)[" in text
    assert text.count("const int c = ") == lanes  # the body once per lane
    assert "} else {" in text and body.split("\n")[-2].strip() in text  # the original kept
    again = apply_rule("vector_access", text, "k", random.Random(0))
    assert not again.ok  # neither the vector loop nor the kept original is rewritten again
    compiled = get_toolchain("nvrtc").compile(CompileRequest(text, "k"))
    assert compiled.ok, compiled.log


def test_grid_rules_follow_whether_apply_can_rescale_an_applications_grid() -> None:
    """An application's kernel (confined) gets a grid-stride variant where r3 apply can rescale
    its launches' grid; not where the host code's grid is fixed (grid_fixed), and never a
    variant that needs dynamic shared memory the host code sets."""
    from r3tui.remix.mutation import Mutator
    from r3tui.remix.prompt import MutationContext

    source = KERNELS["nbody"]
    wanted = transformation("grid_stride_loop")
    mutator = Mutator(None)
    free = mutator.propose_rule(MutationContext("nbody", source, transformation=wanted),
                                random.Random(0))
    assert free.ok and "work_per_thread" in (free.source or "")
    confined = mutator.propose_rule(
        MutationContext("nbody", source, transformation=wanted, confined=True),
        random.Random(0))
    assert confined.ok and confined.source == free.source
    fixed = mutator.propose_rule(
        MutationContext("nbody", source, transformation=wanted, grid_fixed=True,
                        confined=True),
        random.Random(0))
    assert not fixed.ok and "host code sets the launch" in (fixed.reason or "")
    tiled = transformation("shared_memory_tile")
    assert tiled.rule == "tile_shared"
    assert mutator.propose_rule(MutationContext("nbody", source, transformation=tiled),
                                random.Random(0)).ok
    shared = mutator.propose_rule(
        MutationContext("nbody", source, transformation=tiled, confined=True), random.Random(0))
    assert not shared.ok and "dynamic shared memory" in (shared.reason or "")
