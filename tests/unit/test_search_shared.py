"""Dynamic shared memory as a search dimension: the `// r3: shared EXPR` declaration, the
space's constraint against the device limit, and the config round trip (old rows still load)."""

from __future__ import annotations

import json

import pytest

from r3tui.domain import Dim3, TrialConfig
from r3tui.search import (
    DeclarationError,
    DeviceLimits,
    LaunchSpec,
    SearchSpace,
    SpaceError,
    config_key,
    parse_shared,
    parse_tunables,
)
from r3tui.search.block import axis_ladder

SOURCE = """
// r3: tune TILE 256 1024 4096 16384
// r3: shared TILE * 4
#define TILE 256
extern "C" __global__ void k(const int* x, int* out, int n)
{
    extern __shared__ int tile[];
    tile[threadIdx.x] = x[threadIdx.x];
}
"""


def tile_space(limits: DeviceLimits | None = None, recorded: int = 1024) -> SearchSpace:
    return SearchSpace.from_parts(
        [], LaunchSpec(Dim3(128), Dim3(1 << 20), True, shared_mem_bytes=recorded),
        parse_tunables(SOURCE), limits=limits, shared=parse_shared(SOURCE))


def test_declaration_parses_and_needs_an_extern_shared_array() -> None:
    shared = parse_shared(SOURCE)
    assert shared is not None and shared.text == "TILE * 4" and shared.names == {"TILE"}
    assert shared.value({"TILE": 512}) == 2048
    assert parse_shared("__global__ void k() {}") is None
    no_array = SOURCE.replace("extern __shared__ int tile[];", "__shared__ int tile[256];")
    with pytest.raises(DeclarationError, match="no extern __shared__"):
        parse_shared(no_array)
    commented = SOURCE.replace("extern __shared__ int tile[];", "// extern __shared__ int t[];")
    with pytest.raises(DeclarationError, match="no extern __shared__"):
        parse_shared(commented)
    with pytest.raises(DeclarationError, match="twice"):
        parse_shared(SOURCE.replace("// r3: shared TILE * 4", "// r3: shared 4\n// r3: shared 8"))
    with pytest.raises(DeclarationError, match="line 3"):
        parse_shared(SOURCE.replace("TILE * 4", "TILE ** 4"))
    # the tunables parser accepts the line (it is not an unknown declaration)
    assert [t.name for t in parse_tunables(SOURCE)] == ["TILE"]


def test_every_point_launches_with_its_own_size_within_the_device_limit() -> None:
    space = tile_space()
    assert space.names == ["block.x", "tune.TILE"]
    configs = list(space.enumerate())
    # 16384 ints = 64 KiB never fits the default 48 KiB per block
    assert {c.tunables.get("TILE", 256) for c in configs} == {256, 1024, 4096}
    for config in configs:
        tile = config.tunables.get("TILE", 256)
        expected = None if tile == 256 else tile * 4  # None: the recorded 1024 bytes
        assert config.shared_mem_bytes == expected
        assert space.dynamic_shared_bytes(config) == tile * 4
        assert space.from_config(config) is not None
    over = TrialConfig(tunables={"TILE": 16384}, shared_mem_bytes=65536)
    assert any("exceeds the device limit 49152" in why for why in space.check(over))
    # with the opt-in limit of an H100/H200 (227 KiB) the big tile is a point too
    big = tile_space(DeviceLimits(max_shared_per_block=227 * 1024))
    assert big.check(over) == []
    assert big.size() == space.size() + space.size() // 3


def test_a_size_the_point_does_not_launch_with_is_outside_the_space() -> None:
    space = tile_space()
    assert space.from_config(TrialConfig(tunables={"TILE": 1024})) is None  # recorded 1024 B
    assert space.from_config(TrialConfig(tunables={"TILE": 1024}, shared_mem_bytes=999)) is None
    assert space.from_config(TrialConfig(tunables={"TILE": 1024}, shared_mem_bytes=4096))
    # the recorded size given explicitly is the same point as "recorded"
    assert space.from_config(TrialConfig(shared_mem_bytes=1024)) == space.baseline_point()


def test_the_expression_must_reproduce_the_recorded_launch() -> None:
    with pytest.raises(SpaceError, match=r"gives 1024 bytes.*launched with 512"):
        tile_space(recorded=512)


def test_block_and_unknown_names_in_the_size() -> None:
    launch = LaunchSpec(Dim3(128), Dim3(1 << 20), True, shared_mem_bytes=128 * 8)
    space = SearchSpace.from_parts([], launch, shared="BLOCK_THREADS * 8")
    sizes = {space.dynamic_shared_bytes(c) for c in space.enumerate()}
    assert sizes == {8 * v for v in axis_ladder(128, 1 << 20, 1024, low=4) if v >= 32}
    with pytest.raises(SpaceError, match="names WIDTH"):
        SearchSpace.from_parts([], launch, shared="WIDTH * 8")
    # a size that divides by zero is an invalid point, never an error
    zero = SearchSpace.from_parts([], LaunchSpec(Dim3(128), shared_mem_bytes=0),
                                  parse_tunables("// r3: tune D 0 1\n#define D 1\n"),
                                  shared="(1 - D) / D * 0")
    assert zero.size() == 1 and zero.violations(zero.baseline_point()) == []


def test_description_round_trip_keeps_the_declaration() -> None:
    space = tile_space()
    again = SearchSpace.from_description(json.loads(json.dumps(space.describe())))
    assert again.shared is not None and again.shared.text == "TILE * 4"
    assert [config_key(c) for c in again.enumerate()] == [config_key(c) for c in space.enumerate()]
    old = space.describe()
    del old["shared"]  # a description written before the field existed
    assert SearchSpace.from_description(old).shared is None


def test_trial_config_round_trip_and_old_rows() -> None:
    config = TrialConfig(block=Dim3(64), tunables={"TILE": 1024}, shared_mem_bytes=4096)
    data = json.loads(json.dumps(config.to_json()))
    assert data["shared_mem_bytes"] == 4096 and TrialConfig.from_json(data) == config
    plain = TrialConfig(block=Dim3(64))
    assert "shared_mem_bytes" not in plain.to_json()  # rows look as they did before
    old_row = {"toolchain": "nvrtc", "options": [], "block": [64, 1, 1], "tunables": {},
               "launch_bounds": None, "pipeline": None}
    assert TrialConfig.from_json(old_row) == plain
    # keys of configs without a size are unchanged (recorded tables stay valid); sizes differ
    assert "shared_mem_bytes" not in config_key(plain)
    assert config_key(config) != config_key(TrialConfig(block=Dim3(64), tunables={"TILE": 1024}))
