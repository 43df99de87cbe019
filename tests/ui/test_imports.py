"""The UI and `r3 tui`'s command module import without the GPU, the model or the optimizer
(and none of their layers)."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("pycuda", "llama_cpp", "skopt", "cuda")
LAYERS = (
    "r3tui.search",
    "r3tui.remix",
    "r3tui.compile",
    "r3tui.replay",
    "r3tui.record",
    "r3tui.engine",
)


def test_ui_imports_in_a_fresh_interpreter_without_heavy_modules() -> None:
    code = (
        "import sys\n"
        "import r3tui.ui, r3tui.ui.app, r3tui.cli.tui\n"
        f"heavy = [m for m in sys.modules if m.split('.')[0] in {HEAVY!r}]\n"
        f"layers = [m for m in sys.modules if m.startswith({LAYERS!r})]\n"
        "print(heavy, layers)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert result.stdout.strip() == "[] []", result.stdout
