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
