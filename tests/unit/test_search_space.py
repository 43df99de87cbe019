"""The inner search space, built from the compile layer's real option table."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest

from r3tui.compile.options import accepted_options, canonicalize, render
from r3tui.domain import Dim3, TrialConfig
from r3tui.search.block import axis_ladder
from r3tui.search.source import Tunable
from r3tui.search.space import (
    STANDARD_PIPELINES,
    DeviceLimits,
    LaunchSpec,
    SearchSpace,
    SpaceError,
    config_key,
    defines_for,
    option_dims,
)

MATH_PARTS = ("--ftz", "--prec-div", "--prec-sqrt", "--fmad")


def nvrtc_dims():
    return option_dims(accepted_options("nvrtc"))


def stencil_launch() -> LaunchSpec:
    return LaunchSpec(block=Dim3(8, 8, 8), work=Dim3(256, 256, 256), block_tunable=True)


@pytest.fixture(scope="module")
def full_space() -> SearchSpace:
    return SearchSpace.from_parts(
        nvrtc_dims(), stencil_launch(),
        tunables=[Tunable("TILE", (8, 16, 32), 16), Tunable("VEC", (1, 2, 4))],
        relations=["TILE * VEC <= 64"], limits=DeviceLimits(), include_launch_bounds=True)


def test_options_come_from_the_compile_layer_table() -> None:
    dims = {d.name: d for d in nvrtc_dims()}
    tunable = {s.name for s in accepted_options("nvrtc") if s.tunable}
    assert set(dims) == tunable  # -lineinfo, --std, -warn-spills change no speed
    # a few useful register limits, not 16..255, and never a value that restates the default
    assert dims["maxrregcount"].values == ("32", "64", "96", "128")
    assert dims["opt-level"].values == ("0", "1", "2")
    assert dims["ftz"].values == ("true",) and dims["fmad"].values == ("false",)
    for dim in dims.values():
        for value in dim.values:
            assert canonicalize("nvrtc", dim.tokens[value])  # the compile layer's spelling


def test_sampled_configs_are_valid_and_accepted_by_the_toolchain(full_space) -> None:
    rng = random.Random(3)
    for point in full_space.sample(rng, 300):
        assert full_space.is_valid_point(point)
        config = full_space.to_config(point)
        canonical = canonicalize("nvrtc", config.options)  # raises on anything not accepted
        assert render("nvrtc", canonical) == list(render("nvrtc", canonical))
        if "--use_fast_math" in config.options:
            assert not any(o.startswith(MATH_PARTS) for o in config.options)
        block = config.block or Dim3(8, 8, 8)
        assert 32 <= block.volume <= 1024  # at least a warp, as the recorded 8x8x8 has
        grid = full_space.grid_for(config) or Dim3(32, 32, 32)
        assert all(g * b >= w for g, b, w in zip(grid.as_tuple(), block.as_tuple(),
                                                 (256, 256, 256), strict=True))
        if config.launch_bounds:
            assert config.launch_bounds[0] >= block.volume
            assert config.launch_bounds[0] * config.launch_bounds[1] <= 2048
        tile = int(config.tunables.get("TILE", 16))
        assert tile * int(config.tunables["VEC"]) <= 64
        assert isinstance(config.tunables["VEC"], int)


def test_to_config_from_config_round_trip(full_space) -> None:
    for point in full_space.sample(random.Random(5), 200):
        config = full_space.to_config(point)
        assert full_space.from_config(config) == point
        again = TrialConfig.from_json(json.loads(json.dumps(config.to_json())))
        assert full_space.from_config(again) == point  # what the database gives back
        assert all(type(v) is int or type(v) is str for v in point)  # no numpy scalars


def test_baseline_is_the_recorded_configuration(full_space) -> None:
    baseline = full_space.baseline_config()
    assert baseline.options == () and baseline.block is None and baseline.launch_bounds is None
    assert baseline.tunables == {"VEC": 1}  # TILE keeps the source's #define; VEC has none
    assert full_space.from_config(baseline) == full_space.baseline_point()
    assert full_space.to_config(full_space.from_config(baseline)) == baseline


@pytest.mark.parametrize(
    "config",
    [
        TrialConfig(options=("--maxrregcount=40",)),  # a value the space does not offer
        TrialConfig(options=("--use_fast_math", "--ftz=true")),  # contradictory
        TrialConfig(options=("--ftz=false",)),  # restates the default: not a point
        TrialConfig(options=("-lineinfo",)),  # not a search dimension
        TrialConfig(block=Dim3(1024, 2, 1)),  # 2048 threads
        TrialConfig(block=Dim3(24, 1, 1)),  # 24 is on no ladder, and less than a warp
        TrialConfig(tunables={"TILE": 32, "VEC": 4}),  # relation TILE * VEC <= 64
        TrialConfig(tunables={"VEC": 3}),
        TrialConfig(tunables={"VEC": 1, "OTHER": 2}),
        TrialConfig(tunables={"VEC": 1}, launch_bounds=(256, 1)),  # 256 < 8*8*8 = 512
        TrialConfig(tunables={"VEC": 1}, pipeline="default<O3>"),  # no pipeline dimension
        TrialConfig(toolchain="nvcc", tunables={"VEC": 1}),
    ],
)
def test_configs_outside_the_space_map_to_none(full_space, config) -> None:
    assert full_space.from_config(config) is None
    assert full_space.check(config)


def test_size_and_enumerate_agree_on_a_small_space() -> None:
    specs = [d for d in nvrtc_dims() if d.name in ("use_fast_math", "ftz", "opt-level")]
    space = SearchSpace.from_parts(
        specs, LaunchSpec(block=Dim3(128), work=Dim3(100_000), block_tunable=True),
        include_launch_bounds=True)
    configs = list(space.enumerate())
    # fast-math x ftz: 3 consistent settings; -O: 4; block.x on its ladder (at least a warp)
    # with bounds none or 32..1024 >= volume and 1..8 blocks with at most 2048 threads per SM.
    assert len(configs) == space.size()
    assert len({config_key(c) for c in configs}) == len(configs)
    assert all(space.from_config(c) is not None for c in configs)
    xs = [x for x in axis_ladder(128, 100_000, 1024, low=4) if x >= 32]
    assert space.size() == 3 * 4 * sum(
        1 + sum(1 for t in (32, 64, 128, 256, 512, 1024) if t >= x
                for m in (1, 2, 4, 8) if t * m <= 2048)
        for x in xs)


def test_launch_bounds_below_the_applications_largest_block_are_not_searched() -> None:
    # rmsnorm in the corpus: the searched configuration ran 32 threads, the application also
    # launches 1024; the winner's __launch_bounds__(32) could not be shipped
    launch = LaunchSpec(block=Dim3(32), work=Dim3(100_000), block_tunable=True)
    space = SearchSpace.from_parts([], launch, include_launch_bounds=True,
                                   launch_bounds_floor=1024)
    (dim,) = [d for d in space.dims if d.role == "lb_threads"]
    assert dim.choices == (1024, None)
    assert {c.launch_bounds[0] for c in space.enumerate() if c.launch_bounds} == {1024}
    assert any("up to 1024 threads per block" in n for n in space.launch_notes())
    rebuilt = SearchSpace.from_description(json.loads(json.dumps(space.describe())))
    assert rebuilt.size() == space.size() and rebuilt.launch_bounds_floor == 1024
    free = SearchSpace.from_parts([], launch, include_launch_bounds=True)
    assert "launch_bounds_floor" not in free.describe()  # older descriptions stay as they were
    assert 32 in next(d for d in free.dims if d.role == "lb_threads").choices


def test_describe_rebuilds_the_same_space(full_space) -> None:
    data = json.loads(json.dumps(full_space.describe()))
    rebuilt = SearchSpace.from_description(data)
    assert rebuilt.names == full_space.names
    assert rebuilt.size() == full_space.size()
    for point in full_space.sample(random.Random(9), 50):
        assert rebuilt.to_config(point) == full_space.to_config(point)


def test_block_shapes_as_a_categorical_and_as_axes() -> None:
    shapes = SearchSpace.from_parts([], stencil_launch(), block_encoding="shapes",
                                    max_block_shapes=20)
    assert shapes.names == ["block"] and shapes.size() == 21  # the 20 kept + the recorded
    assert Dim3(8, 8, 8) in {c.block or Dim3(8, 8, 8) for c in shapes.enumerate()}
    axes = SearchSpace.from_parts([], stencil_launch())
    assert axes.names == ["block.x", "block.y", "block.z"]
    assert all(32 <= c.block.volume <= 1024 for c in axes.enumerate() if c.block)
    one_d = SearchSpace.from_parts([], LaunchSpec(Dim3(256), Dim3(1 << 20), True))
    assert one_d.names == ["block.x"] and one_d.size() == 11  # the 12-rung ladder less 16
    assert one_d.launch_notes() == (
        "block.x: 16 32 64 128 [256] 320 384 512 640 768 896 1024",)
    fixed = SearchSpace.from_parts([], LaunchSpec(Dim3(256), Dim3(1 << 20), False))
    assert fixed.names == [] and fixed.size() == 1 and fixed.baseline_config().block is None


def test_device_limits_and_shared_memory() -> None:
    with pytest.raises(SpaceError, match="device limits"):
        SearchSpace.from_parts([], LaunchSpec(Dim3(1024, 2), Dim3(4096, 4096), True))
    with pytest.raises(SpaceError, match="shared memory"):
        SearchSpace.from_parts([], LaunchSpec(Dim3(256), shared_mem_bytes=64 * 1024))
    # dynamic shared memory that grows with the block: 64 B/thread allows at most 768 threads
    space = SearchSpace.from_parts([], LaunchSpec(Dim3(256), Dim3(1 << 20), True,
                                                  shared_mem_per_thread=64))
    assert {space.dynamic_shared_bytes(c) for c in space.enumerate()} == {
        64 * t for t in (32, 64, 128, 256, 320, 384, 512, 640, 768)}
    small = SearchSpace.from_parts([], LaunchSpec(Dim3(4, 8, 8), Dim3(256, 256, 256), True),
                                   limits=DeviceLimits(max_threads_per_block=256))
    assert max((c.block or Dim3(4, 8, 8)).volume for c in small.enumerate()) == 256


def test_pipelines_dimension_carries_the_pipeline() -> None:
    space = SearchSpace.from_parts([], LaunchSpec(Dim3(256)), pipelines=STANDARD_PIPELINES,
                                   toolchain="llvm")
    pipelines = [c.pipeline for c in space.enumerate()]
    assert pipelines == [None, *STANDARD_PIPELINES]
    assert space.from_config(TrialConfig(toolchain="llvm", pipeline="default<O2>")) is not None
    assert space.from_config(TrialConfig(toolchain="llvm", pipeline="instcombine")) is None


def test_config_key_is_canonical() -> None:
    a = TrialConfig(options=("--ftz=true", "--maxrregcount=64"), block=Dim3(32, 4),
                    tunables={"B": 2, "A": 1}, launch_bounds=(128, 2))
    b = TrialConfig(options=("--maxrregcount=64", "--ftz=true"), block=Dim3(32, 4, 1),
                    tunables={"A": 1, "B": 2}, launch_bounds=(128, 2))
    assert config_key(a) == config_key(b)
    assert config_key(a) != config_key(TrialConfig(options=a.options))
    assert json.loads(config_key(a))["options"] == ["--ftz=true", "--maxrregcount=64"]
    assert defines_for(a) == (("A", "1"), ("B", "2"))


@pytest.mark.parametrize("module", ["r3tui.search", "r3tui.search.space",
                                    "r3tui.search.simulation"])
def test_importing_the_search_core_does_not_import_skopt(module: str) -> None:
    code = (f"import sys, importlib; importlib.import_module({module!r}); "
            "print(','.join(m for m in ('skopt', 'sklearn', 'scipy') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120, check=True)
    assert result.stdout.strip() == ""
