"""NVRTC in-process through ``cuda.bindings.nvrtc`` (~50 ms for a small kernel on a CPU node).

``cuda.bindings`` is imported on first use only, so importing :mod:`r3tui.compile` stays light.
The kernel is looked up with a name expression (``nvrtcAddNameExpression``), which works for an
``extern "C"`` name and instantiates a template (``"axpy<float>"``) alike.  ptxas always runs
with ``-v``: its report is where the spill counts come from.
"""

from __future__ import annotations

import functools
import glob
import os
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

from r3tui.compile.base import (
    CompiledKernel,
    CompileRequest,
    Toolchain,
    cache_key,
)
from r3tui.compile.options import render
from r3tui.errors import ConfigError, ToolchainError

_INSTALL_HINT = "pip install cuda-bindings nvidia-cuda-nvrtc==13.0.88"


def _module() -> ModuleType:
    try:
        from cuda.bindings import nvrtc
    except ImportError as exc:
        raise ToolchainError(
            f"cuda.bindings.nvrtc cannot be imported: {exc}", hint=_INSTALL_HINT
        ) from exc
    return nvrtc


def _check(nvrtc: ModuleType, result: tuple[Any, ...], what: str) -> tuple[Any, ...]:
    err, *rest = result
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise ToolchainError(f"{what} failed: {_error_name(nvrtc, err)}", hint=_INSTALL_HINT)
    return tuple(rest)


def _error_name(nvrtc: ModuleType, err: Any) -> str:
    _, text = nvrtc.nvrtcGetErrorString(err)
    return text.decode() if isinstance(text, bytes) else str(err)


@functools.cache
def nvrtc_build() -> str:
    """The NVRTC wheel's version: nvrtcVersion has no patch level, this tells 13.0.48 from
    13.0.88.  Read once: ``importlib.metadata`` scans the path each time (0.44 ms a call on
    the CPU machine), and every compile request's cache key asks for it, twice per
    candidate."""
    try:
        return metadata.version("nvidia-cuda-nvrtc")
    except metadata.PackageNotFoundError:
        return "unknown build"


@functools.cache
def nvrtc_version() -> tuple[int, int]:
    """``(major, minor)`` of the NVRTC library this process loads; :class:`ToolchainError`
    when it cannot be loaded."""
    nvrtc = _module()
    try:
        major, minor = _check(nvrtc, nvrtc.nvrtcVersion(), "nvrtcVersion")
    except RuntimeError as exc:  # cuda.bindings raises this when libnvrtc.so is not found
        raise ToolchainError(f"libnvrtc cannot be loaded: {exc}", hint=_INSTALL_HINT) from exc
    return int(major), int(minor)


@functools.cache
def supported_archs() -> tuple[str, ...]:
    """The real architectures this NVRTC builds cubins for, e.g. ``("sm_75", ..., "sm_121")``."""
    nvrtc_version()  # loads the library, or raises ToolchainError with the fix
    nvrtc = _module()
    (archs,) = _check(nvrtc, nvrtc.nvrtcGetSupportedArchs(), "nvrtcGetSupportedArchs")
    return tuple(f"sm_{a}" for a in archs)


@dataclass(frozen=True)
class DriverCompat:
    """Whether a driver loads what this NVRTC produces."""

    driver_version: int  # CUDA version the driver supports, as cuDriverGetVersion: 13000 = 13.0
    compiler_version: tuple[int, int]
    cubin_ok: bool
    ptx_ok: bool
    message: str


def check_driver_compat(
    driver_version: int, compiler_version: tuple[int, int] | None = None
) -> DriverCompat:
    """Can a driver of CUDA version ``driver_version`` (``cuDriverGetVersion``'s number, e.g.
    13000 for 13.0) load this NVRTC's output?

    A cubin for the exact arch loads on any driver of the same CUDA major version or newer
    (CUDA minor-version compatibility).  PTX loads only if the driver's JIT is at least as new
    as the compiler, because PTX from a newer compiler carries an ISA version the older JIT
    rejects (CUDA_ERROR_UNSUPPORTED_PTX_VERSION) — one reason R³ never relies on PTX.
    """
    if driver_version < 1000:
        raise ConfigError(f"bad CUDA driver version {driver_version}: expected e.g. 13000")
    major, minor = compiler_version or nvrtc_version()
    driver_major, driver_minor = driver_version // 1000, driver_version % 1000 // 10
    cubin_ok = driver_major >= major
    ptx_ok = (driver_major, driver_minor) >= (major, minor)
    driver = f"driver CUDA {driver_major}.{driver_minor}"
    compiler = f"NVRTC {major}.{minor}"
    if cubin_ok and ptx_ok:
        message = f"{driver} loads cubins and PTX from {compiler}"
    elif cubin_ok:
        message = (
            f"{driver} loads cubins from {compiler} but not its PTX (JIT older than {compiler})"
        )
    else:
        message = (
            f"{driver} is older than CUDA {major}: it loads neither cubins nor PTX from {compiler}"
        )
    return DriverCompat(driver_version, (major, minor), cubin_ok, ptx_ok, message)


def _is_header_dir(path: str) -> bool:
    return bool(path) and Path(path, "cuda_fp16.h").is_file()


@functools.cache
def default_include_dirs() -> tuple[str, ...]:
    """CUDA headers for sources that include ``<cuda_fp16.h>`` and friends.

    NVRTC has its built-in headers only; the pip ``nvidia-cuda-nvrtc`` wheel ships just
    ``nvrtc.h``.  Looked for, in order: what ``cuda.pathfinder`` finds for cudart (pip
    ``nvidia-cuda-runtime`` or a toolkit), ``$CUDA_HOME``/``$CUDA_PATH``, ``/usr/local/cuda*``.
    Empty when none exists: header-free kernels still compile.
    """
    candidates: list[str] = []
    try:
        from cuda import pathfinder

        candidates.append(pathfinder.find_nvidia_header_directory("cudart") or "")
    except Exception:
        pass
    for variable in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(variable):
            candidates.append(os.path.join(os.environ[variable], "include"))
    candidates.append("/usr/local/cuda/include")
    candidates.extend(sorted(glob.glob("/usr/local/cuda-*/include"), reverse=True))
    found = next((c for c in candidates if _is_header_dir(c)), None)
    if found is None:
        return ()
    # CUDA 13 moved CCCL (<cuda/std/...>, CUB, Thrust) under include/cccl.  The cudart wheel
    # has no CCCL, so a toolkit's is taken when the directory found first lacks it (measured
    # on the H200: every unit including <cmath> through libcu++ failed to compile otherwise).
    cccl = next((d for c in (found, *candidates) if c and (d := _cccl_dir(c))), None)
    return (found,) if cccl is None or cccl == found else (found, cccl)


def _cccl_dir(include: str) -> str | None:
    """The directory holding ``cuda/std`` for the CUDA include directory ``include``."""
    for directory in (os.path.join(include, "cccl"), include):
        if Path(directory, "cuda", "std", "cmath").is_file():
            return directory
    return None


class NvrtcToolchain(Toolchain):
    """NVRTC through ``cuda.bindings.nvrtc``, in the calling process."""

    name = "nvrtc"

    def version(self) -> str:
        major, minor = nvrtc_version()
        return f"nvrtc {major}.{minor}"

    def fingerprint(self) -> str:
        return f"{self.version()} ({nvrtc_build()})"

    def supported_archs(self) -> tuple[str, ...]:
        return supported_archs()

    def available(self) -> tuple[bool, str]:
        try:
            version = self.version()
            archs = supported_archs()
        except ToolchainError as exc:
            return False, exc.one_line()
        headers = default_include_dirs()
        where = f"CUDA headers from {headers[0]}" if headers else "no CUDA headers found"
        return True, f"{version}, cubins for {archs[0]}..{archs[-1]}, {where}"

    def compile(self, req: CompileRequest) -> CompiledKernel:
        canonical = self.validate(req)
        key = cache_key(self, req)
        nvrtc = _module()
        options = [
            f"--gpu-architecture={req.arch}",
            *render(self.name, canonical),
            "--ptxas-options=-v",
            # automatic precompiled headers: a unit that starts with heavy includes (libcu++,
            # cooperative groups) compiles ~10x faster from the second time on in a process;
            # the cubin is the same.  A PCH made under other -D values is not used (629).
            "-pch", "--pch-messages=false", "--diag-suppress=629",
            *(f"--define-macro={name}={value}" for name, value in req.defines),
            *(f"--include-path={d}" for d in (*req.include_dirs, *default_include_dirs())),
        ]
        started = time.perf_counter()
        (prog,) = _check(
            nvrtc,
            nvrtc.nvrtcCreateProgram(req.source.encode(), req.source_name.encode(), 0, [], []),
            "nvrtcCreateProgram",
        )
        try:
            name = req.kernel_name.encode()
            _check(nvrtc, nvrtc.nvrtcAddNameExpression(prog, name), "nvrtcAddNameExpression")
            encoded = [o.encode() for o in options]
            (result,) = nvrtc.nvrtcCompileProgram(prog, len(encoded), encoded)
            log = _program_log(nvrtc, prog)
            if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
                if not log.strip():
                    log = f"nvrtcCompileProgram failed: {_error_name(nvrtc, result)}"
                return CompiledKernel.failure(
                    self, log, cache_key=key, seconds=time.perf_counter() - started
                )
            (lowered,) = _check(nvrtc, nvrtc.nvrtcGetLoweredName(prog, name), "nvrtcGetLoweredName")
            (size,) = _check(nvrtc, nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
            buffer = bytearray(size)
            _check(nvrtc, nvrtc.nvrtcGetCUBIN(prog, buffer), "nvrtcGetCUBIN")
            cubin = bytes(buffer)
        finally:
            nvrtc.nvrtcDestroyProgram(prog)
        seconds = time.perf_counter() - started
        lowered_name = lowered.decode() if isinstance(lowered, bytes) else str(lowered)
        return CompiledKernel.from_cubin(
            self, cubin, lowered_name, log, cache_key=key, seconds=seconds
        )


def _program_log(nvrtc: ModuleType, prog: Any) -> str:
    (size,) = _check(nvrtc, nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
    # A fresh bytearray: NVRTC writes into the buffer, and ``b" " * 1`` would be CPython's
    # shared one-byte constant.
    buffer = bytearray(size)
    _check(nvrtc, nvrtc.nvrtcGetProgramLog(prog, buffer), "nvrtcGetProgramLog")
    return bytes(buffer).rstrip(b"\0").decode(errors="replace").rstrip()
