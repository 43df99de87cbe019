"""An application's kernel in the remix layer: the model sees the kernel and the device code it
reaches, sized to its context, and a change outside the kernel's definition is refused.

The parent is the device unit of a small C++ application written here (tests/unit/
test_device_unit.py); model answers are replayed through RecordedBackend with answers written
for these tests, and every accepted variant is compiled by real NVRTC.
"""

from __future__ import annotations

import random

from r3tui.analysis.device_unit import device_unit
from r3tui.compile import CompileRequest, get_toolchain
from r3tui.compile.nvrtc import default_include_dirs
from r3tui.domain import LLMCall
from r3tui.remix.backends import Sampling, render_prompt
from r3tui.remix.catalogue import transformation
from r3tui.remix.edits import find_kernel, symbol_problem
from r3tui.remix.mutation import ANCHORED_GRAMMAR, Mutator, MutatorSettings, view_chars
from r3tui.remix.prompt import MutationContext, build_messages
from r3tui.remix.recorded import RecordedBackend
from r3tui.remix.rules import apply_rule
from tests.unit.test_device_unit import HEADERS, MAIN_CU

UNIT = device_unit(MAIN_CU, "stencil", HEADERS, ["src"],
                   cuda_include_dirs=default_include_dirs(), scopes=["app"]).text
KERNEL = "app::stencil<float, 2>"
LOOP = "  for (int d = -R; d <= R; ++d)\n"


def ctx(name: str = "unroll_inner_loop", chars: int | None = None) -> MutationContext:
    return MutationContext(KERNEL, UNIT, transformation=transformation(name),
                           edit_format="search_replace", confined=True,
                           view_chars=chars or view_chars(4096, Sampling().max_tokens))


def answer_for(context: MutationContext, response: str) -> LLMCall:
    return LLMCall(model_path="/models/written-for-the-test.gguf", model_sha256="0" * 64,
                   prompt=render_prompt(build_messages(context)), response=response,
                   sampling={**Sampling().to_json(ANCHORED_GRAMMAR)}, seed=1, tokens_in=100,
                   tokens_out=20, latency_s=0.5)


def edit(search: str, replace: str) -> str:
    return f"<<<<<<< SEARCH\n{search}=======\n{replace}>>>>>>> REPLACE\n"


def compiled_rule(rule: str, source: str, kernel: str) -> tuple[str, str | None]:
    """``rule`` applied (seed 0) and its variant compiled by real NVRTC: (source, detail)."""
    result = apply_rule(rule, source, kernel, random.Random(0))
    assert result.ok and result.source is not None, result.reason
    compiled = get_toolchain("nvrtc").compile(CompileRequest(result.source, kernel))
    assert compiled.ok, compiled.log
    return result.source, result.detail


def test_the_prompt_holds_the_kernel_and_the_device_code_it_reaches() -> None:
    user = build_messages(ctx())[1].content
    assert "__global__ void stencil" in user and "square(T x)" in user and "struct Grid" in user
    # the unit's prelude is not reached by the kernel, so it is not shown
    assert "using cuda::std::int8_t" not in user and "#include" not in user
    assert "Change only the definition of `app::stencil<float, 2>`" in user
    small = build_messages(ctx(chars=500))[1].content
    assert "__global__ void stencil" in small  # the kernel is always whole
    assert "// also reached, not shown:" in small and len(small) < len(user)


def test_an_edit_inside_the_kernel_applies_and_compiles() -> None:
    context = ctx()
    call = answer_for(context, edit(LOOP, "  #pragma unroll\n" + LOOP))
    mutator = Mutator(RecordedBackend([call]), MutatorSettings(llm_share=1.0))
    proposal = mutator.propose(context, random.Random(0))
    assert proposal.ok, proposal.reason
    assert proposal.source == UNIT.replace(LOOP, "  #pragma unroll\n" + LOOP)
    compiled = get_toolchain("nvrtc").compile(CompileRequest(proposal.source or "", KERNEL))
    assert compiled.ok, compiled.log


def test_an_edit_outside_the_kernel_is_refused() -> None:
    context = ctx()
    helper = "__device__ __forceinline__ T square(T x) { return x * x; }\n"
    call = answer_for(context, edit(helper, helper.replace("x * x", "x * x * 1")))
    mutator = Mutator(RecordedBackend([call]), MutatorSettings(llm_share=1.0))
    proposal = mutator.propose(context, random.Random(0))
    assert not proposal.ok and proposal.llm_call == call
    assert proposal.reason is not None and "outside the definition of stencil" in proposal.reason


def test_a_rule_on_an_applications_kernel_changes_only_the_kernel() -> None:
    made = 0
    for seed in range(8):
        proposal = Mutator(None).propose(
            MutationContext(KERNEL, UNIT, confined=True), random.Random(seed))
        if not proposal.ok:
            assert proposal.reason is not None
            continue
        made += 1
        assert proposal.source is not None
        head = UNIT.index("template <typename T, int R>\n__global__")
        assert proposal.source[:head] == UNIT[:head]
    assert made > 0


def test_an_edit_that_would_change_the_kernels_symbol_is_refused() -> None:
    """app::stencil has C++ linkage: `const` on a pointee is part of its mangled name, so the
    application's launches would name another function (Rodinia bfs's entry point vanished
    from the patched build's timed runs after restrict_const added it)."""
    at = UNIT.index("__global__ void stencil(")
    line = UNIT[at:UNIT.index("\n", at) + 1]
    assert "T* out," in line
    context = ctx()
    call = answer_for(context, edit(line, line.replace("T* out,", "volatile T* out,")))
    proposal = Mutator(RecordedBackend([call]), MutatorSettings(llm_share=1.0)).propose(
        context, random.Random(0))
    assert not proposal.ok and proposal.reason is not None
    assert "changes the kernel's mangled name" in proposal.reason, proposal.reason
    # the rule qualifies a C++ kernel's read-only pointers with __restrict__ alone
    axpy = ("namespace ops {\n"
            "__global__ void axpy(float a, float* x, float* y, int n) {\n"
            "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
            "  if (i < n) y[i] = a * x[i] + y[i];\n"
            "}\n"
            "}\n")
    restricted, detail = compiled_rule("restrict_const", axpy, "ops::axpy")
    assert "float* __restrict__ x" in restricted and "const" not in restricted
    assert detail == "__restrict__ on x"
    before, after = find_kernel(axpy, "ops::axpy"), find_kernel(restricted, "ops::axpy")
    assert before is not None and after is not None and not before.extern_c
    assert symbol_problem(before, after) is None
    # with C linkage the pointee's const is not in the symbol: the rule adds it
    c_axpy = axpy.replace("namespace ops {\n", 'extern "C" {\n')
    result = apply_rule("restrict_const", c_axpy, "axpy", random.Random(0))
    assert result.ok and "const float* __restrict__ x" in (result.source or "")


def test_restrict_on_a_cpp_kernel_with_a_prototype_compiles() -> None:
    """Rodinia gaussian declares Fan2 before defining it: __restrict__ alone is not part of
    the function's type, so the definition may add it; NVRTC agrees."""
    source = ("__global__ void fan(float* m, float* a, int n);\n"
              "__global__ void fan(float* m, float* a, int n) {\n"
              "  int i = threadIdx.x;\n"
              "  if (i < n) a[i] -= m[i] * a[0];\n"
              "}\n")
    restricted, _ = compiled_rule("restrict_const", source, "fan")
    assert "float* __restrict__ m" in restricted
    assert "__global__ void fan(float* m, float* a, int n);" in restricted  # prototype kept


def test_unroll_reaches_a_grid_stride_loop_around_unrolled_loops() -> None:
    """HeCBench rmsnorm: every innermost loop is already `#pragma unroll`; the loop around
    them is not, and is what is left to unroll."""
    source = ("template <typename T, int U>\n"
              "__global__ void norm(const T* __restrict__ x, T* y, long n) {\n"
              "  for (long o = threadIdx.x * U; o < n; o += blockDim.x * U) {\n"
              "#pragma unroll\n"
              "    for (int i = 0; i < U; ++i) y[o + i] = x[o + i] * 2;\n"
              "  }\n"
              "}\n"
              "template __global__ void norm<float, 4>(const float*, float*, long);\n")
    unrolled, _ = compiled_rule("unroll_pragma", source, "norm<float, 4>")
    lines = unrolled.splitlines()
    at = next(i for i, line in enumerate(lines) if "for (long o" in line)
    assert lines[at - 1].strip().startswith("#pragma unroll ")


def test_ldg_sees_through_a_typedef_of_its_element_type() -> None:
    """LULESH reads `const Real_t* __restrict__ x` with `typedef double Real_t;`."""
    from r3tui.analysis.body import scalar_aliases

    source = ("typedef double real8;\n"
              "typedef real8 Real_t;\n"
              "using Index_t = int;\n"
              "__global__ void sum(const Real_t* __restrict__ x, const Index_t* __restrict__ i,\n"
              "                    Real_t* __restrict__ out, int n) {\n"
              "  int t = threadIdx.x;\n"
              "  if (t < n) out[t] = x[i[t]];\n"
              "}\n")
    assert scalar_aliases(source) == {"real8": "double", "Real_t": "double", "Index_t": "int"}
    rng = random.Random(0)
    while True:  # all read-only parameters, or (by the rng) one of them
        result = apply_rule("ldg_loads", source, "sum", rng)
        assert result.ok and result.source is not None, result.reason
        if "__ldg(&x[__ldg(&i[t])])" in result.source:
            break
    compiled = get_toolchain("nvrtc").compile(CompileRequest(result.source, "sum"))
    assert compiled.ok, compiled.log
