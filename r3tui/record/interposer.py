"""The recording interposer: ``interpose/r3rec.c`` compiled with the system C compiler.

The library ships as C source inside the package and is built on first use into the user
cache (``$R3_CACHE`` or platformdirs' cache dir), named by the sha256 of its source and of
the ``cuda.h`` it was compiled against, so an upgraded R³ or CUDA toolkit builds a new one
and concurrent first uses do not collide (each compiles to a temporary name, then renames).
It needs only ``cuda.h``: every driver entry point is fetched at run time, so it links
against no CUDA library.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from r3tui.errors import RecordingError, ToolchainError

SOURCE = Path(__file__).resolve().parent / "interpose" / "r3rec.c"
_FLAGS = ("-O2", "-std=gnu11", "-shared", "-fPIC", "-fvisibility=default")
_LIBS = ("-ldl", "-lpthread")


@dataclass(frozen=True)
class Interposer:
    path: Path
    include_dir: Path
    compiler: str
    built: bool  # compiled by this call (False: found in the cache)


def cuda_include_dirs() -> list[Path]:
    """Where ``cuda.h`` may be: $CUDA_HOME/$CUDA_PATH, beside nvcc, /usr/local/cuda, pip wheels."""
    found: list[Path] = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            found.append(Path(os.environ[var]) / "include")
    nvcc = shutil.which("nvcc")
    if nvcc:
        real = Path(nvcc).resolve()
        found += [real.parent.parent / "include", Path(nvcc).parent.parent / "include"]
    found.append(Path("/usr/local/cuda/include"))
    try:  # the pip layout: nvidia/cuda_runtime/include or nvidia/cu13/include
        import nvidia  # type: ignore[import-untyped]

        for root in getattr(nvidia, "__path__", []):
            found += sorted(Path(root).glob("*/include"))
    except ImportError:
        pass
    return found


def find_cuda_header() -> Path:
    for directory in cuda_include_dirs():
        if (directory / "cuda.h").is_file():
            return directory
    raise ToolchainError(
        "cuda.h not found (looked in $CUDA_HOME, beside nvcc, /usr/local/cuda and the "
        "nvidia pip packages)",
        hint="install the CUDA toolkit or set CUDA_HOME",
    )


def find_compiler() -> str:
    for name in (os.environ.get("CC") or "", "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    raise ToolchainError("no C compiler (cc, gcc or clang) on PATH",
                         hint="install gcc to build the recording interposer")


def cache_dir() -> Path:
    if os.environ.get("R3_CACHE"):
        return Path(os.environ["R3_CACHE"]) / "interpose"
    import platformdirs

    return Path(platformdirs.user_cache_dir("r3tui")) / "interpose"


def build(directory: Path | None = None, *, force: bool = False) -> Interposer:
    """The interposer library, compiled now unless the cache holds this source's build."""
    include = find_cuda_header()
    compiler = find_compiler()
    digest = hashlib.sha256(SOURCE.read_bytes())
    digest.update((include / "cuda.h").read_bytes())
    target_dir = directory or cache_dir()
    target = target_dir / f"libr3rec-{digest.hexdigest()[:16]}.so"
    if target.is_file() and not force:
        return Interposer(target, include, compiler, built=False)
    target_dir.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    cmd = [compiler, *_FLAGS, f"-I{include}", "-o", str(tmp), str(SOURCE), *_LIBS]
    try:
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ToolchainError(f"cannot run {compiler}: {exc}") from exc
    if run.returncode != 0:
        tmp.unlink(missing_ok=True)
        first = next((ln for ln in run.stderr.splitlines() if "error" in ln),
                     run.stderr.strip().splitlines()[0] if run.stderr.strip() else "")
        raise RecordingError(f"the recording interposer does not compile: {first}")
    os.replace(tmp, target)
    return Interposer(target, include, compiler, built=True)
