"""Real clang-19 -> opt -> llc -> ptxas compiles of the example and fixture kernels for sm_90.

Skipped only when LLVM 19 is not installed (``apt-get install clang-19 llvm-19``); with clang
there, a missing ptxas or CUDA header is a failure, not a skip.
"""

from __future__ import annotations

import os
import re
import shutil
import tomllib
from pathlib import Path

import pytest

from r3tui.compile import (
    CompileCache,
    CompilePool,
    CompileRequest,
    accepted_options,
    cache_key,
    canonicalize,
    get_toolchain,
)
from r3tui.compile.cubin import Cubin
from r3tui.compile.llvm import (
    DEFAULT_PIPELINE,
    PIPELINES,
    LlvmToolchain,
    find_llvm_tool,
    set_nvvm_reflect,
)
from r3tui.compile.options import option_spec
from r3tui.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
KERNELS = (Path(__file__).parent / "data" / "kernels.cu").read_text()
EXAMPLES = sorted(d for d in (ROOT / "examples").iterdir() if (d / "kernel.cu").is_file())
HAVE_CLANG_19 = bool(shutil.which("clang-19") or os.access("/usr/lib/llvm-19/bin/clang", os.X_OK))
needs_llvm = pytest.mark.skipif(
    not HAVE_CLANG_19, reason="clang-19 is not installed (apt-get install clang-19 llvm-19)"
)
SQRT = (
    'extern "C" __global__ void root(const float* x, float* y, int n) {\n'
    "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i < n) y[i] = sqrtf(x[i]) / (x[i] + 1.0f) + expf(x[i]) * y[i];\n"
    "}\n"
)


def example(name: str) -> tuple[str, str]:
    """(source, kernel name) of ``examples/<name>``."""
    folder = ROOT / "examples" / name
    kernel = tomllib.loads((folder / "example.toml").read_text())["kernel"]
    return (folder / "kernel.cu").read_text(), kernel


def passes(pipeline: str) -> tuple[str, ...]:
    return (f"--passes={pipeline}",)


# -- the option table (no compiler needed) ---------------------------------------------------


def test_llvm_options_are_a_pipeline_choice_plus_the_ones_it_translates() -> None:
    specs = {s.name: s for s in accepted_options("llvm")}
    pipeline = specs["passes"]
    assert pipeline.kind == "choice" and pipeline.values == PIPELINES and pipeline.tunable
    assert DEFAULT_PIPELINE in PIPELINES
    assert {"default<O1>", "default<O2>", "default<O3>"} <= set(PIPELINES)
    assert len(set(PIPELINES)) == len(PIPELINES) >= 8
    assert {"maxrregcount", "opt-level", "def-load-cache", "use_fast_math", "prec-sqrt"} <= set(
        specs
    )
    # NVVM-only switches have no clang/llc counterpart.
    assert "restrict" not in specs and "extra-device-vectorization" not in specs
    # The search's tokens round-trip, as for the other toolchains.
    for spec in specs.values():
        values: list[bool | int | str] = [True]
        if spec.kind == "choice":
            values = list(spec.values)
        elif spec.kind == "int":
            assert spec.low is not None and spec.high is not None
            values = [spec.low, spec.high]
        for value in values:
            (pair,) = canonicalize("llvm", spec.tokens(value))
            assert pair[0] == spec.name
    assert option_spec("passes").tokens("default<O2>") == ("--passes=default<O2>",)


def test_pipeline_spellings_canonicalize_and_other_toolchains_refuse_them() -> None:
    one = canonicalize("llvm", ["--passes", "default<O2>", "-Xptxas", "-O1"])
    two = canonicalize("llvm", ["-O1", "-passes=default<O2>"])
    assert one == two == (("opt-level", "1"), ("passes", "default<O2>"))
    # Any pipeline string is passed through: opt, not R³, says whether it is valid.
    assert canonicalize("llvm", ["--passes=function(no-such-pass)"]) == (
        ("passes", "function(no-such-pass)"),
    )
    with pytest.raises(ConfigError, match="needs a value"):
        canonicalize("llvm", ["--passes="])
    with pytest.raises(ConfigError, match="not accepted by nvcc"):
        canonicalize("nvcc", ["--passes=default<O2>"])
    with pytest.raises(ConfigError, match="not accepted by llvm"):
        canonicalize("llvm", ["--restrict"])
    with pytest.raises(ConfigError, match="given twice"):
        canonicalize("llvm", ["--passes=default<O1>", "--passes=default<O2>"])


def test_reflect_rewrite_replaces_only_the_named_query() -> None:
    ir = (
        '@.str = private unnamed_addr constant [11 x i8] c"__CUDA_FTZ\\00", align 1\n'
        '@.str.2 = private unnamed_addr constant [17 x i8] c"__CUDA_PREC_SQRT\\00", align 1\n'
        "  %2 = call i32 @__nvvm_reflect(ptr @.str) #10\n"
        "  %5 = call i32 @__nvvm_reflect(ptr @.str.2) #10\n"
    )
    out = set_nvvm_reflect(ir, "__CUDA_PREC_SQRT", 1)
    assert "%5 = add i32 0, 1\n" in out
    assert "%2 = call i32 @__nvvm_reflect(ptr @.str) #10" in out


# -- real compiles ----------------------------------------------------------------------------


@needs_llvm
def test_toolchain_is_available_and_names_its_versions() -> None:
    tc = get_toolchain("llvm")
    ok, message = tc.available()
    assert ok, message
    assert re.fullmatch(
        r"clang 19\.\d+\.\d+ / opt 19\.\d+\.\d+ / llc 19\.\d+\.\d+ / ptxas \d+\.\d+\.\d+",
        tc.version(),
    )
    assert "sm_90" in tc.supported_archs()
    assert tc.version() in tc.fingerprint()


@needs_llvm
@pytest.mark.parametrize("name", ["stencil7", "sgemm"])
def test_every_pipeline_builds_the_example_and_pipelines_differ(name: str) -> None:
    source, kernel = example(name)
    tc = get_toolchain("llvm")
    results = {p: tc.compile(CompileRequest(source, kernel, options=passes(p))) for p in PIPELINES}
    for pipeline, result in results.items():
        assert result.ok, f"{pipeline}:\n{result.log}"
        assert result.binary is not None and Cubin.parse(result.binary).sm == 90
        assert result.lowered_name == kernel
        assert result.resources.registers and result.resources.spills_bytes == 0
        assert f"-passes={pipeline}" in result.log and "Used" in result.log
    hashes = {r.binary_sha256 for r in results.values()}
    assert len(hashes) >= 2, "every pipeline gave the same cubin"
    # Measured with clang/LLVM 19.1.7 and ptxas 13.0.88: sgemm 14-18 registers, stencil7 24-25.
    registers = {r.resources.registers for r in results.values()}
    assert len(registers) >= 2, registers


@needs_llvm
def test_every_pipeline_changes_register_pressure_of_the_unrolled_kernel() -> None:
    tc = get_toolchain("llvm")
    results = [
        tc.compile(CompileRequest(KERNELS, "pressure", options=passes(p))) for p in PIPELINES
    ]
    assert all(r.ok for r in results), [r.log for r in results if not r.ok]
    registers = {r.resources.registers for r in results}
    assert len(registers) >= 2 and max(r for r in registers if r) > 32, registers


@needs_llvm
def test_fixture_kernels_report_their_resources() -> None:
    tc = get_toolchain("llvm")
    capped = tc.compile(CompileRequest(KERNELS, "pressure", options=("-maxrregcount=32",)))
    tile = tc.compile(CompileRequest(KERNELS, "tile"))
    local = tc.compile(CompileRequest(KERNELS, "local_array"))
    bounded = tc.compile(CompileRequest(KERNELS, "bounded"))
    template = tc.compile(CompileRequest(KERNELS, "axpy<float>"))
    assert all(r.ok for r in (capped, tile, local, bounded, template))
    assert capped.resources.registers is not None and capped.resources.registers <= 32
    assert (capped.resources.spill_stores_bytes or 0) > 0
    assert tile.resources.shared_mem_bytes == 1224
    assert local.resources.local_mem_bytes == 256 and local.resources.spills_bytes == 0
    assert bounded.resources.max_threads_per_block == 128
    assert template.lowered_name == "_Z4axpyIfEvT_PKS0_PS0_i"
    assert template.binary is not None
    assert template.lowered_name in Cubin.parse(template.binary).kernel_names()


@needs_llvm
def test_syntax_error_is_a_failed_result_with_clangs_error() -> None:
    source = 'extern "C" __global__ void broken(float* y) { y[0] = ; }\n'
    result = get_toolchain("llvm").compile(
        CompileRequest(source, "broken", source_name="broken.cu")
    )
    assert not result.ok and result.binary is None and result.lowered_name is None
    assert "broken.cu:1:" in result.log and "error: expected expression" in result.log
    assert result.log.endswith("r3: clang failed: exit status 1")
    assert "$ opt" not in result.log  # later stages never ran
    assert result.cache_key


@needs_llvm
@pytest.mark.parametrize(
    "pipeline, message",
    [
        ("function(bogus-pass)", "unknown function pass 'bogus-pass'"),
        ("default<O3", "unknown pass name 'default<O3'"),
    ],
)
def test_bad_pipeline_is_a_failed_result_with_opts_error(pipeline: str, message: str) -> None:
    result = get_toolchain("llvm").compile(
        CompileRequest(KERNELS, "saxpy", options=passes(pipeline))
    )
    assert not result.ok and result.binary is None
    assert message in result.log
    assert "r3: opt failed: exit status 1" in result.log
    assert "$ clang-19" in result.log or "$ clang" in result.log  # the stages before are kept


@needs_llvm
def test_unknown_kernel_or_unsupported_arch() -> None:
    tc = get_toolchain("llvm")
    missing = tc.compile(CompileRequest(KERNELS, "not_a_kernel"))
    assert not missing.ok and "not_a_kernel" in missing.log and "saxpy" in missing.log
    with pytest.raises(ConfigError, match="cannot build sm_100"):
        tc.compile(CompileRequest(KERNELS, "saxpy", arch="sm_100"))
    with pytest.raises(ConfigError, match="not accepted by llvm"):
        tc.compile(CompileRequest(KERNELS, "saxpy", options=("--extra-device-vectorization",)))


@needs_llvm
def test_math_switches_reach_clang_and_llc() -> None:
    tc = get_toolchain("llvm")

    def build(*options: str) -> str | None:
        result = tc.compile(CompileRequest(SQRT, "root", options=options))
        assert result.ok, result.log
        return result.binary_sha256

    default = build()
    # IEEE sqrt by default, as nvcc: libdevice's __CUDA_PREC_SQRT query is answered with 1.
    assert build("-prec-sqrt=true") == default
    assert len({default, build("-prec-sqrt=false"), build("--use_fast_math")}) == 3
    assert build("--fmad=false") != default
    assert build("-prec-div=false") != default
    assert build("-ftz=true") != default


@needs_llvm
def test_cuda_13_headers_work_through_the_stubs() -> None:
    source = (
        "#include <cuda_fp16.h>\n"
        "#include <cuda/std/limits>\n"
        "#include <cooperative_groups.h>\n"
        "namespace cg = cooperative_groups;\n"
        "__device__ float eps(float x) {\n"
        "    return x * cuda::std::numeric_limits<float>::epsilon();\n"
        "}\n"
        'extern "C" __global__ void half_scale(__half* y, float s) {\n'
        "    cg::thread_block block = cg::this_thread_block();\n"
        "    int i = block.thread_rank();\n"
        "    y[i] = __float2half(__half2float(y[i]) * eps(s) + rsqrtf(s));\n"
        "    block.sync();\n"
        "}\n"
    )
    result = get_toolchain("llvm").compile(CompileRequest(source, "half_scale"))
    assert result.ok, result.log
    assert "__r3_stubs" in result.log and "-disable-llvm-optzns" in result.log


@needs_llvm
def test_defines_and_include_dirs_reach_clang(tmp_path: Path) -> None:
    (tmp_path / "tile_size.h").write_text("#define EXTRA 8\n")
    source = (
        '#include "tile_size.h"\n'
        'extern "C" __global__ void sized(float* y) {\n'
        "    __shared__ float buf[TILE + EXTRA];\n"
        "    buf[threadIdx.x] = y[threadIdx.x]; __syncthreads();\n"
        "    y[threadIdx.x] = buf[(threadIdx.x + 1) % (TILE + EXTRA)];\n"
        "}\n"
    )
    tc = get_toolchain("llvm")
    results = [
        tc.compile(
            CompileRequest(
                source, "sized", defines=(("TILE", str(t)),), include_dirs=(str(tmp_path),)
            )
        )
        for t in (24, 56)
    ]
    assert all(r.ok for r in results), [r.log for r in results]
    assert [r.resources.shared_mem_bytes for r in results] == [128, 256]
    # The header's content is part of the front end's reuse key and of the cache key.
    (tmp_path / "tile_size.h").write_text("#define EXTRA 40\n")
    changed = tc.compile(
        CompileRequest(source, "sized", defines=(("TILE", "24"),), include_dirs=(str(tmp_path),))
    )
    assert changed.ok and changed.resources.shared_mem_bytes == 256
    assert changed.cache_key != results[0].cache_key


@needs_llvm
def test_cache_key_covers_the_pipeline_and_the_llvm_versions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tc = get_toolchain("llvm")
    keys = {cache_key(tc, CompileRequest(KERNELS, "saxpy", options=passes(p))) for p in PIPELINES}
    assert len(keys) == len(PIPELINES)
    spelled = [("--passes", "default<O2>"), ("-passes=default<O2>",)]
    assert len({cache_key(tc, CompileRequest(KERNELS, "saxpy", options=s)) for s in spelled}) == 1
    # Another LLVM release is another key.
    other = LlvmToolchain()
    key = cache_key(other, CompileRequest(KERNELS, "saxpy"))
    monkeypatch.setattr(other, "fingerprint", lambda: "clang 19.1.8 / opt 19.1.8 / llc 19.1.8")
    assert cache_key(other, CompileRequest(KERNELS, "saxpy")) != key
    # Through the compile cache: a second pipeline misses, the first one hits.
    cache = CompileCache(tmp_path)
    first = cache.compile(tc, CompileRequest(KERNELS, "saxpy", options=passes("default<O1>")))
    second = cache.compile(tc, CompileRequest(KERNELS, "saxpy", options=passes("default<O2>")))
    again = cache.compile(tc, CompileRequest(KERNELS, "saxpy", options=passes("default<O1>")))
    assert first.ok and second.ok and not second.cached and again.cached
    assert again.binary == first.binary and again.log == first.log


@needs_llvm
def test_reused_front_end_gives_the_same_cubin_as_a_fresh_one() -> None:
    shared = get_toolchain("llvm")
    source, kernel = example("stencil7")
    request = CompileRequest(source, kernel, options=passes(PIPELINES[-1]))
    shared.compile(CompileRequest(source, kernel, options=passes(PIPELINES[0])))
    reused = shared.compile(request)
    fresh = LlvmToolchain(reuse_frontend=False).compile(request)
    assert reused.ok and fresh.ok
    assert reused.binary_sha256 == fresh.binary_sha256

    def steady(log: str) -> list[str]:  # ptxas reports its own compile time
        return [line for line in log.splitlines() if "Compile time" not in line]

    assert steady(reused.log) == steady(fresh.log)


@needs_llvm
def test_a_stage_past_its_timeout_is_a_failed_result() -> None:
    result = LlvmToolchain(timeout_s=0.001).compile(CompileRequest(KERNELS, "saxpy"))
    assert not result.ok and "r3: clang timed out after 0.001 s" in result.log


def test_missing_clang_is_reported_with_the_fix() -> None:
    ok, message = LlvmToolchain(clang="/nonexistent/clang-19").available()
    assert not ok
    assert "apt-get install clang-19 llvm-19" in message


@needs_llvm
def test_find_llvm_tool_prefers_the_versioned_binary() -> None:
    for tool in ("clang", "opt", "llc"):
        found = find_llvm_tool(tool)
        assert found is not None and ("-19" in found or "llvm-19" in found)


@needs_llvm
def test_compile_pool_runs_llvm_requests() -> None:
    source, kernel = example("sgemm")
    requests = [CompileRequest(source, kernel, options=passes(p)) for p in PIPELINES[:3]]
    requests.append(CompileRequest(KERNELS, "axpy<double>", options=("-maxrregcount=32",)))
    with CompilePool(workers=2) as pool:
        results = pool.map("llvm", requests)
    direct = [get_toolchain("llvm").compile(r) for r in requests]
    assert all(r.ok and r.toolchain == "llvm" for r in results), [r.log for r in results]
    assert [r.binary_sha256 for r in results] == [r.binary_sha256 for r in direct]
    assert results[-1].lowered_name == "_Z4axpyIdEvT_PKS0_PS0_i"


@needs_llvm
@pytest.mark.slow
@pytest.mark.parametrize("folder", EXAMPLES, ids=[d.name for d in EXAMPLES])
def test_every_pipeline_builds_every_example(folder: Path) -> None:
    source, kernel = example(folder.name)
    tc = get_toolchain("llvm")
    for pipeline in PIPELINES:
        result = tc.compile(CompileRequest(source, kernel, options=passes(pipeline)))
        assert result.ok, f"{pipeline}:\n{result.log}"
        assert result.lowered_name == kernel and result.resources.registers


@needs_llvm
@pytest.mark.slow
@pytest.mark.parametrize("kernel", ["saxpy", "tile", "local_array", "bounded", "axpy<float>"])
def test_every_pipeline_builds_every_fixture_kernel(kernel: str) -> None:
    tc = get_toolchain("llvm")
    for pipeline in PIPELINES:
        result = tc.compile(CompileRequest(KERNELS, kernel, options=passes(pipeline)))
        assert result.ok, f"{pipeline}:\n{result.log}"
        assert result.resources.registers
