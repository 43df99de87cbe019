"""The compilation interface: a request, its result, and the toolchain between them.

A :class:`Toolchain` compiles one kernel of one source to a cubin for one exact architecture
(never PTX: PTX from a newer compiler than the GPU node's driver does not load there).  A source
error is a value (``CompiledKernel.ok`` is false and ``log`` says why); a missing or broken
compiler raises :class:`~r3tui.errors.ToolchainError`, a bad option or arch
:class:`~r3tui.errors.ConfigError`.

Identical binaries: ``CompiledKernel.binary_sha256`` hashes the cubin's code and metadata (not
ptxas's command-line note, see :func:`r3tui.compile.cubin.code_sha256`).  Different option
spellings, option orders or options that change nothing give the same hash, so the replay layer
measures ``(binary_sha256, lowered_name)`` once and shares the measurement between trials;
:func:`dedupe` groups results by that pair.
"""

from __future__ import annotations

import hashlib
import json
import re
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from r3tui.compile.cubin import code_sha256
from r3tui.compile.options import TOOLCHAIN_NAMES, Canonical, canonicalize
from r3tui.compile.resources import kernel_resources
from r3tui.domain import ResourceUsage
from r3tui.errors import ConfigError

# Bump when the meaning of a cache entry changes (what goes into the key, or into the result).
CACHE_FORMAT = 1

_ARCH = re.compile(r"^sm_[0-9]{2,3}[af]?$")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"]([^>"]+)[>"]', re.MULTILINE)


@dataclass(frozen=True)
class CompileRequest:
    """One kernel of one source, compiled one way."""

    source: str
    kernel_name: str  # as written: an extern "C" name, or a C++ name expression "axpy<float>"
    arch: str = "sm_90"
    options: tuple[str, ...] = ()  # toolchain flags, e.g. ("--use_fast_math", "-maxrregcount=64")
    defines: tuple[tuple[str, str], ...] = ()  # -D NAME=VALUE
    include_dirs: tuple[str, ...] = ()
    source_name: str = "kernel.cu"


def first_error_line(log: str) -> str:
    """The line of a compiler log to show a user in one line: the first error, else the last."""
    for line in log.splitlines():
        if "error" in line.lower():
            return line.strip()
    lines = log.strip().splitlines()
    return lines[-1].strip() if lines else "the compiler failed without a log"


@dataclass(frozen=True)
class CompiledKernel:
    """The outcome of one compile; failures are values with the compiler's log."""

    ok: bool
    toolchain: str  # "nvrtc" | "nvcc" | "llvm"
    toolchain_version: str
    binary: bytes | None  # a cubin for the exact arch
    binary_kind: str  # "cubin"
    lowered_name: str | None  # the symbol to pass to cuModuleGetFunction
    resources: ResourceUsage
    log: str  # full compiler log (errors, warnings and the ptxas -v report)
    seconds: float  # wall time of the compile (0 when served from a cache)
    cache_key: str
    binary_sha256: str | None  # code hash of the cubin, see the module docstring
    cached: bool = False

    @classmethod
    def from_cubin(
        cls,
        toolchain: Toolchain,
        cubin: bytes,
        lowered_name: str,
        log: str,
        *,
        cache_key: str,
        seconds: float,
    ) -> CompiledKernel:
        """A successful result: resources from the cubin and ptxas's report, the code hash."""
        return cls(
            ok=True,
            toolchain=toolchain.name,
            toolchain_version=toolchain.version(),
            binary=cubin,
            binary_kind="cubin",
            lowered_name=lowered_name,
            resources=kernel_resources(cubin, lowered_name, log),
            log=log,
            seconds=seconds,
            cache_key=cache_key,
            binary_sha256=code_sha256(cubin),
        )

    @classmethod
    def failure(
        cls,
        toolchain: Toolchain | tuple[str, str],
        log: str,
        *,
        cache_key: str = "",
        seconds: float = 0.0,
    ) -> CompiledKernel:
        """A failed result for ``toolchain`` (an instance, or ``(name, version)``)."""
        name, version = (
            toolchain if isinstance(toolchain, tuple) else (toolchain.name, toolchain.version())
        )
        return cls(
            ok=False,
            toolchain=name,
            toolchain_version=version,
            binary=None,
            binary_kind="cubin",
            lowered_name=None,
            resources=ResourceUsage(),
            log=log,
            seconds=seconds,
            cache_key=cache_key,
            binary_sha256=None,
        )


class Toolchain(ABC):
    """A compiler that turns a :class:`CompileRequest` into a cubin."""

    name: ClassVar[str]

    @abstractmethod
    def version(self) -> str:
        """e.g. ``"nvrtc 13.0"`` or ``"nvcc 13.0.88"``; :class:`ToolchainError` if missing."""

    @abstractmethod
    def available(self) -> tuple[bool, str]:
        """``(ok, message)`` for ``r3 doctor``: where the compiler is, or what is wrong."""

    @abstractmethod
    def compile(self, req: CompileRequest) -> CompiledKernel:
        """Compile ``req``; a source error is ``ok=False`` with the log."""

    def fingerprint(self) -> str:
        """What identifies this compiler's output in a cache key (at least :meth:`version`)."""
        return self.version()

    def supported_archs(self) -> tuple[str, ...]:
        """The real archs (``"sm_90"``) this toolchain builds; empty when it cannot tell."""
        return ()

    def validate(self, req: CompileRequest) -> Canonical:
        """``req``'s options in canonical form after checking the whole request
        (:func:`canonical_options`) and that this toolchain builds its arch."""
        canonical = canonical_options(self.name, req)
        archs = self.supported_archs()
        if archs and base_arch(req.arch) not in archs:
            raise ConfigError(
                f"{self.version()} cannot build {req.arch}", hint=f"supported: {', '.join(archs)}"
            )
        return canonical


def canonical_options(toolchain_name: str, req: CompileRequest) -> Canonical:
    """Validate ``req`` and return its options in canonical form; :class:`ConfigError` on a bad
    arch, kernel name, option, define or include directory."""
    if not _ARCH.match(req.arch):
        hint = "PTX is never built: R³ loads cubins for the exact arch"
        raise ConfigError(f"bad arch {req.arch!r}: expected a real GPU arch like sm_90", hint=hint)
    if not req.kernel_name.strip():
        raise ConfigError("a compile request needs a kernel name")
    for name, value in req.defines:
        if not _IDENTIFIER.match(name):
            raise ConfigError(f"bad define name {name!r}: expected a C identifier")
        if "\n" in value or "\0" in value:
            raise ConfigError(f"define {name} has a newline or NUL in its value")
    names = [name for name, _ in req.defines]
    if len(set(names)) != len(names):
        raise ConfigError(
            f"a define is given twice: {sorted(n for n in names if names.count(n) > 1)}"
        )
    for directory in req.include_dirs:
        if not Path(directory).is_dir():
            raise ConfigError(f"include directory {directory} does not exist")
    return canonicalize(toolchain_name, req.options)


def base_arch(arch: str) -> str:
    """``"sm_90a"`` -> ``"sm_90"``: compilers list base archs; suffixed ones come with them."""
    return arch.rstrip("af")


def is_identifier(name: str) -> bool:
    return bool(_IDENTIFIER.match(name))


def header_digest(source: str, include_dirs: Sequence[str]) -> str:
    """sha256 over the headers ``source`` includes that lie in ``include_dirs``, transitively.

    Headers found only in the toolkit (``cuda_fp16.h``) are not read: the toolchain version
    stands for them.  ``#include`` lines are found by a plain scan, so a header behind a false
    ``#if`` is hashed too (a spurious miss at worst, never a stale hit); a computed include
    (``#include MACRO``) is not followed.
    """
    digest = hashlib.sha256()
    seen: set[Path] = set()
    pending: list[tuple[str, Path | None]] = [(name, None) for name in _INCLUDE.findall(source)]
    dirs = [Path(d) for d in include_dirs]
    while pending:
        name, including_dir = pending.pop()
        search = ([including_dir] if including_dir else []) + dirs
        for directory in search:
            path = directory / name
            if path.is_file():
                resolved = path.resolve()
                if resolved in seen:
                    break
                seen.add(resolved)
                content = resolved.read_bytes()
                digest.update(f"{name}\0{len(content)}\0".encode() + content)
                text = content.decode("utf-8", errors="replace")
                pending.extend((inner, resolved.parent) for inner in _INCLUDE.findall(text))
                break
    return digest.hexdigest()


def cache_key(toolchain: Toolchain, req: CompileRequest) -> str:
    """sha256 of everything that decides the result: source, canonical options (so spellings
    and order do not matter), defines, the content of included user headers, the toolchain's
    exact version, the arch, the kernel name and the source name (it appears in the log)."""
    options = canonical_options(toolchain.name, req)
    payload = {
        "format": CACHE_FORMAT,
        "toolchain": toolchain.name,
        "fingerprint": toolchain.fingerprint(),
        "arch": req.arch,
        "kernel": req.kernel_name,
        "source_name": req.source_name,
        "source": hashlib.sha256(req.source.encode()).hexdigest(),
        "options": [list(item) for item in options],
        "defines": sorted([list(item) for item in req.defines]),
        "headers": header_digest(req.source, req.include_dirs) if req.include_dirs else "",
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def dedupe(results: Iterable[CompiledKernel]) -> dict[tuple[str, str], list[int]]:
    """Indices of the successful ``results`` grouped by ``(binary_sha256, lowered_name)``:
    each group is one binary entry point, to be measured once for all its trials."""
    groups: dict[tuple[str, str], list[int]] = {}
    for index, result in enumerate(results):
        if result.ok and result.binary_sha256 and result.lowered_name:
            groups.setdefault((result.binary_sha256, result.lowered_name), []).append(index)
    return groups


_INSTANCES: dict[str, Toolchain] = {}
# name -> (module, class) of each toolchain; imported when first asked for (those modules
# import this one), one instance per process
TOOLCHAIN_CLASSES: dict[str, tuple[str, str]] = {
    "nvrtc": ("r3tui.compile.nvrtc", "NvrtcToolchain"),
    "nvcc": ("r3tui.compile.nvcc", "NvccToolchain"),
    "llvm": ("r3tui.compile.llvm", "LlvmToolchain"),
}


def get_toolchain(name: str = "nvrtc") -> Toolchain:
    """The toolchain called ``name`` (one instance per process); :class:`ConfigError` if unknown."""
    if name not in TOOLCHAIN_NAMES:
        raise ConfigError(
            f"unknown toolchain {name!r}", hint=f"known toolchains: {', '.join(TOOLCHAIN_NAMES)}"
        )
    if name not in _INSTANCES:
        import importlib

        module, cls = TOOLCHAIN_CLASSES[name]
        _INSTANCES[name] = getattr(importlib.import_module(module), cls)()
    return _INSTANCES[name]
