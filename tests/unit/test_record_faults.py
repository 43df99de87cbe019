"""Guard space around arena allocations and faults during `r3 record`, without a GPU.

The interposer's own code (r3rec.c) is compiled into test programs and driven with fakes of
the few driver calls it makes (named fake_*: there is no driver here) -- a device whose
kernel faults after its launch returns, so that every later call sees the sticky error, as
a real one does.  What it writes is then converted by the real app_dump code, and `r3 record`
itself runs on a fake application that writes such a dump.  The same paths run for real on
the H200 in tests/gpu/test_gpu_app_faults.py.
"""

from __future__ import annotations

import itertools
import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from r3tui.cli import main
from r3tui.cuda.arena import ARENA_BASE, GUARD_BYTES
from r3tui.record import app_dump, interposer
from r3tui.record.bundle import Bundle
from r3tui.record.manifest import ArenaInfo, Manifest

FAULT_PROGRAM = r"""
#include "r3rec.c"

/* Fakes of the driver: a device that is healthy until the kernel WILD runs, which faults
 * after its launch has returned; from then on every call reports the sticky error. */
#define WILD ((CUfunction)0x1000)
#define OK ((CUfunction)0x2000)
static CUresult fake_state_ = CUDA_SUCCESS;
static int fake_events_;
static CUresult fake_sync(void) { return fake_state_; }
static CUresult fake_is_capturing(CUstream s, CUstreamCaptureStatus *st) {
    (void)s; *st = CU_STREAM_CAPTURE_STATUS_NONE; return fake_state_;
}
static CUresult fake_event_create(CUevent *e, unsigned flags) {
    (void)flags; *e = (CUevent)(uintptr_t)(16 * ++fake_events_); return CUDA_SUCCESS;
}
static CUresult fake_event_record(CUevent e, CUstream s) { (void)e; (void)s; return fake_state_; }
static CUresult fake_event_query(CUevent e) {
    (void)e; return fake_state_ ? fake_state_ : CUDA_ERROR_NOT_READY;
}
static CUresult fake_launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                            unsigned by, unsigned bz, unsigned shm, CUstream s, void **p,
                            void **e) {
    (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)shm; (void)s; (void)p;
    (void)e;
    CUresult before = fake_state_;
    if (f == WILD) fake_state_ = CUDA_ERROR_ILLEGAL_ADDRESS;  /* later, on the device */
    return before;
}

static CUresult launch(CUfunction f) {
    int n = 64; void *params[] = {&n};
    return w_launch(f, 4, 1, 1, 64, 1, 1, 0, NULL, params, NULL);
}

int main(int argc, char **argv) {
    const char *scenario = argc > 1 ? argv[1] : "";
    if (!strcmp(scenario, "arena")) {
        const char *values[] = {NULL, "0", "1000", "65536", "abc", "-5"};
        for (int i = 0; i < 6; i++) {
            if (values[i]) setenv("R3_GUARD_BYTES", values[i], 1);
            else unsetenv("R3_GUARD_BYTES");
            printf("env %s %llu\n", values[i] ? values[i] : "unset",
                   (unsigned long long)guard_from_env());
        }
        uint64_t guards[] = {0, 65536};
        for (int g = 0; g < 2; g++) {
            uint64_t top = 0, end = 0;
            for (int i = 0; i < 3; i++) {
                uint64_t off = arena_place(top, 100, guards[g], &end);
                printf("place %llu %llu %llu\n", (unsigned long long)guards[g],
                       (unsigned long long)off, (unsigned long long)end);
                top = off + 100;
            }
        }
        return 0;
    }
    if (!strcmp(scenario, "query")) {
        d_iscap = fake_is_capturing;
        CUresult codes[] = {CUDA_SUCCESS, CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
                            CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_ILLEGAL_ADDRESS};
        for (int i = 0; i < 4; i++) {
            fake_state_ = codes[i];
            int got = stream_capture(0, NULL);
            printf("query %d %d faulted=%d error=%d\n", (int)codes[i], got, faulted_,
                   (int)capture_error_);
        }
        return 0;
    }
    /* "exact": the faulting kernel's first launch is snapshotted, so synchronized;
     * "async" (run with R3_RECORD_KERNELS=ok_kernel): it is not, and the fault surfaces at
     * the next launch's capture query. */
    note_func(WILD, -1, 0, "_Z10wild_writePfi");
    note_func(OK, -1, 0, "_Z9ok_kernelPfi");
    d_sync = fake_sync;
    d_iscap = d_iscap_ptsz = fake_is_capturing;
    d_evcreate = fake_event_create;
    d_evrecord = d_evrecord_ptsz = fake_event_record;
    d_evquery = fake_event_query;
    r_launch = fake_launch;
    launch(WILD);
    for (int i = 0; i < 5; i++) launch(OK);
    printf("after_fault=%llu capture_skipped=%llu captured=%llu faulted=%d\n", after_fault_,
           capture_skipped_, captured_launches_, faulted_);
    return 0;
}
"""


@pytest.fixture(scope="module")
def fault_program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        include = interposer.find_cuda_header()
        compiler = interposer.find_compiler()
    except Exception as exc:  # no cuda.h or no cc on this machine
        pytest.skip(f"cannot build the interposer here: {exc}")
    work = tmp_path_factory.mktemp("faults")
    (work / "faults.c").write_text(FAULT_PROGRAM)
    exe = work / "faults"
    subprocess.run([compiler, "-O2", "-std=gnu11", "-Wall", "-Werror", f"-I{include}",
                    f"-I{interposer.SOURCE.parent}", "-o", str(exe), str(work / "faults.c"),
                    "-ldl", "-lpthread"], check=True, capture_output=True, text=True)
    return exe


def _run(exe: Path, scenario: str, raw: Path | None = None, **env: str) -> str:
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith(("R3_", "CUDA_LAUNCH"))}
    environ.update(env)
    environ["R3_REC_NO_GATE"] = "1"
    if raw is not None:
        environ["R3_RECORD_DIR"] = str(raw)
    return subprocess.run([str(exe), scenario], env=environ, capture_output=True, text=True,
                          check=True, timeout=60).stdout


def test_the_guard_comes_from_the_environment_rounded_to_the_alignment(
        fault_program: Path) -> None:
    out = _run(fault_program, "arena").splitlines()
    env = dict((ln.split()[1], int(ln.split()[2])) for ln in out if ln.startswith("env"))
    assert env == {"unset": GUARD_BYTES, "0": 0, "1000": 1024, "65536": 65536,
                   "abc": GUARD_BYTES, "-5": GUARD_BYTES}


def test_each_allocation_has_the_guard_before_and_after_it(fault_program: Path) -> None:
    out = _run(fault_program, "arena").splitlines()
    places = [tuple(int(x) for x in ln.split()[1:]) for ln in out if ln.startswith("place")]
    # without a guard: the bump allocator of old (256-byte aligned, first at the base)
    assert places[:3] == [(0, 0, 100), (0, 256, 356), (0, 512, 612)]
    guard = 65536
    offsets = [off for g, off, _end in places[3:]]
    assert offsets[0] == guard  # the base itself is a guard's start
    for prev, off in itertools.pairwise(offsets):
        assert off - (prev + 100) >= guard and off % 256 == 0
    assert all(end == off + 100 + guard for _g, off, end in places[3:])  # mapped beyond


def test_a_failed_capture_query_is_a_fault_not_a_capture(fault_program: Path,
                                                         tmp_path: Path) -> None:
    rows = [ln.split() for ln in _run(fault_program, "query", tmp_path / "raw").splitlines()]
    got = {int(r[1]): (int(r[2]), r[3], r[4]) for r in rows}
    assert got[0] == (0, "faulted=0", "error=0")
    assert got[906] == (2, "faulted=0", "error=0")  # the legacy stream during a capture
    assert got[1] == (-1, "faulted=0", "error=1")  # another error: not a capture either
    assert got[700] == (-1, "faulted=1", "error=1")


def _events(raw: Path) -> list[dict[str, Any]]:
    (proc,) = raw.glob("p*")
    return [json.loads(ln) for ln in (proc / "index.jsonl").read_text().splitlines()]


def test_a_kernel_that_faults_on_its_first_launch_is_named_exactly(fault_program: Path,
                                                                   tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    said = _run(fault_program, "exact", raw)
    assert said.split() == ["after_fault=5", "capture_skipped=0", "captured=0", "faulted=1"]
    events = _events(raw)
    (fault,) = [e for e in events if e["ev"] == "fault"]
    assert fault["name"] == "_Z10wild_writePfi" and fault["code"] == 700
    assert (fault["nth"], fault["launch"], fault["exact"]) == (1, 1, 1)
    assert fault["where"] == "cuCtxSynchronize after the launch"
    (config,) = [e for e in events if e["ev"] == "config"]
    assert config["sync_rc"] == 700
    end = events[-1]
    assert end["ev"] == "end" and end["faulted"] == 1 and end["after_fault"] == 5
    assert end["capture_skipped"] == 0 and end["captured_launches"] == 0
    data = _convert(tmp_path)
    assert data["fault"]["exact"] and data["fault"]["kernel"] == "wild_write(float*, int)"
    (kernel,) = data["kernels"]
    assert kernel["configs"][0]["reasons"][0] == (
        "the launch faulted in the application (CUDA_ERROR_ILLEGAL_ADDRESS)")
    assert app_dump.fault_line(data) == (
        "kernel wild_write launch 1 faulted: CUDA_ERROR_ILLEGAL_ADDRESS; "
        "5 later launches were not recorded")
    assert not any("capturing" in w for w in data["warnings"])


def test_a_fault_seen_later_names_the_oldest_unfinished_launch(fault_program: Path,
                                                               tmp_path: Path) -> None:
    """The issue's program: its kernel faulted, and the sticky error made every later
    launch's capture query fail, which was read as 'capturing a CUDA graph'."""
    raw = tmp_path / "raw"
    said = _run(fault_program, "async", raw, R3_RECORD_KERNELS="ok_kernel")
    assert said.split() == ["after_fault=5", "capture_skipped=0", "captured=0", "faulted=1"]
    (fault,) = [e for e in _events(raw) if e["ev"] == "fault"]
    assert fault["name"] == "_Z10wild_writePfi" and fault["exact"] == 0
    assert (fault["nth"], fault["launch"], fault["where"]) == (1, 1, "cuStreamIsCapturing")
    line = app_dump.fault_line(_convert(tmp_path))
    assert line is not None and line.startswith(
        "kernel wild_write launch 1 or a launch after it faulted: CUDA_ERROR_ILLEGAL_ADDRESS "
        "(launches run asynchronously; record with CUDA_LAUNCH_BLOCKING=1")


def _convert(root: Path) -> dict[str, Any]:
    names = {"_Z10wild_writePfi": "wild_write(float*, int)", "_Z9ok_kernelPfi": "ok_kernel"}
    return app_dump.build_recording(
        app_dump.read_dump(root / "raw"), root / "out", command=["./app"], cwd=str(root),
        runtime="static", wall_s=0.1, exit_code=1, reachable=False,
        recorded_at="2026-01-01T00:00:00+00:00", demangle=lambda n: names.get(n, n),
        source_of=lambda _n: None)


# -- the bundle says the guard; replay maps it ------------------------------------------------

def test_a_bundle_records_its_guard_and_older_bundles_read_as_none(tmp_path: Path) -> None:
    guard = 65536
    first = ARENA_BASE + guard
    raw = tmp_path / "raw" / "p7"
    (raw / "data").mkdir(parents=True)
    (raw / "data" / "image-0.bin").write_bytes(b"\x7fELF" + bytes(60))
    (raw / "data" / "c0-a0.pro").write_bytes(bytes(64))
    (raw / "data" / "c0-a0.epi").write_bytes(b"\x01" * 64)
    lines = [
        {"ev": "arena", "ok": 1, "base": ARENA_BASE, "reserved": 64 << 30,
         "granularity": 2 << 20, "device": 0, "arch": "sm_90", "guard": guard},
        {"ev": "alloc", "id": 0, "addr": first, "size": 64, "kind": "arena", "api": "cuMemAlloc"},
        {"ev": "image", "id": 0, "file": "image-0.bin", "size": 64},
        {"ev": "config", "id": 0, "recorded": 1, "name": "k", "image": 0, "grid": [1, 1, 1],
         "block": [64, 1, 1], "shm": 0, "api": "cuLaunchKernel", "rc": 0, "sync_rc": 0,
         "time_s": 1e-6, "layout": [[0, 8]], "args": struct.pack("<Q", first).hex(),
         "allocs": [[0, first, 64, "c0-a0.pro", "c0-a0.epi"]], "globals": []},
    ]
    (raw / "index.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    data = _convert(tmp_path)
    assert data["guard_bytes"] == guard and data["fault"] is None
    (config,) = data["kernels"][0]["configs"]
    m = Bundle.open(tmp_path / "out" / config["bundle"], verify=True).manifest
    assert m.arena.guard == guard and m.allocations[0].address == first
    assert m.to_json()["arena"]["guard"] == guard
    assert m.arena.base + m.arena.size >= first + 64 + guard
    older = m.to_json()
    del older["arena"]["guard"]
    assert Manifest.from_json(older).arena == ArenaInfo(m.arena.base, m.arena.size, 0)
    assert "guard" not in Manifest.from_json(older).to_json()["arena"]  # identity kept


# -- `r3 record` on an application that faults -----------------------------------------------

FAKE_FAULTING_APP = r'''
import json, os, sys
# A fake application (there is no GPU here): it writes what the interposer writes for a
# program whose kernel faulted on its first launch and that went on launching 1999 times.
d = os.path.join(os.environ["R3_RECORD_DIR"], f"p{os.getpid()}")
os.makedirs(os.path.join(d, "data"))
lines = [{"ev": "start", "pid": os.getpid(), "reachable": 0},
         {"ev": "arena", "ok": 1, "base": 0x153940000000, "reserved": 64 << 30,
          "granularity": 2 << 20, "device": 0, "arch": "sm_90",
          "guard": int(os.environ["R3_GUARD_BYTES"])},
         {"ev": "config", "id": 0, "recorded": 1, "name": "_Z4stepPfi", "image": -1,
          "grid": [1, 1, 1], "block": [32, 1, 1], "shm": 0, "api": "cuLaunchKernel", "rc": 0,
          "sync_rc": 700, "time_s": 0, "layout": [], "args": "", "allocs": [], "globals": []},
         {"ev": "fault", "code": 700, "error": "CUDA_ERROR_ILLEGAL_ADDRESS",
          "text": "an illegal memory access was encountered", "name": "_Z4stepPfi",
          "config": 0, "graph": -1, "nth": 1, "launch": 1, "exact": 1,
          "where": "cuCtxSynchronize after the launch"},
         {"ev": "profile", "configs": [[0, 1, 0, 0]], "graphs": []},
         {"ev": "end", "launches": 2000, "harvested": 1, "faulted": 1, "after_fault": 1999,
          "capture_skipped": 0, "captured_launches": 0}]
with open(os.path.join(d, "index.jsonl"), "w") as f:
    f.writelines(json.dumps(x) + "\n" for x in lines)
sys.exit(1)
'''


def test_record_of_a_faulting_application_is_one_line_and_exit_1(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    try:
        interposer.find_cuda_header()
        interposer.find_compiler()
    except Exception as exc:
        pytest.skip(f"cannot build the interposer here: {exc}")
    monkeypatch.setenv("R3_CACHE", str(tmp_path / "cache"))
    app = tmp_path / "fake_faulting_app"
    app.write_text(f"#!{sys.executable}\n{FAKE_FAULTING_APP}")
    app.chmod(0o755)
    out = tmp_path / "rec"
    code = main(["--db", str(tmp_path / "r3.sqlite"), "record", "--out", str(out),
                 "--guard-bytes", "0", "--", str(app)])
    assert code == 1
    captured = capsys.readouterr()
    assert "r3: error:" not in captured.out
    errors = [ln for ln in captured.err.splitlines() if ln.startswith("r3: error:")]
    assert errors == [
        "r3: error: kernel step launch 1 faulted: CUDA_ERROR_ILLEGAL_ADDRESS (an illegal "
        "memory access was encountered); 1999 later launches were not recorded (recorded "
        "with --guard-bytes 0: a read just outside an allocation faults); what was recorded "
        f"before it (0 replayable bundles) is in {out / 'recording.json'}"]
    assert "capturing" not in captured.err
    data = json.loads((out / "recording.json").read_text())
    assert data["fault"]["after_fault"] == 1999 and data["guard_bytes"] == 0
    assert data["graphs"]["captured_kernel_launches"] == 0


def test_record_refuses_a_negative_guard(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["record", "--out", str(tmp_path / "o"), "--guard-bytes", "-1", "--",
                 "/bin/true"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--guard-bytes must be 0 or more" in err
