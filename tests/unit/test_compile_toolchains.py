"""Real NVRTC and nvcc compiles of the fixture kernels to sm_90 cubins."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from r3tui.compile import (
    CompileRequest,
    check_driver_compat,
    dedupe,
    get_toolchain,
    nvrtc_version,
)
from r3tui.compile.cubin import Cubin
from r3tui.compile.nvcc import NvccToolchain, lowered_name
from r3tui.compile.nvrtc import default_include_dirs
from r3tui.errors import ConfigError, ToolchainError

DATA = Path(__file__).parent / "data"
KERNELS = (DATA / "kernels.cu").read_text()
HAVE_NVCC = get_toolchain("nvcc").available()[0]
TOOLCHAINS = [
    "nvrtc",
    pytest.param("nvcc", marks=pytest.mark.skipif(not HAVE_NVCC, reason="nvcc is not installed")),
]


@pytest.mark.parametrize("toolchain", TOOLCHAINS)
def test_small_kernel_compiles_to_an_sm90_cubin(toolchain: str) -> None:
    result = get_toolchain(toolchain).compile(CompileRequest(KERNELS, "saxpy"))
    assert result.ok, result.log
    assert result.toolchain == toolchain and result.binary_kind == "cubin"
    assert result.binary is not None and result.binary[:4] == b"\x7fELF"
    assert Cubin.parse(result.binary).sm == 90
    assert result.lowered_name == "saxpy"
    assert result.resources.registers and result.resources.registers > 0
    assert result.resources.spill_stores_bytes == 0
    assert result.resources.max_threads_per_block == 1024
    assert result.seconds > 0 and not result.cached
    assert result.binary_sha256 and len(result.binary_sha256) == 64
    assert "Used" in result.log  # the ptxas -v report is kept in the log


@pytest.mark.parametrize("toolchain", TOOLCHAINS)
def test_template_kernel_through_a_name_expression(toolchain: str) -> None:
    tc = get_toolchain(toolchain)
    floats = tc.compile(CompileRequest(KERNELS, "axpy<float>"))
    doubles = tc.compile(CompileRequest(KERNELS, "axpy< double >"))
    assert floats.ok and doubles.ok, floats.log + doubles.log
    assert floats.lowered_name == "_Z4axpyIfEvT_PKS0_PS0_i"
    assert doubles.lowered_name == "_Z4axpyIdEvT_PKS0_PS0_i"
    assert floats.binary is not None
    assert floats.lowered_name in Cubin.parse(floats.binary).kernel_names()


@pytest.mark.parametrize("toolchain", TOOLCHAINS)
def test_resource_report(toolchain: str) -> None:
    tc = get_toolchain(toolchain)
    capped = tc.compile(CompileRequest(KERNELS, "pressure", options=("-maxrregcount=32",)))
    free = tc.compile(CompileRequest(KERNELS, "pressure"))
    tile = tc.compile(CompileRequest(KERNELS, "tile"))
    local = tc.compile(CompileRequest(KERNELS, "local_array"))
    bounded = tc.compile(CompileRequest(KERNELS, "bounded"))
    assert all(r.ok for r in (capped, free, tile, local, bounded))
    # 32 live accumulators do not fit in 32 registers: ptxas spills them to the stack.
    assert capped.resources.registers is not None and capped.resources.registers <= 32
    assert (capped.resources.spill_stores_bytes or 0) > 0
    assert (capped.resources.spill_loads_bytes or 0) > 0
    assert (capped.resources.local_mem_bytes or 0) > 0
    assert free.resources.spills_bytes == 0
    assert free.resources.registers is not None and free.resources.registers > 32
    assert tile.resources.shared_mem_bytes == 1224
    assert local.resources.local_mem_bytes == 256 and local.resources.spills_bytes == 0
    assert bounded.resources.max_threads_per_block == 128


@pytest.mark.parametrize("toolchain", TOOLCHAINS)
def test_syntax_error_is_a_failed_result_with_the_log(toolchain: str) -> None:
    source = 'extern "C" __global__ void broken(float* y) { y[0] = ; }\n'
    result = get_toolchain(toolchain).compile(
        CompileRequest(source, "broken", source_name="broken.cu")
    )
    assert not result.ok
    assert result.binary is None and result.binary_sha256 is None and result.lowered_name is None
    assert "broken.cu(1): error" in result.log
    assert "expected an expression" in result.log
    assert result.cache_key


@pytest.mark.parametrize("toolchain", TOOLCHAINS)
def test_unknown_kernel_name_is_a_failed_result(toolchain: str) -> None:
    result = get_toolchain(toolchain).compile(CompileRequest(KERNELS, "not_a_kernel"))
    assert not result.ok
    assert "not_a_kernel" in result.log


@pytest.mark.parametrize("toolchain", TOOLCHAINS)
def test_unknown_option_or_arch_raises_before_compiling(toolchain: str) -> None:
    tc = get_toolchain(toolchain)
    with pytest.raises(ConfigError, match="--fast-please"):
        tc.compile(CompileRequest(KERNELS, "saxpy", options=("--fast-please",)))
    with pytest.raises(ConfigError, match="not allowed"):
        tc.compile(CompileRequest(KERNELS, "saxpy", options=("-G",)))
    with pytest.raises(ConfigError, match="sm_35"):
        tc.compile(CompileRequest(KERNELS, "saxpy", arch="sm_35"))


@pytest.mark.parametrize("toolchain", TOOLCHAINS)
def test_option_spellings_give_the_same_binary(toolchain: str) -> None:
    tc = get_toolchain(toolchain)
    one = tc.compile(
        CompileRequest(KERNELS, "pressure", options=("-maxrregcount=64", "-Xptxas", "-O3"))
    )
    two = tc.compile(CompileRequest(KERNELS, "pressure", options=("--maxrregcount", "64")))
    three = tc.compile(
        CompileRequest(KERNELS, "pressure", options=("--ptxas-options=-O3,-v", "-maxrregcount=64"))
    )
    other = tc.compile(CompileRequest(KERNELS, "pressure", options=("-maxrregcount=32",)))
    assert one.ok and two.ok and three.ok and other.ok
    assert one.binary_sha256 == two.binary_sha256 == three.binary_sha256
    assert one.cache_key == three.cache_key != two.cache_key  # -O3 is explicit in one and three
    assert other.binary_sha256 != one.binary_sha256
    # The replay layer measures each (binary, entry point) once.
    groups = dedupe([one, two, three, other])
    assert sorted(groups.values()) == [[0, 1, 2], [3]]


@pytest.mark.parametrize("toolchain", TOOLCHAINS)
def test_defines_and_include_dirs_reach_the_compiler(toolchain: str, tmp_path: Path) -> None:
    (tmp_path / "tile_size.h").write_text("#define EXTRA 8\n")
    source = (
        '#include "tile_size.h"\n'
        'extern "C" __global__ void sized(float* y) {\n'
        "    __shared__ float buf[TILE + EXTRA];\n"
        "    buf[threadIdx.x] = y[threadIdx.x]; __syncthreads();\n"
        "    y[threadIdx.x] = buf[(threadIdx.x + 1) % (TILE + EXTRA)];\n"
        "}\n"
    )
    tc = get_toolchain(toolchain)
    sizes = []
    for tile in ("56", "120"):
        result = tc.compile(
            CompileRequest(
                source, "sized", defines=(("TILE", tile),), include_dirs=(str(tmp_path),)
            )
        )
        assert result.ok, result.log
        sizes.append(result.resources.shared_mem_bytes)
    assert sizes == [4 * 64, 4 * 128]


@pytest.mark.skipif(not default_include_dirs(), reason="no CUDA headers on this machine")
def test_nvrtc_finds_the_cuda_headers() -> None:
    source = (DATA / "half.cu").read_text()
    result = get_toolchain("nvrtc").compile(CompileRequest(source, "half_scale"))
    assert result.ok, result.log
    assert Path(default_include_dirs()[0], "cuda_fp16.h").is_file()


@pytest.mark.skipif(len(default_include_dirs()) < 2, reason="no CCCL headers on this machine")
def test_nvrtc_compiles_a_kernel_using_libcu_cmath() -> None:
    source = ('#include <cuda/std/cmath>\n'
              'extern "C" __global__ void r(float* x) { x[0] = cuda::std::sqrt(x[0]); }\n')
    result = get_toolchain("nvrtc").compile(CompileRequest(source, "r"))
    assert result.ok, result.log


def test_cccl_comes_from_a_toolkit_when_the_cudart_wheel_has_none(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the H200 image: cuda.pathfinder finds the cudart wheel's headers (no cccl/), the
    # toolkit under CUDA_HOME has include/cccl/cuda/std
    from cuda import pathfinder

    wheel, toolkit = tmp_path / "wheel" / "include", tmp_path / "toolkit"
    wheel.mkdir(parents=True)
    (wheel / "cuda_fp16.h").write_text("")
    std = toolkit / "include" / "cccl" / "cuda" / "std"
    std.mkdir(parents=True)
    (std / "cmath").write_text("")
    (toolkit / "include" / "cuda_fp16.h").write_text("")
    monkeypatch.setattr(pathfinder, "find_nvidia_header_directory", lambda _name: str(wheel))
    monkeypatch.setenv("CUDA_HOME", str(toolkit))
    default_include_dirs.cache_clear()
    try:
        assert default_include_dirs() == (str(wheel), str(toolkit / "include" / "cccl"))
        (wheel / "cccl" / "cuda" / "std").mkdir(parents=True)
        (wheel / "cccl" / "cuda" / "std" / "cmath").write_text("")
        default_include_dirs.cache_clear()
        assert default_include_dirs() == (str(wheel), str(wheel / "cccl"))
    finally:
        default_include_dirs.cache_clear()


def test_versions_and_availability() -> None:
    nvrtc = get_toolchain("nvrtc")
    ok, message = nvrtc.available()
    assert ok and "sm_" in message
    assert re.fullmatch(r"nvrtc \d+\.\d+", nvrtc.version())
    major, minor = nvrtc_version()
    assert nvrtc.version() == f"nvrtc {major}.{minor}"
    assert nvrtc.fingerprint().startswith(nvrtc.version())
    if HAVE_NVCC:
        assert re.fullmatch(r"nvcc \d+\.\d+\.\d+", get_toolchain("nvcc").version())


def test_every_toolchain_name_has_its_class_and_one_instance() -> None:
    from r3tui.compile.base import TOOLCHAIN_CLASSES
    from r3tui.compile.options import TOOLCHAIN_NAMES
    from r3tui.errors import ConfigError

    assert sorted(TOOLCHAIN_CLASSES) == sorted(TOOLCHAIN_NAMES)
    for name in TOOLCHAIN_NAMES:  # constructing one runs nothing (nvcc is found when used)
        chain = get_toolchain(name)
        assert chain.name == name and get_toolchain(name) is chain
    with pytest.raises(ConfigError, match="unknown toolchain 'clang'"):
        get_toolchain("clang")


def test_missing_nvcc_is_reported_and_raises(tmp_path: Path) -> None:
    missing = NvccToolchain(executable=str(tmp_path / "bin" / "nvcc"))
    ok, message = missing.available()
    assert not ok and "nvcc" in message
    with pytest.raises(ToolchainError):
        missing.compile(CompileRequest(KERNELS, "saxpy"))


def test_driver_compatibility() -> None:
    same = check_driver_compat(13000, (13, 0))
    assert same.cubin_ok and same.ptx_ok
    newer_driver = check_driver_compat(13020, (13, 0))
    assert newer_driver.cubin_ok and newer_driver.ptx_ok
    newer_compiler = check_driver_compat(13000, (13, 1))
    assert newer_compiler.cubin_ok and not newer_compiler.ptx_ok
    assert "not its PTX" in newer_compiler.message
    old_driver = check_driver_compat(12080, (13, 0))
    assert not old_driver.cubin_ok and not old_driver.ptx_ok
    assert check_driver_compat(13000).compiler_version == nvrtc_version()
    with pytest.raises(ConfigError):
        check_driver_compat(13)


@pytest.mark.skipif(not HAVE_NVCC, reason="nvcc is not installed")
def test_nvcc_finds_template_kernels_without_cxxfilt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = get_toolchain("nvcc").compile(CompileRequest(KERNELS, "axpy<float>"))
    assert result.ok and result.binary is not None
    monkeypatch.setenv("PATH", str(tmp_path))  # no c++filt on PATH
    assert lowered_name(result.binary, "axpy<float>") == (result.lowered_name, "")
    assert lowered_name(result.binary, "saxpy") == ("saxpy", "")
    missing, why = lowered_name(result.binary, "nothing<int>")
    assert missing is None and "not in the cubin" in why
