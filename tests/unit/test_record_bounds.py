"""Bounded snapshots and write errors under `r3 record`, without a GPU.

The interposer's own code (r3rec.c) is compiled into a test program and driven with fakes of
the driver calls it makes (named fake_*: there is no driver here): a kernel launched with 40
grid sizes, as Rodinia lud's are (its grid changes on every iteration), and one launched
three times with one grid.  Only the first --max-configs configurations of each kernel are
snapshotted, none once the byte budget would be passed, and a file that cannot be written
(/dev/full: a real ENOSPC) ends the snapshots; every launch is still counted and timed.  What
it writes is converted by the real app_dump code, and `r3 record` runs the same program as
its application.  The same bounds run on the H200 in tests/gpu/test_gpu_app_bounds.py.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from r3tui.cli import main
from r3tui.engine.application import load_recording, select
from r3tui.errors import R3Error
from r3tui.record import app_dump, interposer
from r3tui.record.bundle import Bundle, BundleWriter

BOUNDS_PROGRAM = r"""
#ifdef DIRTY_REALLOC
/* realloc's new bytes are unspecified: here they are 0xab, as reused heap memory can be */
#define _GNU_SOURCE
#include <malloc.h>
#include <stdlib.h>
#include <string.h>
static void *dirty_realloc(void *p, size_t n) {
    unsigned char *q = malloc(n);
    if (!q) return NULL;
    memset(q, 0xab, n);
    if (p) {
        size_t old = malloc_usable_size(p);
        memcpy(q, p, old < n ? old : n);
        free(p);
    }
    return q;
}
#define realloc dirty_realloc
#endif
#include "r3rec.c"

/* Fakes of the driver: kernels that run at once and take 1 ms, two live arena blocks of
 * 4096 bytes each (so a snapshot writes 2 x 8192 bytes), an image and a parameter layout of
 * one pointer, so the snapshotted configurations convert into replayable bundles. */
#define MANY ((CUfunction)0x1000)
#define ONE ((CUfunction)0x2000)
#define BLOCK 4096
static unsigned char fake_image_[64] = {0x7f, 'E', 'L', 'F'};
static unsigned char fake_memory_[2][BLOCK];
static int fake_events_;
static CUresult fake_sync(void) { return CUDA_SUCCESS; }
static CUresult fake_is_capturing(CUstream s, CUstreamCaptureStatus *st) {
    (void)s; *st = CU_STREAM_CAPTURE_STATUS_NONE; return CUDA_SUCCESS;
}
static CUresult fake_event_create(CUevent *e, unsigned flags) {
    (void)flags; *e = (CUevent)(uintptr_t)(16 * ++fake_events_); return CUDA_SUCCESS;
}
static CUresult fake_event_record(CUevent e, CUstream s) { (void)e; (void)s; return CUDA_SUCCESS; }
static CUresult fake_event_query(CUevent e) { (void)e; return CUDA_SUCCESS; }
static CUresult fake_elapsed(float *ms, CUevent a, CUevent b) {
    (void)a; (void)b; *ms = 1.0f; return CUDA_SUCCESS;
}
static CUresult fake_dtoh(void *dst, CUdeviceptr src, size_t n) {
    memcpy(dst, fake_memory_[src == R3_ARENA_BASE + 65536 ? 0 : 1], n); return CUDA_SUCCESS;
}
static CUresult fake_param_info(CUfunction f, size_t i, size_t *off, size_t *size) {
    (void)f; if (i) return CUDA_ERROR_INVALID_VALUE; *off = 0; *size = 8; return CUDA_SUCCESS;
}
static CUresult fake_launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                            unsigned by, unsigned bz, unsigned shm, CUstream s, void **p,
                            void **e) {
    (void)f; (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)shm; (void)s;
    (void)p; (void)e;
    fake_memory_[1][0]++;  /* the kernel writes its output */
    return CUDA_SUCCESS;
}

static void launch(CUfunction f, unsigned grid) {
    CUdeviceptr out = R3_ARENA_BASE + 65536;
    void *params[] = {&out};
    w_launch(f, grid, 1, 1, 128, 1, 1, 0, NULL, params, NULL);
}

/* a launch whose one argument points at arena block `which` (0 or 1) */
static void launch_at(CUfunction f, unsigned grid, int which) {
    CUdeviceptr out = R3_ARENA_BASE + 65536 + (uint64_t)which * 2 * 65536;
    void *params[] = {&out};
    w_launch(f, grid, 1, 1, 128, 1, 1, 0, NULL, params, NULL);
}

int main(int argc, char **argv) {
    const char *scenario = argc > 1 ? argv[1] : "";
    d_sync = fake_sync;
    d_iscap = d_iscap_ptsz = fake_is_capturing;
    d_evcreate = fake_event_create;
    d_evrecord = d_evrecord_ptsz = fake_event_record;
    d_evquery = d_evsync = fake_event_query;
    d_elapsed = fake_elapsed;
    d_dtoh = fake_dtoh;
    d_pinfo = fake_param_info;
    r_launch = fake_launch;
    open_index();
    arena_ready_ = 1;
    arena_reserved_ = 1ULL << 30;
    for (int i = 0; i < 2; i++) {
        GROW(blocks_, nblocks_, capblocks_);
        blocks_[nblocks_++] = (block_t){R3_ARENA_BASE + 65536 + (uint64_t)i * 2 * 65536, BLOCK, 1};
    }
    GROW(images_, nimages_, capimages_);
    images_[nimages_++] = (image_t){fake_image_, sizeof fake_image_, 0};
    note_func(MANY, 0, 0, "_Z4manyPf");
    note_func(ONE, 0, 0, "_Z3onePf");
    if (!strcmp(scenario, "full")) {
        /* the second configuration's first file goes to /dev/full: a real ENOSPC */
        char link[4400];
        snprintf(link, sizeof link, "%s/data/c1-a0.pro", dir_);
        if (symlink("/dev/full", link) != 0) return 3;
    }
    if (!strcmp(scenario, "strata")) {
        /* one configuration, 40 launches: the first 9 on block 0, then on block 1 from the
         * 10th to the 20th, then on block 0 again */
        for (int i = 1; i <= 40; i++) launch_at(ONE, 7, i >= 10 && i <= 20);
        printf("strata configs=%zu bytes=%llu budget_spent=%d\n", nconfigs_,
               (unsigned long long)snap_bytes_, budget_spent_);
        return 0;
    }
    for (int i = 0; i < 3; i++) launch(ONE, 7);
    for (unsigned g = 1; g <= 40; g++) launch(MANY, g);
    for (unsigned g = 1; g <= 40; g++) launch(MANY, g);  /* every configuration again */
    printf("snapped many=%llu one=%llu bytes=%llu budget_spent=%d write_errno=%d\n",
           funcs_[0].snapped, funcs_[1].snapped, (unsigned long long)snap_bytes_,
           budget_spent_, write_errno_);
    return 0;
}
"""

SNAPSHOT = 2 * 2 * 4096  # two blocks, prologue and epilogue
NAMES = {"_Z4manyPf": "many(float*)", "_Z3onePf": "one(float*)"}


def _build(work: Path, *defines: str) -> Path:
    try:
        include = interposer.find_cuda_header()
        compiler = interposer.find_compiler()
    except Exception as exc:  # no cuda.h or no cc on this machine
        pytest.skip(f"cannot build the interposer here: {exc}")
    (work / "bounds.c").write_text(BOUNDS_PROGRAM)
    exe = work / "bounds"
    subprocess.run([compiler, "-O2", "-std=gnu11", "-Wall", "-Werror", f"-I{include}",
                    f"-I{interposer.SOURCE.parent}", *defines, "-o", str(exe),
                    str(work / "bounds.c"), "-ldl", "-lpthread"],
                   check=True, capture_output=True, text=True)
    return exe


@pytest.fixture(scope="module")
def bounds_program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build(tmp_path_factory.mktemp("bounds"))


def _run(exe: Path, scenario: str, raw: Path, **env: str) -> dict[str, str]:
    """Run a scenario; every snapshot file written (R3_RECORD_DEDUP=0) unless ``env`` says
    otherwise, so the byte counts below are those of the bounds alone: the files that share
    their bytes with an earlier one are the dedup tests' (test_snapshot_files_*)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("R3_", "CUDA_"))}
    environ["R3_RECORD_DEDUP"] = "0"
    environ.update(env, R3_REC_NO_GATE="1", R3_RECORD_DIR=str(raw))
    out = subprocess.run([str(exe), scenario], env=environ, capture_output=True, text=True,
                         check=True, timeout=60).stdout
    return dict(item.split("=") for item in out.split()[1:])


def _convert(root: Path, raw: str = "raw", out: str = "out") -> dict[str, Any]:
    return app_dump.build_recording(
        app_dump.read_dump(root / raw), root / out, command=["./app"], cwd=str(root),
        runtime="static", wall_s=0.1, exit_code=0, reachable=False,
        recorded_at="2026-01-01T00:00:00+00:00", demangle=lambda n: NAMES.get(n, n),
        source_of=lambda _n: None)


def _kernel(data: dict[str, Any], name: str) -> dict[str, Any]:
    (kernel,) = [k for k in data["kernels"] if k["name"] == name]
    return kernel


def test_only_the_first_configurations_of_a_kernel_are_snapshotted_and_all_are_counted(
        bounds_program: Path, tmp_path: Path) -> None:
    said = _run(bounds_program, "many", tmp_path / "raw")
    assert said["many"] == "4" and said["one"] == "1" and said["budget_spent"] == "0"
    # each of the four and one: the first launch and the check launch; and the image
    assert int(said["bytes"]) == 10 * SNAPSHOT + 64
    data = _convert(tmp_path)
    many = _kernel(data, "many(float*)")
    assert len(many["configs"]) == 40 and many["launches"] == 80
    snapped = [c for c in many["configs"] if c["snapshotted"]]
    assert [c["grid"][0] for c in snapped] == [1, 2, 3, 4]  # the first four seen
    for config in many["configs"]:
        # counted and timed like any launch: two launches of 1 ms each
        assert config["count"] == 2 and config["device_time_s"] == pytest.approx(2e-3)
        if config["snapshotted"]:
            assert config["replayable"] and config["bundle"] and config["check_launch"]
        else:
            assert not config["replayable"] and config["bundle"] is None
            assert config["reasons"] == ["not snapshotted: --max-configs 4 reached"]
    one = _kernel(data, "one(float*)")
    (config,) = one["configs"]
    assert config["replayable"] and config["check_launch"] and config["count"] == 3
    assert data["snapshots"] == {"max_configs": 4, "max_bytes": 8 << 30, "dedup": False,
                                 "bytes": 10 * SNAPSHOT + 64, "snapshotted": 5,
                                 "not_snapshotted": {"max_configs": 36},
                                 "budget_spent": False}
    assert ("36 configurations beyond --max-configs 4 per kernel were profiled but not "
            "snapshotted (many 36)") in data["warnings"]
    assert data["write_error"] is None
    bundle = Bundle.open(tmp_path / "out" / snapped[0]["bundle"], verify=True)
    assert bundle.manifest.launch.grid.x == 1 and len(bundle.manifest.allocations) == 2
    # the buffer the kernel's float* points to is an array of floats; the other, untyped
    assert sorted(str(a.dtype) for a in bundle.manifest.allocations) == ["None", "float32"]


def _files(raw: Path) -> list[Path]:
    return sorted(f for f in raw.rglob("data/*") if f.is_file() and not f.name.startswith("image"))


def _snapshots(root: Path, data: dict[str, Any], out: str) -> dict[tuple[str, int], list[bytes]]:
    """Each snapshotted configuration's allocations and globals, prologue and epilogue bytes,
    its check launch's too, as its bundle holds them."""
    found = {}
    for kernel in data["kernels"]:
        for config in kernel["configs"]:
            if not config["bundle"]:
                continue
            bundle = Bundle.open(root / out / config["bundle"], verify=True)
            found[(kernel["name"], config["grid"][0])] = [
                bundle.blob(ref) for a in bundle.manifest.all_allocations
                for ref in (a.prologue, a.epilogue)]
    return found


def test_snapshot_files_with_the_same_bytes_are_written_once(
        bounds_program: Path, tmp_path: Path) -> None:
    """A buffer the kernel does not write has its prologue for epilogue, and one nothing wrote
    between two snapshots has the epilogue of the first for the prologue of the second: such
    bytes are written once, the events name that file, and the bundles hold what every file
    written would give (lulesh, H100: 15 snapshots of 499 MiB each, 9 of them past 3 GiB)."""
    every = _run(bounds_program, "many", tmp_path / "raw")
    once = _run(bounds_program, "many", tmp_path / "raw-dedup", R3_RECORD_DEDUP="1")
    assert once["many"] == every["many"] == "4" and once["one"] == every["one"] == "1"
    # bytes written: each distinct content of the files written without dedup, once
    contents = {f.read_bytes() for f in _files(tmp_path / "raw")}
    assert int(once["bytes"]) == sum(len(c) for c in contents) + 64  # and the image
    assert int(once["bytes"]) < int(every["bytes"]) == 10 * SNAPSHOT + 64
    assert len(_files(tmp_path / "raw-dedup")) == len(contents)
    plain = _convert(tmp_path)
    dedup = _convert(tmp_path, "raw-dedup", "out-dedup")
    assert dedup["snapshots"]["bytes"] == int(once["bytes"]) and dedup["snapshots"]["dedup"]
    assert _snapshots(tmp_path, dedup, "out-dedup") == _snapshots(tmp_path, plain, "out")
    assert len(_snapshots(tmp_path, plain, "out")) == 5


def test_snapshot_files_written_once_leave_room_for_more_snapshots(
        bounds_program: Path, tmp_path: Path) -> None:
    """Under a budget that every file written fills with three snapshots (one's, its check
    launch's, many's first), the files shared with earlier ones let more of many's
    configurations in, and what is written stays within the budget."""
    budget = 3 * SNAPSHOT + 100
    every = _run(bounds_program, "many", tmp_path / "raw", R3_RECORD_MAX_BYTES=str(budget))
    once = _run(bounds_program, "many", tmp_path / "raw-dedup", R3_RECORD_MAX_BYTES=str(budget),
                R3_RECORD_DEDUP="1")
    assert (every["one"], every["many"]) == ("1", "1")
    assert once["one"] == "1" and int(once["many"]) > 1
    assert int(once["bytes"]) <= budget
    data = _convert(tmp_path, "raw-dedup", "out-dedup")
    snapped = [c for c in _kernel(data, "many(float*)")["configs"] if c["snapshotted"]]
    assert len(snapped) == int(once["many"]) and all(c["replayable"] for c in snapped)
    assert len(_snapshots(tmp_path, data, "out-dedup")) == 1 + len(snapped)


def test_a_kernels_counters_start_at_zero_whatever_realloc_returns(tmp_path: Path) -> None:
    # Rodinia cfd on the H200: every kernel's first configuration was "--max-configs 4
    # reached", its counters being the bytes realloc left in the interposer's function table
    exe = _build(tmp_path, "-DDIRTY_REALLOC")
    said = _run(exe, "many", tmp_path / "raw")
    assert said["many"] == "4" and said["one"] == "1" and said["budget_spent"] == "0"
    data = _convert(tmp_path)
    assert _kernel(data, "many(float*)")["launches"] == 80
    assert _kernel(data, "one(float*)")["configs"][0]["replayable"]


def test_max_configs_comes_from_the_environment(bounds_program: Path, tmp_path: Path) -> None:
    said = _run(bounds_program, "many", tmp_path / "raw", R3_RECORD_MAX_CONFIGS="1")
    assert said["many"] == "1" and said["one"] == "1"
    said = _run(bounds_program, "many", tmp_path / "raw0", R3_RECORD_MAX_CONFIGS="0")
    assert said["many"] == "0" and said["one"] == "0" and said["bytes"] == "0"


def test_the_budget_keeps_room_for_the_next_kernels_first_snapshot(
        bounds_program: Path, tmp_path: Path) -> None:
    # Room for two snapshots.  `one` runs first: its check launch would fit, but it must leave
    # room for another kernel's first snapshot, so `many` (launched after it) gets one too.
    # Rodinia nw on the H200: its first kernel took the whole budget and its second none.
    said = _run(bounds_program, "many", tmp_path / "raw",
                R3_RECORD_MAX_BYTES=str(2 * SNAPSHOT + 100))
    assert said["one"] == "1" and said["many"] == "1" and said["budget_spent"] == "1"
    data = _convert(tmp_path)
    kept = ("not snapshotted: its snapshot (16.0 KiB) would pass the snapshot budget "
            "(32.1 KiB, --max-snapshot-bytes) with 16.0 KiB kept for another kernel's first "
            "configuration")
    (one,) = _kernel(data, "one(float*)")["configs"]
    assert one["replayable"] and not one["check_launch"] and one["check_reasons"] == [kept]
    first, *rest = _kernel(data, "many(float*)")["configs"]
    assert first["snapshotted"] and first["replayable"] and first["grid"][0] == 1
    assert first["check_reasons"] == [kept]
    assert all(c["reasons"] == [kept] for c in rest) and len(rest) == 39
    assert sum(c["count"] for c in rest) == 78  # still counted
    assert data["snapshots"]["budget_spent"] and data["snapshots"]["bytes"] <= 2 * SNAPSHOT + 100
    (tmp_path / "out" / "recording.json").write_text(json.dumps(data))
    chosen = dict((k.name, why) for k, why in select(load_recording(tmp_path / "out"), 5))
    assert chosen == {"one(float*)": None, "many(float*)": None}


def test_a_first_snapshot_past_the_budget_is_not_taken_and_tune_app_says_why(
        bounds_program: Path, tmp_path: Path) -> None:
    said = _run(bounds_program, "many", tmp_path / "raw",
                R3_RECORD_MAX_BYTES=str(SNAPSHOT + 100))
    assert said["one"] == "1" and said["many"] == "0" and said["budget_spent"] == "1"
    data = _convert(tmp_path)
    (config,) = _kernel(data, "one(float*)")["configs"]
    assert config["replayable"] and config["bundle"] and config["count"] == 3
    assert not config["check_launch"]
    assert config["check_reasons"] == [
        "not snapshotted: its snapshot (16.0 KiB) would pass the snapshot budget "
        "(16.1 KiB, --max-snapshot-bytes) with 16.0 KiB kept for another kernel's first "
        "configuration"]
    # no room was kept for `many`'s first: it did not fit in what was left, nor did the rest
    configs = _kernel(data, "many(float*)")["configs"]
    assert all(c["reasons"] == ["not snapshotted: its snapshot (16.0 KiB) would pass the "
                                "snapshot budget (16.1 KiB, --max-snapshot-bytes)"]
               for c in configs)
    (tmp_path / "out" / "recording.json").write_text(json.dumps(data))
    chosen = dict((k.name, why) for k, why in select(load_recording(tmp_path / "out"), 5))
    assert chosen["one(float*)"] is None
    assert "would pass the snapshot budget" in (chosen["many(float*)"] or "")


def test_a_full_disk_while_dumping_ends_the_snapshots_and_keeps_the_profile(
        bounds_program: Path, tmp_path: Path) -> None:
    said = _run(bounds_program, "full", tmp_path / "raw")
    assert said["write_errno"] == str(errno.ENOSPC)
    data = _convert(tmp_path)
    err = data["write_error"]
    assert err["stage"] == "raw dump" and err["path"].endswith("/data/c1-a0.pro")
    assert err["error"] == os.strerror(errno.ENOSPC)
    configs = [c for k in data["kernels"] for c in k["configs"]]
    assert sum(c["replayable"] for c in configs) == 1  # one's, written before the disk filled
    assert all(c["count"] >= 2 for c in configs) and len(configs) == 41
    line = app_dump.write_error_line(data)
    assert line is not None and line.startswith("dumping snapshots failed: ")
    assert line.endswith(f"c1-a0.pro: {os.strerror(errno.ENOSPC)} (after 32.1 KiB of snapshots)")


def _full_after(monkeypatch: pytest.MonkeyPatch, blobs: int) -> None:
    """BundleWriter.add_blob fails with ENOSPC after `blobs` blobs, as on a full disk."""
    real = BundleWriter.add_blob
    count = {"n": 0}

    def add_blob(self: BundleWriter, data: bytes | bytearray | memoryview) -> str:
        count["n"] += 1
        if count["n"] > blobs:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC),
                          str(self.tmp / "blobs" / "next"))
        return real(self, data)

    monkeypatch.setattr(BundleWriter, "add_blob", add_blob)


def test_a_full_disk_while_writing_bundles_keeps_those_written(
        bounds_program: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _run(bounds_program, "many", tmp_path / "raw")
    _full_after(monkeypatch, 12)  # the first bundle, not the second
    data = _convert(tmp_path)
    configs = [c for k in data["kernels"] for c in k["configs"]]
    written = [c for c in configs if c["bundle"]]
    assert len(written) == 1
    Bundle.open(tmp_path / "out" / written[0]["bundle"], verify=True)
    unwritten = [c for c in configs if c["snapshotted"] and not c["bundle"]]
    assert len(unwritten) == 4
    assert all(c["reasons"] == [f"its bundle was not written: {os.strerror(errno.ENOSPC)}"]
               for c in unwritten)
    err = data["write_error"]
    assert err["stage"] == "bundles" and err["bundles_written"] == 1
    assert not any(p.name.startswith(".") for p in (tmp_path / "out" / "bundles").iterdir())


def test_record_bounds_its_snapshots_and_says_so(
        bounds_program: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("R3_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("R3_REC_NO_GATE", "1")
    out = tmp_path / "rec"
    code = main(["--db", str(tmp_path / "r3.sqlite"), "record", "--out", str(out),
                 "--max-configs", "2", "--max-snapshot-bytes", "1G", "--",
                 str(bounds_program), "many"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    data = json.loads((out / "recording.json").read_text())
    assert data["snapshots"]["max_configs"] == 2 and data["snapshots"]["max_bytes"] == 1 << 30
    assert data["snapshots"]["max_bytes_from"] == "--max-snapshot-bytes"
    many = _kernel(data, "many(float*)")
    assert sum(c["snapshotted"] for c in many["configs"]) == 2 and len(many["configs"]) == 40
    assert "38 configurations beyond --max-configs 2" in " ".join(captured.err.split())
    assert f"{out / 'recording.json'}: 3 replayable bundles" in captured.out


def test_the_default_budget_is_the_smaller_of_8_gib_and_a_quarter_of_free_space(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    from r3tui.record.app_recorder import snapshot_budget

    assert snapshot_budget(tmp_path, 12345) == (12345, "--max-snapshot-bytes")
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage",
                        lambda _p: usage._replace(free=100 << 30))
    assert snapshot_budget(tmp_path, None) == (8 << 30, "the default 8.0 GiB")
    monkeypatch.setattr(shutil, "disk_usage", lambda _p: usage._replace(free=10 << 30))
    assert snapshot_budget(tmp_path, None) == (
        (10 << 30) // 4, f"a quarter of the 10.0 GiB free under {tmp_path}")


def test_record_on_a_full_disk_is_one_line_and_exit_1(
        bounds_program: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("R3_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("R3_REC_NO_GATE", "1")
    _full_after(monkeypatch, 12)
    out = tmp_path / "rec"
    db = tmp_path / "r3.sqlite"
    code = main(["--db", str(db), "record", "--out", str(out), "--", str(bounds_program),
                 "many"])
    assert code == 1
    captured = capsys.readouterr()
    errors = [ln for ln in captured.err.splitlines() if ln.startswith("r3: error:")]
    assert len(errors) == 1 and "Traceback" not in captured.err
    (line,) = errors
    assert line.startswith(f"r3: error: writing bundle {out}/bundles/")
    assert f": {os.strerror(errno.ENOSPC)} (after 1 bundle, " in line
    assert line.endswith(f"the 1 replayable bundles written before it are registered in {db}; "
                         f"{out / 'recording.json'} says what was recorded")
    data = json.loads((out / "recording.json").read_text())
    assert data["write_error"]["bundles_written"] == 1
    assert not (out / "raw").exists()  # removed before recording.json: room for it


def test_strata_start_and_snapshot_at_the_launches_their_file_names(
        bounds_program: Path, tmp_path: Path) -> None:
    """gaussian's Fan2 runs 4095 launches of one configuration, each with another elimination
    step, and a replay of the first alone mispredicted the whole (10.2x against 17.8x, H100,
    session 45).  R3_RECORD_STRATA_FILE names (begin, snapshot) launch pairs of a
    configuration: from each begin a stratum (a configuration of the same grid and block)
    counts the launches, and its snapshot launch is recorded as its first, with a check
    launch; one whose snapshot launch never comes is counted, not recorded."""
    said = _run(bounds_program, "strata", tmp_path / "off")
    assert said["configs"] == "1"  # without the file: none
    spec = tmp_path / "strata.txt"
    spec.write_text("_Z3onePf 7 1 1 128 1 1 0 11 15 21 25 38 45\n"
                    "_Z3onePf 8 1 1 128 1 1 0 2 2\n"  # another grid: not launched
                    "a line that does not parse\n")
    said = _run(bounds_program, "strata", tmp_path / "raw", R3_RECORD_STRATA_FILE=str(spec))
    assert said["configs"] == "4" and said["budget_spent"] == "0"
    assert int(said["bytes"]) == 3 * 2 * SNAPSHOT + 64  # three recorded, each with a check
    data = _convert(tmp_path)
    (one,) = [k for k in data["kernels"] if k["name"] == "one(float*)"]
    assert [(c["from_launch"], c["snapshot_launch"], c["count"]) for c in one["configs"]] == [
        (1, 1, 10), (11, 15, 10), (21, 25, 17), (38, None, 3)]
    assert [c["device_time_s"] for c in one["configs"]] == pytest.approx(
        [10e-3, 10e-3, 17e-3, 3e-3])
    assert [c["replayable"] for c in one["configs"]] == [True, True, True, False]
    assert all(c["check_launch"] for c in one["configs"][:3])
    assert one["configs"][3]["reasons"] == [
        "not snapshotted: this stratum's launch to snapshot did not come (the run launched "
        "fewer times than the recording its strata were chosen from)"]
    assert one["launches"] == 40
    # each stratum's reference: its snapshot launch's arguments (block 1 from the 10th launch
    # to the 20th, block 0 before and after)
    assert [c["same_args"]["count"] for c in one["configs"][:3]] == [9, 6, 13]
    (tmp_path / "out" / "recording.json").write_text(json.dumps(data))
    (kernel,) = [k for k in load_recording(tmp_path / "out").kernels if k.name == "one(float*)"]
    assert [c.from_launch for c in kernel.configs] == [21, 1, 11, 38]  # by device time
    assert kernel.target is not None and kernel.target.from_launch == 21
    bundle = Bundle.open(tmp_path / "out" / one["configs"][1]["bundle"], verify=True)
    assert bundle.manifest.launch.grid.x == 7


def _earlier(directory: Path, same: dict[str, Any] | None) -> Path:
    """An earlier recording of the bounds program's strata scenario, as its recording.json
    says it: one's 40 launches at grid 7, 30 ms in all, ``same`` those with the first's
    arguments."""
    directory.mkdir(parents=True)
    config = {"grid": [7, 1, 1], "block": [128, 1, 1], "shared_mem_bytes": 0, "count": 40,
              "device_time_s": 0.03, "same_args": same}
    (directory / "recording.json").write_text(json.dumps({
        "format_version": 1, "kernels": [{"entry_point": "_Z3onePf", "configs": [config]}]}))
    return directory


def test_strata_are_chosen_where_the_earlier_recordings_later_launches_do_other_work(
        tmp_path: Path) -> None:
    from r3tui.record.strata import read_strata_source, strata_lines, windows_of

    # gaussian's Fan2: 4095 launches in four runs, each snapshotted at its middle (the first
    # from the second launch: the first launch stays the configuration's own)
    assert windows_of(4095, 4) == [(2, 513), (1025, 1537), (2049, 2560), (3072, 3584)]
    assert windows_of(40, 4) == [(2, 6), (11, 16), (21, 26), (31, 36)]
    assert windows_of(4, 2) == [(2, 2), (3, 4)]
    varies = _earlier(tmp_path / "a", {"count": 10, "time_s": 0.02, "timed": 10})
    assert read_strata_source(varies, 4) == ["_Z3onePf 7 1 1 128 1 1 0 2 6 11 16 21 26 31 36"]
    # half the launches with the replayed arguments and the same time a launch (swapped
    # pointers), every launch alike, or nothing known: none
    for same in ({"count": 20, "time_s": 0.015, "timed": 20},
                 {"count": 40, "time_s": 0.03, "timed": 40}, None):
        assert read_strata_source(_earlier(tmp_path / str(len(list(tmp_path.iterdir()))),
                                           same), 4) == []
    # most launches with other arguments at the same time a launch: the original's time may
    # be set by its grid, not by the work a change gains with (strata, and no note)
    counter = _earlier(tmp_path / "counter", {"count": 4, "time_s": 0.003, "timed": 4})
    assert len(read_strata_source(counter, 4)) == 1
    # a configuration with under 5% of the recorded device time: none (gaussian's Fan1 at
    # 0.7% beside Fan2), while the larger one keeps its strata
    data = json.loads((varies / "recording.json").read_text())
    small = {**data["kernels"][0]["configs"][0], "device_time_s": 0.03 * 0.04 / 0.96}
    both = {"format_version": 1, "kernels": [
        *data["kernels"], {"entry_point": "_Z3twoPf", "configs": [small]}]}
    assert [line.split()[0] for line in strata_lines(both, 4)] == ["_Z3onePf"]
    small["device_time_s"] = 0.03 * 0.06 / 0.94
    assert [line.split()[0] for line in strata_lines(both, 4)] == ["_Z3onePf", "_Z3twoPf"]
    # fewer than two launches a run
    assert strata_lines(data, 21) == []
    with pytest.raises(R3Error, match="--strata must be 2 or more"):
        read_strata_source(varies, 1)
    with pytest.raises(R3Error, match="not an application recording"):
        read_strata_source(tmp_path / "none", 4)


def test_record_with_strata_from_an_earlier_recording(
        bounds_program: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("R3_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("R3_REC_NO_GATE", "1")
    earlier = _earlier(tmp_path / "earlier", {"count": 10, "time_s": 0.02, "timed": 10})
    out, db = tmp_path / "rec", tmp_path / "r3.sqlite"
    code = main(["--db", str(db), "record", "--out", str(out), "--strata-from", str(earlier),
                 "--", str(bounds_program), "strata"])
    assert code == 0, capsys.readouterr().err
    assert "strata: 1 configuration(s) of" in capsys.readouterr().err
    assert (out / "strata.txt").read_text() == \
        "_Z3onePf 7 1 1 128 1 1 0 2 6 11 16 21 26 31 36\n"
    data = json.loads((out / "recording.json").read_text())
    (one,) = [k for k in data["kernels"] if k["entry_point"] == "_Z3onePf"]
    assert [(c["from_launch"], c["snapshot_launch"], c["count"]) for c in one["configs"]] == [
        (1, 1, 1), (2, 6, 9), (11, 16, 10), (21, 26, 10), (31, 36, 10)]
    assert all(c["replayable"] for c in one["configs"])
    # each stratum with its check launch; the first launch alone has none
    assert [c["check_launch"] for c in one["configs"]] == [False, True, True, True, True]
    # bad input: one line, exit 2, nothing recorded
    for argv in (["--strata-from", str(tmp_path / "none")],
                 ["--strata-from", str(earlier), "--strata", "1"]):
        code = main(["--db", str(db), "record", "--out", str(tmp_path / "bad"), *argv, "--",
                     str(bounds_program), "strata"])
        err = capsys.readouterr().err
        assert code == 2 and err.count("r3: error:") == 1 and "Traceback" not in err, err
        assert not (tmp_path / "bad").exists()


def test_record_names_the_kernels_whose_later_launches_do_other_work() -> None:
    from r3tui.cli.record import _other_work_names

    varies = {"grid": [7, 1, 1], "block": [128, 1, 1], "count": 40, "device_time_s": 0.03,
              "same_args": {"count": 10, "time_s": 0.02, "timed": 10}}
    alike = {**varies, "same_args": {"count": 40, "time_s": 0.03, "timed": 40}}
    # most launches with other arguments, each as long: an iteration counter, not noted
    counter = {**varies, "same_args": {"count": 4, "time_s": 0.003, "timed": 4}}
    data = {"kernels": [{"entry_point": "_Z3onePf", "name": "one(float*)", "configs": [varies]},
                        {"entry_point": "_Z3twoPf", "name": "two(float*)", "configs": [alike]},
                        {"entry_point": "_Z5threePf", "name": "three(float*)",
                         "configs": [counter]}]}
    assert _other_work_names(data) == "one(float*)"
