"""Application headers in a bundle: discovery through the include path, the manifest fields,
and the tree a bundle writes out for compilers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from r3tui.errors import ManifestError, RecordingError
from r3tui.record import headers
from r3tui.record.bundle import Bundle
from r3tui.record.headers import MissingHeader, collect, includes
from r3tui.record.manifest import Manifest

UNIT = """\
#include <cstdio>
#include "solver.h"        // beside the unit
#include <app/config.h>    /* through -Iinclude */
// #include "commented_out.h"
/* #include "also_commented.h" */
namespace solver {
__global__ void step(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = relax(x[i]) * APP_SCALE;
}
}
"""


def app_tree(root: Path) -> Path:
    """src/solver.cu, src/solver.h -> ../common/defs.h (which includes solver.h back: a
    cycle), include/app/config.h -> "scalar.h" (beside it) -> <app/config.h> (a cycle)."""
    (root / "src").mkdir(parents=True)
    (root / "common").mkdir()
    (root / "include" / "app").mkdir(parents=True)
    unit = root / "src" / "solver.cu"
    unit.write_text(UNIT)
    (root / "src" / "solver.h").write_text(
        "#ifndef SOLVER_H\n#define SOLVER_H\n#include \"../common/defs.h\"\n"
        "__device__ inline float relax(float v) { return DEFS_HALF * v; }\n#endif\n")
    (root / "common" / "defs.h").write_text(
        "#pragma once\n#include \"../src/solver.h\"\n#define DEFS_HALF 0.5f\n")
    (root / "include" / "app" / "config.h").write_text(
        "#if !defined(APP_CONFIG_H)\n#define APP_CONFIG_H\n#include \"scalar.h\"\n"
        "#define APP_SCALE SCALAR(3)\n#endif\n")
    (root / "include" / "app" / "scalar.h").write_text(
        "#ifndef SCALAR_H\n#define SCALAR_H\n#include <app/config.h>\n"
        "#define SCALAR(v) ((float)(v))\n#endif\n")
    return unit


def test_collect_follows_nested_includes_through_the_search_path(tmp_path: Path) -> None:
    unit = app_tree(tmp_path)
    tree = collect(unit, UNIT, [unit.parent, tmp_path / "include"])
    assert sorted(name for name, _ in tree.files) == [
        "common/defs.h", "include/app/config.h", "include/app/scalar.h", "src/solver.h"]
    assert tree.include_dirs == ("src", "include")  # the unit's directory first
    assert dict(tree.files)["src/solver.h"] == (tmp_path / "src" / "solver.h").read_bytes()
    assert set(tree.origins) == {tmp_path / "src" / "solver.h", tmp_path / "common" / "defs.h",
                                 tmp_path / "include" / "app" / "config.h",
                                 tmp_path / "include" / "app" / "scalar.h"}
    assert tree.unresolved == ()


def test_headers_in_system_directories_stay_out(tmp_path: Path) -> None:
    unit = app_tree(tmp_path)
    # the compile command names the "system" directory with -I: still not copied
    tree = collect(unit, UNIT, [unit.parent, tmp_path / "include"],
                   system_dirs=(tmp_path / "include", *headers.system_include_dirs()))
    assert sorted(name for name, _ in tree.files) == ["common/defs.h", "src/solver.h"]
    assert tree.include_dirs == ("src",)


def test_real_toolkit_and_compiler_headers_are_system() -> None:
    dirs = headers.system_include_dirs()
    assert any((d / "cstdio").is_file() or (d / "stdio.h").is_file() for d in dirs)


@pytest.mark.parametrize("spelled", ['"app/config.h"', "<app/config.h>"])
def test_a_missing_header_is_one_clear_error(tmp_path: Path, spelled: str) -> None:
    unit = app_tree(tmp_path)
    with pytest.raises(MissingHeader) as caught:  # -Iinclude forgotten
        collect(unit, UNIT.replace("<app/config.h>", spelled), [unit.parent])
    message = caught.value.one_line()
    assert f"{unit}:3: #include {spelled} is not in {unit.parent}" in message
    assert "--include DIR" in message


def test_a_missing_header_inside_a_guarded_header_is_still_an_error(tmp_path: Path) -> None:
    unit = app_tree(tmp_path)
    scalar = tmp_path / "include" / "app" / "scalar.h"
    scalar.write_text(scalar.read_text().replace('#include <app/config.h>', '#include "gone.h"'))
    with pytest.raises(MissingHeader, match=r'scalar.h:3: #include "gone.h"'):
        collect(unit, UNIT, [unit.parent, tmp_path / "include"])


def test_a_missing_header_under_a_conditional_is_listed_not_fatal(tmp_path: Path) -> None:
    unit = app_tree(tmp_path)
    text = UNIT + '#ifdef USE_MPI\n#  include "mpi_glue.h"\n#endif\n'
    tree = collect(unit, text, [unit.parent, tmp_path / "include"])
    assert tree.unresolved == ("solver.cu:13: mpi_glue.h",)
    assert len(tree.files) == 4


def test_includes_reads_directives_and_guards() -> None:
    found = includes('#ifndef G\n#define G\n#include "a.h"\n#if X\n # include <b.h>\n#endif\n'
                     '#endif\n// #include "c.h"\n#include "d.h"\n')
    assert [(i.name, i.quoted, i.line, i.conditional) for i in found] == [
        ("a.h", True, 3, False), ("b.h", False, 5, True), ("d.h", True, 9, False)]


def test_too_many_headers_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    unit = app_tree(tmp_path)
    monkeypatch.setattr(headers, "MAX_HEADERS", 2)
    with pytest.raises(RecordingError, match="more than 2 headers"):
        collect(unit, UNIT, [unit.parent, tmp_path / "include"])


# -- manifest fields and the written-out tree -----------------------------------------------

def _with_headers(tmp_path: Path) -> Bundle:
    from tests.unit.test_bundle import write_bundle

    plain = write_bundle(tmp_path / "plain")
    data = json.loads((plain.path / "manifest.json").read_text())
    target = tmp_path / "with"
    (target / "blobs").mkdir(parents=True)
    for blob in (plain.path / "blobs").iterdir():
        (target / "blobs" / blob.name).write_bytes(blob.read_bytes())
    import hashlib

    kernel = data["kernel"]
    kernel["headers"] = []
    for name, text in (("src/k.h", b"#define K 2\n"), ("include/app/v.h", b"#define V 3\n")):
        sha = hashlib.sha256(text).hexdigest()
        (target / "blobs" / sha).write_bytes(text)
        data["blobs"][sha] = len(text)
        kernel["headers"].append({"name": name, "sha256": sha})
    kernel["include_dirs"] = ["src", "include"]
    (target / "manifest.json").write_text(json.dumps(data))
    return Bundle.open(target, verify=True)


def test_manifest_round_trip_keeps_headers_and_include_dirs(tmp_path: Path) -> None:
    bundle = _with_headers(tmp_path)
    k = bundle.manifest.kernel
    assert [h.name for h in k.headers] == ["src/k.h", "include/app/v.h"]
    assert k.include_dirs == ("src", "include")
    again = Manifest.from_json(json.loads(json.dumps(bundle.manifest.to_json())))
    assert again == bundle.manifest and again.sha256 == bundle.manifest.sha256


def test_a_bundle_without_headers_keeps_its_json_and_identity(tmp_path: Path) -> None:
    from tests.unit.test_bundle import write_bundle

    bundle = write_bundle(tmp_path / "old")
    stored = json.loads((bundle.path / "manifest.json").read_text())
    assert "headers" not in stored["kernel"] and "include_dirs" not in stored["kernel"]
    assert bundle.manifest.to_json() == stored  # an old bundle loads and writes back unchanged
    assert bundle.include_dirs() == ()


@pytest.mark.parametrize(
    ("field", "value", "expect"),
    [
        ("headers", [{"name": "../escape.h", "sha256": "0" * 64}], "headers[0].name"),
        ("headers", [{"name": "/abs.h", "sha256": "0" * 64}], "headers[0].name"),
        ("include_dirs", ["/usr/include"], "include_dirs[0]"),
        ("include_dirs", [3], "include_dirs[0]"),
        ("headers", [{"name": "a.h", "sha256": "a" * 64}], "kernel.headers[0]"),  # no blob
    ],
)
def test_bad_header_fields_are_named(tmp_path: Path, field: str, value: object,
                                     expect: str) -> None:
    bundle = _with_headers(tmp_path)
    data = bundle.manifest.to_json()
    data["kernel"][field] = value
    with pytest.raises(ManifestError, match=expect.replace("[", r"\[").replace("]", r"\]")):
        Manifest.from_json(data)


def test_include_dirs_write_the_tree_once(tmp_path: Path) -> None:
    bundle = _with_headers(tmp_path)
    dirs = bundle.include_dirs(tmp_path / "cache")
    root = Path(dirs[0]).parent
    assert dirs == (str(root / "src"), str(root / "include"))
    assert (root / "src" / "k.h").read_bytes() == b"#define K 2\n"
    assert (root / "include" / "app" / "v.h").read_bytes() == b"#define V 3\n"
    (root / "src" / "k.h").unlink()  # a tree that lost a file is completed, not trusted
    assert bundle.include_dirs(tmp_path / "cache") == dirs
    assert (root / "src" / "k.h").is_file()
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [root.name]  # no temporaries


def test_an_include_directory_without_headers_exists_in_the_tree(tmp_path: Path) -> None:
    # cfd in the corpus: the unit's own folder is an include directory, and every header it
    # reads lies under other -I folders; the compiler refused the missing folder
    bundle = _with_headers(tmp_path)
    data = bundle.manifest.to_json()
    data["kernel"]["include_dirs"] = ["cfd", "src", "include"]
    (bundle.path / "manifest.json").write_text(json.dumps(data))
    again = Bundle.open(bundle.path, verify=True)
    dirs = again.include_dirs(tmp_path / "cache")
    assert [Path(d).name for d in dirs] == ["cfd", "src", "include"]
    assert all(Path(d).is_dir() for d in dirs)
    from r3tui.compile import CompileRequest, get_toolchain

    result = get_toolchain("nvrtc").compile(CompileRequest(
        '#include "k.h"\n#include "app/v.h"\n'
        'extern "C" __global__ void f(int* x) { x[0] = K * V; }\n', "f", include_dirs=dirs))
    assert result.ok, result.log
