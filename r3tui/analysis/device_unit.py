"""The device side of an application's translation unit, as one text NVRTC can compile.

A recorded kernel of an application lives in a unit that also holds host code: ``main``,
``#include <chrono>``, ``std::vector``, a CPU reference.  NVRTC has no host headers, so the unit
as written does not compile there, and nvcc takes about two seconds per compile of it (see
docs/device-unit.md for the measurements that chose this path).  :func:`device_unit` makes what
R³ compiles, edits and shows instead:

1. **Flatten.** Each ``#include`` that resolves in the application's header tree (the headers
   the bundle carries) is replaced by that header's text, once (a second include of the same
   header is empty, as its guard would make it); the unit's own directory and the include
   directories are searched the way the compiler would.  Other includes are *system* includes:
   a device header of the CUDA toolkit (``cuda_fp16.h``, ``cooperative_groups.h``) is kept; a
   C/C++ standard header is replaced by its ``cuda/std`` counterpart where device code could use
   it (``<cstdint>``, ``<cmath>``, ``<limits>``; ``std::`` names resolve there) and dropped where
   it is host-only (``<chrono>``, ``<vector>``, ``<iostream>``); any other is dropped.  The kept
   and replacement includes go first, so NVRTC's automatic precompiled header covers them.
   (:mod:`r3tui.analysis.flat_unit` does this step.)
2. **Slice.** From the kernel's definition, the items it names are kept, and the items they
   name, and so on: device and ``__host__ __device__`` functions, ``constexpr`` functions,
   types, aliases, ``__device__``/``__constant__`` variables (always kept: they are the module's
   state) and ``const`` host variables.  Host functions, host prototypes, other kernels and
   anything the kernel does not reach are left out, and so are host-only member functions of the
   kept types.  Preprocessor lines (``#define``, ``#if``) all stay.
3. **Origins.** Every kept piece of text remembers the file and offset it came from, so the
   kernel's definition in the device unit maps back to the file and the span that define it
   (a header, another file, the unit itself): that is where ``r3 apply`` writes a tuned kernel.

The result is a plain text: a search edits and compiles it like a standalone kernel, and the
same text compiles with nvcc too (the fallback when NVRTC rejects it).
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from r3tui.analysis.cuda import parse_translation_unit
from r3tui.analysis.facts import ExecutionSpace, Item, ItemKind, char_index, words
from r3tui.analysis.flat_unit import STANDARD_HEADERS, FlatUnit, Piece, flatten, prelude

__all__ = [
    "STANDARD_HEADERS",
    "DeviceUnit",
    "DeviceUnitError",
    "KernelView",
    "Piece",
    "device_unit",
    "kernel_view",
]

_KEEP_ALWAYS = {ItemKind.DEFINE, ItemKind.CONDITIONAL, ItemKind.DIRECTIVE, ItemKind.PRAGMA}
_NAMED = {ItemKind.FUNCTION, ItemKind.DECLARATION, ItemKind.TYPE, ItemKind.ALIAS}
_DECLARED_NAME = re.compile(r"(\w+) (?:=|,|;|\[|\{)")


class DeviceUnitError(ValueError):
    """The kernel is not defined in the unit or any header it includes."""



@dataclass(frozen=True)
class DeviceUnit:
    text: str
    kernel: str  # the unqualified name of the kernel
    kernel_span: tuple[int, int]  # its definition in ``text`` (template header included)
    file: str | None  # where it is defined: a header tree path, or None for the unit itself
    file_span: tuple[int, int]  # its definition in that file
    pieces: tuple[Piece, ...] = ()
    dropped: tuple[str, ...] = ()  # what was left out, one short phrase each
    includes: tuple[str, ...] = ()  # the system includes the text starts with

    def origin_of(self, start: int, end: int) -> tuple[str | None, int, int] | None:
        """The file and span that ``text[start:end]`` was copied from, when one piece holds it."""
        for piece in self.pieces:
            if piece.start <= start and end <= piece.end:
                offset = piece.file_start - piece.start
                return piece.file, start + offset, end + offset
        return None




def device_unit(unit: str, kernel: str, headers: Mapping[str, str] | None = None,
                include_dirs: Sequence[str] = (), *, cuda_include_dirs: Sequence[str] = (),
                scopes: Sequence[str] | None = None, forced: Sequence[str] = ()) -> DeviceUnit:
    """The device-only unit of the kernel named ``kernel`` (unqualified, no template
    arguments), defined in ``unit`` or a header it includes.

    ``headers`` maps header tree paths (posix, relative) to their texts; ``include_dirs`` are
    tree directories searched in order, the unit's own directory first.  A system include is
    kept when it names a file under ``cuda_include_dirs`` and is no standard header.  With
    ``scopes`` (the namespaces of the recorded entry point), only a definition inside them is
    the kernel.  ``forced``: header tree paths the build puts before the unit's first line
    (nvcc ``-include FILE``), inlined first, in order.  Raises :class:`DeviceUnitError` when no
    definition is found.
    """
    flat = FlatUnit()
    base = include_dirs[0] if include_dirs else "."
    headers = headers or {}
    for path in forced:
        if path not in headers:
            raise DeviceUnitError(f"the forced include {path} is not among the headers")
        if path not in flat.seen:
            flat.seen.add(path)
            text = headers[path]
            flatten(text if text.endswith("\n") else text + "\n", path,
                    posixpath.dirname(path) or ".", headers, include_dirs, cuda_include_dirs,
                    flat, 1)
    flatten(unit, None, base, headers, include_dirs, cuda_include_dirs, flat, 0)
    text = "".join(flat.text)
    data = text.encode("utf-8")
    parsed = parse_translation_unit(text)
    top = _top_level(parsed.items)
    roots = [i for i in top if i.kind is ItemKind.FUNCTION and i.space is ExecutionSpace.GLOBAL
             and _last(i.name) == kernel and (scopes is None or _scopes(i) == tuple(scopes))]
    if not roots:
        where = f" in namespace {'::'.join(scopes)}" if scopes else ""
        raise DeviceUnitError(f"no __global__ function {kernel!r}{where} is defined in the unit "
                              "or the headers it includes")
    kept = _closure(top, roots)
    cut: list[tuple[int, int]] = []
    for item in top:
        if item.kind is ItemKind.PRAGMA and item.name == "once":
            cut.append((item.start, item.end))  # the headers are inlined, once each
            continue
        if item.kind in _KEEP_ALWAYS or item.start < 0:
            continue
        if item.kind is ItemKind.INCLUDE:  # an include the flattening left: unresolved
            continue
        if id(item) not in kept:
            cut.append((item.start, item.end))
            if item.kind is ItemKind.FUNCTION and item.space is ExecutionSpace.HOST:
                flat.dropped.append(f"host function {item.qualified_name}")
            continue
        for member in _members(parsed.items, item):
            if member.kind is ItemKind.FUNCTION and member.space is ExecutionSpace.HOST and (
                    not {"constexpr", "virtual"} & words(_head(member.text))):
                cut.append((member.start, member.end))
    cut += _error_gaps(data, parsed.items, top)
    pieces, body = _cut(data, flat.pieces, sorted(cut))
    body = _balance_conditionals(body)
    prelude_text = prelude(flat.system, text)
    shift = len(prelude_text)
    pieces = [Piece(p.start + shift, p.end + shift, p.file, p.file_start) for p in pieces]
    full = prelude_text + body
    first = roots[0]
    start = _char_in_output(data, flat.pieces, pieces, first.start)
    end = _char_in_output(data, flat.pieces, pieces, first.end)
    unit_out = DeviceUnit(full, kernel, (start, end), None, (0, 0), tuple(pieces),
                          tuple(dict.fromkeys(flat.dropped)), tuple(flat.system))
    origin = unit_out.origin_of(start, end)
    if origin is None:
        raise DeviceUnitError(f"the definition of {kernel!r} spans an #include")
    file, file_start, file_end = origin
    return DeviceUnit(full, kernel, (start, end), file, (file_start, file_end),
                      tuple(pieces), unit_out.dropped, unit_out.includes)


# -- slicing ---------------------------------------------------------------------------------

def _last(name: str | None) -> str:
    if not name:
        return ""
    return re.sub(r"<.*", "", name).split("::")[-1].strip()


def _scopes(item: Item) -> tuple[str, ...]:
    """The namespaces of ``item`` with an out-of-line qualification (``ns::k``) added."""
    written = [p for p in re.sub(r"<.*", "", item.name or "").split("::")[:-1] if p]
    scope = [p for p in item.scope.split("::") if p]
    return tuple(scope + written)


def _head(text: str) -> str:
    return text.split("{", 1)[0]


def _top_level(items: Sequence[Item]) -> list[Item]:
    """Items not inside another item (members of a type are inside it)."""
    out: list[Item] = []
    end = -1
    for item in sorted((i for i in items if i.start >= 0), key=lambda i: (i.start, -i.end)):
        if item.kind is ItemKind.ERROR:
            continue  # text the parser could not place: the items it found inside stand alone
        if item.start < end:
            continue
        out.append(item)
        end = item.end
    return out


_DIRECTIVE_LINE = re.compile(rb"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", re.MULTILINE)


def _error_gaps(data: bytes, items: Sequence[Item], top: Sequence[Item]
                ) -> list[tuple[int, int]]:
    """The parts of unparsed regions that are no item of their own (``#ifdef __cplusplus
    extern "C" { #endif`` reads as one): left out, since nothing the kernel reaches is there;
    their preprocessor lines stay, so every #if keeps its #endif."""
    gaps: list[tuple[int, int]] = []
    for start, end in _error_regions(items, top):
        at = start
        for line in _DIRECTIVE_LINE.finditer(data, start, end):
            if line.start() > at:
                gaps.append((at, line.start()))
            at = max(at, min(line.end() + 1, end))  # the line and its newline
        if at < end:
            gaps.append((at, end))
    return gaps


def _error_regions(items: Sequence[Item], top: Sequence[Item]) -> list[tuple[int, int]]:
    gaps: list[tuple[int, int]] = []
    for error in (i for i in items if i.kind is ItemKind.ERROR and i.start >= 0):
        at = error.start
        for inner in sorted((i for i in top if error.start <= i.start and i.end <= error.end),
                            key=lambda i: i.start):
            if inner.start > at:
                gaps.append((at, inner.start))
            at = max(at, inner.end)
        if at < error.end:
            gaps.append((at, error.end))
    return gaps


def _members(items: Sequence[Item], outer: Item) -> list[Item]:
    return [i for i in items if i.start >= 0 and outer.start <= i.start and i.end <= outer.end
            and i is not outer]


def _names(item: Item) -> set[str]:
    names = {_last(item.name)} if item.name else set()
    if item.kind is ItemKind.FUNCTION and item.name and "::" in item.name:
        names.add(_scopes(item)[-1])  # `Foo::bar` defines part of Foo
    if item.kind is ItemKind.DECLARATION and not item.prototype:
        names |= set(_DECLARED_NAME.findall(_head(item.text)))
    names.discard("")
    return names


def _wanted(item: Item) -> bool:
    """Whether device code may use ``item`` at all."""
    if item.kind is ItemKind.FUNCTION:
        assert item.space is not None
        return item.space.on_device or "constexpr" in words(_head(item.text))
    if item.kind is ItemKind.DECLARATION:
        if item.memory_space is not None:
            return True
        head = words(item.text.split("=", 1)[0])
        return item.prototype or bool({"const", "constexpr"} & head)
    return True


def _closure(top: Sequence[Item], roots: Sequence[Item]) -> set[int]:
    by_name: dict[str, list[Item]] = {}
    for item in top:
        # another kernel is never called from device code (a same-named one elsewhere is not
        # the recorded one)
        if item.kind is ItemKind.FUNCTION and item.space is ExecutionSpace.GLOBAL:
            continue
        if item.kind in _NAMED and _wanted(item):
            for name in _names(item):
                by_name.setdefault(name, []).append(item)
    kept: set[int] = set()
    pending = list(roots)
    # module state is kept whether or not the kernel names it: other device code may
    pending += [i for i in top if i.kind is ItemKind.DECLARATION and i.memory_space is not None]
    # a macro the kept code names reaches what its replacement names (`#define texture
    # __device__ r3_texture_reference` makes `texture<float, 1> t;` need that template)
    macros: dict[str, set[str]] = {}  # a name defined in several branches: all of them
    for i in top:
        if i.kind is ItemKind.DEFINE and i.name:
            macros.setdefault(i.name, set()).update(words(i.text))
    seen_words: set[str] = set()
    while pending:
        item = pending.pop()
        if id(item) in kept:
            continue
        kept.add(id(item))
        found = list(words(item.text) - seen_words)
        while found:
            word = found.pop()
            if word in seen_words:
                continue
            seen_words.add(word)
            pending.extend(by_name.get(word, ()))
            found.extend(macros.get(word, ()))
    # prototypes only for what is defined and kept; instantiations and statements of what is kept
    for item in top:
        if item.kind is ItemKind.DECLARATION and item.prototype and id(item) in kept:
            if not any(_names(item) & _names(o) for o in top if id(o) in kept
                       and o.kind is ItemKind.FUNCTION):
                kept.discard(id(item))
        elif item.kind in (ItemKind.TEMPLATE_INSTANTIATION, ItemKind.STATEMENT,
                           ItemKind.STATIC_ASSERT, ItemKind.ERROR):
            mentioned = words(item.text)
            if any(mentioned & _names(o) for o in top if id(o) in kept):
                kept.add(id(item))
    return kept


_CONDITIONAL = re.compile(r"^[ \t]*#[ \t]*(if|ifdef|ifndef|elif|else|endif)\b")


def _balance_conditionals(text: str) -> str:
    """``text`` with the conditional directives that lost their partners blanked (same
    length, so offsets hold): an ``#ifdef`` kept from a cut host function whose ``#endif``
    went with it (SU3's main) would make the rest of the unit conditional."""
    from r3tui.analysis.text import mask

    lines = text.split("\n")
    masked = mask(text).split("\n")  # a directive inside a comment is none
    open_groups: list[list[int]] = []
    orphans: list[int] = []
    for index, line in enumerate(masked):
        match = _CONDITIONAL.match(line)
        if match is None:
            continue
        word = match.group(1)
        if word.startswith("if"):
            open_groups.append([index])
        elif not open_groups:
            orphans.append(index)
        elif word == "endif":
            open_groups.pop()
        else:
            open_groups[-1].append(index)
    for index in orphans + [i for group in open_groups for i in group]:
        lines[index] = " " * len(lines[index])
    return "\n".join(lines)


def _cut(data: bytes, flat_pieces: Sequence[Piece], cut: Sequence[tuple[int, int]]
         ) -> tuple[list[Piece], str]:
    """The text without the byte ranges in ``cut`` (and the blank lines they leave), and the
    pieces of its origins (character offsets)."""
    ranges = _widen(data, _merge(cut))
    kept: list[tuple[int, int]] = []
    at = 0
    for start, end in ranges:
        if start > at:
            kept.append((at, start))
        at = max(at, end)
    if at < len(data):
        kept.append((at, len(data)))
    text = data.decode("utf-8")
    to_char = char_index(data)
    pieces: list[Piece] = []
    out: list[str] = []
    length = 0
    for start, end in kept:
        cs, ce = to_char(start), to_char(end)
        for piece in flat_pieces:
            lo, hi = max(cs, piece.start), min(ce, piece.end)
            if lo < hi:
                pieces.append(Piece(length + lo - cs, length + hi - cs, piece.file,
                                    piece.file_start + lo - piece.start))
        out.append(text[cs:ce])
        length += ce - cs
    return pieces, "".join(out)


def _merge(ranges: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for start, end in ranges:
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def _widen(data: bytes, ranges: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Each range with the rest of its last line when only blanks follow it, so that leaving
    an item out leaves no empty line behind."""
    out: list[tuple[int, int]] = []
    for start, end in ranges:
        line_start = data.rfind(b"\n", 0, start) + 1
        newline = data.find(b"\n", end)
        stop = len(data) if newline < 0 else newline + 1
        if not data[end:stop].strip() and not data[line_start:start].strip():
            start, end = line_start, stop
        out.append((start, end))
    return _merge(out)


def _char_in_output(data: bytes, flat_pieces: Sequence[Piece], pieces: Sequence[Piece],
                    byte_offset: int) -> int:
    """Where the flat text's ``byte_offset`` landed in the output (it must be kept)."""
    char = char_index(data)(byte_offset)
    for flat_piece in flat_pieces:
        if flat_piece.start <= char <= flat_piece.end:
            file_offset = flat_piece.file_start + char - flat_piece.start
            for piece in pieces:
                length = piece.end - piece.start
                if piece.file == flat_piece.file and \
                        piece.file_start <= file_offset <= piece.file_start + length:
                    return piece.start + file_offset - piece.file_start
    raise DeviceUnitError("the kernel's definition was cut from the device unit")


# -- what a model is shown ---------------------------------------------------------------------

@dataclass(frozen=True)
class KernelView:
    """The kernel's definition and the device code it reaches, within a size."""

    text: str
    omitted: tuple[str, ...]  # items reached but left out for size, nearest first


def kernel_view(source: str, kernel: str, max_chars: int) -> KernelView:
    """``kernel``'s definition first-class, with the types, device functions, variables and
    macros it reaches (nearest first) in source order, as far as ``max_chars`` allows; the
    definition itself is always whole.  What did not fit is named in a comment."""
    parsed = parse_translation_unit(source)
    data = source.encode("utf-8")
    top = _top_level(parsed.items)
    roots = [i for i in top if i.kind is ItemKind.FUNCTION
             and i.space is ExecutionSpace.GLOBAL and _last(i.name) == kernel]
    if not roots:
        return KernelView(source, ())
    by_name: dict[str, list[Item]] = {}
    for item in top:
        if item.kind is ItemKind.FUNCTION and item.space is ExecutionSpace.GLOBAL:
            continue
        if item.kind in _NAMED or item.kind is ItemKind.DEFINE:
            for name in _names(item):
                by_name.setdefault(name, []).append(item)
    # breadth first from the kernel: the nearer an item, the sooner it is shown
    order: list[Item] = []
    seen: set[int] = {id(r) for r in roots}
    frontier = list(roots)
    while frontier:
        following: list[Item] = []
        for item in frontier:
            for word in sorted(words(data[item.start:item.end].decode("utf-8", "replace"))):
                for found in by_name.get(word, ()):
                    if id(found) not in seen and found.start >= 0:
                        seen.add(id(found))
                        following.append(found)
        order.extend(following)
        frontier = following
    budget = max_chars - sum(r.end - r.start for r in roots)
    shown: list[Item] = list(roots)
    omitted: list[str] = []
    for item in order:
        size = item.end - item.start + 1
        if size <= budget:
            shown.append(item)
            budget -= size
        else:
            omitted.append(item.qualified_name or item.kind.value)
    parts: list[str] = []
    scope: str | None = None
    for item in sorted(shown, key=lambda i: i.start):
        end = item.end
        if data[end:].lstrip().startswith(b";"):  # `struct S {...};`: the type ends there
            end = data.index(b";", end) + 1
        text = data[item.start:end].decode("utf-8", "replace").rstrip()
        if item.scope != scope and item.scope:
            parts.append(f"// in namespace {item.scope}")
        scope = item.scope
        parts.append(text)
    if omitted:
        parts.append("// also reached, not shown: " + ", ".join(omitted))
    return KernelView("\n\n".join(parts) + "\n", tuple(omitted))
