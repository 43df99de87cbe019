"""The index rules on kernels written in the older C style that application suites keep:
locals declared together at the top and assigned later (the grid index among them), a macro
for the floating type with casts the parser reads as calls, a struct accumulator with a brace
initializer, and a pure ``__device__`` helper called in the loops.  Small kernels written here
show those structures; each rewrite is compiled with g++ and run on this CPU thread by thread
(tests/unit/cpu_grid.py) against the original, and compiled with real NVRTC."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from r3tui.analysis.per_thread import declared_at_assignment
from r3tui.compile import CompileRequest, get_toolchain
from r3tui.remix.coarsen import FACTORS
from r3tui.remix.rules import apply_rule
from r3tui.search.source import parse_tunables, parse_work_per_thread
from tests.unit import cpu_grid

CURVE = r"""
#define REAL double
struct P3 { REAL x, y, z; };

// a weight from a product and a power: pure, with loops, locals and casts
__host__ __device__ inline REAL weight(int k, REAL t, int n) {
  int m, r;
  REAL w = 1;
  m = n;
  r = k;
  while (m > 1) {
    w *= m;
    m--;
    if (r > 1) {
      w /= (REAL)r;
      r--;
    }
  }
  if (k > 0)
    w *= pow(t, (REAL)k);
  return (w);
}

__global__ void curve(const P3 *ctrl, P3 *out, const int nc, const int nu, const int nv) {
  int u, v, c;
  REAL tu, tv, wu, wv;

  u = blockDim.x * blockIdx.x + threadIdx.x;
  if (u >= nu) return;

  tu = u / (REAL)(nu - 1);
  for (v = 0; v < nv; v++) {
    tv = v / (REAL)(nv - 1);
    P3 acc = {0, 0, 0};
    for (c = 0; c < nc; c++) {
      wu = weight(c, tu, nc);
      wv = weight(c, tv, nc);
      acc.x += ctrl[c].x * wu * wv;
      acc.y += ctrl[c].y * wu * wv;
      acc.z += ctrl[c].z * wu * wv;
    }
    out[u * nv + v] = acc;
  }
}
"""

CURVE_DRIVER = r"""
#ifndef DX
#define DX 1
#endif
int main() {
    const int nc = 6, nu = 37, nv = 5;
    std::vector<P3> ctrl(nc), out(nu * nv, P3{-1, -1, -1});
    for (int c = 0; c < nc; ++c) ctrl[c] = P3{c * 0.5, 1.0 - c * 0.25, (c % 3) * 0.75};
    dim3 block(BX, 1, 1);
    dim3 grid(r3_cover(nu, DX, BX), 1, 1);
    launch(grid, block, [&] { curve(ctrl.data(), out.data(), nc, nu, nv); });
    for (const P3& p : out) printf("%a %a %a\n", p.x, p.y, p.z);
}
"""

# several dependent locals in one declaration, beside ones that do not depend on the index
FORCES = r"""
typedef double real_t;
__global__ void forces(const real_t* x, const real_t* y, real_t* f, int n) {
  int i = blockDim.x * blockIdx.x + threadIdx.x;
  real_t ax, ay, s = 2.0, t;
  if (i >= n) return;
  ax = x[i] * s;
  ay = y[i] + ax;
  t = s * 3.0;
  f[i] = ax * ay + t;
}
"""

FORCES_DRIVER = r"""
#ifndef DX
#define DX 1
#endif
int main() {
    const int n = 45;
    std::vector<double> x(n), y(n), f(n, -3.0);
    for (int i = 0; i < n; ++i) { x[i] = i * 0.125 - 2.0; y[i] = (i % 7) * 0.5; }
    dim3 block(BX, 1, 1);
    dim3 grid(r3_cover(n, DX, BX), 1, 1);
    launch(grid, block, [&] { forces(x.data(), y.data(), f.data(), n); });
    for (double v : f) printf("%a\n", v);
}
"""


def same_at_every_factor(original: str, variant: str, driver: str, tmp: Path, block: int,
                         factors: tuple[int, ...] = FACTORS) -> str:
    """Run the original and the variant at each factor along x (the driver divides its grid
    by ``DX``) on this CPU under AddressSanitizer; the original's output, each equal to it."""
    prelude = f"#define BX {block}\n"
    expected = cpu_grid.run(prelude + original, driver, tmp, name="original")
    for factor in factors:
        got = cpu_grid.run(prelude + variant, driver, tmp, {"DX": factor, "R3_CF_X": factor},
                           f"x{factor}", sanitize=True)
        assert got == expected, f"x{factor}:\n{variant}"
    return expected


def coarsened(source: str, kernel: str) -> str:
    result = apply_rule("coarsen", source, kernel, random.Random(0))
    assert result.ok and result.source is not None, result.reason
    return result.source


def test_an_index_assigned_after_its_declaration_is_declared_where_it_is_assigned() -> None:
    out = declared_at_assignment(CURVE, "curve")
    assert "  int v, c;\n" in out
    assert "  int u = blockDim.x * blockIdx.x + threadIdx.x;\n" in out
    assert out.replace("  int u = ", "  u = ").replace("int v, c;", "int u, v, c;") == CURVE
    alone = "__global__ void k(float* a, int n) {\n    int i;\n    i = threadIdx.x + " \
            "blockIdx.x * blockDim.x;\n    if (i < n) a[i] = 1;\n}\n"
    assert declared_at_assignment(alone, "k") == (
        "__global__ void k(float* a, int n) {\n    int i = threadIdx.x + blockIdx.x * "
        "blockDim.x;\n    if (i < n) a[i] = 1;\n}\n")


@pytest.mark.parametrize("change", [
    ("  u = blockDim.x", "  u = 0;\n  u = blockDim.x"),  # assigned twice
    ("  if (u >= nu) return;", "  if (u >= nu) return;\n  int* at = &u;"),  # address taken
    ("  REAL tu, tv, wu, wv;", "  REAL tu = u, tv, wu, wv;"),  # read before it is assigned
    ("  int u, v, c;", "  long double u; int v, c;"),  # not an integer
])
def test_the_index_stays_as_written_where_moving_its_declaration_could_change_something(
        change: tuple[str, str]) -> None:
    before, after = change
    source = CURVE.replace(before, after, 1)
    assert source != CURVE
    assert declared_at_assignment(source, "curve") == source


def test_the_curve_kernel_coarsened_computes_what_the_original_does(tmp_path: Path) -> None:
    cpu_grid.compiler()
    variant = coarsened(CURVE, "curve")
    assert parse_work_per_thread(variant) == {"x": "R3_CF_X"}
    (tunable,) = parse_tunables(variant)
    assert tunable.values == FACTORS
    # the weight along v does not depend on u: computed once for all of a thread's elements
    assert re.search(r"^\s*wv = weight\(c, tv, nc\);", variant, re.MULTILINE), variant
    assert "REAL wv;" in variant and "REAL wu[r3_cf];" in variant
    assert "acc[r3_e] = {0, 0, 0};" in variant
    expected = same_at_every_factor(CURVE, variant, CURVE_DRIVER, tmp_path, 8)
    assert len(expected.splitlines()) == 37 * 5
    compiled = get_toolchain("nvrtc").compile(CompileRequest(
        variant, "curve", arch="sm_90", defines=(("R3_CF_X", "4"),)))
    assert compiled.ok, compiled.log


def test_the_grid_stride_rule_reads_the_index_assigned_later() -> None:
    result = apply_rule("grid_stride", CURVE, "curve", random.Random(0))
    assert result.ok and result.source is not None, result.reason
    assert "int u = blockDim.x * blockIdx.x + threadIdx.x;" not in CURVE
    compiled = get_toolchain("nvrtc").compile(CompileRequest(result.source, "curve",
                                                             arch="sm_90"))
    assert compiled.ok, compiled.log


def test_several_locals_in_one_declaration_each_kept_as_it_depends(tmp_path: Path) -> None:
    cpu_grid.compiler()
    variant = coarsened(FORCES, "forces")
    # ax and ay hold one value per element; s and t do not depend on the index
    for declared in ("real_t ax[r3_cf];", "real_t ay[r3_cf];", "real_t s = 2.0;", "real_t t;"):
        assert declared in variant, variant
    same_at_every_factor(FORCES, variant, FORCES_DRIVER, tmp_path, 4)
    compiled = get_toolchain("nvrtc").compile(CompileRequest(
        variant, "forces", arch="sm_90", defines=(("R3_CF_X", "2"),)))
    assert compiled.ok, compiled.log


@pytest.mark.parametrize(("case", "reason"), [
    # the helper writes through a pointer: a thread whose elements are all past the work
    # would call it, where the original's thread had returned
    ("impure helper",
     r"line \d+: a statement after the bound check writes memory"),
    # a call among the initializers of locals that do not depend on the index
    ("impure initializer", r"a declaration of several locals with a call"),
    # a helper that adds atomically is not pure
    ("atomic helper", r"line \d+: a statement after the bound check writes memory"),
])
def test_it_still_declines_where_a_call_could_have_an_effect(case: str, reason: str) -> None:
    source = {
        "impure helper": CURVE.replace(
            "__global__ void curve(",
            "__device__ REAL tally(int c, REAL* seen) { seen[c] += 1; return seen[c]; }\n"
            "__global__ void curve(REAL* seen, ").replace(
            "wv = weight(c, tv, nc);", "wv = tally(c, seen);"),
        "impure initializer": FORCES.replace(
            "typedef double real_t;",
            "typedef double real_t;\n"
            "__device__ real_t next(real_t* p) { return *p += 1; }").replace(
            "real_t ax, ay, s = 2.0, t;\n  if (i >= n) return;",
            "if (i >= n) return;\n  real_t ax, ay, s = next(f), t;"),
        "atomic helper": CURVE.replace(
            "__global__ void curve(",
            "__device__ REAL count(REAL* c) { return atomicAdd(c, 1.0); }\n"
            "__global__ void curve(REAL* seen, ").replace(
            "wv = weight(c, tv, nc);", "wv = count(seen);"),
    }[case]
    result = apply_rule("coarsen", source, "curve" if "curve" in source else "forces",
                        random.Random(0))
    assert not result.ok and result.reason and re.search(reason, result.reason), result.reason


# cfd's shape: no bound on the index (the host pads the work to the block), and a helper that
# returns its result through a reference parameter
UNCHECKED = r"""
struct v3 { float x, y, z; };
__device__ inline void velocity_of(float& density, v3& momentum, v3& velocity) {
  velocity.x = momentum.x / density;
  velocity.y = momentum.y / density;
  velocity.z = momentum.z / density;
}
__device__ inline float speed2(const v3& v) { return v.x * v.x + v.y * v.y + v.z * v.z; }

__global__ void step_factor(int nelr, const float* variables, float* factors) {
  const int i = (blockDim.x * blockIdx.x + threadIdx.x);
  float density = variables[i];
  v3 momentum;
  momentum.x = variables[i + 1 * nelr];
  momentum.y = variables[i + 2 * nelr];
  momentum.z = variables[i + 3 * nelr];
  v3 velocity;       velocity_of(density, momentum, velocity);
  float s = speed2(velocity);
  factors[i] = 0.5f / (sqrtf(s) + density);
}
"""

UNCHECKED_DRIVER = r"""
#ifndef DX
#define DX 1
#endif
int main() {
    const int nelr = 8 * 8 * 3;  // every factor times the block divides it: an exact grid
    std::vector<float> variables(4 * nelr), factors(nelr, -1.0f);
    for (int k = 0; k < 4 * nelr; ++k) variables[k] = 1.0f + (float)((k * 13) % 29) / 8.0f;
    dim3 block(BX, 1, 1);
    dim3 grid(nelr / (BX * DX), 1, 1);
    launch(grid, block, [&] { step_factor(nelr, variables.data(), factors.data()); });
    for (float v : factors) printf("%a\n", v);
}
"""


def test_a_kernel_that_never_bounds_its_index_is_coarsened_for_exact_grids(
        tmp_path: Path) -> None:
    cpu_grid.compiler()
    variant = coarsened(UNCHECKED, "step_factor")
    assert "// r3: exact x" in variant
    assert "r3_all" not in variant  # no element is ever past the work: no flags checked
    # what the helper writes through its reference is one value per element
    assert "v3 velocity[r3_cf];" in variant and "speed2(velocity[r3_e])" in variant
    expected = same_at_every_factor(UNCHECKED, variant, UNCHECKED_DRIVER, tmp_path, 8)
    assert len(expected.splitlines()) == 192
    compiled = get_toolchain("nvrtc").compile(CompileRequest(
        variant, "step_factor", arch="sm_90", defines=(("R3_CF_X", "4"),)))
    assert compiled.ok, compiled.log


def test_a_helper_writing_a_reference_makes_its_argument_one_value_per_element(
        tmp_path: Path) -> None:
    """With a bound check, too: before, `velocity` was read as not depending on the index,
    so every element used the last element's velocity."""
    cpu_grid.compiler()
    guarded = UNCHECKED.replace("float density = variables[i];",
                                "if (i >= nelr) return;\n  float density = variables[i];")
    variant = coarsened(guarded, "step_factor")
    assert "// r3: exact" not in variant and "v3 velocity[r3_cf];" in variant
    driver = UNCHECKED_DRIVER.replace("const int nelr = 8 * 8 * 3;", "const int nelr = 190;") \
        .replace("dim3 grid(nelr / (BX * DX), 1, 1);", "dim3 grid(r3_cover(nelr, DX, BX), 1, 1);")
    same_at_every_factor(guarded, variant, driver, tmp_path, 8, (2, 8))


def test_the_coarsened_unchecked_kernel_keeps_to_exact_grids_in_the_search() -> None:
    from r3tui.domain import Dim3
    from r3tui.engine import KernelSource, build_space
    from r3tui.engine.inner import InnerSettings
    from r3tui.record.manifest import LaunchInfo
    from r3tui.search import DeviceLimits

    variant = coarsened(UNCHECKED, "step_factor")
    launch = LaunchInfo(grid=Dim3(506), block=Dim3(192), work=Dim3(97152), block_tunable=True)
    space = build_space(launch, KernelSource(variant, "step_factor"),
                        InnerSettings(launch_bounds=False), DeviceLimits())
    pairs = {((c.block or launch.block).x, int(c.tunables.get("R3_CF_X", 1)))
             for c in (space.to_config(p) for p in space.sample(random.Random(1), 3000))}
    assert {f for _, f in pairs} == set(FACTORS)
    assert all(97152 % (b * f) == 0 for b, f in pairs), sorted(pairs)


# a helper that fills a local array through a pointer parameter, and a statement that does not
# depend on the index between the fill and the use
FILLED = r"""
__device__ void fill(float* a, float v) { a[0] = v; a[1] = 2.0f * v; }
__device__ float bump(float a[2]) { a[0] += 1.0f; return a[0]; }

__global__ void filled(const float* x, const float* w, float* y, int n, int m) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float acc[2];
  fill(acc, x[i]);
  float s = 0.0f;
  for (int k = 0; k < m; ++k) s += w[k];
  y[i] = (acc[0] + acc[1]) * s + bump(acc);
}
"""

FILLED_DRIVER = r"""
#ifndef DX
#define DX 1
#endif
int main() {
    const int n = 45, m = 3;
    std::vector<float> x(n), w(m), y(n, -1.0f);
    for (int i = 0; i < n; ++i) x[i] = (float)((i * 7) % 11) * 0.5f;
    for (int k = 0; k < m; ++k) w[k] = 0.25f * (k + 1);
    dim3 block(BX, 1, 1);
    dim3 grid(r3_cover(n, DX, BX), 1, 1);
    launch(grid, block, [&] { filled(x.data(), w.data(), y.data(), n, m); });
    for (float v : y) printf("%a\n", v);
}
"""


@pytest.mark.parametrize(("declared", "made"), [
    ("float acc[2];", "float acc[r3_cf][2];"),
    # zeroed, as xsbench's `double macro_xs_vector[5] = {0};`, and added to by the helper
    ("float acc[2] = {0};", "float acc[r3_cf][2] = {};"),
])
def test_a_local_array_a_helper_fills_through_a_pointer_is_one_per_element(
        tmp_path: Path, declared: str, made: str) -> None:
    cpu_grid.compiler()
    source = FILLED.replace("float acc[2];", declared)
    if "{0}" in declared:
        source = source.replace("a[0] = v; a[1] = 2.0f * v;", "a[0] += v; a[1] += 2.0f * v;")
    variant = coarsened(source, "filled")
    assert made in variant, variant
    same_at_every_factor(source, variant, FILLED_DRIVER, tmp_path, 4, (2, 4, 8))


# kmeans' invert_mapping: the work inside `if (i < n) { ... }`, then a bare `return;`
TRANSPOSE = r"""
__global__ void transpose(const float* input, float* output, int npoints, int nfeatures) {
  int point_id = threadIdx.x + blockDim.x * blockIdx.x;
  int i;

  if (point_id < npoints) {
    for (i = 0; i < nfeatures; i++)
      output[point_id + npoints * i] = input[point_id * nfeatures + i];
  }
  return;
}
"""

TRANSPOSE_DRIVER = r"""
#ifndef DX
#define DX 1
#endif
int main() {
    const int npoints = 45, nfeatures = 3;
    std::vector<float> input(npoints * nfeatures), output(npoints * nfeatures, -1.0f);
    for (size_t k = 0; k < input.size(); ++k) input[k] = (float)k * 0.5f;
    dim3 block(BX, 1, 1);
    dim3 grid(r3_cover(npoints, DX, BX), 1, 1);
    launch(grid, block, [&] { transpose(input.data(), output.data(), npoints, nfeatures); });
    for (float v : output) printf("%a\n", v);
}
"""


def test_a_bare_return_ending_the_body_does_not_hide_the_enclosing_bound(
        tmp_path: Path) -> None:
    cpu_grid.compiler()
    variant = coarsened(TRANSPOSE, "transpose")
    assert "r3_live" in variant and "return;" not in variant.split("transpose(")[1]
    same_at_every_factor(TRANSPOSE, variant, TRANSPOSE_DRIVER, tmp_path, 4)
