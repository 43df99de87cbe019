"""The application headers a translation unit reaches, copied into its bundle.

A recorded kernel's unit often includes headers of the application's own tree
(``#include "solver.h"``, ``#include <app/vec.h>`` through ``-Iinclude``).  To recompile the
unit for tuning anywhere, the bundle carries those headers: :func:`collect` follows
``#include`` lines from the unit through the include search path the application compiles
with -- the including file's directory first for quoted includes, then the ``-I``/``-isystem``
directories in order -- and keeps every header found there.  Headers found in the CUDA
toolkit or the host compiler's system directories (``c++ -E -v``) stay out: every compiler
finds its own.

The headers keep their layout relative to a common root, so ``"../common/defs.h"`` and a
header's own quoted includes resolve in the copy exactly as in the tree; the bundle stores
the include directories relative to that root, the unit's own directory first (a compiler
given the unit as text has no directory for it).

The scan reads ``#include`` lines, not the preprocessor's result: a header behind a false
``#if`` is copied too (harmless), and a computed include (``#include MACRO``) is not
followed.  An include found nowhere is an error (:class:`MissingHeader`) unless it sits
inside a conditional block other than an include guard, where it is listed as unresolved
instead (``#ifdef USE_MPI`` / ``#include <mpi.h>``).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from r3tui.errors import RecordingError

MAX_HEADERS = 2000
MAX_HEADER_BYTES = 32 << 20

_DIRECTIVE = re.compile(r"^[ \t]*#[ \t]*(\w+)", re.MULTILINE)
_INCLUDE_NAME = re.compile(r'[ \t]*(?:"([^"\n]+)"|<([^>\n]+)>)')
_IDENT = re.compile(r"[ \t]*(?:!\s*defined\s*\(?\s*)?([A-Za-z_]\w*)")


class MissingHeader(RecordingError):
    """An ``#include`` of the unit is found in none of the include directories."""


@dataclass(frozen=True)
class HeaderTree:
    """The headers a unit reaches, as a tree relative to a common root."""

    files: tuple[tuple[str, bytes], ...]  # (posix path under the root, content)
    include_dirs: tuple[str, ...]  # posix paths under the root ("." is the root)
    origins: tuple[Path, ...]  # where each file was read, in the order of ``files``
    unresolved: tuple[str, ...] = ()  # quoted includes under a conditional, found nowhere
    forced: tuple[str, ...] = ()  # the forced includes (-include FILE), as tree paths

    @property
    def size(self) -> int:
        return sum(len(content) for _name, content in self.files)


@dataclass(frozen=True)
class _Include:
    name: str
    quoted: bool
    line: int
    conditional: bool  # inside an #if block that is not an include guard


def includes(text: str) -> list[_Include]:
    """The ``#include`` lines of ``text``, outside comments, in order."""
    from r3tui.analysis.text import mask

    masked = mask(text)
    found: list[_Include] = []
    stack: list[bool] = []  # per open conditional: does it count (False: an include guard)
    guard_candidate: str | None = None  # the name of an #ifndef that may be a guard
    for match in _DIRECTIVE.finditer(masked):
        word = match.group(1)
        end = text.find("\n", match.end())
        rest = text[match.end() : end if end >= 0 else len(text)]
        pending, guard_candidate = guard_candidate, None
        if word in ("if", "ifdef", "ifndef"):
            name = _IDENT.match(rest)
            guardish = word == "ifndef" or (word == "if" and "defined" in rest and "!" in rest)
            stack.append(True)
            if guardish and name:
                guard_candidate = name.group(1)
        elif word == "define" and pending is not None and stack:
            defined = _IDENT.match(rest)
            if defined and defined.group(1) == pending:
                stack[-1] = False  # #ifndef X / #define X: an include guard
        elif word == "endif" and stack:
            stack.pop()
        elif word == "include":
            name_match = _INCLUDE_NAME.match(rest)
            if name_match:
                quoted = name_match.group(1) is not None
                found.append(_Include(name_match.group(1) or name_match.group(2), quoted,
                                      text.count("\n", 0, match.start()) + 1, any(stack)))
    return found


@functools.cache
def system_include_dirs() -> tuple[Path, ...]:
    """Directories whose headers every compiler finds itself: the CUDA toolkit's (with CCCL)
    and the host C++ compiler's search list (``c++ -E -v``), plus /usr/include."""
    from r3tui.compile.nvrtc import default_include_dirs
    from r3tui.record.interposer import cuda_include_dirs

    dirs: list[Path] = [Path(d) for d in default_include_dirs()]
    for d in cuda_include_dirs():
        dirs += [d, d / "cccl"]
    compiler = next((c for c in ("c++", "g++", "clang++") if shutil.which(c)), None)
    if compiler is not None:
        try:
            run = subprocess.run([compiler, "-E", "-x", "c++", "-v", "-"], input="",
                                 capture_output=True, text=True, timeout=30, check=False)
            listing = run.stderr.split("search starts here:")[-1].split("End of search list.")[0]
            dirs += [Path(line.strip().split(" (")[0]) for line in listing.splitlines()
                     if line.startswith(" ")]
        except (OSError, subprocess.TimeoutExpired):
            pass
    dirs += [Path("/usr/local/include"), Path("/usr/include")]
    seen: dict[Path, None] = {}
    for d in dirs:
        if d.is_dir():
            seen.setdefault(d.resolve(), None)
    return tuple(seen)


def _under(path: Path, roots: Sequence[Path]) -> bool:
    real = path.resolve()
    return any(real.is_relative_to(root) for root in roots)


def _absolute(path: Path) -> Path:
    return Path(os.path.normpath(path.absolute()))


def collect(unit: Path, text: str, include_dirs: Sequence[Path],
            system_dirs: Sequence[Path] | None = None,
            forced: Sequence[Path] = ()) -> HeaderTree:
    """The application headers ``text`` (the unit at ``unit``) reaches through
    ``include_dirs``, transitively, and the ``forced`` ones the build puts before its first
    line (nvcc ``-include FILE``) with what they reach; :class:`MissingHeader` names the first
    quoted include (or forced file) found nowhere, :class:`RecordingError` a tree over the
    size limits."""
    system = tuple(system_include_dirs() if system_dirs is None else system_dirs)
    unit_dir = _absolute(unit).parent
    search = [_absolute(d) for d in include_dirs]
    files: dict[Path, bytes] = {}
    used_dirs: set[Path] = {unit_dir}
    unresolved: list[str] = []
    total = 0
    pending: list[tuple[Path, str]] = []
    forced_paths = []
    for path in map(_absolute, forced):
        if not path.is_file():
            raise MissingHeader(f"{unit}: the forced include (-include) {path} does not exist")
        if path in files:
            continue
        data = path.read_bytes()
        total += len(data)
        files[path] = data
        forced_paths.append(path)
        pending.append((path, data.decode("utf-8", errors="replace")))
    pending.append((_absolute(unit), text))
    while pending:
        including, content = pending.pop(0)
        for inc in includes(content):
            where = ([including.parent] if inc.quoted else []) + search
            hit = next(((d, d / inc.name) for d in where if (d / inc.name).is_file()), None)
            if hit is None:
                if any((d / inc.name).is_file() for d in system):
                    continue  # a toolkit or compiler header
                if inc.conditional:
                    unresolved.append(f"{including.name}:{inc.line}: {inc.name}")
                    continue
                spelled = f'"{inc.name}"' if inc.quoted else f"<{inc.name}>"
                dirs = ", ".join(str(d) for d in dict.fromkeys(where)) or "no include directory"
                raise MissingHeader(
                    f"{including}:{inc.line}: #include {spelled} is not in {dirs}",
                    hint="pass the directory that holds it with --include DIR")
            directory, path = hit
            path = _absolute(path)
            if path in files or _under(path, system):
                continue
            data = path.read_bytes()
            total += len(data)
            if len(files) >= MAX_HEADERS or total > MAX_HEADER_BYTES:
                raise RecordingError(
                    f"{unit.name} reaches more than {MAX_HEADERS} headers or "
                    f"{MAX_HEADER_BYTES >> 20} MiB of them through its include directories",
                    hint="give only the application's own include directories")
            files[path] = data
            if directory != including.parent:
                used_dirs.add(directory)
            pending.append((path, data.decode("utf-8", errors="replace")))
    kept = [unit_dir, *(d for d in search if d in used_dirs and d != unit_dir)]
    root = Path(os.path.commonpath([*map(str, kept), *(str(p.parent) for p in files)]))
    return HeaderTree(
        files=tuple((p.relative_to(root).as_posix(), data) for p, data in files.items()),
        include_dirs=tuple(d.relative_to(root).as_posix() for d in kept),
        origins=tuple(files),
        unresolved=tuple(unresolved),
        forced=tuple(p.relative_to(root).as_posix() for p in forced_paths),
    )


def check_relative(value: str, *, allow_root: bool) -> str | None:
    """Why ``value`` is not a safe relative posix path inside a header tree (None: it is)."""
    if not value or "\0" in value or "\\" in value:
        return "expected a relative path"
    path = PurePosixPath(value)
    if path.is_absolute() or ".." in path.parts:
        return "expected a relative path inside the header tree"
    if not allow_root and value in (".", "./"):
        return "expected a file path"
    return None
