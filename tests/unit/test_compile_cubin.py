"""The cubin ELF reader against ptxas's own -v report, on real NVRTC and nvcc cubins."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from r3tui.compile import CompiledKernel, CompileRequest, get_toolchain
from r3tui.compile.cubin import (
    Cubin,
    CubinError,
    KernelAttributes,
    code_sha256,
    parse_nv_info,
)
from r3tui.compile.resources import kernel_resources, max_threads_per_block, parse_ptxas_log

DATA = Path(__file__).parent / "data"
KERNELS = (DATA / "kernels.cu").read_text()
CASES = [
    ("saxpy", ()),
    ("tile", ()),
    ("local_array", ()),
    ("pressure", ("-maxrregcount=32",)),
    ("bounded", ()),
    ("axpy<double>", ()),
]
TOOLCHAINS = [
    "nvrtc",
    pytest.param(
        "nvcc",
        marks=pytest.mark.skipif(
            not get_toolchain("nvcc").available()[0], reason="nvcc is not installed"
        ),
    ),
]


@pytest.fixture(scope="module", params=TOOLCHAINS)
def compiled(request: pytest.FixtureRequest) -> dict[str, CompiledKernel]:
    toolchain = get_toolchain(request.param)
    results = {}
    for name, options in CASES:
        result = toolchain.compile(CompileRequest(KERNELS, name, options=options))
        assert result.ok, result.log
        results[name] = result
    return results


def test_elf_attributes_match_the_ptxas_report(compiled: dict[str, CompiledKernel]) -> None:
    for name, result in compiled.items():
        assert result.binary is not None and result.lowered_name is not None
        attrs = Cubin.parse(result.binary).kernel(result.lowered_name)
        report = parse_ptxas_log(result.log)[result.lowered_name]
        assert attrs.registers == report.registers, name
        assert attrs.frame_bytes == report.stack_frame_bytes, name
        assert attrs.min_stack_bytes == report.cumulative_stack_bytes, name
        assert attrs.shared_bytes == report.shared_bytes, name
        # Without the log the cubin alone gives the same resources, less the spill counts.
        from_elf = kernel_resources(result.binary, result.lowered_name, "")
        assert from_elf.registers == result.resources.registers
        assert from_elf.shared_mem_bytes == result.resources.shared_mem_bytes
        assert from_elf.local_mem_bytes == result.resources.local_mem_bytes
        assert from_elf.max_threads_per_block == result.resources.max_threads_per_block
        assert from_elf.spill_stores_bytes is None


def test_elf_reader_sees_each_resource(compiled: dict[str, CompiledKernel]) -> None:
    def attrs(name: str) -> KernelAttributes:
        result = compiled[name]
        assert result.binary is not None and result.lowered_name is not None
        return Cubin.parse(result.binary).kernel(result.lowered_name)

    assert attrs("tile").shared_bytes == 1224  # 300 floats + 3 doubles, the reserved KiB removed
    assert attrs("saxpy").shared_bytes == 0
    assert attrs("local_array").frame_bytes == 256  # float[64]
    assert attrs("pressure").registers == 32
    assert (attrs("pressure").frame_bytes or 0) > 0
    assert attrs("bounded").max_threads == (128, 1, 1)
    assert attrs("saxpy").max_threads is None
    cubin = Cubin.parse(compiled["saxpy"].binary or b"")
    assert cubin.sm == 90
    # Every extern "C" kernel of the source is in the cubin; the template only when named.
    assert set(cubin.kernel_names()) == {"saxpy", "tile", "local_array", "pressure", "bounded"}
    with pytest.raises(KeyError):
        cubin.kernel("not_there")


def test_code_hash_ignores_only_the_ptxas_command_line_note() -> None:
    nvrtc = get_toolchain("nvrtc")
    plain = nvrtc.compile(CompileRequest(KERNELS, "saxpy"))
    # -O3 is ptxas's default: the same code, but ptxas writes "-O 3" into .note.nv.tkinfo.
    explicit = nvrtc.compile(CompileRequest(KERNELS, "saxpy", options=("-Xptxas", "-O3")))
    other = nvrtc.compile(CompileRequest(KERNELS, "saxpy", options=("-Xptxas", "-O0")))
    assert plain.binary and explicit.binary and other.binary
    assert plain.binary != explicit.binary
    assert plain.binary_sha256 == explicit.binary_sha256 == code_sha256(plain.binary)
    assert other.binary_sha256 != plain.binary_sha256
    assert code_sha256(b"not a cubin") == hashlib.sha256(b"not a cubin").hexdigest()


def test_malformed_cubins_raise_cubin_error(compiled: dict[str, CompiledKernel]) -> None:
    good = compiled["saxpy"].binary
    assert good is not None
    for bad in (b"", b"\x7fELF", b"\x7fELF\x01\x01" + bytes(60), good[:200], b"MZ" + good[2:]):
        with pytest.raises(CubinError):
            Cubin.parse(bad)
    with pytest.raises(CubinError):
        parse_nv_info(bytes([4, 0x2F, 16, 0]) + bytes(4))  # claims 16 bytes, has 4
    # A damaged binary degrades to the log's numbers instead of failing.
    usage = kernel_resources(good[:200], "saxpy", compiled["saxpy"].log)
    assert usage.registers == compiled["saxpy"].resources.registers


@pytest.mark.parametrize(
    "registers, bound, expected",
    [
        (32, None, 1024),
        (64, None, 1024),
        (72, None, 896),
        (128, None, 512),
        (255, None, 256),
        (40, 128, 128),
        (None, None, None),
    ],
)
def test_max_threads_per_block_follows_the_register_file(
    registers: int | None, bound: int | None, expected: int | None
) -> None:
    assert max_threads_per_block(registers, bound) == expected


def test_ptxas_report_parser_reads_both_log_styles() -> None:
    nvrtc_style = (
        "ptxas info    : Compiling entry function 'k' for 'sm_90'\n"
        "ptxas info    : Function properties for k\n"
        "ptxas         .     24 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads\n"
        "ptxas info    : Used 40 registers, used 1 barriers, 24 bytes cumulative stack size, "
        "512 bytes smem\n"
    )
    nvcc_style = nvrtc_style.replace("ptxas         .     ", "    ")
    for log in (nvrtc_style, nvcc_style):
        report = parse_ptxas_log(log)["k"]
        assert (
            report.registers,
            report.stack_frame_bytes,
            report.spill_stores_bytes,
            report.spill_loads_bytes,
            report.cumulative_stack_bytes,
            report.shared_bytes,
        ) == (40, 24, 8, 12, 24, 512)
