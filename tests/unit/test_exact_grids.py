"""A kernel that never checks its grid index against a bound (cfd's and hotspot3D's kernels:
the host sizes the work to a multiple of the block) stays within its arrays only when the grid
covers the work exactly.  The analysis finds such axes, and the launch space keeps to blocks
(and elements a thread) that divide the work there; kernels that check their index keep the
whole ladder."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from r3tui.analysis.per_thread import unchecked_axes
from r3tui.domain import Dim3
from r3tui.engine import KernelSource, build_space
from r3tui.engine.inner import InnerSettings
from r3tui.record.manifest import LaunchInfo
from r3tui.search import DeviceLimits
from r3tui.search.source import DeclarationError, parse_exact, parse_tunables

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

# the shape of cfd's element kernels: the index straight into the arrays, no bound
UNCHECKED = r"""
#define NVAR 5
__global__ void step(int nelr, const float* variables, const float* areas, float* factors)
{
    const int i = (blockDim.x * blockIdx.x + threadIdx.x);
    float density = variables[i + 0 * nelr];
    float energy = variables[i + 4 * nelr];
    factors[i] = 0.5f / (sqrtf(areas[i]) * (density + energy));
}
"""

# hotspot3D's shape: two unchecked indices and boundary tests by equality, not bounds
PLANES = r"""
__global__ void planes(const float* in, float* out, int nx, int ny, int nz)
{
    int i = blockDim.x * blockIdx.x + threadIdx.x;
    int j = blockDim.y * blockIdx.y + threadIdx.y;
    int c = i + j * nx;
    int w = (i == 0) ? c : c - 1;
    int e = (i == nx - 1) ? c : c + 1;
    for (int k = 0; k < nz; ++k) {
        out[c + k * nx * ny] = in[w + k * nx * ny] + in[e + k * nx * ny];
    }
}
"""


def test_the_analysis_finds_the_axes_a_kernel_never_bounds() -> None:
    assert unchecked_axes(UNCHECKED, "step") == ("x",)
    assert unchecked_axes(PLANES, "planes") == ("x", "y")
    # bounded by the index, by a local computed from it, or by the built-ins themselves
    for guard in ("if (i >= nelr) return;", "int r = i * 2; if (r > nelr) return;",
                  "if (threadIdx.x + blockIdx.x * blockDim.x >= nelr) return;"):
        checked = UNCHECKED.replace("float density", f"{guard}\n    float density")
        assert unchecked_axes(checked, "step") == (), guard
    # a value read from memory at the index is not the index: comparing it bounds nothing
    read = UNCHECKED.replace("float density", "if (areas[i] > 1.0f) return;\n    float density")
    assert unchecked_axes(read, "step") == ("x",)
    for name in ("stencil7", "softmax", "nbody", "spmv_csr", "reduce_sum"):
        assert unchecked_axes((EXAMPLES / name / "kernel.cu").read_text(), name) == (), name


def configs(space):
    """3,000 points drawn uniformly from the valid ones (the spaces are too big to list)."""
    return [space.to_config(p) for p in space.sample(random.Random(0), 3000)]


def blocks(space, axis: int = 0) -> set[int]:
    return {(c.block or space.launch.block).as_tuple()[axis] for c in configs(space)}


def test_an_unchecked_axis_keeps_to_blocks_that_divide_the_work() -> None:
    # an application's launch: 506 blocks of 192 threads, the work 97152 threads
    launch = LaunchInfo(grid=Dim3(506), block=Dim3(192), work=Dim3(97152), block_tunable=True)
    space = build_space(launch, KernelSource(UNCHECKED, "step"),
                        InnerSettings(launch_bounds=False), DeviceLimits())
    offered = blocks(space)
    assert 192 in offered and len(offered) > 3
    assert all(97152 % b == 0 for b in offered), sorted(offered)
    assert any("only grids that cover the work exactly" in n for n in space.launch_notes())
    # the same kernel checking its index, on a work of a prime number of elements: the
    # whole ladder (no block but 1 divides it)
    checked = UNCHECKED.replace("float density", "if (i >= nelr) return;\n    float density")
    ragged = LaunchInfo(grid=Dim3(782), block=Dim3(128), work=Dim3(100003), block_tunable=True)
    free = build_space(ragged, KernelSource(checked, "step"),
                       InnerSettings(launch_bounds=False), DeviceLimits())
    assert len(blocks(free)) > 3 and not any("exactly" in n for n in free.launch_notes())


def test_both_axes_of_a_two_dimensional_kernel_and_elements_a_thread() -> None:
    launch = LaunchInfo(grid=Dim3(16, 64), block=Dim3(32, 4), work=Dim3(512, 256),
                        block_tunable=True)
    space = build_space(launch, KernelSource(PLANES, "planes"),
                        InnerSettings(launch_bounds=False), DeviceLimits())
    for config in configs(space):
        block = config.block or launch.block
        assert 512 % block.x == 0 and 256 % block.y == 0, block
    # a variant that declares the axis exact and covers R3_W elements a thread along it
    declared = ("// r3: tune R3_W 1 2 3 4\n// r3: work_per_thread R3_W x\n// r3: exact x\n"
                "#ifndef R3_W\n#define R3_W 1\n#endif\n" + UNCHECKED.replace(
                    "const int i = (blockDim.x * blockIdx.x + threadIdx.x);",
                    "const int i = blockIdx.x * R3_W * blockDim.x + threadIdx.x;"))
    assert unchecked_axes(declared, "step") == ()  # no index the analysis reads: declared
    launch1 = LaunchInfo(grid=Dim3(506), block=Dim3(192), work=Dim3(97152), block_tunable=True)
    space1 = build_space(launch1, KernelSource(declared, "step"),
                         InnerSettings(launch_bounds=False), DeviceLimits())
    pairs = {((c.block or launch1.block).x, int(c.tunables.get("R3_W", 1)))
             for c in configs(space1)}
    assert (192, 1) in pairs and any(w == 3 for _, w in pairs)
    assert all(97152 % (b * w) == 0 for b, w in pairs), sorted(pairs)


def test_no_relation_where_the_recorded_launch_itself_is_not_exact() -> None:
    # 1000 elements in blocks of 128: the recorded grid already runs past them, so the kernel
    # must bound its index some way the reading does not see; nothing is imposed
    launch = LaunchInfo(grid=Dim3(8), block=Dim3(128), work=Dim3(1000), block_tunable=True)
    space = build_space(launch, KernelSource(UNCHECKED, "step"),
                        InnerSettings(launch_bounds=False), DeviceLimits())
    assert not any("exactly" in n for n in space.launch_notes())


def test_the_exact_declaration_parses_axes_and_refuses_other_words() -> None:
    assert parse_exact("// r3: exact x\n// r3: exact z y\n") == ("x", "y", "z")
    assert parse_tunables("// r3: exact x\n") == ()
    with pytest.raises(DeclarationError, match="not a list of axes"):
        parse_exact("// r3: exact w\n")
