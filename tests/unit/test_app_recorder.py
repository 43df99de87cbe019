"""`r3 record -- ./app` without a GPU: the interposer compiles and loads, and a raw dump
written here in the interposer's format converts into valid bundles and recording.json."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from r3tui.cli import main
from r3tui.cuda.arena import ARENA_BASE
from r3tui.domain import LaunchTimes
from r3tui.record import app_dump, interposer
from r3tui.record.bundle import Bundle
from r3tui.record.manifest import ParamKind


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> interposer.Interposer:
    try:
        interposer.find_cuda_header()
        interposer.find_compiler()
    except Exception as exc:  # no cuda.h or no cc on this machine
        pytest.skip(f"cannot build the interposer here: {exc}")
    return interposer.build(tmp_path_factory.mktemp("interpose"))


def test_interposer_compiles_and_exports_the_hooks(library: interposer.Interposer) -> None:
    assert library.built and library.path.is_file()
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(library.path)],
                             capture_output=True, text=True, check=True).stdout
    for name in ("dlsym", "cuMemAlloc_v2", "cuMemFree_v2", "cuLaunchKernel", "cuLaunchKernelEx",
                 "cuStreamBeginCapture_v2", "cuStreamEndCapture", "cuGraphInstantiateWithFlags",
                 "cuGraphInstantiateWithParams", "cuGraphLaunch"):
        assert f" T {name}\n" in symbols, name
    again = interposer.build(library.path.parent)
    assert again.path == library.path and not again.built  # cached by source hash


def test_interposer_loads_into_a_process_without_cuda(library: interposer.Interposer,
                                                      tmp_path: Path) -> None:
    # A process that never touches CUDA runs normally (dlsym still works through the hook)
    # and leaves no per-process directory behind.
    env = {**os.environ, "LD_PRELOAD": str(library.path), "R3_RECORD_DIR": str(tmp_path / "raw")}
    run = subprocess.run([sys.executable, "-c", "import ctypes; print(ctypes.CDLL(None).getpid())"],
                         env=env, capture_output=True, text=True, check=True)
    assert run.stdout.strip().isdigit()
    assert not (tmp_path / "raw").exists()


# The interposer's argument comparison, compiled from r3rec.c itself into a test program
# (its static functions called directly; no driver is needed for them).
SAME_ARGS_PROGRAM = r"""
#include "r3rec.c"

static void show(const char *what, int v) { printf("%s=%d\n", what, v); }

int main(void) {
    /* kernel(double *p, int n, char c, double x): offsets 0, 8, 12, 16 */
    size_t offs[] = {0, 8, 12, 16}, sizes[] = {8, 4, 1, 8};
    double *p = (double *)0x153940000100ULL; int n = 7; char ch = 'a'; double x = 2.5;
    void *params[] = {&p, &n, &ch, &x};
    unsigned char *ref = calloc(25, 1);
    for (int i = 0; i < 4; i++) memcpy(ref + offs[i], params[i], sizes[i]);
    config_t k = {0};
    keep_reference(&k, ref, 24, 1, offs, sizes, 4);
    call_t c = {0};
    c.params = params;
    show("same", same_args(&k, &c));
    n = 8; show("int_differs", same_args(&k, &c)); n = 7;
    x = 3.0; show("double_differs", same_args(&k, &c)); x = 2.5;
    double *q = p + 1; params[0] = &q; show("pointer_differs", same_args(&k, &c));
    params[0] = &p;
    /* the same values through an `extra` buffer whose padding bytes are not zero */
    unsigned char buf[24]; memset(buf, 0xee, sizeof buf);
    for (int i = 0; i < 4; i++) memcpy(buf + offs[i], params[i], sizes[i]);
    size_t bsize = sizeof buf;
    void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, buf, CU_LAUNCH_PARAM_BUFFER_SIZE, &bsize,
                     CU_LAUNCH_PARAM_END};
    call_t e = {0};
    e.extra = extra;
    show("extra_same", same_args(&k, &e));
    bsize = 20; show("extra_short", same_args(&k, &e)); bsize = 24;
    /* no layout: the recorded `extra` buffer is compared whole */
    unsigned char *whole = malloc(24); memcpy(whole, buf, 24);
    config_t w = {0};
    keep_reference(&w, whole, 24, 0, NULL, NULL, 0);
    show("whole_same", same_args(&w, &e));
    buf[13] = 0; show("whole_padding_differs", same_args(&w, &e));
    show("whole_params_launch", same_args(&w, &c));
    /* a kernel without parameters, and a configuration without a reference */
    config_t none = {0};
    keep_reference(&none, NULL, 0, 1, NULL, NULL, 0);
    call_t bare = {0};
    show("no_params", same_args(&none, &bare));
    config_t unknown = {0};
    show("no_reference", same_args(&unknown, &c));
    return 0;
}
"""


def test_interposer_compares_launch_arguments_with_the_recorded_ones(tmp_path: Path) -> None:
    try:
        include = interposer.find_cuda_header()
        compiler = interposer.find_compiler()
    except Exception as exc:  # no cuda.h or no cc on this machine
        pytest.skip(f"cannot build the interposer here: {exc}")
    (tmp_path / "same_args.c").write_text(SAME_ARGS_PROGRAM)
    exe = tmp_path / "same_args"
    subprocess.run([compiler, "-O2", "-std=gnu11", f"-I{include}",
                    f"-I{interposer.SOURCE.parent}", "-o", str(exe),
                    str(tmp_path / "same_args.c"), "-ldl", "-lpthread"],
                   check=True, capture_output=True, text=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    seen = dict(line.split("=") for line in out.split())
    assert seen == {
        "same": "1", "int_differs": "0", "double_differs": "0", "pointer_differs": "0",
        "extra_same": "1", "extra_short": "0", "whole_same": "1",
        "whole_padding_differs": "0", "whole_params_launch": "0", "no_params": "1",
        "no_reference": "0"}


# -- a synthetic dump in the interposer's format ---------------------------------------------

A0, A1, A2 = ARENA_BASE, ARENA_BASE + 256, ARENA_BASE + 512  # bump allocator, 256-byte align
MANAGED = 0x7F0000000000


class Dump:
    def __init__(self, root: Path, pid: int = 4242) -> None:
        self.dir = root / f"p{pid}"
        (self.dir / "data").mkdir(parents=True)
        self.lines: list[dict[str, object]] = [{"ev": "start", "pid": pid, "reachable": 0}]

    def data(self, name: str, content: bytes) -> str:
        (self.dir / "data" / name).write_bytes(content)
        return name

    def config(self, cid: int, name: str, layout: list[list[int]], args: bytes,
               allocs: dict[int, tuple[int, bytes, bytes]], image: int = 0) -> None:
        entries = []
        for aid, (addr, pro, epi) in allocs.items():
            entries.append([aid, addr, len(pro), self.data(f"c{cid}-a{aid}.pro", pro),
                            self.data(f"c{cid}-a{aid}.epi", epi)])
        self.lines.append({"ev": "config", "id": cid, "recorded": 1, "name": name,
                           "image": image, "grid": [4, 1, 1], "block": [64, 1, 1], "shm": 0,
                           "api": "cuLaunchKernel", "rc": 0, "sync_rc": 0, "time_s": 2e-6,
                           "layout": layout, "args": args.hex(), "allocs": entries,
                           "globals": []})

    def check(self, cid: int, args: bytes, allocs: dict[int, tuple[int, bytes, bytes]],
              rc: int = 0) -> None:
        """The interposer's snapshot of configuration ``cid``'s second launch."""
        entries = [[aid, addr, len(pro), self.data(f"k{cid}-a{aid}.pro", pro),
                    self.data(f"k{cid}-a{aid}.epi", epi)] for aid, (addr, pro, epi)
                   in allocs.items()]
        self.lines.append({"ev": "check", "id": cid, "recorded": 1, "name": "x", "image": 0,
                           "grid": [4, 1, 1], "block": [64, 1, 1], "shm": 0,
                           "api": "cuLaunchKernel", "rc": rc, "sync_rc": 0, "time_s": 2e-6,
                           "layout": [[0, 8], [8, 4]], "args": args.hex(), "allocs": entries,
                           "globals": []})

    def write(self, *, cut_last: bool = False) -> None:
        text = "\n".join(json.dumps(x) for x in self.lines) + "\n"
        if cut_last:
            text += '{"ev":"prof'  # the line a crash cut short
        (self.dir / "index.jsonl").write_text(text)


def _synthetic(root: Path) -> Dump:
    d = Dump(root)
    d.lines.append({"ev": "arena", "ok": 1, "base": ARENA_BASE, "reserved": 64 << 30,
                    "granularity": 2 << 20, "device": 0, "arch": "sm_90"})
    for aid, addr in enumerate((A0, A1, A2)):
        d.lines.append({"ev": "alloc", "id": aid, "addr": addr, "size": 32, "kind": "arena",
                        "api": "cuMemAlloc"})
    d.data("image-0.bin", b"\x7fELF" + bytes(60))
    d.lines.append({"ev": "image", "id": 0, "file": "image-0.bin", "size": 64})
    # kernel 1: (Pair* pairs, int n) where pairs holds pointers to alloc1 and alloc2
    table = struct.pack("<QQ", A1, A2) + bytes(16)
    args = struct.pack("<Qi", A0, 2) + bytes(4)
    d.config(0, "_Z9ptr_kernelP4Pairi", [[0, 8], [8, 4]], args[:12],
             {0: (A0, table, table), 1: (A1, bytes(32), b"\x01" * 32),
              2: (A2, bytes(32), b"\x02" * 32)})
    # kernel 2 is launched on managed memory
    d.lines.append({"ev": "alloc", "id": -1, "addr": MANAGED, "size": 4096, "kind": "managed",
                    "api": "cuMemAllocManaged"})
    d.config(1, "_Z7managedPfi", [[0, 8], [8, 4]], struct.pack("<Qi", MANAGED + 64, 7), {})
    # config 0 with its same-args launches (3 of 5 had the recorded arguments); config 1 in
    # the older 4-field form
    d.lines.append({"ev": "profile", "configs": [[0, 5, 1e-5, 5, 3, 4.5e-6, 3],
                                                 [1, 3, 6e-6, 3]]})
    d.lines.append({"ev": "end", "launches": 8, "getproc": 1, "exported": 0,
                    "arena_failed": 0, "harvested": 1})
    return d


def _build(root: Path) -> dict[str, object]:
    procs = app_dump.read_dump(root / "raw")
    return app_dump.build_recording(
        procs, root / "out", command=["./app", "-n", "2"], cwd=str(root), runtime="static",
        wall_s=0.5, exit_code=0, reachable=False, recorded_at="2026-01-01T00:00:00+00:00",
        demangle=lambda n: {"_Z9ptr_kernelP4Pairi": "ptr_kernel(Pair*, int)"}.get(n, n),
        source_of=lambda _n: None)


def test_dump_becomes_bundles_with_pointer_params_and_allocations(tmp_path: Path) -> None:
    _synthetic(tmp_path / "raw").write()
    data = _build(tmp_path)
    assert data["format_version"] == 1 and data["runtime"] == "static"
    kernels = {k["entry_point"]: k for k in data["kernels"]}  # type: ignore[union-attr]
    ptr = kernels["_Z9ptr_kernelP4Pairi"]
    assert ptr["name"] == "ptr_kernel(Pair*, int)" and ptr["launches"] == 5
    assert ptr["device_time_s"] == pytest.approx(1e-5)
    (config,) = ptr["configs"]
    assert config["replayable"] and config["reasons"] == [] and config["count"] == 5
    bundle = Bundle.open(tmp_path / "out" / config["bundle"], verify=True)
    m = bundle.manifest
    assert m.kernel.entry_point == "_Z9ptr_kernelP4Pairi" and m.kernel.binary is not None
    assert m.kernel.binary.kind == "cubin" and m.kernel.binary.arch == "sm_90"
    assert [(p.offset, p.size, p.kind) for p in m.params] == [
        (0, 8, ParamKind.POINTER), (8, 4, ParamKind.BYTES)]
    assert m.params[0].allocation == "alloc0" and m.params[0].alloc_offset == 0
    assert struct.unpack("<i", m.params[1].raw) == (2,)
    assert [a.address for a in m.allocations] == [A0, A1, A2]
    assert bundle.blob(m.allocation("alloc1").epilogue) == b"\x01" * 32
    assert m.arena.base == ARENA_BASE and m.arena.size == 2 << 20
    assert m.launch.count == 5 and m.launch.total_time_s == pytest.approx(1e-5)


def test_a_second_launch_snapshot_becomes_the_bundles_check_launch(tmp_path: Path) -> None:
    d = _synthetic(tmp_path / "raw")
    table = struct.pack("<QQ", A1, A2) + bytes(16)
    d.check(0, struct.pack("<Qi", A0, 3), {0: (A0, table, table),
                                           1: (A1, b"\x01" * 32, b"\x03" * 32),
                                           2: (A2, b"\x02" * 32, b"\x04" * 32)})
    d.lines.insert(-2, d.lines.pop())  # before the profile and end events
    d.write()
    data = _build(tmp_path)
    kernels = {k["entry_point"]: k for k in data["kernels"]}  # type: ignore[union-attr]
    (config,) = kernels["_Z9ptr_kernelP4Pairi"]["configs"]
    assert config["check_launch"] is True and config["check_reasons"] == []
    (managed,) = kernels["_Z7managedPfi"]["configs"]
    assert managed["check_launch"] is False
    assert managed["check_reasons"] == ["the application launched this configuration once"]
    bundle = Bundle.open(tmp_path / "out" / config["bundle"], verify=True)
    (check,) = bundle.manifest.checks
    assert check.label == "the application's second launch of this configuration"
    assert [a.address for a in check.allocations] == [A0, A1, A2]
    assert bundle.blob(check.allocations[1].prologue) == b"\x01" * 32
    assert bundle.blob(check.allocations[2].epilogue) == b"\x04" * 32
    assert struct.unpack("<i", check.params[1].raw) == (3,)
    assert check.params[0].allocation == "alloc0"


def test_a_failed_second_launch_leaves_the_bundle_without_a_check_launch(
        tmp_path: Path) -> None:
    d = _synthetic(tmp_path / "raw")
    d.check(0, struct.pack("<Qi", A0, 3), {}, rc=700)
    d.lines.insert(-2, d.lines.pop())
    d.write()
    data = _build(tmp_path)
    kernels = {k["entry_point"]: k for k in data["kernels"]}  # type: ignore[union-attr]
    (config,) = kernels["_Z9ptr_kernelP4Pairi"]["configs"]
    assert config["replayable"] and config["check_launch"] is False
    assert "the launch failed in the application (CUresult 700)" in config["check_reasons"]
    assert Bundle.open(tmp_path / "out" / config["bundle"]).manifest.checks == ()


def test_same_args_launches_reach_recording_json_and_older_rows_still_load(
        tmp_path: Path) -> None:
    _synthetic(tmp_path / "raw").write()
    (proc,) = app_dump.read_dump(tmp_path / "raw")
    ptr, managed = proc.configs
    assert ptr.same_args == LaunchTimes(3, 4.5e-6, 3) and ptr.count == 5
    assert managed.same_args is None and managed.count == 3  # a row without the fields
    data = _build(tmp_path)
    kernels = {k["entry_point"]: k for k in data["kernels"]}  # type: ignore[union-attr]
    (config,) = kernels["_Z9ptr_kernelP4Pairi"]["configs"]
    assert config["same_args"] == {"count": 3, "time_s": pytest.approx(4.5e-6), "timed": 3}
    assert config["count"] == 5 and config["device_time_s"] == pytest.approx(1e-5)
    (config,) = kernels["_Z7managedPfi"]["configs"]
    assert config["same_args"] is None


def test_a_crashed_process_has_no_same_args_figures(tmp_path: Path) -> None:
    d = _synthetic(tmp_path / "raw")
    d.lines = [x for x in d.lines if x["ev"] not in ("profile", "end")]
    d.write(cut_last=True)
    (proc,) = app_dump.read_dump(tmp_path / "raw")
    assert [c.same_args for c in proc.configs] == [None, None]
    assert [c.count for c in proc.configs] == [1, 1]


def test_managed_memory_kernel_is_not_replayable(tmp_path: Path) -> None:
    _synthetic(tmp_path / "raw").write()
    data = _build(tmp_path)
    kernels = {k["entry_point"]: k for k in data["kernels"]}  # type: ignore[union-attr]
    (config,) = kernels["_Z7managedPfi"]["configs"]
    assert not config["replayable"] and config["bundle"] is None
    assert "managed memory" in config["reasons"][0]
    assert data["unsupported_allocations"] == [
        {"kind": "managed", "size": 4096, "address": MANAGED}]
    assert not (tmp_path / "out" / "bundles" / "001-managed").exists()


def test_pointer_to_managed_memory_inside_a_buffer_is_found(tmp_path: Path) -> None:
    d = Dump(tmp_path / "raw")
    d.lines.append({"ev": "alloc", "id": -1, "addr": MANAGED, "size": 64, "kind": "managed",
                    "api": "cuMemAllocManaged"})
    d.data("image-0.bin", b"\x7fELF" + bytes(60))
    d.lines.append({"ev": "image", "id": 0, "file": "image-0.bin", "size": 64})
    holder = struct.pack("<QQ", 5, MANAGED + 8)
    d.config(0, "k", [[0, 8]], struct.pack("<Q", A0), {0: (A0, holder, holder)})
    d.write(cut_last=True)  # and the process crashed before its profile line
    data = _build(tmp_path)
    (config,) = data["kernels"][0]["configs"]  # type: ignore[index]
    assert not config["replayable"]
    assert config["reasons"] == [
        f"allocation alloc0 holds a pointer into managed memory (64 bytes at {MANAGED:#x}, "
        "cuMemAllocManaged), which the arena does not hold"]
    assert any("did not exit normally" in w for w in data["warnings"])  # type: ignore[union-attr]


def test_missing_image_and_failed_launch_are_reasons(tmp_path: Path) -> None:
    d = Dump(tmp_path / "raw")
    d.config(0, "k", [], b"", {}, image=3)
    d.lines[-1]["rc"] = 700
    d.write()
    (config,) = _build(tmp_path)["kernels"][0]["configs"]  # type: ignore[index]
    assert config["reasons"] == ["the launch failed in the application (CUresult 700)",
                                 "no module image of this kernel was captured"]


def test_short_names_are_file_system_safe() -> None:
    assert app_dump.short_name("cg::detail::xpay<double>(double const*, int)") == "xpay"
    assert app_dump.short_name("a b/c") == "a_b_c"


def test_record_without_a_command_is_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["record", "--"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no application to record" in err


def test_record_missing_executable_is_one_line_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["record", "--out", str(tmp_path / "o"), "--", str(tmp_path / "nope"), "-x"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no executable" in err
    assert not (tmp_path / "o").exists()


def test_record_app_without_cuda_says_so(library: interposer.Interposer, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from r3tui.record.app_recorder import missing_driver

    if missing_driver() is not None:  # test_cli_first_hour.py covers the driverless message
        pytest.skip("no CUDA driver here: the error names the missing driver instead")
    monkeypatch.setenv("R3_CACHE", str(library.path.parent.parent))
    monkeypatch.chdir(tmp_path)
    assert main(["--db", str(tmp_path / "r3.sqlite"), "record", "--out", "rec", "--",
                 "/bin/true"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("r3: error: the interposer saw no CUDA activity")
    assert not (tmp_path / "rec").exists()


# -- a unit that includes the application's own headers ---------------------------------------

HEADER_UNIT = """\
#include "solver.h"
#include <app/config.h>
namespace solver {
__global__ void step(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = relax(x[i]) * APP_SCALE;
}
}
"""
STEP = "_ZN6solver4stepEPfi"


def _header_app(root: Path) -> Path:
    """src/step.cu includes src/solver.h (-> ../common/defs.h) and include/app/config.h."""
    for sub in ("src", "common", "include/app"):
        (root / sub).mkdir(parents=True)
    unit = root / "src" / "step.cu"
    unit.write_text(HEADER_UNIT)
    (root / "src" / "solver.h").write_text(
        '#pragma once\n#include "../common/defs.h"\n'
        "__device__ inline float relax(float v) { return DEFS_HALF * v; }\n")
    (root / "common" / "defs.h").write_text("#pragma once\n#define DEFS_HALF 0.5f\n")
    (root / "include" / "app" / "config.h").write_text("#pragma once\n#define APP_SCALE 3.0f\n")
    return unit


def _record_header_app(root: Path, include_dirs: tuple[Path, ...]) -> dict[str, object]:
    from r3tui.record.app_recorder import AppRecordRequest, _source_lookup

    unit = _header_app(root / "app")
    d = Dump(root / "raw")
    d.data("image-0.bin", b"\x7fELF" + bytes(60))
    d.lines.append({"ev": "image", "id": 0, "file": "image-0.bin", "size": 64})
    d.config(0, STEP, [[0, 8], [8, 4]], struct.pack("<Qi", A0, 32),
             {0: (A0, bytes(128), bytes(128))})
    d.lines.append({"ev": "profile", "configs": [[0, 1, 2e-6, 1]]})
    d.write()
    req = AppRecordRequest(command=("./app",), out=root / "out", sources=(unit,),
                           include_dirs=include_dirs)
    return app_dump.build_recording(
        app_dump.read_dump(root / "raw"), root / "out", command=["./app"], cwd=str(root),
        runtime="static", wall_s=0.1, exit_code=0, reachable=False,
        recorded_at="2026-01-01T00:00:00+00:00", demangle=lambda n: n,
        source_of=_source_lookup(req))


def _toolchains() -> list[object]:
    from r3tui.compile import get_toolchain

    out: list[object] = ["nvrtc"]
    for name in ("nvcc", "llvm"):
        ok, why = get_toolchain(name).available()
        out.append(pytest.param(name, marks=pytest.mark.skipif(not ok, reason=why)))
    return out


@pytest.mark.parametrize("toolchain", _toolchains())
def test_a_unit_with_application_headers_recompiles_from_its_bundle(tmp_path: Path,
                                                                    toolchain: str) -> None:
    from r3tui.compile import CompileRequest, get_toolchain

    data = _record_header_app(tmp_path, (tmp_path / "app" / "include",))
    assert data["warnings"] == []
    (kernel,) = data["kernels"]  # type: ignore[misc]
    assert kernel["source"]["error"] is None
    assert sorted(Path(p).name for p in kernel["source"]["headers"]) == [
        "config.h", "defs.h", "solver.h"]
    bundle = Bundle.open(tmp_path / "out" / kernel["configs"][0]["bundle"], verify=True)
    k = bundle.manifest.kernel
    assert sorted(h.name for h in k.headers) == [
        "common/defs.h", "include/app/config.h", "src/solver.h"]
    assert k.include_dirs == ("src", "include") and k.toolchain == "nvcc"
    # the application tree is gone: only the bundle's copy can serve the headers
    import shutil

    shutil.rmtree(tmp_path / "app")
    source = bundle.source()
    assert source == HEADER_UNIT
    tc = get_toolchain(toolchain)
    request = CompileRequest(source, k.name, source_name=k.sources[0].name,
                             include_dirs=bundle.include_dirs(tmp_path / "cache"))
    compiled = tc.compile(request)
    assert compiled.ok, compiled.log
    assert compiled.lowered_name == STEP and compiled.binary is not None
    without = tc.compile(CompileRequest(source, k.name, source_name=k.sources[0].name))
    assert not without.ok and "solver.h" in without.log


def test_a_missing_header_is_a_warning_and_the_bundle_carries_no_source(tmp_path: Path) -> None:
    data = _record_header_app(tmp_path, ())  # --include forgotten: <app/config.h> is missing
    (kernel,) = data["kernels"]  # type: ignore[misc]
    assert "step.cu:2: #include <app/config.h> is not in" in kernel["source"]["error"]
    (warning,) = data["warnings"]  # type: ignore[misc]
    assert warning.startswith(f"{STEP}: ") and "carry no source" in warning
    (config,) = kernel["configs"]
    bundle = Bundle.open(tmp_path / "out" / config["bundle"])
    assert config["replayable"] and bundle.source() is None and bundle.binary() is not None
    assert bundle.manifest.kernel.headers == () and bundle.manifest.kernel.toolchain is None


def test_record_include_needs_an_existing_directory_and_a_source(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "o")
    assert main(["record", "--out", out, "--include", str(tmp_path / "nope"), "--source",
                 str(tmp_path), "--", "/bin/true"]) == 2
    assert "no include directory" in capsys.readouterr().err
    assert main(["record", "--out", out, "--include", str(tmp_path), "--", "/bin/true"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--include needs --source or --compile-db" in err
    assert not (tmp_path / "o").exists()


# -- CUDA graphs: counted and timed, not recorded ----------------------------------------------

def _graph_dump(root: Path, *, configs: bool = True) -> None:
    d = Dump(root / "raw")
    d.data("image-0.bin", b"\x7fELF" + bytes(60))
    d.lines.append({"ev": "image", "id": 0, "file": "image-0.bin", "size": 64})
    if configs:
        d.config(0, "_Z6normalPfi", [[0, 8], [8, 4]], struct.pack("<Qi", A0, 4),
                 {0: (A0, bytes(32), b"\x01" * 32)})
    d.lines.append({"ev": "graph", "id": 0, "kernel_nodes": 3,
                    "kernels": ["_Z4stepPfi", "_Z3mixPfS_i"]})
    d.lines.append({"ev": "graph", "id": 1, "kernel_nodes": 1, "kernels": ["_Z4stepPfi"]})
    d.lines.append({"ev": "profile", "configs": [[0, 2, 3e-6, 2]] if configs else [],
                    "graphs": [[0, 5, 4e-6, 5], [1, 2, 1e-6, 2]]})
    d.lines.append({"ev": "end", "launches": 6, "getproc": 1, "exported": 0, "arena_failed": 0,
                    "harvested": 1, "graph_launches": 7, "captured_launches": 4,
                    "capture_skipped": 1})
    d.write()


def test_graph_launches_are_reported_not_recorded(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from r3tui.cli.record import print_profile

    _graph_dump(tmp_path)
    data = _build(tmp_path)
    assert data["graphs"] == {"launches": 7, "device_time_s": pytest.approx(5e-6),
                              "instantiated": 2, "kernel_node_launches": 17,
                              "captured_kernel_launches": 4,
                              "kernels": ["_Z4stepPfi", "_Z3mixPfS_i"]}
    (kernel,) = data["kernels"]  # type: ignore[misc]
    assert kernel["entry_point"] == "_Z6normalPfi" and kernel["launches"] == 2
    assert data["warnings"] == [
        "1 kernel launches made while a stream was capturing a CUDA graph were passed through "
        "unrecorded (they are not in the profile)"]
    assert app_dump.graph_line(data) == (  # type: ignore[arg-type]
        "7 CUDA graph launches were not recorded: 17 kernel runs (_Z4stepPfi, _Z3mixPfS_i) "
        "are not in the profile (0.005 ms of device time in graphs)")
    print_profile(data)  # type: ignore[arg-type]
    table = capsys.readouterr().out
    assert "(CUDA graphs)" in table and "not recorded" in table
    assert "62.5%" in table  # graph time counts in the shares: 5 us of 8 us


def test_a_graph_instantiated_unseen_has_unknown_kernel_runs(tmp_path: Path) -> None:
    _graph_dump(tmp_path)
    index = tmp_path / "raw" / "p4242" / "index.jsonl"
    index.write_text(index.read_text().replace('"kernel_nodes": 1, "kernels": ["_Z4stepPfi"]',
                                               '"kernel_nodes": -1, "kernels": []'))
    data = _build(tmp_path)
    assert data["graphs"]["kernel_node_launches"] is None  # type: ignore[index]
    assert "7 CUDA graph launches were not recorded: their kernel runs" in str(
        app_dump.graph_line(data))  # type: ignore[arg-type]


def test_a_recording_without_graphs_prints_no_graph_line(tmp_path: Path) -> None:
    _synthetic(tmp_path / "raw").write()
    data = _build(tmp_path)
    assert data["graphs"]["launches"] == 0  # type: ignore[index]
    assert app_dump.graph_line(data) is None  # type: ignore[arg-type]


def test_an_application_that_only_launches_graphs_is_one_clear_error(tmp_path: Path) -> None:
    from r3tui.errors import RecordingError
    from r3tui.record.app_recorder import ExecutableInfo, _diagnose

    _graph_dump(tmp_path, configs=False)
    procs = app_dump.read_dump(tmp_path / "raw")
    with pytest.raises(RecordingError, match=r"only through CUDA graphs \(7 graph launches"):
        _diagnose(procs, ExecutableInfo("static", False, ()), 0)
