"""A build that forces a header in before the unit (nvcc -include FILE), as Rodinia kmeans needs
under CUDA 12 (its texture references are gone; a shim header gives them back): the compile
database's -include is read, the header goes into the bundle's header tree and manifest, and the
kernel's device unit inlines it first, so NVRTC compiles a kernel whose unit does not compile
without it.  The application (a shim, a unit, a compile database) is written here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from r3tui.analysis.device_unit import DeviceUnitError, device_unit
from r3tui.compile.base import CompileRequest, get_toolchain
from r3tui.compile.nvrtc import default_include_dirs
from r3tui.cuda.arena import ARENA_BASE
from r3tui.domain import Dim3
from r3tui.engine.unit_source import seed_unit
from r3tui.errors import ManifestError
from r3tui.record.bundle import BundleWriter
from r3tui.record.headers import collect
from r3tui.record.manifest import (
    ArenaInfo,
    KernelInfo,
    LaunchInfo,
    Manifest,
    SourceFile,
)
from r3tui.record.sources import associate, read_compile_db

SHIM = """\
#pragma once
template <class T, int Dim>
struct shim_texture { const T* ptr; };
#define texture __device__ shim_texture
template <class T, int Dim>
__device__ __forceinline__ T tex1Dfetch(const shim_texture<T, Dim>& t, int i) { return t.ptr[i]; }
"""

UNIT = """\
#include <cstdio>
texture<float, 1> t_in;          // needs the shim: no such template in CUDA 12
__global__ void scale(float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = 2.0f * t_in.ptr[i];
}
__global__ void gather(float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = tex1Dfetch(t_in, i);
}
int main() { std::printf("host\\n"); return 0; }
"""


def write_app(root: Path) -> Path:
    (root / "app").mkdir(parents=True)
    (root / "shims").mkdir()
    (root / "shims" / "texture_shim.h").write_text(SHIM)
    (root / "app" / "main.cu").write_text(UNIT)
    db = root / "app" / "compile_commands.json"
    db.write_text(json.dumps([{
        "directory": str(root / "app"),
        "arguments": ["nvcc", "-O3", "-arch=sm_90", "-include", "../shims/texture_shim.h",
                      "-c", "main.cu", "-o", "main.o"],
        "file": "main.cu"}]))
    return db


def test_the_forced_header_reaches_the_device_unit_and_nvrtc_compiles_it(tmp_path: Path) -> None:
    db = write_app(tmp_path)
    (command,) = read_compile_db(db)
    assert command.forced_includes == ((tmp_path / "shims" / "texture_shim.h").resolve(),)
    found = associate("_Z5scalePfi", [], db)
    assert found is not None and found.forced_includes == command.forced_includes
    tree = collect(found.path, found.text, found.include_dirs, forced=found.forced_includes)
    assert tree.forced == ("shims/texture_shim.h",)
    headers = {name: data.decode() for name, data in tree.files}
    assert headers["shims/texture_shim.h"] == SHIM
    nvrtc = get_toolchain("nvrtc")
    for kernel in ("scale", "gather"):  # gather reaches the template through tex1Dfetch;
        # scale only through the `texture` macro's replacement
        unit = device_unit(UNIT, kernel, headers, list(tree.include_dirs),
                           cuda_include_dirs=default_include_dirs(), forced=tree.forced)
        assert unit.text.index("struct shim_texture") < unit.text.index("t_in;")
        assert "int main" not in unit.text and unit.file is None
        compiled = nvrtc.compile(CompileRequest(unit.text, kernel))
        assert compiled.ok, compiled.log
    # without the shim the unit does not compile: the forced include is what makes it work
    bare = device_unit(UNIT, "scale", headers, list(tree.include_dirs),
                       cuda_include_dirs=default_include_dirs())
    assert not nvrtc.compile(CompileRequest(bare.text, "scale")).ok
    with pytest.raises(DeviceUnitError, match="forced include"):
        device_unit(UNIT, "scale", {}, ["app"], forced=["shims/missing.h"])


def test_a_bundle_keeps_its_forced_includes_and_the_campaign_searches_with_them(
        tmp_path: Path) -> None:
    db = write_app(tmp_path)
    found = associate("_Z6gatherPfi", [], db)
    assert found is not None
    tree = collect(found.path, found.text, found.include_dirs, forced=found.forced_includes)
    with BundleWriter(tmp_path / "b") as w:
        unit = w.add_blob(UNIT.encode())
        files = tuple(SourceFile(name, w.add_blob(data)) for name, data in tree.files)
        manifest = Manifest(
            kernel=KernelInfo("gather", "_Z6gatherPfi", (SourceFile("main.cu", unit),), "nvcc",
                              "nvcc 13.0", ("-O3",), headers=files,
                              include_dirs=tree.include_dirs, forced_includes=tree.forced),
            launch=LaunchInfo(Dim3(4), Dim3(256), 0, Dim3(1024), True),
            params=(), allocations=(), arena=ArenaInfo(ARENA_BASE, 2 << 20),
            recorded_at="2026-12-04T12:00:00+00:00", blobs=dict(w.blobs))
        bundle = w.commit(manifest)
    assert bundle.manifest.kernel.forced_includes == ("shims/texture_shim.h",)
    data = json.loads((bundle.path / "manifest.json").read_text())
    assert data["kernel"]["forced_includes"] == ["shims/texture_shim.h"]
    seed = seed_unit(bundle)
    assert seed.unit is not None and "struct shim_texture" in seed.source.text
    assert get_toolchain("nvrtc").compile(CompileRequest(seed.source.text, "gather")).ok
    # a forced include that is not among the bundle's headers is a manifest error
    data["kernel"]["forced_includes"] = ["shims/other.h"]
    with pytest.raises(ManifestError, match="forced_includes"):
        Manifest.from_json(data)


def test_a_cut_host_function_takes_its_conditionals_with_it() -> None:
    """SU3: main() holds `#ifdef MILC_COMPLEX ... #else ... #endif` around a macro call the
    parser cannot read; the kept `#ifdef` lost its `#endif` and made the rest of the unit
    conditional.  A macro defined in two branches reaches both types it may name."""
    unit = """\
#if (PRECISION == 1)
  #define matrix_t fmatrix
#else
  #define matrix_t dmatrix
#endif
typedef struct { float e[9]; } fmatrix;
typedef struct { double e[9]; } dmatrix;
#define ACC(a, c) { (c) += (a); }
__global__ void k(const matrix_t* m, matrix_t* out) {
    out[threadIdx.x] = m[threadIdx.x];
}
int main() {
    double c = 0;
    for (int i = 0; i < 3; ++i) {
      #ifdef FLAVOUR
        ACC(i, c)
      #else
        c += i;
      #endif
    }
    return (int)c;
}
"""
    for precision in ("1", "2"):
        unit_text = device_unit(unit, "k", {}, ["."]).text
        assert "int main" not in unit_text and "fmatrix" in unit_text and "dmatrix" in unit_text
        assert _balanced(unit_text), unit_text
        compiled = get_toolchain("nvrtc").compile(
            CompileRequest(unit_text, "k", defines=(("PRECISION", precision),)))
        assert compiled.ok, compiled.log
    # SU3's unit reduced by delta debugging to what still lost an #endif (the source is
    # balanced; a host function's head the parser misreads takes a directive with it)
    reduced = """\
__global__ void k_mat_nn(
  int               total_sites)
{
}
              size_t total_sites, int iterations, int threadsPerBlock, int use_device)
#ifndef _SU3_H
#if (PRECISION==1)
#endif  // PRECISION
#endif  // _SU3_HPP
"""
    assert _balanced(reduced)
    assert _balanced(device_unit(reduced, "k_mat_nn", {}, ["."]).text)


def _balanced(text: str) -> bool:
    from r3tui.analysis.device_unit import _CONDITIONAL

    depth = 0
    for line in text.split("\n"):
        match = _CONDITIONAL.match(line)
        if match is not None and match.group(1).startswith("if"):
            depth += 1
        elif match is not None and match.group(1) == "endif":
            depth -= 1
            if depth < 0:
                return False
    return depth == 0
