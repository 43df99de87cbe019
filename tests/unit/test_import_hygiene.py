"""Importing the light layers must not pull in the GPU, the model or the optimizer."""

import subprocess
import sys

import pytest

HEAVY = ("pycuda", "llama_cpp", "skopt", "cuda.bindings.driver", "cuda.bindings.nvrtc")


@pytest.mark.parametrize(
    "module",
    [
        "db",
        "db.repository",
        "r3tui.domain",
        "r3tui.cli",
        "r3tui.config",
        "r3tui.ui",
        "r3tui.record",
        "r3tui.replay",
        "r3tui.compile",
    ],
)
def test_module_imports_without_heavy_dependencies(module: str) -> None:
    code = (
        "import sys, importlib\n"
        f"importlib.import_module({module!r})\n"
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert result.stdout.strip() == "", f"{module} imported {result.stdout.strip()}"
