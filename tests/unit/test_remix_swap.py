"""The axis-exchange rule (r3tui.remix.swap): on 2-D kernels written here, the exact text it
writes (coordinates of the kernel's body exchanged; comments, strings, another kernel and a
device function left alone), both sides compiled with real NVRTC for sm_90; what the variant
computes, run on this CPU (tests/unit/cpu_grid.py, each block's threads at once with shared
memory and barriers): the original's output at the transposed launch, and at the same launch
where the work is as wide along x as along y; each case it declines; and the mutator offering
it only for such square work."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from r3tui.compile import CompileRequest, get_toolchain
from r3tui.remix.catalogue import transformation
from r3tui.remix.mutation import Mutator
from r3tui.remix.prompt import MutationContext
from r3tui.remix.rules import INDEX_RULES, LAUNCH_RULES, SQUARE_WORK_RULES, apply_rule
from r3tui.remix.swap import Declined, swap_axes
from tests.unit import cpu_grid

# Written here, in the shape of Gaussian elimination's row update: the row below the pivot
# comes from x, so the lanes of a warp touch different rows.  A comment and a string name the
# coordinates; the bound checks read them without a local, one with spaces around the dot.
ELIMINATE = r"""
// threadIdx.x walks the rows below the pivot here
extern "C" __global__ void eliminate(const float* mult, float* mat, float* rhs, int n, int piv)
{
    if (threadIdx.x + blockIdx.x * blockDim.x >= n - 1 - piv) return;
    if (threadIdx . y + blockIdx.y * blockDim.y >= n - piv) return;
    int row = blockIdx.x * blockDim.x + threadIdx.x;  /* from threadIdx.x */
    int col = blockIdx.y * blockDim.y + threadIdx.y;
    const char* note = "blockIdx.x, gridDim.y";
    (void)note;
    mat[n * (row + 1 + piv) + (col + piv)] -=
        mult[n * (row + 1 + piv) + piv] * mat[n * piv + (col + piv)];
    if (col == 0) {
        rhs[row + 1 + piv] -= mult[n * (row + 1 + piv) + piv] * rhs[piv];
    }
}
"""

# The same kernel as the rule writes it: only the coordinates of the code change.
SWAPPED = ELIMINATE
for before, after in (
    ("    if (threadIdx.x + blockIdx.x * blockDim.x >= n - 1 - piv) return;\n",
     "    if (threadIdx.y + blockIdx.y * blockDim.y >= n - 1 - piv) return;\n"),
    ("    if (threadIdx . y + blockIdx.y * blockDim.y >= n - piv) return;\n",
     "    if (threadIdx . x + blockIdx.x * blockDim.x >= n - piv) return;\n"),
    ("    int row = blockIdx.x * blockDim.x + threadIdx.x;  /* from threadIdx.x */\n",
     "    int row = blockIdx.y * blockDim.y + threadIdx.y;  /* from threadIdx.x */\n"),
    ("    int col = blockIdx.y * blockDim.y + threadIdx.y;\n",
     "    int col = blockIdx.x * blockDim.x + threadIdx.x;\n"),
):
    assert SWAPPED.count(before) == 1
    SWAPPED = SWAPPED.replace(before, after)

# Written here: a device function with a warp shuffle that the kernel does not call, and a
# second kernel, both reading the coordinates; neither changes nor stops the rule.
NEIGHBOURS = r"""
__device__ float warp_sum(float v) {
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v + (float)threadIdx.x;
}
extern "C" __global__ void other(float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x + threadIdx.y;
    if (i < n) out[i] = warp_sum((float)i);
}
"""

ELIMINATE_DRIVER = r"""
int main() {
    const int n = 13, piv = 2;
    std::vector<float> mult(n * n), mat(n * n), rhs(n);
    for (int i = 0; i < n * n; ++i) mult[i] = (float)((i * 7) % 11) * 0.25f - 1.0f;
    for (int i = 0; i < n * n; ++i) mat[i] = (float)((i * 5) % 13) * 0.5f - 2.0f;
    for (int i = 0; i < n; ++i) rhs[i] = (float)(i % 5) + 0.5f;
    launch(dim3(GX, GY), dim3(BX, BY), [&] {
        eliminate(mult.data(), mat.data(), rhs.data(), n, piv); });
    for (float v : mat) printf("%a\n", v);
    for (float v : rhs) printf("%a\n", v);
}
"""

# Written here: each thread stages its value in shared memory and, after the barrier, reads
# its block's next thread along y; the output also reads the grid's and the block's extents.
STAGE = r"""
extern "C" __global__ void stage_rows(const float* in, float* out, int rows, int cols)
{
    extern __shared__ float stage[];
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    int c = blockIdx.y * blockDim.y + threadIdx.y;
    bool inside = r < rows && c < cols;
    stage[threadIdx.x * 32 + threadIdx.y] = inside ? in[r * cols + c] : 0.0f;
    __syncthreads();
    unsigned next = (threadIdx.y + 1) % blockDim.y;
    float v = stage[threadIdx.x * 32 + next];
    if (inside) out[r * cols + c] = v + 0.25f * (float)(3 * gridDim.x + gridDim.y) + blockDim.x;
}
"""

STAGE_DRIVER = r"""
int main() {
    const int rows = 11, cols = 7;
    std::vector<float> in(rows * cols), out(rows * cols, -1.0f);
    for (int i = 0; i < rows * cols; ++i) in[i] = (float)((i * 3) % 17) * 0.125f;
    launch_threads(dim3(GX, GY), dim3(BX, BY), [&] {
        stage_rows(in.data(), out.data(), rows, cols); });
    for (float v : out) printf("%a\n", v);
}
"""


def _swap(source: str, kernel: str) -> str:
    made = apply_rule("swap_xy", source, kernel, random.Random(0))
    assert made.ok and made.source is not None, made.reason
    return made.source


def _compiles(source: str, kernel: str) -> None:
    compiled = get_toolchain("nvrtc").compile(CompileRequest(source, kernel, arch="sm_90"))
    assert compiled.ok, f"{kernel}:\n{source}\n{compiled.log}"
    assert compiled.lowered_name == kernel


def _run(source: str, driver: str, tmp: Path, grid: tuple[int, int],
         block: tuple[int, int], name: str) -> str:
    (gx, gy), (bx, by) = grid, block
    return cpu_grid.run(source, driver, tmp, {"GX": gx, "GY": gy, "BX": bx, "BY": by}, name)


def test_the_coordinates_of_the_kernels_body_alone_are_exchanged() -> None:
    source = ELIMINATE + NEIGHBOURS
    made = apply_rule("swap_xy", source, "eliminate", random.Random(0))
    assert made.ok and made.source == SWAPPED + NEIGHBOURS, made.reason
    assert made.detail == "x and y of the thread grid exchanged in eliminate (12 indices)"
    for kernel in ("eliminate", "other"):
        _compiles(source, kernel)
        _compiles(SWAPPED + NEIGHBOURS, kernel)


def test_exchanging_twice_gives_the_original_back() -> None:
    for source, kernel in ((ELIMINATE + NEIGHBOURS, "eliminate"), (STAGE, "stage_rows")):
        once = _swap(source, kernel)
        assert once != source
        assert _swap(once, kernel) == source


def test_z_is_left_alone() -> None:
    source = ELIMINATE.replace("int col = ", "int layer = blockIdx.z * blockDim.z + threadIdx.z;"
                               "\n    if (layer != 0 || gridDim.z == 0) return;\n    int col = ")
    swapped = swap_axes(source, "eliminate", random.Random(0))[0]
    assert "int layer = blockIdx.z * blockDim.z + threadIdx.z;" in swapped
    assert "if (layer != 0 || gridDim.z == 0) return;" in swapped
    _compiles(swapped, "eliminate")


def test_the_variant_computes_what_the_original_does_at_the_transposed_launch(
        tmp_path: Path) -> None:
    """Any work, grid and block: the variant at (G, B) prints what the original prints at
    (G.y, G.x), (B.y, B.x), shared memory and the barrier included; at the same launch, with
    work that is not as wide along x as along y, it prints something else."""
    variant = _swap(STAGE, "stage_rows")
    for (grid, block) in (((3, 2), (4, 5)), ((2, 4), (8, 2)), ((11, 1), (1, 7))):
        flipped = (grid[1], grid[0]), (block[1], block[0])
        expected = _run(STAGE, STAGE_DRIVER, tmp_path, *flipped, "original")
        assert _run(variant, STAGE_DRIVER, tmp_path, grid, block, "variant") == expected
    same = _run(STAGE, STAGE_DRIVER, tmp_path, (3, 2), (4, 5), "same")
    assert _run(variant, STAGE_DRIVER, tmp_path, (3, 2), (4, 5), "variant") != same


def test_on_square_work_the_variant_computes_what_the_original_does(tmp_path: Path) -> None:
    """Elimination below a pivot of a 13 x 13 system: with a grid that covers 13 along both
    axes the variant prints the original's bits at the same launch, at wide and tall blocks;
    with a grid exact to the rows along x and the columns along y it leaves a column undone."""
    variant = _swap(ELIMINATE, "eliminate")
    for grid, block in (((4, 7), (4, 2)), ((7, 4), (2, 4)), ((1, 1), (16, 16))):
        expected = _run(ELIMINATE, ELIMINATE_DRIVER, tmp_path, grid, block, "original")
        assert _run(variant, ELIMINATE_DRIVER, tmp_path, grid, block, "variant") == expected
    # 10 rows (x) and 11 columns (y) below and right of the pivot, covered exactly in pairs
    expected = _run(ELIMINATE, ELIMINATE_DRIVER, tmp_path, (5, 6), (2, 2), "original")
    assert _run(variant, ELIMINATE_DRIVER, tmp_path, (5, 6), (2, 2), "variant") != expected


ONE_D = r"""
extern "C" __global__ void axpy(float* y, const float* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += a * x[i];
}
"""


def _variant(line: str, before: str = "") -> str:
    """ELIMINATE with ``line`` as the body's last statement and ``before`` ahead of it."""
    return before + ELIMINATE.replace("        rhs[row + 1 + piv]", f"        {line}\n"
                                      "        rhs[row + 1 + piv]")


_DECLINED = [
    (ONE_D, "along both x and y"),
    (_variant("mat[0] = __shfl_down_sync(0xffffffffu, mat[0], 1);"), "uses __shfl_down_sync"),
    (_variant("rhs[0] += (float)warpSize;"), "uses warpSize"),
    (_variant("rhs[0] += (float)(row % 32);"), "uses % 32"),
    (_variant("rhs[0] += (float)(col & 31);"), "uses & 31"),
    (_variant('asm volatile("" ::: "memory");'), "uses asm"),
    (_variant("rhs[0] += scaled(rhs[0]);",
              "__device__ float scaled(float v) { return v * blockDim.x; }\n"),
     "the device function scaled, which the kernel calls, reads the grid's coordinates"),
    (_variant("rhs[0] += spread(rhs[0]);",
              "__device__ float lanes(float v) { return __shfl_sync(0xffffffffu, v, 0); }\n"
              "__device__ float spread(float v) { return lanes(v) + 1.0f; }\n"),
     "lanes, which the kernel calls, uses __shfl_sync"),
    (_variant("cg::this_thread_block().sync();",
              "#include <cooperative_groups.h>\nnamespace cg = cooperative_groups;\n"),
     "uses this_thread_block"),
    (_variant("rhs[0] += (float)ROW;", "#define ROW (blockIdx.x * blockDim.x + threadIdx.x)\n"),
     "the macro ROW, which reads the grid's coordinates"),
    (_variant("uint3 t = threadIdx; rhs[0] += (float)t.x;"), "whole"),
    (_variant("rhs[0] += mat[threadIdx.y * blockDim.x + threadIdx.x];"),
     "flattens its threads itself (`threadIdx.y * blockDim.x`)"),
    (_variant("rhs[0] += 1.0f;", "// r3: work_per_thread R3_CF_X x\n"),
     "names an axis of the launch (`// r3: work_per_thread R3_CF_X x`)"),
]


@pytest.mark.parametrize(("source", "reason"), _DECLINED, ids=[r for _s, r in _DECLINED])
def test_the_rule_declines_where_a_warp_or_the_other_code_would_differ(
        source: str, reason: str) -> None:
    kernel = "axpy" if source is ONE_D else "eliminate"
    _compiles(source, kernel)  # each is real CUDA: the rule declines what it could compile
    with pytest.raises(Declined) as raised:
        swap_axes(source, kernel, random.Random(0))
    assert reason in str(raised.value)
    made = apply_rule("swap_xy", source, kernel, random.Random(0))
    assert not made.ok and made.source is None and reason in (made.reason or "")


def test_the_examples_that_flatten_their_block_or_are_one_dimensional_decline() -> None:
    examples = Path(__file__).resolve().parents[2] / "examples"
    applies = {p.parent.name for p in examples.glob("*/kernel.cu")
               if apply_rule("swap_xy", p.read_text(), p.parent.name, random.Random(0)).ok}
    assert applies == {"ptr_struct", "sgemm", "stencil7"}
    missing = apply_rule("swap_xy", ELIMINATE, "not_here", random.Random(0))
    assert not missing.ok and "not_here" in (missing.reason or "")


def test_the_mutator_offers_it_only_where_the_work_is_square() -> None:
    assert {"swap_xy"} == SQUARE_WORK_RULES
    assert "swap_xy" not in LAUNCH_RULES | INDEX_RULES
    wanted = transformation("swap_xy")
    assert wanted.rule == "swap_xy" and wanted.family == "parallelism"
    mutator = Mutator(None)
    wide = mutator.propose_rule(
        MutationContext(kernel_name="eliminate", parent_source=ELIMINATE, transformation=wanted),
        random.Random(0))
    assert not wide.ok
    assert "not as wide along x as along y" in (wide.reason or "")
    square = mutator.propose_rule(
        MutationContext(kernel_name="eliminate", parent_source=ELIMINATE, transformation=wanted,
                        square_work=True), random.Random(0))
    assert square.ok and square.source == SWAPPED


def test_the_model_is_not_asked_to_exchange_the_axes_of_work_that_is_not_square() -> None:
    """The model's transformation is drawn from the catalogue less swap_xy where the work is
    not square, also when the campaign's bandit prefers it."""
    from r3tui.remix.catalogue import CATALOGUE
    from r3tui.remix.mutation import _offered, _preferred

    wide = MutationContext(kernel_name="eliminate", parent_source=ELIMINATE)
    square = MutationContext(kernel_name="eliminate", parent_source=ELIMINATE, square_work=True)
    assert "swap_xy" not in {t.name for t in _offered(wide)}
    assert _offered(square) == CATALOGUE
    order = ("swap_xy", "register_blocking")
    assert _preferred(order, _offered(wide)).name == "register_blocking"  # type: ignore[union-attr]
    assert _preferred(order, _offered(square)).name == "swap_xy"  # type: ignore[union-attr]
