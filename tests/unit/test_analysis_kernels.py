"""Kernel declarations and definitions read from the parse: the one lookup that rules, edits,
__launch_bounds__ injection, source association and `r3 apply` share."""

from __future__ import annotations

from r3tui.analysis.kernels import ANONYMOUS, kernel_declarations, kernel_definitions

UNIT = """\
#define KERNEL __global__
// __global__ void k(float* commented_out) {}
const char* text = "__global__ void k(int in_a_string) {}";
namespace outer { namespace inner {
template <typename T, int N>
__global__ void __launch_bounds__(256) k(const T* __restrict__ in, T* out);
template <typename T, int N>
__global__ void __launch_bounds__(256) k(const T* __restrict__ in, T* out) {
  for (int i = 0; i < N; ++i) out[i] = in[i];
}
}}  // namespace outer::inner
namespace { KERNEL void k(void) {} }
extern "C" __global__ void k(int n) __launch_bounds__(128) { (void)n; }
__device__ void k(double) {}  // a device function, not a kernel
void launch() { outer::inner::k<float, 4><<<1, 1>>>(nullptr, nullptr); }
"""


def test_every_kernel_of_a_name_with_its_namespaces_and_parts() -> None:
    found = kernel_declarations(UNIT, "k")
    assert [(d.scopes, d.defined) for d in found] == [
        (("outer", "inner"), False), (("outer", "inner"), True), ((ANONYMOUS,), True),
        ((), True)]
    templated = found[1]
    assert UNIT[templated.start:].startswith("template <typename T, int N>\n__global__")
    assert UNIT[templated.name_at:templated.params_open] == "k"
    assert [UNIT[a:b] for a, b in templated.params] == ["const T* __restrict__ in", "T* out"]
    assert UNIT[templated.body_open] == "{" and UNIT[templated.end - 1] == "}"
    assert UNIT[found[0].end - 1] == ";"  # a prototype ends at its ';'
    macro = found[2]  # `KERNEL` expands to __global__
    assert UNIT[macro.start:macro.end] == "KERNEL void k(void) {}"
    linked = found[3]
    assert UNIT[linked.start:].startswith('extern "C" __global__ void k(int n)')


def test_kernels_in_comments_strings_and_device_functions_are_not_kernels() -> None:
    names = [(d.scopes, d.defined) for d in kernel_definitions(UNIT, "k")]
    assert len(names) == 3
    assert kernel_declarations(UNIT, "launch") == []  # a host function
    assert kernel_declarations(UNIT, "absent") == []


def test_offsets_are_characters_in_text_with_non_ascii() -> None:
    text = "// größe\n__global__ void k(float* x) { x[0] = 1; }\n"
    (d,) = kernel_definitions(text, "k")
    assert text[d.start:d.end] == "__global__ void k(float* x) { x[0] = 1; }"


def test_the_parse_of_a_kernel_is_read_once_for_all_its_parameters() -> None:
    """The rules ask about each parameter of one kernel of one source: the parse behind
    those questions is cached (a decorator that once slipped onto the function above it)."""
    from r3tui.analysis.kernels import declared_kernels

    source = "__global__ void k(const float* a, float* b) { b[0] = a[0]; }\n"
    first = declared_kernels(source, "k")
    assert declared_kernels(source, "k") is first
