"""`r3 record verify`, `r3 recordings` and `r3 replay` as a user runs them, without a GPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from r3tui.record.registration import register
from tests.unit.test_bundle import write_bundle

REPO = Path(__file__).resolve().parents[2]


def r3(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("R3_")}
    env.update({"NO_COLOR": "1", "COLUMNS": "200", "XDG_CONFIG_HOME": str(cwd / ".config"),
                "PYTHONPATH": str(REPO)})
    return subprocess.run([sys.executable, "-m", "r3tui", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=180)


def _no_gpu() -> bool:
    try:
        from r3tui.cuda.driver import init_device

        init_device(0)
    except Exception:
        return True
    return False


def test_record_verify_checks_checksums(tmp_path: Path) -> None:
    bundle = write_bundle(tmp_path / "b")
    result = r3("record", "verify", str(bundle.path), "--no-gpu", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "5 blobs match their sha256" in result.stdout
    assert bundle.sha256[:16] in result.stdout


def test_record_verify_names_a_corrupt_blob_in_one_line(tmp_path: Path) -> None:
    bundle = write_bundle(tmp_path / "b")
    x = bundle.manifest.allocation("x")
    blob = bundle.path / "blobs" / x.prologue
    data = bytearray(blob.read_bytes())
    data[0] ^= 0xFF
    blob.write_bytes(bytes(data))
    result = r3("record", "verify", str(bundle.path), "--no-gpu", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().count("\n") == 0
    assert f"blob {x.prologue[:12]} (prologue of x) is corrupt" in result.stderr


@pytest.mark.skipif(not _no_gpu(), reason="a GPU is present: the GPU tests replay for real")
def test_record_verify_without_a_gpu_skips_the_replay(tmp_path: Path) -> None:
    bundle = write_bundle(tmp_path / "b")
    result = r3("record", "verify", str(bundle.path), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "replay: skipped (replay worker: no usable CUDA device" in result.stdout


@pytest.mark.skipif(not _no_gpu(), reason="a GPU is present")
def test_replay_without_a_gpu_is_one_line(tmp_path: Path) -> None:
    bundle = write_bundle(tmp_path / "b")
    result = r3("replay", str(bundle.path), cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.startswith("r3: error: replay worker: no usable CUDA device")


def test_recordings_table_lists_registered_bundles(tmp_path: Path) -> None:
    db = tmp_path / "r3.sqlite"
    bundle = write_bundle(tmp_path / "b")
    first = register(db, bundle)
    assert register(db, bundle) == first  # idempotent on the manifest hash
    result = r3("recordings", "--db", str(db), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "axpy" in result.stdout and bundle.sha256[:12] in result.stdout
    assert "16x1x1" in result.stdout and "256x1x1" in result.stdout


def test_recordings_without_a_database_is_one_line(tmp_path: Path) -> None:
    result = r3("recordings", "--db", str(tmp_path / "none.sqlite"), cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "no experiment database" in result.stderr


def test_record_kernel_with_a_missing_inputs_file_is_one_line(tmp_path: Path) -> None:
    src = tmp_path / "k.cu"
    src.write_text('extern "C" __global__ void k() {}\n')
    result = r3("record", "kernel", str(src), "--kernel", "k", "--inputs",
                str(tmp_path / "nope.py"), cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "inputs file" in result.stderr and "does not exist" in result.stderr
