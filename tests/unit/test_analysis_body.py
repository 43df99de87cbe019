"""What a kernel's body does with its pointer parameters, and its loops, from the parse
(r3tui.analysis.body): the facts restrict_const, ldg_loads and unroll_pragma rewrite by."""

from __future__ import annotations

import pytest

from r3tui.analysis.body import for_loops, pointer_uses

KERNEL = """\
namespace ops {
template <int N>
__global__ void k(const float* a, float* b, float2* c, float (*m)[4], const float* u,
                  int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  const float* row = a + (long long)i * n;   // const alias through arithmetic
  float s = a[i] + row[0] + __ldg(&a[i + 1]) + c[i].x;
  b[i] = s;                                   // written
  b[i + 1] += s;                              // written
  ++b[i + 2];                                 // written
  m[i][0] = s;                                // written through a second subscript
  c[i].y = s;                                 // written through a member
  float* w = &b[i];                           // address taken
  float t = u[i] * 2 + u[i + 1];
  // u[i] = 0;  a comment is not code
  #pragma unroll
  for (int j = 0; j < N; ++j) {
    for (int q = 0; q < 2; ++q) t += a[j + q];
  }
  while (t > 1) { for (int r = 0; r < 3; ++r) t *= 0.5f; }
  w[0] = t;
}
}  // namespace ops
"""


def kinds(name: str) -> list[str]:
    return [u.kind + ("+ldg" if u.in_ldg else "") for u in pointer_uses(KERNEL, "k", name)]


@pytest.mark.parametrize("name, expected", [
    ("a", ["const_alias", "read", "read+ldg", "read"]),
    ("b", ["other", "other", "other", "other"]),
    ("c", ["read", "other"]),
    ("m", ["other"]),
    ("u", ["read", "read"]),
    ("n", ["other"]),
])
def test_each_use_of_a_parameter_is_classified(name: str, expected: list[str]) -> None:
    assert kinds(name) == expected


def test_a_read_knows_its_brackets() -> None:
    read = next(u for u in pointer_uses(KERNEL, "k", "u") if u.kind == "read")
    assert read.index_open is not None and read.index_close is not None
    assert KERNEL[read.start:read.index_close + 1] == "u[i]"


def test_loops_and_which_are_innermost() -> None:
    loops = for_loops(KERNEL, "k")
    heads = [KERNEL[f.start:KERNEL.index(")", f.start) + 1] for f in loops]
    assert heads == ["for (int j = 0; j < N; ++j)", "for (int q = 0; q < 2; ++q)",
                     "for (int r = 0; r < 3; ++r)"]
    assert [f.innermost for f in loops] == [False, True, True]
    assert [f.inner_unrolled for f in loops] == [False, False, False]  # q's has no pragma


def test_a_loop_around_unrolled_loops_counts_as_unrollable() -> None:
    from r3tui.analysis.body import for_loops

    source = """__global__ void k(float* a, int n) {
  for (int o = threadIdx.x; o < n; o += 4 * blockDim.x) {
#pragma unroll
    for (int i = 0; i < 4; ++i) a[o + i] += 1;
  }
  for (int o = 0; o < n; ++o) {
    for (int i = 0; i < 4; ++i) a[i] += o;
  }
}"""
    outer, inner, plain, plain_inner = for_loops(source, "k")
    assert outer.inner_unrolled and not outer.innermost and inner.innermost
    assert not plain.inner_unrolled and plain_inner.innermost


def test_code_the_parser_cannot_read_counts_as_a_write() -> None:
    broken = "__global__ void k(const float* a, float* b) { b[0] = a[0] +; }"
    assert all(u.kind == "other" for u in pointer_uses(broken, "k", "a"))
    assert pointer_uses("__global__ void other(float* a) { a[0] = 1; }", "k", "a") == []


def test_the_names_a_body_uses_leave_comments_out() -> None:
    from r3tui.analysis.body import body_identifiers

    names = body_identifiers(KERNEL, "k")
    assert {"N", "blockIdx", "row", "u", "x", "y"} <= names
    assert "comment" not in names and "namespace" not in names and "ops" not in names
