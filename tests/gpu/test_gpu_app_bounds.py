"""Bounded snapshots under `r3 record`: a program with a new grid on every launch.

tests/gpu/apps/grids_app.cu launches one kernel 40 times on a 64 MiB buffer, each time with a
smaller grid, as Rodinia lud does (its 768 configurations once took a recording from 33 ms to
51 s and filled a 64 GiB disk).  Recorded with the defaults, only the first four
configurations are snapshotted, all 40 are counted and timed, the others say why, and a
snapshotted one replays to its epilogue; a byte budget stops snapshots, and --max-configs 0
records a profile alone.  The CPU side of the same paths: tests/unit/test_record_bounds.py.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from r3tui.cli import main
from tests.gpu.app_build import build_app, replays_exactly

pytestmark = pytest.mark.gpu

APP = Path(__file__).resolve().parent / "apps" / "grids_app.cu"
BUFFER = 64 << 20  # the app's one allocation
CONFIGS = 40


@pytest.fixture(scope="module")
def grids_app(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    work = tmp_path_factory.mktemp("grids")
    return work, build_app(APP, work / "grids_app", "static")


def _record(work: Path, exe: Path, name: str, capfd: pytest.CaptureFixture[str],
            *options: str) -> tuple[int, str, str, Path]:
    out = work / name
    code = main(["--db", str(work / "r3.sqlite"), "record", "--out", str(out),
                 "--timeout", "300", *options, "--", str(exe)])
    said = capfd.readouterr()
    return code, said.out, said.err, out


def _loop_ms(stdout: str) -> float:
    found = re.search(r"loop_ms ([0-9.]+)", stdout)
    assert found, stdout
    return float(found.group(1))


def test_the_first_four_configurations_are_snapshotted_and_all_40_counted(
        grids_app: tuple[Path, Path], capfd: pytest.CaptureFixture[str]) -> None:
    work, exe = grids_app
    plain = subprocess.run([str(exe)], capture_output=True, text=True, check=True, timeout=120)
    code, stdout, stderr, out = _record(work, exe, "default", capfd)
    assert code == 0, stderr
    data: dict[str, Any] = json.loads((out / "recording.json").read_text())
    (kernel,) = data["kernels"]
    assert kernel["launches"] == CONFIGS and len(kernel["configs"]) == CONFIGS
    snapped = [c for c in kernel["configs"] if c["snapshotted"]]
    grids = [c["grid"][0] for c in kernel["configs"]]
    assert [c["grid"][0] for c in snapped] == sorted(grids, reverse=True)[:4]  # the first
    for config in kernel["configs"]:
        assert config["count"] == 1 and config["device_time_s"] > 0
        if not config["snapshotted"]:
            assert config["reasons"] == ["not snapshotted: --max-configs 4 reached"]
            assert config["bundle"] is None and not config["replayable"]
    summary = data["snapshots"]
    assert summary["max_configs"] == 4 and summary["snapshotted"] == 4
    assert summary["not_snapshotted"] == {"max_configs": CONFIGS - 4}
    # each snapshot keeps the buffer twice (prologue, epilogue), but each launch reads what the
    # launch before it wrote: a prologue is the last snapshot's epilogue, written once, so four
    # snapshots write the buffer five times (every file: eight; all 40 would be 5 GiB)
    assert 5 * BUFFER <= summary["bytes"] < 6 * BUFFER
    assert "36 configurations beyond --max-configs 4" in " ".join(stderr.split())
    ok, why = replays_exactly(out / snapped[0]["bundle"])
    assert ok, why
    # what recording costs the application's own timer: four snapshots of 64 MiB, not 40
    print(f"grids_app loop: plain {_loop_ms(plain.stdout):.1f} ms, recorded "
          f"{_loop_ms(stdout):.1f} ms; recording wall {data['wall_s']:.2f} s")


def test_the_byte_budget_stops_snapshots_and_tune_app_skips_with_the_reason(
        grids_app: tuple[Path, Path], capfd: pytest.CaptureFixture[str]) -> None:
    from r3tui.engine.application import load_recording, select

    work, exe = grids_app
    # room for one snapshot of the 64 MiB buffer (128 MiB written), not two
    code, _stdout, stderr, out = _record(work, exe, "budget", capfd,
                                         "--max-snapshot-bytes", "200M")
    assert code == 0, stderr
    data = json.loads((out / "recording.json").read_text())
    (kernel,) = data["kernels"]
    first, second, *rest = kernel["configs"]
    assert first["snapshotted"] and first["replayable"]
    # the later ones keep room for another kernel's first snapshot, and are judged by size
    # alone once one was refused
    kept = ("not snapshotted: its snapshot (128.0 MiB) would pass the snapshot budget "
            "(200.0 MiB, --max-snapshot-bytes) with 128.0 MiB kept for another kernel's first "
            "configuration")
    assert second["reasons"] == [kept] and all(c["reasons"] == [kept] for c in rest)
    assert data["snapshots"]["budget_spent"] and data["snapshots"]["bytes"] <= 200 << 20
    assert data["snapshots"]["max_bytes_from"] == "--max-snapshot-bytes"
    ((share, why),) = select(load_recording(out), 3)
    assert why is None and share.target is not None and share.target.grid[0] == first["grid"][0]


def test_max_configs_0_records_a_profile_alone(
        grids_app: tuple[Path, Path], capfd: pytest.CaptureFixture[str]) -> None:
    from r3tui.engine.application import load_recording, select

    work, exe = grids_app
    code, _stdout, stderr, out = _record(work, exe, "profile", capfd, "--max-configs", "0")
    assert code == 0, stderr
    data = json.loads((out / "recording.json").read_text())
    (kernel,) = data["kernels"]
    assert kernel["launches"] == CONFIGS and kernel["device_time_s"] > 0
    assert not any(c["snapshotted"] for c in kernel["configs"])
    assert data["snapshots"]["bytes"] < 1 << 20  # the module image alone
    ((_share, why),) = select(load_recording(out), 3)
    assert why == "skipped: not snapshotted: --max-configs 0 reached"
