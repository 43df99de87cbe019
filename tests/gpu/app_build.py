"""Building the CUDA test applications of tests/gpu/apps for the GPU tests."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

# nvcc options of each CUDA runtime linkage the recorder supports
LINKAGES = {"shared": ["-cudart=shared"], "static": []}


def build_app(source: Path, exe: Path, linkage: str, *extra: str) -> Path:
    """``exe`` built from ``source`` for sm_90 with ``linkage``'s runtime; skips without nvcc."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on PATH")
    build = subprocess.run([nvcc, "-arch=sm_90", *LINKAGES[linkage], *extra, "-o", str(exe),
                            str(source)], capture_output=True, text=True, timeout=300, check=False)
    assert build.returncode == 0, build.stderr
    return exe


def replays_exactly(path: Path) -> tuple[bool, str]:
    """Whether the bundle at ``path`` replays its recorded binary to its epilogue exactly, and
    what the replay said."""
    from r3tui.domain import MeasurementStatus
    from r3tui.record.bundle import Bundle
    from r3tui.replay import Candidate, ReplayWorker

    bundle = Bundle.open(path, verify=True)
    binary = bundle.binary()
    assert binary is not None
    with ReplayWorker(path, timeout_s=120) as worker:
        result = worker.evaluate(Candidate(binary, bundle.manifest.kernel.entry_point),
                                 timed=False)
    ok = bool(result.status is MeasurementStatus.OK and result.verified and not result.max_error)
    return ok, f"{result.status}: {result.error_text} (max error {result.max_error})"


def require_app_tools() -> None:
    """Skip an application round trip where nvcc or the application interposer is missing."""
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not installed")
    try:
        import r3tui.record.app_recorder  # noqa: F401
    except ImportError:
        pytest.skip("the application interposer (r3 record --) is not in this checkout")
