"""Source association by mangled name, and the example application compiling with nvcc."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from r3tui.errors import RecordingError
from r3tui.record.sources import (
    associate,
    definitions,
    function_name,
    kernel_expression,
    qualified_name,
)

REPO = Path(__file__).resolve().parents[2]
CG = REPO / "examples" / "apps" / "cg"

DEFINES = """
#include "common.h"
namespace ns {
template <int B>
__global__ void __launch_bounds__(B) scale(float* x, int n) {  // a { in a comment }
    const char* s = "}";
    if (threadIdx.x < n) x[threadIdx.x] *= B;
}
namespace inner {
__global__ void plain(int* y) { y[0] = 1; }
}
}
extern "C" __global__ void flat(int* y) { y[0] = 2; }
int main() { ns::scale<4><<<1, 32>>>(nullptr, 0); ns::inner::plain<<<1, 1>>>(nullptr); }
"""

DECLARES = """
namespace ns { namespace inner { __global__ void plain(int* y); } }
namespace other { __global__ void plain(int* y) { y[0] = 3; } }
void launch(int* y) { ns::inner::plain<<<1, 1>>>(y); }
"""


@pytest.mark.parametrize(
    ("symbol", "scopes", "name", "templated"),
    [
        ("_Z4axpyPfS_i", (), "axpy", False),
        ("_Z4axpyIfEvPT_S1_i", (), "axpy", True),
        ("_ZN2cg8spmv_csrENS_9CsrMatrixEPKdPd", ("cg",), "spmv_csr", False),
        ("_ZN2cg11dot_partialILi256EEEvPKdS2_Pdi", ("cg",), "dot_partial", True),
        ("_ZN2cg6detail4xpayIdEEvPKT_S2_PS2_i", ("cg", "detail"), "xpay", True),
        # a template argument that is a class whose name holds an 'E', and a pack
        ("_ZN2ns1kILi3ENS_4ElemEEEvv", ("ns",), "k", True),
        ("_ZN2ns1kIJifEEEvv", ("ns",), "k", True),
        ("flat", (), "flat", False),
    ],
)
def test_qualified_name_without_binutils(
    symbol: str, scopes: tuple[str, ...], name: str, templated: bool
) -> None:
    q = qualified_name(symbol)
    assert q is not None
    assert (q.scopes, q.name, q.templated) == (scopes, name, templated)


def test_unreadable_symbols_give_none() -> None:
    assert qualified_name("_Z") is None
    assert qualified_name("_ZN2cg") is None
    assert qualified_name("not a symbol") is None


def test_function_name_strips_return_type_and_parameters() -> None:
    assert function_name("void cg::dot<256>(double const*, int)") == "cg::dot<256>"
    assert function_name("cg::spmv(cg::Csr, double*)") == "cg::spmv"
    assert function_name("(anonymous namespace)::k(int)") == "(anonymous namespace)::k"


@pytest.mark.skipif(shutil.which("c++filt") is None, reason="c++filt not installed")
def test_kernel_expression_keeps_template_arguments() -> None:
    assert kernel_expression("_ZN2cg11dot_partialILi256EEEvPKdS2_Pdi") == "cg::dot_partial<256>"
    assert kernel_expression("_ZN2cg8spmv_csrENS_9CsrMatrixEPKdPd") == "cg::spmv_csr"
    assert kernel_expression("flat") == "flat"


def test_definitions_skip_declarations_launches_and_comments() -> None:
    defs = definitions(DEFINES, "scale")
    assert len(defs) == 1
    d = defs[0]
    assert d.scopes == ("ns",)
    assert DEFINES[d.start :].startswith("template <int B>")
    assert DEFINES[: d.end].endswith("*= B;\n}")
    assert [x.scopes for x in definitions(DEFINES, "plain")] == [("ns", "inner")]
    assert definitions(DECLARES, "plain")[0].scopes == ("other",)  # only the definition


def _tree(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "inc").mkdir()
    (tmp_path / "inc" / "common.h").write_text("#pragma once\n")
    declares = tmp_path / "a_declares.cu"
    declares.write_text(DECLARES)
    defines = tmp_path / "b_defines.cu"
    defines.write_text(DEFINES)
    return declares, defines


def test_associate_finds_the_defining_unit(tmp_path: Path) -> None:
    declares, defines = _tree(tmp_path)
    cases = {
        "_ZN2ns5scaleILi4EEEvPfi": "scale",  # templated, namespaced
        "_ZN2ns5inner5plainEPi": "plain",  # nested namespace; a_declares.cu only declares it
        "flat": "flat",  # extern "C"
    }
    for symbol, base in cases.items():
        found = associate(symbol, [declares, defines], None)
        assert found is not None, symbol
        assert found.path == defines.resolve()
        assert found.text == DEFINES
        assert base in found.kernel
        assert found.include_dirs[0] == defines.resolve().parent
    # other::plain is defined in a_declares.cu, and only there
    other = associate("_ZN5other5plainEPi", [tmp_path], None)
    assert other is not None and other.path == declares.resolve()
    assert associate("_ZN2ns7missingEv", [declares, defines], None) is None
    assert associate("_ZN2ns5inner5plainEPi", [declares], None) is None


def test_associate_finds_a_definition_in_an_included_header(tmp_path: Path) -> None:
    (tmp_path / "kern.cuh").write_text("namespace k { __global__ void go(int* p) { *p = 1; } }\n")
    unit = tmp_path / "main.cu"
    unit.write_text('#include "kern.cuh"\nint main() { k::go<<<1, 1>>>(nullptr); }\n')
    found = associate("_ZN1k2goEPi", [unit], None)
    assert found is not None and found.path == unit.resolve()


def test_associate_takes_flags_from_compile_commands(tmp_path: Path) -> None:
    _, defines = _tree(tmp_path)
    db = tmp_path / "compile_commands.json"
    db.write_text(
        json.dumps(
            [
                {
                    "directory": str(tmp_path),
                    "file": "b_defines.cu",
                    "command": "nvcc -O3 -arch=sm_90 -Iinc -I /opt/x -DBLOCK=64 -DFAST "
                    "--use_fast_math -std=c++17 -maxrregcount 64 -c b_defines.cu -o b.o",
                },
                {
                    "directory": str(tmp_path),
                    "file": "a_declares.cu",
                    "arguments": ["nvcc", "-c", "a_declares.cu"],
                },
            ]
        )
    )
    found = associate("_ZN2ns5inner5plainEPi", [], db)
    assert found is not None and found.path == defines.resolve()
    assert found.include_dirs == (tmp_path.resolve(), (tmp_path / "inc").resolve(), Path("/opt/x"))
    assert found.defines == (("BLOCK", "64"), ("FAST", "1"))
    assert found.options == ("--use_fast_math", "-std=c++17", "-maxrregcount", "64")


def test_a_broken_compile_database_is_one_error(tmp_path: Path) -> None:
    db = tmp_path / "compile_commands.json"
    db.write_text("{not json")
    with pytest.raises(RecordingError, match="cannot read compile database"):
        associate("flat", [], db)


def test_example_app_kernels_are_associated_with_cg_cu() -> None:
    kernels = [
        "_ZN2cg8spmv_csrENS_9CsrMatrixEPKdPd",
        "_ZN2cg11dot_partialILi256EEEvPKdS2_Pdi",
        "_ZN2cg12reduce_finalILi256EEEvPKdiPdi",
        "_ZN2cg9update_xrEPKNS_9CgVectorsEdi",
        "_ZN2cg6detail4xpayIdEEvPKT_S2_PS2_i",
    ]
    for symbol in kernels:
        found = associate(symbol, [CG], None)
        assert found is not None and found.path == (CG / "cg.cu").resolve(), symbol


# -- the example application compiles (nvcc here; no GPU needed) ----------------------------
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")


@needs_nvcc
@pytest.mark.parametrize("runtime", ["static", "shared"])
def test_example_app_builds_with_both_runtimes(tmp_path: Path, runtime: str) -> None:
    tree = tmp_path / "cg"
    shutil.copytree(CG, tree, ignore=shutil.ignore_patterns("cg", "cg-shared", "*.o", "*.json"))
    run = subprocess.run(
        ["make", f"RUNTIME={runtime}", "EXTRA_FLAGS=-DCG_BLOCK_SPMV=256"],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"-cudart={runtime}" in run.stdout and "-DCG_BLOCK_SPMV=256" in run.stdout
    binary = tree / ("cg-shared" if runtime == "shared" else "cg")
    assert binary.is_file()
    needed = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=False)
    assert ("libcudart.so" in needed.stdout) == (runtime == "shared")


@needs_nvcc
def test_nvcc_toolchain_compiles_the_whole_unit_and_finds_mangled_kernels() -> None:
    from r3tui.compile.base import CompileRequest
    from r3tui.compile.nvcc import NvccToolchain

    found = associate("_ZN2cg11dot_partialILi256EEEvPKdS2_Pdi", [CG], None)
    assert found is not None
    nvcc = NvccToolchain()
    # cu++filt's spelling of the template argument (on the GPU nodes) and c++filt's (here)
    spellings = ("cg::dot_partial<(int)256>", "cg::dot_partial<256>")
    for name in (found.kernel, *spellings, "_ZN2cg9update_xrEPKNS_9CgVectorsEdi"):
        compiled = nvcc.compile(
            CompileRequest(
                source=found.text,
                kernel_name=name,
                arch="sm_90",
                include_dirs=tuple(str(d) for d in found.include_dirs),
                source_name="cg.cu",
            )
        )
        assert compiled.ok, compiled.log
        assert compiled.lowered_name is not None and compiled.lowered_name.startswith("_ZN2cg")
        assert compiled.binary is not None and compiled.resources.registers > 0
