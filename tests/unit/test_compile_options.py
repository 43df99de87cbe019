"""Option validation and canonical spelling, request validation, cache keys, light imports."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from r3tui.compile import (
    CompileRequest,
    accepted_options,
    cache_key,
    canonicalize,
    get_toolchain,
)
from r3tui.compile.base import canonical_options
from r3tui.compile.options import SPECS, describe, option_spec, render
from r3tui.errors import ConfigError

SOURCE = 'extern "C" __global__ void k(float* y) { y[threadIdx.x] += 1.0f; }\n'


@pytest.mark.parametrize("toolchain", ["nvrtc", "nvcc"])
def test_equivalent_spellings_have_one_canonical_form(toolchain: str) -> None:
    spellings = [
        ("-maxrregcount=64", "-Xptxas", "-O2", "--use_fast_math", "-ftz=true"),
        ("--maxrregcount", "64", "--ptxas-options=-O2", "-use_fast_math", "--ftz", "true"),
        ("-ftz=true", "-Xptxas=-O2", "--use_fast_math", "--maxrregcount=64"),
        ("-O2", "--maxrregcount=64", "-ftz=true", "-use_fast_math", "-Xptxas", "-v"),
    ]
    forms = {canonicalize(toolchain, s) for s in spellings}
    assert forms == {
        (("use_fast_math", ""), ("ftz", "true"), ("maxrregcount", "64"), ("opt-level", "2"))
    }


def test_ptxas_comma_lists_are_split_into_one_switch_each() -> None:
    canonical = canonicalize("nvrtc", ["-Xptxas=-O1,-dlcm=cg", "-Xptxas", "-v"])
    assert canonical == (("opt-level", "1"), ("def-load-cache", "cg"))
    # NVRTC hands a --ptxas-options value to ptxas whole, so each switch gets its own.
    assert render("nvrtc", canonical) == ["--ptxas-options=-O1", "--ptxas-options=-dlcm=cg"]


@pytest.mark.parametrize(
    "options, message",
    [
        (["--bogus"], "not accepted by nvrtc"),
        (["-G"], "not allowed"),
        (["--device-debug"], "not allowed"),
        (["-rdc=true"], "not allowed"),
        (["-arch=sm_80"], "CompileRequest.arch"),
        (["-DTILE=4"], "CompileRequest.defines"),
        (["-I/usr/include"], "CompileRequest.include_dirs"),
        (["-maxrregcount=300"], "outside 16..255"),
        (["-maxrregcount=lots"], "needs an integer"),
        (["--ftz=maybe"], "takes one of true, false"),
        (["-Xptxas", "-dlcm=xx"], "takes one of ca, cg"),
        (["-Xptxas", "--bogus"], "ptxas option '--bogus' is not accepted"),
        (["-Xptxas"], "needs a value"),
        (["--maxrregcount"], "needs a value"),
        (["-maxrregcount=32", "-maxrregcount=64"], "given twice with different values"),
        (["--use_fast_math=yes"], "takes no value"),
    ],
)
def test_bad_options_raise_config_error(options: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        canonicalize("nvrtc", options)


def test_unknown_option_error_lists_what_is_accepted() -> None:
    with pytest.raises(ConfigError) as caught:
        canonicalize("nvcc", ["--bogus"])
    assert "--maxrregcount" in caught.value.one_line()
    assert "-Xptxas" in caught.value.one_line()


def test_repeating_an_option_with_the_same_value_is_harmless() -> None:
    assert canonicalize("nvcc", ["--restrict", "-restrict"]) == (("restrict", ""),)


@pytest.mark.parametrize("toolchain", ["nvrtc", "nvcc"])
def test_accepted_options_round_trip_through_canonicalize(toolchain: str) -> None:
    specs = accepted_options(toolchain)
    assert {s.name for s in specs} >= {
        "use_fast_math",
        "ftz",
        "prec-div",
        "prec-sqrt",
        "fmad",
        "maxrregcount",
        "extra-device-vectorization",
        "restrict",
        "opt-level",
        "def-load-cache",
    }
    for spec in specs:
        if spec.kind == "int":
            assert spec.low is not None and spec.high is not None and spec.low < spec.high
            values: list[bool | int | str] = [spec.low, spec.high]
        elif spec.kind == "choice":
            assert spec.values
            values = list(spec.values)
        else:
            values = [True]
            assert spec.tokens(False) == ()
        for value in values:
            canonical = canonicalize(toolchain, spec.tokens(value))
            expected = "" if spec.kind == "flag" else str(value)
            assert canonical == ((spec.name, expected),)
    assert len(describe(specs)) == len(specs)


def test_search_space_view_marks_untunable_options() -> None:
    tunable = {s.name for s in accepted_options("nvrtc") if s.tunable}
    assert "maxrregcount" in tunable
    assert "generate-line-info" not in tunable and "std" not in tunable
    assert option_spec("maxrregcount").tokens(64) == ("--maxrregcount=64",)
    assert option_spec("opt-level").tokens(1) == ("--ptxas-options=-O1",)
    with pytest.raises(ConfigError):
        option_spec("maxrregcount").tokens(8)
    with pytest.raises(ConfigError):
        option_spec("bogus")
    assert len({s.name for s in SPECS}) == len(SPECS)


def test_unknown_toolchain_is_a_config_error_listing_the_known_ones() -> None:
    with pytest.raises(ConfigError) as caught:
        get_toolchain("clang")
    assert "nvrtc" in caught.value.one_line() and "nvcc" in caught.value.one_line()
    with pytest.raises(ConfigError):
        accepted_options("clang")


@pytest.mark.parametrize(
    "request_, message",
    [
        (CompileRequest(SOURCE, "k", arch="compute_90"), "bad arch"),
        (CompileRequest(SOURCE, "k", arch="90"), "bad arch"),
        (CompileRequest(SOURCE, " "), "kernel name"),
        (CompileRequest(SOURCE, "k", defines=(("1BAD", "1"),)), "bad define name"),
        (CompileRequest(SOURCE, "k", defines=(("A", "1\n2"),)), "newline"),
        (CompileRequest(SOURCE, "k", defines=(("A", "1"), ("A", "2"))), "given twice"),
        (CompileRequest(SOURCE, "k", include_dirs=("/no/such/dir",)), "does not exist"),
    ],
)
def test_bad_requests_raise_config_error(request_: CompileRequest, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        canonical_options("nvrtc", request_)


def test_cache_key_ignores_spelling_and_order_but_not_content(tmp_path: Path) -> None:
    nvrtc = get_toolchain("nvrtc")
    base = CompileRequest(SOURCE, "k", options=("-maxrregcount=64", "--use_fast_math"))
    same = CompileRequest(SOURCE, "k", options=("-use_fast_math", "--maxrregcount", "64"))
    assert cache_key(nvrtc, base) == cache_key(nvrtc, same)
    different = [
        CompileRequest(SOURCE + "\n", "k", options=base.options),
        CompileRequest(SOURCE, "k", arch="sm_80", options=base.options),
        CompileRequest(SOURCE, "k", options=("-maxrregcount=32", "--use_fast_math")),
        CompileRequest(SOURCE, "k", options=base.options, defines=(("N", "1"),)),
        CompileRequest(SOURCE, "k", options=base.options, source_name="other.cu"),
    ]
    keys = {cache_key(nvrtc, r) for r in different}
    assert len(keys) == len(different) and cache_key(nvrtc, base) not in keys
    assert cache_key(nvrtc, base) != cache_key(get_toolchain("nvcc"), base)


def test_cache_key_follows_included_header_contents(tmp_path: Path) -> None:
    nvrtc = get_toolchain("nvrtc")
    (tmp_path / "inner.h").write_text("#define N 4\n")
    (tmp_path / "outer.h").write_text('#include "inner.h"\n')
    source = '#include "outer.h"\n' + SOURCE
    req = CompileRequest(source, "k", include_dirs=(str(tmp_path),))
    before = cache_key(nvrtc, req)
    assert cache_key(nvrtc, req) == before
    (tmp_path / "inner.h").write_text("#define N 8\n")  # reached only through outer.h
    assert cache_key(nvrtc, req) != before


def test_importing_the_compile_layer_imports_no_cuda_module() -> None:
    code = (
        "import sys\n"
        "import r3tui.compile\n"
        "from r3tui.compile import CompilePool, CompileCache, get_toolchain, accepted_options\n"
        "get_toolchain('nvrtc'); get_toolchain('nvcc'); accepted_options('nvrtc')\n"
        "print(','.join(m for m in sys.modules if m == 'cuda' or m.startswith('cuda.')))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert result.stdout.strip() == ""
