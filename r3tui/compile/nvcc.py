"""nvcc as a subprocess: ``nvcc -cubin -arch=sm_XX`` in a temporary directory (~0.4 s a kernel).

nvcc only emits template kernels that the source instantiates.  For a name expression such as
``"axpy<float>"`` a line taking the kernel's address is appended to the source (after the
user's last line, so error line numbers stay right), which instantiates it as NVRTC's name
expressions do.  The lowered (mangled) name is then found in the cubin's symbol table by
demangling its kernels with ``c++filt`` when it is installed.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from r3tui.compile.base import (
    CompiledKernel,
    CompileRequest,
    Toolchain,
    cache_key,
    is_identifier,
)
from r3tui.compile.cubin import Cubin, CubinError
from r3tui.compile.options import render
from r3tui.demangle import demangle_all
from r3tui.errors import ToolchainError

_INSTALL_HINT = "install the CUDA toolkit and put nvcc on PATH (or set CUDA_HOME)"
_VERSION = re.compile(r"release (\d+\.\d+), V(\d+\.\d+\.\d+)")


def find_nvcc() -> str | None:
    """nvcc on ``PATH``, else under ``$CUDA_HOME``/``$CUDA_PATH``, else ``/usr/local/cuda``."""
    found = shutil.which("nvcc")
    if found:
        return found
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    for root in roots:
        if root and os.access(os.path.join(root, "bin", "nvcc"), os.X_OK):
            return os.path.join(root, "bin", "nvcc")
    return None


class NvccToolchain(Toolchain):
    """The CUDA toolkit's nvcc, run once per compile."""

    name = "nvcc"

    def __init__(self, executable: str | None = None, timeout_s: float = 300.0) -> None:
        self._executable = executable
        self.timeout_s = timeout_s

    @property
    def executable(self) -> str:
        path = self._executable or find_nvcc()
        if path is None:
            raise ToolchainError("nvcc is not on PATH", hint=_INSTALL_HINT)
        return path

    def version(self) -> str:
        return _version(self.executable)

    def supported_archs(self) -> tuple[str, ...]:
        return _gpu_codes(self.executable)

    def available(self) -> tuple[bool, str]:
        try:
            version = self.version()
            archs = _gpu_codes(self.executable)
        except ToolchainError as exc:
            return False, exc.one_line()
        # -cubin still runs the host preprocessor, so nvcc without a host compiler cannot work.
        host = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
        if host is None:
            return False, f"{version} at {self.executable}, but no host C++ compiler (g++)"
        return True, f"{version} at {self.executable}, cubins for {archs[0]}..{archs[-1]}"

    def compile(self, req: CompileRequest) -> CompiledKernel:
        canonical = self.validate(req)
        executable = self.executable
        key = cache_key(self, req)
        source = req.source
        if not is_identifier(req.kernel_name):
            source += (
                f"\n// added by R³: instantiate the requested kernel\n"
                f"void* const __r3_kernel_reference = (void*)&{req.kernel_name};\n"
            )
        with tempfile.TemporaryDirectory(prefix="r3-nvcc-") as tmp:
            name = Path(req.source_name).name or "kernel.cu"
            source_path = Path(tmp, name)
            source_path.write_text(source)
            output = Path(tmp, "__r3_output.cubin")
            command = [
                executable,
                "-cubin",
                f"-arch={req.arch}",
                # nvcc picks the language from the extension; a source may be named "k.cuh".
                *([] if name.endswith(".cu") else ["-x", "cu"]),
                *render(self.name, canonical),
                "--ptxas-options=-v",
                *(f"-D{n}={v}" for n, v in req.defines),
                # Absolute: nvcc runs in the temporary directory.
                *(f"-I{os.path.abspath(d)}" for d in req.include_dirs),
                "-o",
                str(output),
                name,
            ]
            started = time.perf_counter()
            try:
                run = subprocess.run(
                    command,
                    cwd=tmp,
                    capture_output=True,
                    text=True,
                    timeout=self.timeout_s,
                    check=False,
                )
            except subprocess.TimeoutExpired as exc:
                log = _text(exc.stdout) + _text(exc.stderr)
                return CompiledKernel.failure(
                    self,
                    f"{log}\nnvcc timed out after {self.timeout_s:g} s".lstrip(),
                    cache_key=key,
                    seconds=time.perf_counter() - started,
                )
            except OSError as exc:
                raise ToolchainError(f"nvcc cannot run: {exc}", hint=_INSTALL_HINT) from exc
            seconds = time.perf_counter() - started
            log = (run.stdout + run.stderr).rstrip()
            if run.returncode != 0 or not output.is_file():
                if _is_broken_toolkit(log, name):
                    raise ToolchainError(
                        f"nvcc failed without compiling: {log.splitlines()[-1]}", hint=_INSTALL_HINT
                    )
                return CompiledKernel.failure(self, log, cache_key=key, seconds=seconds)
            cubin = output.read_bytes()
        lowered, problem = lowered_name(cubin, req.kernel_name)
        if lowered is None:
            return CompiledKernel.failure(
                self, f"{log}\n{problem}".lstrip(), cache_key=key, seconds=seconds
            )
        return CompiledKernel.from_cubin(
            self, cubin, lowered, log, cache_key=key, seconds=seconds
        )


def _text(value: str | bytes | None) -> str:
    if value is None:
        return ""
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _is_broken_toolkit(log: str, source_name: str) -> bool:
    """nvcc said "fatal" about something other than the source: a missing cudafe++, host
    compiler or ptxas.  Source errors always name the source file."""
    return "nvcc fatal" in log and source_name not in log


@functools.cache
def _version(executable: str) -> str:
    try:
        run = subprocess.run(
            [executable, "--version"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ToolchainError(f"{executable} --version failed: {exc}", hint=_INSTALL_HINT) from exc
    match = _VERSION.search(run.stdout)
    if run.returncode != 0 or match is None:
        raise ToolchainError(
            f"{executable} --version printed no CUDA release: {run.stdout!r}", hint=_INSTALL_HINT
        )
    return f"nvcc {match.group(2)}"


@functools.cache
def _gpu_codes(executable: str) -> tuple[str, ...]:
    try:
        run = subprocess.run(
            [executable, "--list-gpu-code"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ToolchainError(
            f"{executable} --list-gpu-code failed: {exc}", hint=_INSTALL_HINT
        ) from exc
    codes = tuple(line.strip() for line in run.stdout.split() if line.startswith("sm_"))
    if not codes:
        raise ToolchainError(f"{executable} lists no GPU architectures", hint=_INSTALL_HINT)
    return codes


def lowered_name(cubin: bytes, kernel_name: str) -> tuple[str | None, str]:
    """The cubin symbol of ``kernel_name`` (an extern "C" name, a mangled name or a C++ name
    expression), or ``(None, why not)``."""
    try:
        kernels = Cubin.parse(cubin).kernel_names()
    except CubinError as exc:
        return None, f"nvcc wrote an unreadable cubin: {exc}"
    if kernel_name in kernels:
        return kernel_name, ""
    wanted = _normalise(kernel_name)
    demangled = demangle_all(kernels)
    matches = [
        k for k in kernels if demangled.get(k) and _normalise(function_name(demangled[k])) == wanted
    ]
    if not matches and not demangled:
        # Without c++filt: the Itanium mangling spells the kernel's last name component as
        # <length><name> ("axpy<float>" -> _Z4axpyIf...); take it when exactly one kernel has it.
        base = re.split(r"::", kernel_name.split("<", 1)[0].strip())[-1].strip()
        matches = [k for k in kernels if k.startswith("_Z") and f"{len(base)}{base}" in k]
    if len(matches) == 1:
        return matches[0], ""
    listed = ", ".join(f"{k} ({demangled.get(k, '?')})" for k in kernels) or "none"
    if matches:
        return None, f"kernel {kernel_name!r} is ambiguous in the cubin: {listed}"
    return None, f"kernel {kernel_name!r} is not in the cubin; its kernels: {listed}"


def function_name(demangled: str) -> str:
    """``"void cg::dot<256>(double const*, int)"`` -> ``"cg::dot<256>"``: the parameter list
    and any return type removed."""
    text = demangled.strip()
    depth = 0
    for index in range(len(text) - 1, -1, -1):  # the parameter list is the last (...) group
        if text[index] == ")":
            depth += 1
        elif text[index] == "(":
            depth -= 1
            if depth == 0:
                text = text[:index]
                break
    depth = 0
    for index in range(len(text) - 1, -1, -1):  # a return type ends at the last top-level space
        ch = text[index]
        if ch in ">)":
            depth += 1
        elif ch in "<(":
            depth -= 1
        elif ch == " " and depth == 0:
            return text[index + 1 :]
    return text


# cu++filt spells integer template arguments with a cast ("dot<(int)256>"), c++filt without
# ("dot<256>"); a name from either must find the same kernel.
_INTEGER_CAST = re.compile(r"\((?:unsigned|signed|int|long|short|char|bool|\s)+\)(?=-?\d)")


def _normalise(name: str) -> str:
    return _INTEGER_CAST.sub("", re.sub(r"\s+", " ", name)).replace(" ", "").removeprefix("::")
