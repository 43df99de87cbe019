"""Recording does not change what a program does: guard space and faults under `r3 record`.

tests/gpu/apps/guard_app.cu reads four elements before and after its buffers: with the
default guard it records, and its launches replay to their epilogue; with --guard-bytes 0 its
first launch faults and `r3 record` says so in one line, exit 1.  tests/gpu/apps/wild_app.cu
writes through a wild pointer and then launches 50 more kernels into the faulted context:
the fault is named in one line, no launch is counted as a graph capture, and what was
recorded before the fault replays.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path
from typing import Any

import pytest

from r3tui.cli import main
from tests.gpu.app_build import build_app, replays_exactly

pytestmark = pytest.mark.gpu

APPS = Path(__file__).resolve().parent / "apps"


def _record(work: Path, exe: Path, name: str, *options: str,
            env: dict[str, str] | None = None) -> tuple[int, str, Path]:
    out = work / name
    said = io.StringIO()
    saved = {k: os.environ.get(k) for k in env or {}}
    os.environ.update(env or {})
    try:
        with contextlib.redirect_stderr(said):
            code = main(["--db", str(work / "r3.sqlite"), "record", "--out", str(out),
                         "--timeout", "300", *options, "--", str(exe)])
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return code, said.getvalue(), out


def _errors(said: str) -> list[str]:
    return [ln for ln in said.splitlines() if ln.startswith("r3: error:")]


@pytest.fixture(scope="module")
def guard_app(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    work = tmp_path_factory.mktemp("guard")
    return work, build_app(APPS / "guard_app.cu", work / "guard_app", "static")


def test_reads_just_outside_allocations_record_and_replay_with_the_guard(
        guard_app: tuple[Path, Path]) -> None:
    from r3tui.cuda.arena import ARENA_BASE, GUARD_BYTES
    from r3tui.record.bundle import Bundle

    work, exe = guard_app
    code, said, out = _record(work, exe, "guarded")
    assert code == 0, said
    data: dict[str, Any] = json.loads((out / "recording.json").read_text())
    assert data["exit_code"] == 0 and data["fault"] is None
    assert data["guard_bytes"] == GUARD_BYTES
    (kernel,) = data["kernels"]
    assert kernel["launches"] == 3
    (config,) = kernel["configs"]
    assert config["replayable"] and config["check_launch"], config
    m = Bundle.open(out / config["bundle"]).manifest
    assert m.arena.guard == GUARD_BYTES
    starts = sorted(a.address for a in m.allocations)
    assert starts[0] >= ARENA_BASE + GUARD_BYTES  # the read before `in` lands in the guard
    ok, why = replays_exactly(out / config["bundle"])
    assert ok, why


def test_without_the_guard_the_read_faults_and_is_reported_in_one_line(
        guard_app: tuple[Path, Path]) -> None:
    work, exe = guard_app
    code, said, out = _record(work, exe, "unguarded", "--guard-bytes", "0")
    assert code == 1, said
    (line,) = _errors(said)
    assert line.startswith("r3: error: kernel smooth launch 1 faulted: "
                           "CUDA_ERROR_ILLEGAL_ADDRESS"), line
    assert "--guard-bytes 0" in line
    data = json.loads((out / "recording.json").read_text())
    assert data["fault"]["exact"] and data["guard_bytes"] == 0
    assert data["graphs"]["captured_kernel_launches"] == 0
    assert not any("capturing" in w for w in data["warnings"])


@pytest.fixture(scope="module")
def wild_app(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    work = tmp_path_factory.mktemp("wild")
    return work, build_app(APPS / "wild_app.cu", work / "wild_app", "static")


def test_a_wild_write_is_named_and_nothing_after_it_is_a_capture(
        wild_app: tuple[Path, Path]) -> None:
    work, exe = wild_app
    code, said, out = _record(work, exe, "wild")
    assert code == 1, said
    (line,) = _errors(said)
    assert line.startswith(
        "r3: error: kernel wild_write launch 1 faulted: CUDA_ERROR_ILLEGAL_ADDRESS"), line
    assert "50 later launches were not recorded" in line
    assert "(1 replayable bundles)" in line
    data = json.loads((out / "recording.json").read_text())
    assert data["fault"]["after_fault"] == 50
    assert data["graphs"]["captured_kernel_launches"] == 0
    assert not any("capturing" in w for w in data["warnings"]), data["warnings"]
    # what was recorded before the fault is intact: scale's bundle replays exactly
    (scale,) = [k for k in data["kernels"] if "scale" in k["entry_point"]]
    (config,) = scale["configs"]
    assert config["replayable"] and config["check_launch"], config
    ok, why = replays_exactly(out / config["bundle"])
    assert ok, why
    (wild,) = [k for k in data["kernels"] if "wild_write" in k["entry_point"]]
    assert not wild["configs"][0]["replayable"]


def test_a_fault_in_an_unsnapshotted_launch_names_the_oldest_unfinished_one(
        wild_app: tuple[Path, Path]) -> None:
    work, exe = wild_app
    code, said, _out = _record(work, exe, "wild-async", "--kernel", "scale")
    assert code == 1, said
    (line,) = _errors(said)
    assert line.startswith("r3: error: kernel wild_write launch 1 or a launch after it "
                           "faulted: CUDA_ERROR_ILLEGAL_ADDRESS"), line


def test_with_blocking_launches_the_unsnapshotted_launch_is_named_exactly(
        wild_app: tuple[Path, Path]) -> None:
    work, exe = wild_app
    code, said, out = _record(work, exe, "wild-blocking", "--kernel", "scale",
                              env={"CUDA_LAUNCH_BLOCKING": "1"})
    assert code == 1, said
    (line,) = _errors(said)
    assert line.startswith(
        "r3: error: kernel wild_write launch 1 faulted: CUDA_ERROR_ILLEGAL_ADDRESS"), line
    data = json.loads((out / "recording.json").read_text())
    assert data["fault"]["where"] == "the launch (CUDA_LAUNCH_BLOCKING=1)"
