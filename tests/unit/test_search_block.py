"""The launch space's block shapes: derived ladders, macros tied to the block, and the reasons
a kernel's block stays fixed (read from real CUDA sources with the tree-sitter parser)."""

from __future__ import annotations

import json
import math

import pytest

from r3tui.compile.base import get_toolchain
from r3tui.domain import Dim3, MeasurementStatus, TrialConfig
from r3tui.engine.inner import KernelSource, compile_request, launch_facts
from r3tui.record.app_dump import launched_threads
from r3tui.record.manifest import LaunchInfo
from r3tui.search import BayesSearch, BayesSettings, Budget, parse_tunables
from r3tui.search.block import AXIS_LADDER_MAX, axis_ladder
from r3tui.search.block_source import block_facts
from r3tui.search.space import LaunchSpec, SearchSpace

GENERIC = """
__global__ void scale(float *x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int j = blockIdx.y * blockDim.y + threadIdx.y;
    if (i < n && j < n) x[j * n + i] *= 2.0f;
}
"""

TILED = """
#include <cstdio>
#ifndef BLOCK_SIZE
#define BLOCK_SIZE 16
#endif
__global__ void transpose(float *out, const float *in, int n) {
    __shared__ float tile[BLOCK_SIZE][BLOCK_SIZE + 1];
    int x = blockIdx.x * BLOCK_SIZE + threadIdx.x, y = blockIdx.y * BLOCK_SIZE + threadIdx.y;
    tile[threadIdx.y][threadIdx.x] = in[y * n + x];
    __syncthreads();
    out[x * n + y] = tile[threadIdx.y][threadIdx.x];
}
int main() {
    dim3 threads(BLOCK_SIZE, BLOCK_SIZE);
    transpose<<<dim3(64, 64), threads>>>(0, 0, 1024);
    return 0;
}
"""


def ladder_ok(values: tuple[int, ...], recorded: int) -> None:
    assert list(values) == sorted(set(values)) and len(values) <= AXIS_LADDER_MAX
    assert recorded in values


@pytest.mark.parametrize(("recorded", "work"), [
    (48, 48 * 1000), (48, 1000), (80, 80 * 1000), (80, 1001), (256, 1 << 20), (256, 1_000_000),
    (16, 4096),
])
def test_axis_ladders_keep_the_recorded_extent_its_neighbours_and_exact_grids(
        recorded: int, work: int) -> None:
    values = axis_ladder(recorded, work, 1024, low=4)
    ladder_ok(values, recorded)
    assert {recorded // 2, 2 * recorded} <= set(values)  # its neighbours
    assert any(v & (v - 1) for v in values)  # not only powers of two
    # every rung gives an exact grid or full (half) warps
    assert all(work % v == 0 or v % 16 == 0 for v in values if v != recorded // 2)
    exact = sorted(v for v in range(32, 1025, 32) if work % v == 0)
    kept = [v for v in values if work % v == 0 and v % 32 == 0]
    # divisors that are multiples of 32 go first: as many as the ladder has room for
    assert len(kept) >= min(len(exact), AXIS_LADDER_MAX - 3)


def test_ladders_on_real_shapes() -> None:
    assert axis_ladder(80, 80_000, 1024, low=4) == (
        16, 32, 40, 64, 80, 128, 160, 256, 320, 400, 640, 800)
    assert axis_ladder(48, 48_000, 1024, low=4) == (
        24, 32, 48, 64, 96, 128, 160, 192, 320, 384, 640, 960)
    assert axis_ladder(1, 1, 1024, axis=1) == (1,)  # no work along y: nothing to vary
    assert axis_ladder(16, 2048, 1024, axis=1)[:5] == (1, 2, 4, 8, 16)


@pytest.mark.parametrize(("block", "work"), [
    (Dim3(16, 16), Dim3(1024, 1024)), (Dim3(16, 16), Dim3(1000, 1000)),
    (Dim3(48), Dim3(48_000)), (Dim3(48), Dim3(1000)), (Dim3(80), Dim3(80_000)),
    (Dim3(16, 1), Dim3(4096, 1)), (Dim3(256), Dim3(1 << 20)), (Dim3(256), Dim3(1_000_000)),
])
def test_spaces_of_real_shapes_cover_the_work(block: Dim3, work: Dim3) -> None:
    space = SearchSpace.from_parts([], LaunchSpec(block, work, True))
    configs = list(space.enumerate())
    assert space.baseline_config().block is None and len(configs) > 5
    shapes = {c.block or block for c in configs}
    assert any(s.volume % 32 for s in shapes) or block.volume % 32 == 0
    for config in configs:
        shape = config.block or block
        assert min(32, block.volume) <= shape.volume <= 1024
        grid = space.grid_for(config) or shape.grid_for(work)
        assert all(g * b >= w for g, b, w in zip(grid.as_tuple(), shape.as_tuple(),
                                                 work.as_tuple(), strict=True))
        assert space.from_config(config) is not None
    if work.y == 1:  # 16x1: y stays 1
        assert {s.y for s in shapes} == {1}


def test_a_macro_tied_to_the_block_is_one_dimension_sent_as_a_define() -> None:
    facts = block_facts(TILED, "transpose", Dim3(16, 16))
    assert [(t.macro, t.axes, t.guarded) for t in facts.ties] == [("BLOCK_SIZE", (0, 1), True)]
    space = SearchSpace.from_parts([], LaunchSpec(Dim3(16, 16), Dim3(1024, 1024), True,
                                                  facts=facts))
    assert space.names == ["block.BLOCK_SIZE"]
    configs = list(space.enumerate())
    # 4x4 is on the ladder but has less than a warp of threads
    assert [(c.block, c.tunables) for c in configs] == [
        (Dim3(8, 8), {"BLOCK_SIZE": 8}), (None, {}), (Dim3(32, 32), {"BLOCK_SIZE": 32})]
    assert space.launch_notes() == (
        "block.x, block.y = BLOCK_SIZE: 4 8 [16] 32 (-DBLOCK_SIZE=value)",)
    # the block and its macro only together
    assert space.from_config(TrialConfig(block=Dim3(8, 8))) is None
    assert space.from_config(TrialConfig(tunables={"BLOCK_SIZE": 8})) is None
    assert space.from_config(TrialConfig(block=Dim3(8, 8), tunables={"BLOCK_SIZE": 8}))
    # the -D reaches the compiler: the tile in shared memory follows it (real NVRTC)
    source = KernelSource(TILED.split("int main")[0].replace("#include <cstdio>", ""),
                          "transpose")
    sizes = {}
    for config in configs:
        compiled = get_toolchain("nvrtc").compile(compile_request(source, config, "sm_90"))
        assert compiled.ok, compiled.log
        sizes[(config.block or Dim3(16, 16)).x] = compiled.resources.shared_mem_bytes
    assert sizes == {8: 8 * 9 * 4, 16: 16 * 17 * 4, 32: 32 * 33 * 4}


def test_a_declared_tunable_gives_the_macro_its_values() -> None:
    source = "// r3: tune BLOCK_SIZE 8 16 24\n" + TILED
    tunables = parse_tunables(source)
    launch = LaunchInfo(Dim3(64, 64), Dim3(16, 16), work=Dim3(1024, 1024), block_tunable=True)
    facts = launch_facts(launch, KernelSource(source, "transpose"), tunables)
    assert facts is not None and facts.ties[0].values == (8, 16, 24)
    space = SearchSpace.from_parts([], LaunchSpec.of(launch, facts=facts), tunables,
                                   relations=["BLOCK_SIZE * BLOCK_SIZE >= 64"])
    assert space.names == ["block.BLOCK_SIZE"]  # the tunable is the block's dimension
    assert sorted((c.block or Dim3(16, 16)).x for c in space.enumerate()) == [8, 16, 24]
    rebuilt = SearchSpace.from_description(json.loads(json.dumps(space.describe())))
    assert rebuilt.names == space.names and rebuilt.size() == space.size()


@pytest.mark.parametrize(("source", "block", "why"), [
    ("__global__ void k(float *x) { x[blockIdx.x * 256 + threadIdx.x] = 0; }", Dim3(256),
     "block.x fixed at 256: the kernel reads threadIdx.x but not blockDim.x"),
    ("#define BX 16\n#define BY 16\n__global__ void k(float *x) { __shared__ float t[BX][BY];"
     " t[threadIdx.y][threadIdx.x] = x[threadIdx.x]; x[threadIdx.y] = t[0][threadIdx.y]; }",
     Dim3(16, 16), "macros BX and BY both equal 16"),
    ("__global__ void k(float *x) { x[0] = 1; }", Dim3(32),
     "the kernel reads neither threadIdx.x nor blockDim.x"),
    ("__global__ void other(float *x) { x[threadIdx.x] = 0; }", Dim3(64),
     "the definition of k is not in the recorded source"),
])
def test_fixed_shapes_say_why(source: str, block: Dim3, why: str) -> None:
    facts = block_facts(source, "k", block)
    work = Dim3(4096, 64 if block.y > 1 else 1)
    space = SearchSpace.from_parts([], LaunchSpec(block, work, True, facts=facts))
    assert space.names == [] and space.size() == 1
    assert space.launch_notes()[0].startswith(f"block fixed at {block.x}x{block.y}x1: ")
    assert why in space.launch_notes()[0]


def test_the_recording_alone_can_fix_the_block() -> None:
    no_work = SearchSpace.from_parts([], LaunchSpec(Dim3(80), None, True))
    assert no_work.launch_notes() == ("block fixed at 80x1x1: no work size recorded, so no grid "
                                      "can be derived for another block (record the program "
                                      "again)",)
    declared = SearchSpace.from_parts([], LaunchSpec(Dim3(80), Dim3(8000), False))
    assert "hard-codes its block size" in declared.launch_notes()[0]
    launch = LaunchInfo(Dim3(100), Dim3(80))  # an application bundle from before work sizes
    assert launch_facts(launch, KernelSource(GENERIC, "scale")) is None


def test_launch_bounds_warps_and_halving_limit_the_shapes() -> None:
    source = """
    __global__ void __launch_bounds__(128) reduce(float *x, float *out) {
        __shared__ float s[1024];
        s[threadIdx.x] = x[blockIdx.x * blockDim.x + threadIdx.x];
        for (int k = blockDim.x / 2; k > 0; k >>= 1) { __syncthreads(); s[threadIdx.x] += s[k]; }
        float v = __shfl_down_sync(0xffffffff, s[0], 1);
        if (threadIdx.x == 0) out[blockIdx.x] = v;
    }"""
    facts = block_facts(source, "reduce", Dim3(96))
    assert facts.max_threads == 128 and facts.pow2 == (0,) and facts.full_warps
    space = SearchSpace.from_parts([], LaunchSpec(Dim3(96), Dim3(96 * 512), True, facts=facts))
    shapes = {(c.block or Dim3(96)).x for c in space.enumerate()}
    assert shapes == {32, 64, 96, 128}  # powers of two, full warps, the recorded 96, <= 128
    notes = "\n".join(space.launch_notes())
    assert "__launch_bounds__(128)" in notes and "__shfl_down_sync" in notes
    assert "powers of two only" in notes
    # with the search injecting its own bounds, the source's no longer caps the block
    injected = SearchSpace.from_parts([], LaunchSpec(Dim3(96), Dim3(96 * 512), True,
                                                     facts=facts), include_launch_bounds=True)
    assert max((c.block or Dim3(96)).x for c in injected.enumerate() if c.launch_bounds) > 128
    assert all((c.block or Dim3(96)).x <= 128 for c in injected.enumerate()
               if c.launch_bounds is None)


def test_an_unguarded_macro_is_tied_and_says_so() -> None:
    source = TILED.replace("#ifndef BLOCK_SIZE\n", "").replace("#endif\n", "", 1)
    facts = block_facts(source, "transpose", Dim3(16, 16))
    assert [(t.macro, t.guarded) for t in facts.ties] == [("BLOCK_SIZE", False)]
    space = SearchSpace.from_parts([], LaunchSpec(Dim3(16, 16), Dim3(1024, 1024), True,
                                                  facts=facts))
    assert "no #ifndef guard" in space.launch_notes()[0]
    config = next(c for c in space.enumerate() if c.block == Dim3(8, 8))
    request = compile_request(KernelSource(source, "transpose"), config,
                              "sm_90")
    assert "#ifndef BLOCK_SIZE" in request.source  # the engine guards it so the -D wins


def test_bayes_asks_only_valid_points_of_derived_spaces() -> None:
    facts = block_facts(TILED, "transpose", Dim3(16, 16))
    spaces = [
        SearchSpace.from_parts([], LaunchSpec(Dim3(48), Dim3(1000), True),
                               include_launch_bounds=True),
        SearchSpace.from_parts([], LaunchSpec(Dim3(16, 16), Dim3(1000, 1000), True)),
        SearchSpace.from_parts([], LaunchSpec(Dim3(16, 16), Dim3(1024, 1024), True,
                                              facts=facts), include_launch_bounds=True),
    ]
    for space in spaces:
        search = BayesSearch(space, seed=2, settings=BayesSettings(n_initial_points=5,
                                                                   n_candidates=200))
        budget = Budget(max_trials=14)
        asked: list[TrialConfig] = []
        while not search.done(budget):
            for config in search.ask(min(3, search.remaining(budget))):
                asked.append(config)
                assert not space.check(config), space.check(config)
                block = config.block or space.launch.block
                # SYNTHETIC landscape: fastest near 128 threads
                search.tell(config, 1e-4 * (1 + abs(math.log2(block.volume / 128)))
                            if block.volume != 1024 else MeasurementStatus.LAUNCH_ERROR)
        assert len(asked) == 14 and len({json.dumps(c.to_json()) for c in asked}) == 14


def test_descriptions_keep_their_ladder() -> None:
    space = SearchSpace.from_parts([], LaunchSpec(Dim3(80), Dim3(80_000), True))
    data = json.loads(json.dumps(space.describe()))
    assert data["launch"]["ladder"] == "derived"
    assert SearchSpace.from_description(data).size() == space.size()
    del data["launch"]["ladder"]  # written before the derived ladders: powers of two
    old = SearchSpace.from_description(data)
    assert {(c.block or Dim3(80)).x for c in old.enumerate()} == {32, 64, 80, 128, 256, 512,
                                                                   1024}


def test_an_application_launch_records_its_threads_as_work() -> None:
    assert launched_threads(Dim3(1000), Dim3(80)) == Dim3(80_000)
    assert launched_threads(Dim3(64, 64), Dim3(16, 16)) == Dim3(1024, 1024)
