"""C++ symbol names demangled, for every layer that shows or matches kernels by name.

``cu++filt`` (CUDA's, which knows CUDA's own manglings) where it is installed, else
``c++filt``; several symbols go through one process.  Without either a symbol stays
undemangled (the callers fall back on the mangled name).  cu++filt spells integer template
arguments with a cast (``dot<(int)256>``), c++filt without (``dot<256>``): a caller that
matches names removes the casts.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence

TOOLS = ("cu++filt", "c++filt")


def demangle_all(symbols: Sequence[str]) -> dict[str, str]:
    """``{symbol: demangled}`` for the mangled (``_Z``) ones a demangler could read."""
    mangled = list(dict.fromkeys(s for s in symbols if s.startswith("_Z")))
    if not mangled:
        return {}
    for tool in TOOLS:
        path = shutil.which(tool)
        if path is None:
            continue
        try:
            run = subprocess.run([path], input="\n".join(mangled) + "\n", capture_output=True,
                                 text=True, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired):
            continue
        lines = run.stdout.splitlines()
        if run.returncode == 0 and len(lines) == len(mangled):
            return {s: d.strip() for s, d in zip(mangled, lines, strict=True)
                    if d.strip() and d.strip() != s}
    return {}


def demangle(symbol: str) -> str | None:
    """One symbol demangled; None where it is not mangled or no demangler reads it."""
    return demangle_all([symbol]).get(symbol)
