"""The coarsening rule (register blocking, r3tui.remix.coarsen): on the example kernels and on
small C++ kernels written here, every factor along every axis computes what the original
computes (compiled with g++ and run on this CPU, thread by thread: tests/unit/cpu_grid.py) and
compiles with real NVRTC for sm_90; the rule declines where threads work together or where
the rewrite could change what a thread does."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from r3tui.compile import CompileRequest, get_toolchain
from r3tui.domain import Dim3
from r3tui.remix.coarsen import FACTORS, Declined, coarsen
from r3tui.remix.rules import apply_rule
from r3tui.replay.candidate import Candidate
from r3tui.search.source import parse_tunables, parse_work_per_thread, work_divisors
from tests.unit import cpu_grid

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def example(name: str) -> str:
    return (EXAMPLES / name / "kernel.cu").read_text()


def along(source: str, kernel: str, axes: str) -> str:
    """The rule's rewrite along ``axes`` ("y", or "x, y")."""
    out, detail = coarsen(source, kernel, random.Random(0), axes=axes)
    assert f"along {axes}:" in detail, detail
    return out


# Drivers: ragged sizes (no extent is a multiple of a block or a factor), deterministic data,
# the grid computed from the work as the replay computes it (Candidate._covered), and every
# output printed exactly (%a).
_DIVISORS = """
#ifndef DX
#define DX 1
#endif
#ifndef DY
#define DY 1
#endif
#ifndef DZ
#define DZ 1
#endif
"""

DRIVERS = {
    "sgemm": (_DIVISORS + r"""
int main() {
    const int M = 37, N = 45, K = 13;
    std::vector<float> A(M * K), B(K * N), C(M * N);
    for (int i = 0; i < M * K; ++i) A[i] = (float)((i * 7) % 11) * 0.25f - 1.0f;
    for (int i = 0; i < K * N; ++i) B[i] = (float)((i * 5) % 13) * 0.125f - 0.5f;
    for (int i = 0; i < M * N; ++i) C[i] = (float)(i % 17) * 0.5f;
    dim3 block(BX, BY, BZ);
    dim3 grid(r3_cover(N, DX, BX), r3_cover(M, DY, BY), r3_cover(1, DZ, BZ));
    launch(grid, block, [&] { sgemm(M, N, K, 1.5f, A.data(), B.data(), 0.5f, C.data()); });
    for (float v : C) printf("%a\n", v);
}
""", ("x", "y", "x, y")),  # z: `layer != 0` bounds nothing from above: declined
    "stencil7": (_DIVISORS + r"""
int main() {
    const int nx = 13, ny = 11, nz = 9, n = nx * ny * nz;
    std::vector<double> in(n), out(n, -7.0);
    for (int i = 0; i < n; ++i) in[i] = (double)((i * 37) % 101) / 7.0;
    dim3 block(BX, BY, BZ);
    dim3 grid(r3_cover(nx, DX, BX), r3_cover(ny, DY, BY), r3_cover(nz, DZ, BZ));
    launch(grid, block, [&] { stencil7(in.data(), out.data(), nx, ny, nz, 0.5, 1.0 / 12); });
    for (double v : out) printf("%a\n", v);
}
""", ("x", "y", "z", "y, z")),
    "nbody": (_DIVISORS + r"""
int main() {
    const int n = 45;
    std::vector<float4> pos(n), acc(n, float4{-1, -1, -1, -1});
    for (int i = 0; i < n; ++i)
        pos[i] = make_float4(i * 0.37f, (i % 7) * 1.1f, (i % 5) * -0.6f, 1.0f + (i % 3));
    dim3 block(BX, BY, BZ);
    dim3 grid(r3_cover(n, DX, BX), 1, 1);
    launch(grid, block, [&] { nbody(pos.data(), acc.data(), n, 0.01f); });
    for (float4 v : acc) printf("%a %a %a %a\n", v.x, v.y, v.z, v.w);
}
""", ("x",)),
    "spmv_csr": (_DIVISORS + r"""
int main() {
    const int nrows = 29, ncols = 31;
    std::vector<int> rowptr(nrows + 1), cols;
    std::vector<double> vals, x(ncols), y(nrows, -3.0);
    for (int r = 0; r < nrows; ++r) {
        rowptr[r] = (int)cols.size();
        for (int k = 0; k < (r * 3) % 7; ++k) {
            cols.push_back((r * 11 + k * 5) % ncols);
            vals.push_back((double)(r - k) / 3.0);
        }
    }
    rowptr[nrows] = (int)cols.size();
    for (int i = 0; i < ncols; ++i) x[i] = 1.0 + i * 0.5;
    dim3 block(BX, BY, BZ);
    dim3 grid(r3_cover(nrows, DX, BX), 1, 1);
    launch(grid, block, [&] {
        spmv_csr(nrows, rowptr.data(), cols.data(), vals.data(), x.data(), y.data()); });
    for (double v : y) printf("%a\n", v);
}
""", ("x",)),
    "ptr_struct": (_DIVISORS + r"""
int main() {
    const int n = 27, npairs = 3;
    std::vector<double> xs[npairs], ys[npairs];
    Pair pairs[npairs];
    for (int p = 0; p < npairs; ++p) {
        xs[p].resize(n);
        ys[p].resize(n);
        for (int i = 0; i < n; ++i) { xs[p][i] = i * 0.5 + p; ys[p][i] = 3.0 - i * 0.25; }
        pairs[p] = Pair{xs[p].data(), ys[p].data()};
    }
    dim3 block(BX, BY, BZ);
    dim3 grid(r3_cover(n, DX, BX), r3_cover(npairs, DY, BY), 1);
    launch(grid, block, [&] {
        ptr_struct(pairs, npairs, n, 0.5, xs[0].data(), ys[0].data(), xs[1].data(),
                   ys[1].data(), xs[2].data(), ys[2].data()); });
    for (int p = 0; p < npairs; ++p) for (double v : ys[p]) printf("%a\n", v);
}
""", ("x", "y", "x, y")),
}
BLOCKS = {"sgemm": (8, 4, 2), "stencil7": (4, 3, 2), "nbody": (16, 1, 1),
          "spmv_csr": (8, 1, 1), "ptr_struct": (4, 2, 1)}


def _run(source: str, kernel: str, tmp: Path, block: tuple[int, int, int],
         defines: dict[str, int], name: str) -> str:
    driver, _ = DRIVERS[kernel]
    bx, by, bz = block
    return cpu_grid.run(source, driver, tmp, {"BX": bx, "BY": by, "BZ": bz, **defines}, name)


@pytest.mark.parametrize("kernel", sorted(DRIVERS))
def test_every_factor_along_every_axis_computes_what_the_original_does(
        kernel: str, tmp_path: Path) -> None:
    original = example(kernel)
    block = BLOCKS[kernel]
    expected = _run(original, kernel, tmp_path, block, {}, "original")
    assert len(expected.splitlines()) > 20
    _, axes = DRIVERS[kernel]
    for chosen in axes:
        variant = along(original, kernel, chosen)
        names = {a: f"R3_CF_{a.upper()}" for a in chosen.split(", ")}
        assert parse_work_per_thread(variant) == names
        tunables = parse_tunables(variant)
        assert {t.name for t in tunables} == set(names.values())
        assert all(t.values == FACTORS and t.default == 1 for t in tunables)
        # every factor alone, and for two axes two uneven pairs
        settings = ([dict.fromkeys(names, f) for f in FACTORS] if len(names) == 1 else
                    [dict(zip(names, pair, strict=True)) for pair in ((2, 4), (8, 1))])
        for setting in settings:
            defines = {**{f"D{a.upper()}": f for a, f in setting.items()},
                       **{names[a]: f for a, f in setting.items()}}
            label = "".join(f"{a}{f}" for a, f in setting.items())
            got = _run(variant, kernel, tmp_path, block, defines, label)
            assert got == expected, f"{kernel} {label}:\n{variant}"


def test_the_check_fails_when_the_grid_and_the_factor_disagree(tmp_path: Path) -> None:
    """The comparison can fail: a grid divided by 4 along y while the kernel covers one row
    a thread leaves rows undone, and the output shows it."""
    original = example("sgemm")
    variant = along(original, "sgemm", "y")
    expected = _run(original, "sgemm", tmp_path, (8, 4, 1), {}, "original")
    undone = _run(variant, "sgemm", tmp_path, (8, 4, 1), {"DY": 4, "R3_CF_Y": 1}, "undone")
    assert undone != expected


def test_two_axes_at_once_make_a_two_dimensional_register_tile(tmp_path: Path) -> None:
    original = example("sgemm")
    twice = along(original, "sgemm", "x, y")
    assert parse_work_per_thread(twice) == {"x": "R3_CF_X", "y": "R3_CF_Y"}
    assert "float sum[r3_cf];" in twice  # one accumulator per element of the tile
    # the rule does not coarsen a coarsened kernel again
    again = apply_rule("coarsen", twice, "sgemm", random.Random(0))
    assert not again.ok and "r3_cf is already a name" in (again.reason or "")
    expected = _run(original, "sgemm", tmp_path, (8, 4, 1), {}, "original")
    for fx, fy in ((2, 4), (4, 2), (8, 8), (1, 2)):
        defines = {"DX": fx, "R3_CF_X": fx, "DY": fy, "R3_CF_Y": fy}
        assert _run(twice, "sgemm", tmp_path, (8, 4, 1), defines, f"t{fx}{fy}") == expected
    assert work_divisors(twice, {"R3_CF_X": 2, "R3_CF_Y": 4}) == (2, 4, 1)


def test_the_jammed_loop_reads_the_shared_operand_once_per_iteration() -> None:
    """sgemm along y: the k loop stays one loop and the per-row work is inside it, so B's
    element is the same expression for every row (what register blocking reuses)."""
    variant = along(example("sgemm"), "sgemm", "y")
    fast = variant[variant.index("if (r3_all)"):variant.index("} else {")]
    loop = fast[fast.index("for (int k = 0"):]
    assert loop.index("for (int k = 0") < loop.index("for (int r3_e = 0")
    assert "B[(long long)k * N + col]" in loop and "row[r3_e]" in loop
    # and the slow path checks each element's flag
    assert "if (r3_live[r3_e])" in variant


@pytest.mark.parametrize("kernel", sorted(DRIVERS))
def test_each_factor_compiles_with_nvrtc(kernel: str) -> None:
    nvrtc = get_toolchain("nvrtc")
    _, axes = DRIVERS[kernel]
    for chosen in axes:
        variant = along(example(kernel), kernel, chosen)
        for factor in (1, 8):
            defines = tuple((f"R3_CF_{a.upper()}", str(factor)) for a in chosen.split(", "))
            compiled = nvrtc.compile(CompileRequest(variant, kernel, arch="sm_90",
                                                    defines=defines))
            assert compiled.ok, f"{kernel} {chosen} {factor}:\n{variant}\n{compiled.log}"
            assert compiled.lowered_name == kernel


def test_the_replay_divides_the_grid_along_the_declared_axis() -> None:
    """What the search launches: the work along y covered with 4 rows a thread."""
    candidate = Candidate(b"cubin", "k", work_divisor=(1, 4, 1))
    assert candidate.divisors == (1, 4, 1) and candidate.rescales
    assert candidate._covered(Dim3(45, 37, 1)) == Dim3(45, 10, 1)
    assert Dim3(8, 4, 1).grid_for(candidate._covered(Dim3(45, 37, 1))) == Dim3(6, 3, 1)
    assert Candidate(b"cubin", "k", work_divisor=4).divisors == (4, 1, 1)
    assert not Candidate(b"cubin", "k").rescales


# ---- C++ kernels written here: templates, namespaces, a header's device function -----------

TEMPLATED = r"""
namespace physics {
template <typename T>
__device__ T weight(T r) { return r * r + T(1); }

template <typename T, int K>
__global__ void blur(const T* __restrict__ in, T* __restrict__ out, int n, T scale)
{
    const int i = threadIdx.x + blockIdx.x * blockDim.x;
    if (i < n) {
        T acc = T(0);
        #pragma unroll
        for (int k = -K; k <= K; ++k) {
            int j = i + k;
            if (j < 0) j = 0;
            if (j >= n) j = n - 1;
            acc += in[j] * weight(T(k));
        }
        out[i] = scale * acc;
    }
}
template __global__ void blur<float, 2>(const float*, float*, int, float);
}
"""

TEMPLATED_DRIVER = _DIVISORS + r"""
int main() {
    const int n = 53;
    std::vector<float> in(n), out(n, -1.0f);
    for (int i = 0; i < n; ++i) in[i] = (float)((i * 13) % 29) * 0.5f;
    dim3 block(BX, 1, 1);
    launch(dim3(r3_cover(n, DX, BX)), block, [&] {
        physics::blur<float, 2>(in.data(), out.data(), n, 0.25f); });
    for (float v : out) printf("%a\n", v);
}
"""


def test_a_template_in_a_namespace_with_an_enclosing_bound_check(tmp_path: Path) -> None:
    cpu_grid.compiler()
    prelude = "#define BX 16\n"
    expected = cpu_grid.run(prelude + TEMPLATED, TEMPLATED_DRIVER, tmp_path, name="original")
    variant, detail = coarsen(TEMPLATED, "blur", random.Random(0))
    assert "i coarsened along x" in detail
    # the declarator's own const goes (the array's elements are assigned one by one)
    assert re.search(r"\bint i\[r3_cf\];", variant)
    for factor in FACTORS:
        got = cpu_grid.run(prelude + variant, TEMPLATED_DRIVER, tmp_path,
                           {"DX": factor, "R3_CF_X": factor}, f"v{factor}")
        assert got == expected, variant
    compiled = get_toolchain("nvrtc").compile(CompileRequest(
        variant, "physics::blur<float, 2>", arch="sm_90", defines=(("R3_CF_X", "4"),)))
    assert compiled.ok, compiled.log


DECLINES = {
    "shared memory": (
        "__global__ void k(float* o, const float* x, int n) {\n"
        "    __shared__ float t[32];\n"
        "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
        "    if (i >= n) return;\n    t[threadIdx.x] = x[i];\n    __syncthreads();\n"
        "    o[i] = t[0];\n}\n", "__syncthreads|__shared__"),
    # ordered against something, but not bounded from above (a kernel that orders its index
    # nowhere is coarsened for exact grids: test_remix_older_kernels)
    "no bound": (
        "__global__ void k(float* o, int n) {\n"
        "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n    if (i > 2) o[i] = 1.0f;\n}\n",
        "no guard bounds i"),
    "grid stride": (
        "__global__ void k(float* o, int n) {\n"
        "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
        "    for (; i < n; i += gridDim.x * blockDim.x) o[i] = 1.0f;\n}\n",
        "no index"),
    "return in a loop": (
        "__global__ void k(float* o, const int* f, int n) {\n"
        "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
        "    if (i >= n) return;\n"
        "    for (int k = 0; k < 4; ++k) {\n        if (f[i * 4 + k]) return;\n"
        "        o[i] += 1.0f;\n    }\n}\n", "return that depends on the index"),
    "read before the bound": (
        "__global__ void k(float* o, const float* x, int n) {\n"
        "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
        "    float v = x[i];\n    if (i >= n) return;\n    o[i] = v;\n}\n",
        "before its bound is checked"),
    "break out of a shared loop": (
        "__global__ void k(float* o, const float* x, int n) {\n"
        "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
        "    if (i >= n) return;\n    float s = 0.0f;\n"
        "    for (int k = 0; k < n; ++k) {\n        if (x[i] > k) break;\n"
        "        s += 1.0f;\n    }\n    o[i] = s;\n}\n", "leaves a loop"),
    "a write after the bound that every thread makes": (
        "__global__ void k(float* o, int* count, int n) {\n"
        "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
        "    if (i >= n) return;\n    o[i] = 1.0f;\n    count[0] = n;\n}\n",
        "writes memory without depending on the index"),
    "a reference": (
        "__global__ void k(float* o, int n) {\n"
        "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
        "    if (i >= n) return;\n    float& r = o[i];\n    r = 2.0f;\n}\n",
        "reference"),
}


@pytest.mark.parametrize("case", sorted(DECLINES))
def test_it_declines_with_the_reason(case: str) -> None:
    source, reason = DECLINES[case]
    with pytest.raises(Declined, match=reason):
        coarsen(source, "k", random.Random(0))
    result = apply_rule("coarsen", source, "k", random.Random(0))
    assert not result.ok and result.reason and re.search(reason, result.reason)


MIXED = r"""
__device__ float weight(float v, int k) { return v * (float)(k % 3 + 1); }

__global__ void mixed(const float* a, float* out, int nx, int ny, int m)
{
    int x = blockIdx.x * blockDim.x + threadIdx.x;
    int y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x < nx && y < ny) {
        float acc[3];
        for (int q = 0; q < 3; ++q) {
            acc[q] = 0.0f;
        }
        for (int k = 0; k < m; ++k) {
            float v = a[(k * ny + y) * nx + x];
            acc[k % 3] += v > 0.5f ? weight(v, k) : -v;
        }
        int t = x + y;
        while (t > 7) {
            t -= 7;
        }
        const float scale = t == 0 ? 1.0f : 1.0f / t;
        out[y * nx + x] = (acc[0] + 2.0f * acc[1] + 3.0f * acc[2]) * scale;
    }
}
"""

MIXED_DRIVER = _DIVISORS + r"""
int main() {
    const int nx = 21, ny = 10, m = 5;
    std::vector<float> a(nx * ny * m), out(nx * ny, -2.0f);
    for (size_t i = 0; i < a.size(); ++i) a[i] = (float)((i * 29) % 17) / 16.0f;
    dim3 block(BX, BY, 1);
    dim3 grid(r3_cover(nx, DX, BX), r3_cover(ny, DY, BY), 1);
    launch(grid, block, [&] { mixed(a.data(), out.data(), nx, ny, m); });
    for (float v : out) printf("%a\n", v);
}
"""


def test_local_arrays_device_calls_and_loops_that_depend_on_the_index(tmp_path: Path) -> None:
    """A local array accumulated per element, a call, a ternary, a while loop whose test
    depends on the index, a const local, and the bound as an `if` closing the body."""
    prelude = "#define BX 8\n#define BY 4\n"
    expected = cpu_grid.run(prelude + MIXED, MIXED_DRIVER, tmp_path, name="original")
    for chosen in ("x", "y", "x, y"):
        variant = along(MIXED, "mixed", chosen)
        assert "float acc[r3_cf][3];" in variant
        names = {a: f"R3_CF_{a.upper()}" for a in chosen.split(", ")}
        for factor in (2, 4, 8):
            defines = {**{f"D{a.upper()}": factor for a in names},
                       **dict.fromkeys(names.values(), factor)}
            got = cpu_grid.run(prelude + variant, MIXED_DRIVER, tmp_path, defines,
                               f"{chosen.replace(', ', '')}{factor}")
            assert got == expected, f"{chosen} x{factor}:\n{variant}"
        compiled = get_toolchain("nvrtc").compile(CompileRequest(
            variant, "mixed", arch="sm_90", defines=tuple((n, "4") for n in names.values())))
        assert compiled.ok, compiled.log


def test_an_axis_with_one_element_of_work_is_not_coarsened() -> None:
    """sgemm works on one layer (``layer != 0`` ends the thread): the rule coarsens x and y,
    never z (before: x+z and y+z children behaved as x or y alone, 6 of 23 coarsened
    children in session 42's sgemm campaigns); stencil7's three axes all work and stay, two
    at a time (a pair holds each of its axes alone: factors include 1)."""
    import random

    from r3tui.remix.rules import apply_rule

    def axes(example: str) -> set[str]:
        text = (EXAMPLES / example / "kernel.cu").read_text()
        made = (apply_rule("coarsen", text, example, random.Random(seed)).source
                for seed in range(30))
        return {"".join(a for a in "XYZ" if f"R3_CF_{a}" in s) for s in made if s}

    assert axes("sgemm") == {"XY"}
    assert axes("stencil7") == {"XY", "XZ", "YZ"}
    # one axis where no two can be: nbody's one index
    assert axes("nbody") == {"X"}


# Written here in the shape of Rodinia gaussian's Fan2: the bound checks spell the grid indices
# out before the kernel declares them.
CHECKED_FIRST = r"""
__global__ void step(const float *mult, float *mat, float *rhs, int n, int piv) {
    if (threadIdx.x + blockIdx.x * blockDim.x >= n - 1 - piv) return;
    if ((threadIdx.y + blockIdx.y * blockDim.y) >= n - piv) return;
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    int c = blockIdx.y * blockDim.y + threadIdx.y;
    mat[n * (r + 1 + piv) + (c + piv)] -= mult[n * (r + 1 + piv) + piv] * mat[n * piv + (c + piv)];
    if (c == 0) rhs[r + 1 + piv] -= mult[n * (r + 1 + piv) + piv] * rhs[piv];
}
"""
CHECKED_FIRST_DRIVER = _DIVISORS + r"""
int main() {
    const int n = 23, piv = 2;
    std::vector<float> mult(n * n), mat(n * n), rhs(n);
    for (int i = 0; i < n * n; ++i) mult[i] = (float)((i * 7) % 11) * 0.25f - 1.0f;
    for (int i = 0; i < n * n; ++i) mat[i] = (float)((i * 5) % 13) * 0.125f - 0.5f;
    for (int i = 0; i < n; ++i) rhs[i] = (float)(i % 17) * 0.5f;
    dim3 block(BX, BY, BZ);
    dim3 grid(r3_cover(n, DX, BX), r3_cover(n, DY, BY), 1);
    launch(grid, block, [&] { step(mult.data(), mat.data(), rhs.data(), n, piv); });
    for (float v : mat) printf("%a\n", v);
    for (float v : rhs) printf("%a\n", v);
}
"""


def test_an_index_its_checks_spell_out_before_it_is_declared_is_coarsened(
        tmp_path: Path) -> None:
    """The checks read `threadIdx.x + blockIdx.x * blockDim.x` before `int r = ...;`: the
    index is declared first and the checks read it (analysis.per_thread.index_named), so the
    rule finds the index and its bound, and every factor computes what the original does."""
    from r3tui.analysis.per_thread import index_named
    from r3tui.remix.rules import apply_rule

    named = index_named(CHECKED_FIRST, "step")
    body = named[named.index("{"):]
    assert body.index("int r = ") < body.index("int c = ") < body.index("if (r >= n - 1 - piv)")
    assert "if (c >= n - piv) return;" in body and "threadIdx.x +" not in body
    assert index_named(named, "step") == named  # nothing left to name
    made = apply_rule("coarsen", CHECKED_FIRST, "step", random.Random(0))
    assert made.ok and made.source is not None, made.reason
    cpu_grid.compiler()
    expected = cpu_grid.run(CHECKED_FIRST, CHECKED_FIRST_DRIVER, tmp_path,
                            {"BX": 4, "BY": 4, "BZ": 1}, "original")
    assert len(expected.splitlines()) == 23 * 23 + 23
    names = parse_work_per_thread(made.source)
    for factors in ((2, 4), (8, 1), (4, 2)):
        setting = dict(zip(sorted(names), factors, strict=False))
        defines = {"BX": 4, "BY": 4, "BZ": 1,
                   **{f"D{a.upper()}": f for a, f in setting.items()},
                   **{names[a]: f for a, f in setting.items()}}
        got = cpu_grid.run(made.source, CHECKED_FIRST_DRIVER, tmp_path, defines,
                           "f" + "".join(map(str, factors)))
        assert got == expected, f"{factors}:\n{made.source}"
