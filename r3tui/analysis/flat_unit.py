"""Step 1 of a device unit: the application's unit flattened, and the includes it starts with.

Each ``#include`` that resolves in the application's header tree is replaced by that header's
text, once; a system include is kept when it is a CUDA toolkit header, mapped to its
``cuda/std`` counterpart when it is a C/C++ standard header device code can use, and dropped
otherwise.  :class:`FlatUnit` holds the flat text with the origin of every piece (a
:class:`Piece`) and what was dropped; :func:`prelude` writes the system includes (and the
``__NVCC__``, integer-width and math-constant fixes NVRTC needs) that the device unit starts
with.  :mod:`r3tui.analysis.device_unit` slices the flat text down to what a kernel reaches.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from r3tui.analysis.facts import words

_INCLUDE_LINE = re.compile(
    r'^[ \t]*#[ \t]*include[ \t]*(?:"(?P<quoted>[^"\n]+)"|<(?P<system>[^>\n]+)>)[^\n]*(?:\n|$)',
    re.MULTILINE)

# A C/C++ standard header, and what stands in for it in device code (empty: nothing does, the
# header is host-only or its device part is built into the compiler, e.g. printf and sqrtf).
STANDARD_HEADERS: Mapping[str, tuple[str, ...]] = {
    **{h: ("cuda/std/cstdint",) for h in ("cstdint", "stdint.h", "inttypes.h", "cinttypes")},
    **{h: ("cuda/std/cstddef",) for h in ("cstddef", "stddef.h")},
    **{h: ("cuda/std/climits",) for h in ("climits", "limits.h")},
    **{h: ("cuda/std/cfloat",) for h in ("cfloat", "float.h")},
    "cmath": ("cuda/std/cmath",),
    "limits": ("cuda/std/limits",),
    "type_traits": ("cuda/std/type_traits",),
    "utility": ("cuda/std/utility",),
    "complex": ("cuda/std/complex",),
    "array": ("cuda/std/array",),
    "tuple": ("cuda/std/tuple",),
    "bit": ("cuda/std/bit",),
    "functional": ("cuda/std/functional",),
    "algorithm": ("cuda/std/__algorithm/min.h", "cuda/std/__algorithm/max.h"),
    **{h: ("cuda/std/cassert",) for h in ("cassert", "assert.h")},
    **{h: () for h in (
        "math.h", "stdio.h", "cstdio", "stdlib.h", "cstdlib", "string.h", "cstring", "iostream",
        "fstream", "sstream", "iomanip", "ostream", "istream", "vector", "string", "map",
        "unordered_map", "set", "unordered_set", "list", "deque", "queue", "stack", "memory",
        "chrono", "thread", "mutex", "atomic", "random", "numeric", "iterator", "exception",
        "stdexcept", "new", "ctime", "time.h", "sys/time.h", "unistd.h", "omp.h", "mpi.h",
        "getopt.h", "errno.h", "cerrno", "signal.h", "csignal", "cstdarg", "stdarg.h",
        "stdbool.h", "ctype.h", "cctype", "fcntl.h", "sys/stat.h", "sys/types.h", "filesystem",
        "optional", "variant", "initializer_list", "cfenv", "fenv.h", "locale", "regex",
        "bitset", "valarray", "execution", "cuda_runtime_api.h", "cuda.h", "helper_cuda.h",
        "helper_functions.h", "helper_timer.h")},
}
# Math constants from <math.h> that device code uses and NVRTC does not define.
_MATH_CONSTANTS = (("M_PI", "3.14159265358979323846"), ("M_PI_2", "1.57079632679489661923"),
                   ("M_PI_4", "0.78539816339744830962"), ("M_E", "2.7182818284590452354"),
                   ("M_SQRT2", "1.41421356237309504880"), ("M_1_PI", "0.31830988618379067154"),
                   ("M_2_PI", "0.63661977236758134692"), ("M_LN2", "0.69314718055994530942"),
                   ("M_SQRT1_2", "0.70710678118654752440"))
_INT_TYPES = ("int8_t", "int16_t", "int32_t", "int64_t", "uint8_t", "uint16_t", "uint32_t",
              "uint64_t", "intptr_t", "uintptr_t")


@dataclass(frozen=True)
class Piece:
    """A run of the device unit's text copied from one file: ``file`` is the header tree path,
    or None for the unit itself."""

    start: int  # in the device unit
    end: int
    file: str | None
    file_start: int  # in that file


@dataclass
class FlatUnit:
    """The unit's text with its includes inlined, built up piece by piece by :func:`flatten`."""

    text: list[str] = field(default_factory=list)
    pieces: list[Piece] = field(default_factory=list)
    length: int = 0
    system: list[str] = field(default_factory=list)  # system includes in first-seen order
    dropped: list[str] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)

    def add(self, text: str, file: str | None, file_start: int) -> None:
        if text:
            self.pieces.append(Piece(self.length, self.length + len(text), file, file_start))
            self.text.append(text)
            self.length += len(text)


def _resolve(name: str, quoted: bool, current_dir: str, headers: Mapping[str, str],
             include_dirs: Sequence[str]) -> str | None:
    dirs = ([current_dir] if quoted else []) + list(include_dirs)
    for directory in dirs:
        path = posixpath.normpath(posixpath.join(directory, name))
        if path in headers:
            return path
    return None


def flatten(text: str, file: str | None, directory: str, headers: Mapping[str, str],
            include_dirs: Sequence[str], cuda_dirs: Sequence[str], flat: FlatUnit,
            depth: int) -> None:
    """Add ``text`` (of ``file``, found in ``directory``) to ``flat``, each include that
    resolves in ``headers`` replaced by that header's flattened text the first time."""
    at = 0
    for match in _INCLUDE_LINE.finditer(_mask_comments(text)):
        flat.add(text[at:match.start()], file, at)
        at = match.end()
        quoted, system = match.group("quoted"), match.group("system")
        name = quoted or system
        path = _resolve(name, quoted is not None, directory, headers, include_dirs)
        if path is not None:
            if path not in flat.seen and depth < 64:
                flat.seen.add(path)
                flatten(headers[path], path, posixpath.dirname(path) or ".", headers,
                        include_dirs, cuda_dirs, flat, depth + 1)
                flat.add("\n", file, match.end() - 1)
            continue
        if name in STANDARD_HEADERS or _in_cuda(name, cuda_dirs):
            if name not in flat.system:
                flat.system.append(name)
            if STANDARD_HEADERS.get(name) == ():
                flat.dropped.append(f"#include <{name}> (not needed by device code)")
        else:
            shown = f"<{name}>" if system else repr(name)
            flat.dropped.append(f"#include {shown} "
                                "(found neither in the application's headers nor in CUDA's)")
    flat.add(text[at:], file, at)


def _in_cuda(name: str, cuda_dirs: Sequence[str]) -> bool:
    return any(Path(d, name).is_file() for d in cuda_dirs)


def _mask_comments(text: str) -> str:
    """``text`` with comments blanked (offsets kept), so a commented-out include is none."""
    def blank(match: re.Match[str]) -> str:
        return re.sub(r"[^\n]", " ", match.group(0))
    return re.sub(r"//[^\n]*|/\*.*?\*/", blank, text, flags=re.S)


# Under NVRTC, CCCL's <cuda/std/cstdint> makes int64_t `long long`; the host build (glibc,
# LP64) that nvcc compiles the application with makes it `long`, and code written for it
# passes a `uint64_t*` where a function takes `unsigned long*` (xsbench in the corpus).  The
# device unit keeps the host's types: CCCL's own are renamed while its headers are read.
_LP64 = {"int64_t": "long", "uint64_t": "unsigned long", "intptr_t": "long",
         "uintptr_t": "unsigned long"}


def _host_width_integers(includes: list[str]) -> list[str]:
    rename = [f"#define {t} r3_cccl_{t}" for t in _LP64]
    restore = [f"#undef {t}" for t in _LP64] + [f"typedef {c} {t};" for t, c in _LP64.items()]
    into_std = " ".join(f"using ::{t};" for t in _LP64)
    return ["#ifdef __CUDACC_RTC__", *rename, "#endif", *includes,
            "#ifdef __CUDACC_RTC__", *restore,
            f"namespace cuda {{ namespace std {{ {into_std} }} }}", "#else",
            *(f"using cuda::std::{t};" for t in _LP64), "#endif"]


def prelude(system: Iterable[str], text: str) -> str:
    """The lines the device unit starts with: the kept ``system`` includes (a standard
    header's device counterparts in its place) and what NVRTC lacks that ``text`` uses."""
    # the application's code is written for nvcc, which defines __NVCC__ (NVRTC does not):
    # `#if !defined(__NVCC__)` branches meant for host compilers must stay closed
    lines: list[str] = ["#ifndef __NVCC__", "#define __NVCC__ 1", "#endif"]
    used = words(text)
    if used & set(_INT_TYPES):
        # a host build gets int64_t & co. through <cstdio>, <chrono> or <cuda_runtime.h>
        # without naming <cstdint> (rmsnorm in the corpus); the device unit names it
        system = ["cstdint", *system]
    standard = False
    for name in system:
        mapped = STANDARD_HEADERS.get(name)
        if mapped is None:
            lines.append(f"#include <{name}>")
            continue
        for header in mapped:
            standard = True
            line = f"#include <{header}>"
            if line not in lines:
                lines.append(line)
    if "#include <cuda/std/cstdint>" in lines:
        lines[3:] = _host_width_integers(lines[3:])
    if standard:  # (<cuda/std/cassert> alone declares no cuda::std)
        lines.append("namespace cuda { namespace std {} }")
        lines.append("namespace std { using namespace cuda::std; }")
        if "#include <cuda/std/cstdint>" in lines:
            lines.extend(f"using cuda::std::{t};" for t in _INT_TYPES if t not in _LP64)
    for name, value in _MATH_CONSTANTS:
        if name in used:
            lines.append(f"#ifndef {name}\n#define {name} {value}\n#endif")
    return "\n".join(lines) + "\n"
