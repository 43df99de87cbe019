"""The compile cache on real NVRTC results and a real directory."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from r3tui.compile import CompileCache, CompileRequest, cache_key, get_toolchain

KERNELS = (Path(__file__).parent / "data" / "kernels.cu").read_text()
REQUEST = CompileRequest(KERNELS, "saxpy", options=("-maxrregcount=64",))


def entry_file(directory: Path, key: str) -> Path:
    return directory / key[:2] / f"{key}.json"


def test_second_compile_is_a_hit_with_the_same_binary(tmp_path: Path) -> None:
    nvrtc = get_toolchain("nvrtc")
    cache = CompileCache(tmp_path)
    first = cache.compile(nvrtc, REQUEST)
    second = cache.compile(nvrtc, REQUEST)
    assert first.ok and not first.cached and first.seconds > 0
    assert second.cached and second.seconds == 0.0
    assert second.binary == first.binary and second.binary_sha256 == first.binary_sha256
    assert second.resources == first.resources and second.lowered_name == first.lowered_name
    # A different spelling of the same options is the same entry.
    respelled = cache.compile(
        nvrtc, CompileRequest(KERNELS, "saxpy", options=("--maxrregcount", "64"))
    )
    assert respelled.cached and respelled.binary == first.binary


def test_disk_cache_survives_a_new_instance(tmp_path: Path) -> None:
    nvrtc = get_toolchain("nvrtc")
    first = CompileCache(tmp_path).compile(nvrtc, REQUEST)
    fresh = CompileCache(tmp_path)
    assert first.cache_key in fresh
    hit = fresh.get(first.cache_key)
    assert hit is not None and hit.cached and hit.seconds == 0.0
    assert hit.binary == first.binary and hit.log == first.log
    assert hit.toolchain_version == first.toolchain_version
    assert list(tmp_path.rglob("*.tmp")) == []  # writes leave no temporary files behind


@pytest.mark.parametrize(
    "damage",
    ["torn", "garbage", "not-an-object", "bad-checksum", "wrong-key", "old-format"],
)
def test_damaged_entries_are_misses_not_errors(tmp_path: Path, damage: str) -> None:
    nvrtc = get_toolchain("nvrtc")
    first = CompileCache(tmp_path).compile(nvrtc, REQUEST)
    path = entry_file(tmp_path, first.cache_key)
    text = path.read_text()
    data = json.loads(text)
    if damage == "torn":
        path.write_text(text[: len(text) // 2])
    elif damage == "garbage":
        path.write_bytes(os.urandom(256))
    elif damage == "not-an-object":
        path.write_text("[1, 2, 3]")
    elif damage == "bad-checksum":
        data["binary_b64"] = data["binary_b64"][:-8] + "AAAAAAA="
        path.write_text(json.dumps(data))
    elif damage == "wrong-key":
        data["cache_key"] = "0" * 64
        path.write_text(json.dumps(data))
    else:
        data["format"] = -1
        path.write_text(json.dumps(data))
    fresh = CompileCache(tmp_path)
    assert fresh.get(first.cache_key) is None
    again = fresh.compile(nvrtc, REQUEST)  # recompiled and rewritten
    assert again.ok and not again.cached and again.binary_sha256 == first.binary_sha256
    assert CompileCache(tmp_path).get(first.cache_key) is not None


def test_a_killed_writers_temporary_file_is_not_an_entry(tmp_path: Path) -> None:
    nvrtc = get_toolchain("nvrtc")
    key = cache_key(nvrtc, REQUEST)
    path = entry_file(tmp_path, key)
    path.parent.mkdir(parents=True)
    # What a writer killed between write and os.replace leaves: a half-written temporary file.
    (path.parent / f".{path.name}.abc123.tmp").write_text('{"format": 1, "cache_')
    cache = CompileCache(tmp_path)
    assert cache.get(key) is None
    assert cache.compile(nvrtc, REQUEST).ok
    assert CompileCache(tmp_path).get(key) is not None


def test_failed_compiles_are_not_cached(tmp_path: Path) -> None:
    nvrtc = get_toolchain("nvrtc")
    cache = CompileCache(tmp_path)
    broken = CompileRequest('extern "C" __global__ void k() { nope }', "k")
    assert not cache.compile(nvrtc, broken).ok
    again = cache.compile(nvrtc, broken)
    assert not again.ok and not again.cached
    assert list(tmp_path.rglob("*.json")) == []


def test_memory_only_cache_is_bounded() -> None:
    nvrtc = get_toolchain("nvrtc")
    cache = CompileCache(max_memory_entries=1)
    first = cache.compile(nvrtc, REQUEST)
    assert cache.compile(nvrtc, REQUEST).cached
    other = cache.compile(nvrtc, CompileRequest(KERNELS, "tile"))
    assert other.ok and first.cache_key not in cache and other.cache_key in cache
