"""Which translation unit defines a recorded kernel: source association by (de)mangled name.

An application's launch names its kernel by the entry point in the module, an Itanium-mangled
name such as ``_ZN2cg6detail4xpayIdEEvPKT_S2_PS2_i`` (or a plain name for ``extern "C"``).  To
replay it from source, R³ compiles the whole translation unit that *defines* that
``__global__`` function device-side, so the helpers, macros and template instantiations it
needs are all present.  :func:`associate` finds that unit among ``--source`` files and the
files of a ``compile_commands.json``, and takes the include directories, ``-D`` values and the
device-relevant flags from the compile database's command for it.

The qualified name comes from ``c++filt``/``cu++filt`` when installed (with template
arguments, e.g. ``cg::detail::xpay<double>``); :func:`qualified_name` is a small pure-Python
reading of the mangling that gives the namespaces and the function name (template arguments
skipped), enough to find the definition without binutils.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from r3tui.compile.nvcc import function_name
from r3tui.demangle import demangle

_ANONYMOUS = "(anonymous namespace)"
_SOURCE_SUFFIXES = (".cu", ".cuh", ".cpp", ".cc", ".cxx", ".h", ".hpp")
_QUOTE_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"', re.MULTILINE)
# flags of a compile command that change what the device code means (not -arch: replay
# compiles for the GPU it runs on; not -O/-o/-c/-l: host side or build plumbing)
_DEVICE_FLAG_PREFIXES = (
    "-std=",
    "--std=",
    "-use_fast_math",
    "--use_fast_math",
    "-ftz=",
    "--ftz=",
    "-prec-div=",
    "--prec-div=",
    "-prec-sqrt=",
    "--prec-sqrt=",
    "-fmad=",
    "--fmad=",
    "-maxrregcount",
    "--maxrregcount",
    "--expt-relaxed-constexpr",
    "--expt-extended-lambda",
    "--extended-lambda",
    "-Xptxas",
    "--ptxas-options",
)


@dataclass(frozen=True)
class KernelSource:
    """The translation unit that defines a kernel, and how the application compiles it."""

    path: Path
    text: str  # the whole translation unit
    kernel: str  # what to compile: a C++ name expression (``cg::dot<256>``) or the symbol
    include_dirs: tuple[Path, ...] = ()
    defines: tuple[tuple[str, str], ...] = ()
    options: tuple[str, ...] = ()
    forced_includes: tuple[Path, ...] = ()  # nvcc -include FILE, in order


@dataclass(frozen=True)
class QualifiedName:
    """``cg::detail::xpay`` as ``scopes=("cg", "detail")``, ``name="xpay"``."""

    scopes: tuple[str, ...]
    name: str
    templated: bool

    def __str__(self) -> str:
        return "::".join((*self.scopes, self.name))


# -- names ---------------------------------------------------------------------------------


class _Reader:
    """A cursor over a mangled name."""

    def __init__(self, text: str, pos: int) -> None:
        self.text = text
        self.pos = pos

    def peek(self, n: int = 1) -> str:
        return self.text[self.pos : self.pos + n]

    def number(self) -> int:
        start = self.pos
        while self.pos < len(self.text) and self.text[self.pos].isdigit():
            self.pos += 1
        if start == self.pos:
            raise ValueError("expected a number")
        return int(self.text[start : self.pos])

    def source_name(self) -> str:
        length = self.number()
        name = self.text[self.pos : self.pos + length]
        if len(name) != length:
            raise ValueError("truncated name")
        self.pos += length
        return _ANONYMOUS if name.startswith("_GLOBAL__N") else name

    def skip_to(self, char: str) -> None:
        end = self.text.index(char, self.pos)
        self.pos = end + 1

    def skip_template_args(self) -> None:
        """From just after ``I`` to just after its ``E``: types, literals and nested groups."""
        depth = 1
        while depth:
            ch = self.peek()
            if not ch:
                raise ValueError("unterminated template arguments")
            if ch.isdigit():
                self.source_name()
            elif ch == "L":  # literal: L <type> <value> E, or L_Z <encoding> E
                self.pos += 1
                if self.peek(2) == "_Z":
                    self.pos += 2
                    depth += 1
                    continue
                if self.peek().isdigit():
                    self.source_name()
                elif self.peek() == "D":
                    self.pos += 2
                else:
                    self.pos += 1
                while self.peek() and self.peek() != "E":
                    self.pos += 1
                self.pos += 1
            elif ch in "ST" and self.peek(2)[1:] != "t":  # S_, S0_, T_, T1_ (not St)
                self.pos += 1
                if self.peek() and (self.peek().isalnum() or self.peek() == "_"):
                    if self.peek() in "abdios" and ch == "S":  # Sa, Sb, Sd, Si, So, Ss
                        self.pos += 1
                    else:
                        self.skip_to("_")
            elif ch == "A" or self.peek(2) == "Dv":  # array / vector: A10_, Dv4_
                self.pos += 1 if ch == "A" else 2
                self.skip_to("_")
            elif ch in "INXJF":
                self.pos += 1
                depth += 1
            elif ch == "E":
                self.pos += 1
                depth -= 1
            else:
                self.pos += 1


def qualified_name(symbol: str) -> QualifiedName | None:
    """The scopes and function name an Itanium-mangled ``symbol`` names (template arguments
    skipped), or a plain (``extern "C"``) name as is; None when it cannot be read."""
    if not symbol.startswith("_Z"):
        if re.fullmatch(r"[A-Za-z_]\w*", symbol):
            return QualifiedName((), symbol, False)
        return None
    reader = _Reader(symbol, 2)
    parts: list[str] = []
    templated = False
    try:
        if reader.peek() == "N":
            reader.pos += 1
            while reader.peek() in ("r", "V", "K", "R", "O"):  # cv / ref qualifiers
                reader.pos += 1
            while reader.peek() != "E":
                ch = reader.peek()
                if not ch:
                    return None
                if ch.isdigit():
                    parts.append(reader.source_name())
                    templated = False
                elif reader.peek(2) == "St":
                    parts.append("std")
                    reader.pos += 2
                elif ch == "I":
                    reader.pos += 1
                    reader.skip_template_args()
                    templated = True
                elif ch == "B":  # ABI tag on the previous component
                    reader.pos += 1
                    reader.source_name()
                else:
                    return None  # substitutions and special names: not a kernel's name
        else:
            if reader.peek(2) == "St":
                parts.append("std")
                reader.pos += 2
            if not reader.peek().isdigit():
                return None
            parts.append(reader.source_name())
            if reader.peek() == "I":
                reader.pos += 1
                reader.skip_template_args()
                templated = True
    except ValueError:
        return None
    if not parts:
        return None
    return QualifiedName(tuple(parts[:-1]), parts[-1], templated)


# -- finding the definition ----------------------------------------------------------------
@dataclass(frozen=True)
class Definition:
    """Where a ``__global__`` function is defined: ``start`` is the start of its declaration
    (``template <...>`` included), ``end`` just after its closing brace."""

    start: int
    name_at: int
    end: int
    scopes: tuple[str, ...]


def definitions(text: str, name: str) -> list[Definition]:
    """Every definition (not a declaration, not a launch) of the ``__global__`` function
    ``name`` (unqualified) in ``text``, with the namespaces it is defined in; read from the
    parse (:func:`r3tui.analysis.kernels.kernel_definitions`)."""
    from r3tui.analysis.kernels import kernel_definitions

    return [Definition(d.start, d.name_at, d.end, d.scopes)
            for d in kernel_definitions(text, name)]


def _defines_kernel(text: str, wanted: QualifiedName, exact: bool) -> bool:
    defs = definitions(text, wanted.name)
    if not exact:
        return bool(defs)
    return any(d.scopes == wanted.scopes for d in defs)


def _translation_unit_defines(
    path: Path, wanted: QualifiedName, exact: bool, include_dirs: Sequence[Path]
) -> bool:
    """Whether ``path`` or a header it includes with quotes (resolved against its directory
    and ``include_dirs``) defines the kernel."""
    seen: set[Path] = set()
    pending = [path]
    while pending and len(seen) < 64:
        current = pending.pop()
        if current in seen:
            continue
        seen.add(current)
        try:
            text = current.read_text(errors="replace")
        except OSError:
            continue
        if _defines_kernel(text, wanted, exact):
            return True
        for include in _QUOTE_INCLUDE.findall(text):
            for base in (current.parent, *include_dirs):
                candidate = (base / include).resolve()
                if candidate.is_file():
                    pending.append(candidate)
                    break
    return False


# -- compile databases ---------------------------------------------------------------------
@dataclass(frozen=True)
class CompileCommand:
    path: Path
    include_dirs: tuple[Path, ...]
    defines: tuple[tuple[str, str], ...]
    options: tuple[str, ...]
    forced_includes: tuple[Path, ...] = ()  # -include / --pre-include FILE, in order


def read_compile_db(compile_db: Path) -> list[CompileCommand]:
    """The entries of a ``compile_commands.json``; a broken file is a one-line RecordingError."""
    from r3tui.errors import RecordingError

    try:
        entries = json.loads(compile_db.read_text())
    except (OSError, ValueError) as exc:
        raise RecordingError(f"cannot read compile database {compile_db}: {exc}") from exc
    if not isinstance(entries, list):
        raise RecordingError(f"{compile_db}: a compile database is a JSON list of entries")
    commands: list[CompileCommand] = []
    for entry in entries:
        if not isinstance(entry, dict) or "file" not in entry:
            raise RecordingError(f"{compile_db}: an entry without a 'file'")
        directory = Path(entry.get("directory") or compile_db.parent)
        if not directory.is_absolute():
            directory = compile_db.parent / directory
        if "arguments" in entry:
            args = [str(a) for a in entry["arguments"]]
        else:
            args = shlex.split(str(entry.get("command", "")))
        commands.append(_parse_command(directory, Path(entry["file"]), args))
    return commands


def _in(directory: Path, value: str) -> Path:
    """A path of a compile command: absolute, or relative to its directory."""
    path = Path(value)
    return path if path.is_absolute() else (directory / path).resolve()


def _parse_command(directory: Path, file: Path, args: list[str]) -> CompileCommand:
    includes: list[Path] = []
    defines: list[tuple[str, str]] = []
    options: list[str] = []
    forced: list[Path] = []
    i = 0
    while i < len(args):
        arg = args[i]
        value: str | None = None
        if arg in ("-include", "--pre-include") and i + 1 < len(args):
            forced.append(_in(directory, args[i + 1]))
            i += 2
            continue
        if arg.startswith("--pre-include="):
            forced.append(_in(directory, arg.split("=", 1)[1]))
            i += 1
            continue
        for flag in ("-I", "--include-path", "-isystem", "-D", "--define-macro"):
            if arg == flag and i + 1 < len(args):
                value, i = args[i + 1], i + 1
            elif arg.startswith(flag + "=") and flag.startswith("--"):
                value = arg[len(flag) + 1 :]
            elif arg.startswith(flag) and not flag.startswith("--") and len(arg) > len(flag):
                value = arg[len(flag) :]
            else:
                continue
            if flag in ("-D", "--define-macro"):
                key, _, val = value.partition("=")
                defines.append((key, val if "=" in value else "1"))
            else:
                includes.append(_in(directory, value))
            break
        else:
            if arg.startswith(_DEVICE_FLAG_PREFIXES):
                if arg in ("-maxrregcount", "--maxrregcount", "-Xptxas") and i + 1 < len(args):
                    options.extend((arg, args[i + 1]))
                    i += 1
                else:
                    options.append(arg)
        i += 1
    path = file if file.is_absolute() else directory / file
    return CompileCommand(path.resolve(), tuple(includes), tuple(defines), tuple(options),
                          tuple(forced))


# -- association ---------------------------------------------------------------------------
def _expand(sources: Sequence[Path]) -> list[Path]:
    out: list[Path] = []
    for source in sources:
        if source.is_dir():
            out.extend(
                sorted(p for p in source.rglob("*") if p.suffix in _SOURCE_SUFFIXES and p.is_file())
            )
        elif source.is_file():
            out.append(source)
    return out


def kernel_expression(entry_point: str) -> str:
    """What to hand a toolchain for ``entry_point``: the demangled function name with its
    template arguments when a demangler is installed; else the qualified name when the
    kernel is not a template; else the mangled symbol itself (nvcc finds it in the cubin)."""
    demangled = demangle(entry_point)
    # an anonymous namespace cannot be named in C++ source: only the symbol finds it
    if demangled is not None and _ANONYMOUS not in demangled:
        return function_name(demangled)
    name = qualified_name(entry_point)
    if name is not None and not name.templated and _ANONYMOUS not in name.scopes:
        return str(name)
    return entry_point


def associate(
    entry_point: str,
    sources: Sequence[Path],
    compile_db: Path | None,
    include_dirs: Sequence[Path] = (),
) -> KernelSource | None:
    """The translation unit that defines the ``__global__`` function ``entry_point`` (mangled
    or ``extern "C"``), searched in the compile database's files first, then ``sources``
    (files, or directories searched for CUDA/C++ files); None when none defines it.
    ``include_dirs`` (``r3 record --include``) are searched after a unit's own ``-I``."""
    wanted = qualified_name(entry_point)
    if wanted is None:
        return None
    exact = entry_point.startswith("_Z")  # an extern "C" name carries no namespaces
    candidates: list[CompileCommand] = []
    if compile_db is not None:
        candidates.extend(read_compile_db(compile_db))
    known = {c.path for c in candidates}
    for path in _expand(sources):
        resolved = path.resolve()
        if resolved not in known:
            known.add(resolved)
            candidates.append(CompileCommand(resolved, (), (), ()))
    extra = tuple(Path(d).resolve() for d in include_dirs)
    for command in candidates:
        if not command.path.is_file():
            continue
        searched = (*command.include_dirs, *extra)
        if not _translation_unit_defines(command.path, wanted, exact, searched):
            continue
        # the unit's own directory first: replay compiles a copy elsewhere, and its quoted
        # includes must still resolve
        include_dirs = (command.path.parent, *searched)
        return KernelSource(
            path=command.path,
            text=command.path.read_text(errors="replace"),
            kernel=kernel_expression(entry_point),
            include_dirs=tuple(dict.fromkeys(include_dirs)),
            defines=command.defines,
            options=command.options,
            forced_includes=command.forced_includes,
        )
    return None
