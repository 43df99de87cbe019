"""The facts :mod:`r3tui.analysis.cuda` reads from a translation unit, as typed values, and
the tokenizer it compares texts with (comments dropped, one space between tokens)."""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum


def _join(scope: str, name: str) -> str:
    return f"{scope}::{name}" if scope else name


class ItemKind(StrEnum):
    FUNCTION = "function"  # a definition, including member functions of a type
    DECLARATION = "declaration"  # variables and function prototypes at namespace scope
    TYPE = "type"  # struct, class, union and enum definitions
    ALIAS = "alias"  # typedef, using, namespace alias
    STATIC_ASSERT = "static_assert"
    TEMPLATE_INSTANTIATION = "template_instantiation"
    INCLUDE = "include"
    DEFINE = "define"
    PRAGMA = "pragma"
    CONDITIONAL = "conditional"  # an #if/#ifdef/#ifndef/#elif/#else line
    DIRECTIVE = "directive"  # #undef, #error, #line, ...
    ASM = "asm"  # asm at namespace scope
    STATEMENT = "statement"  # anything else at namespace scope, e.g. a macro invocation
    ERROR = "error"  # text the parser could not place


class ExecutionSpace(StrEnum):
    GLOBAL = "global"
    DEVICE = "device"
    HOST = "host"
    HOST_DEVICE = "host_device"

    @property
    def on_host(self) -> bool:
        return self in (ExecutionSpace.HOST, ExecutionSpace.HOST_DEVICE)

    @property
    def on_device(self) -> bool:
        return self is not ExecutionSpace.HOST


class MemorySpace(StrEnum):
    DEVICE = "device"
    CONSTANT = "constant"
    MANAGED = "managed"
    SHARED = "shared"


@dataclass(frozen=True)
class Call:
    callee: str  # as written, whitespace collapsed: "std::system", "cg::dot_partial<256>"
    name: str  # last component: "system", "dot_partial", "operator new"; "" when indirect
    line: int
    function: str  # qualified name of the enclosing item; "" at namespace scope
    space: ExecutionSpace | None  # of the enclosing function; None outside functions


@dataclass(frozen=True)
class InlineAsm:
    text: str  # the assembly strings' contents, with the unit's macros they name
    line: int
    function: str
    space: ExecutionSpace | None


@dataclass(frozen=True)
class Item:
    kind: ItemKind
    name: str | None
    scope: str  # enclosing namespaces and types joined by "::"; "" at global scope
    line: int  # 1-based
    text: str  # normalised
    space: ExecutionSpace | None = None  # functions only
    defines_main: bool = False
    memory_space: MemorySpace | None = None  # declarations only
    prototype: bool = False  # a declaration of functions only, no variable
    # what in an initializer runs code when the variable (or, for a type, an object) is
    # created, e.g. "a call to 'system'"; None when the initializers are constant
    dynamic_init: str | None = None
    calls: tuple[Call, ...] = ()
    # byte offsets of the item's text in the parsed unit (a template's header included);
    # -1 for conditional lines, which stand for a whole #if block
    start: int = -1
    end: int = -1

    @property
    def qualified_name(self) -> str | None:
        return None if self.name is None else _join(self.scope, self.name)


@dataclass(frozen=True)
class Variable:
    name: str
    line: int
    memory_space: MemorySpace | None  # None for a function-scope static without one
    const: bool  # const or constexpr
    scope: str = ""  # namespaces at namespace scope
    function: str | None = None  # the enclosing function of a function-scope static

    @property
    def qualified_name(self) -> str:
        return _join(self.function if self.function is not None else self.scope, self.name)

    @property
    def mutable(self) -> bool:
        return not self.const and self.memory_space is not MemorySpace.CONSTANT


@dataclass(frozen=True)
class Include:
    target: str  # "cuda_fp16.h", "heat/params.h"; the macro name for `#include MACRO`
    system: bool  # <...> rather than "..."
    line: int


@dataclass(frozen=True)
class Macro:
    name: str
    params: tuple[str, ...] | None  # None for an object-like macro
    body: str  # normalised
    line: int


@dataclass(frozen=True)
class ParseError:
    line: int
    text: str  # the normalised text the parser could not place, or "missing X"


@dataclass(frozen=True)
class TranslationUnit:
    items: tuple[Item, ...]
    variables: tuple[Variable, ...]  # namespace scope, with a device memory space
    statics: tuple[Variable, ...]  # function-scope statics in any function
    asm: tuple[InlineAsm, ...]
    includes: tuple[Include, ...]
    macros: tuple[Macro, ...]
    parse_errors: tuple[ParseError, ...]

    @property
    def functions(self) -> tuple[Item, ...]:
        return tuple(i for i in self.items if i.kind is ItemKind.FUNCTION)

    @property
    def calls(self) -> tuple[Call, ...]:
        return tuple(c for f in self.functions for c in f.calls)

    @property
    def defines_main(self) -> bool:
        return any(i.defines_main for i in self.items)

    @property
    def has_errors(self) -> bool:
        return bool(self.parse_errors)

    @property
    def error_lines(self) -> tuple[int, ...]:
        return tuple(e.line for e in self.parse_errors)


# the warp-level intrinsics (lanes exchanging values or voting): a kernel that calls one ties
# its threads to their lanes (r3tui.search.block_source, r3tui.remix.swap)
WARP_CALLS = (r"__shfl\w*|__ballot_sync|__any_sync|__all_sync|__activemask|__match_\w+"
              r"|__reduce_\w+_sync|__syncwarp")


def device_callees(kernels: Sequence[Item], functions: Sequence[Item]) -> list[Item]:
    """The device functions of ``functions`` that ``kernels`` call, transitively (by name),
    the kernels themselves left out: what runs on the device on their behalf."""
    by_name: dict[str, list[Item]] = {}
    for f in functions:
        if f.space is not None and f.space.on_device and f.name and f not in kernels:
            by_name.setdefault(f.name, []).append(f)
    seen: list[Item] = []
    todo = list(kernels)
    while todo:
        for call in todo.pop().calls:
            for callee in by_name.get(call.name, ()):
                if callee not in seen:
                    seen.append(callee)
                    todo.append(callee)
    return seen


# Comments match outside the group and come back empty; a comment marker inside a string
# literal never starts a match, since the string is consumed from its opening quote.
_TOKEN = re.compile(
    r"""//[^\n]*|/\*.*?\*/|("(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'|\w+"""
    r"""|::|->\*?|\.\.\.|<=>|<<=|>>=|##|&&|\|\||\+\+|--|<<|>>|[-+*/%&|^!=<>]=|\S)""",
    re.S,
)
_WORD = re.compile(r"\w+")


def tokens(text: str) -> list[str]:
    """The C++ tokens of ``text``, comments dropped (close enough for comparing and scanning).
    A backslash-newline (a macro's continuation) is no token."""
    text = text.replace("\\\r\n", " ").replace("\\\n", " ")
    return [t for t in _TOKEN.findall(text) if t]


def normalize(text: str) -> str:
    return " ".join(tokens(text))


def _compact(text: str) -> str:
    """A name as written, whitespace collapsed: "S::get", "operator[]", "operator new"."""
    return " ".join(text.split())


def words(text: str) -> set[str]:
    """The identifier-like tokens of ``text``, outside comments and string literals."""
    return {t for t in tokens(text) if _WORD.fullmatch(t)}


def char_index(data: bytes) -> Callable[[int], int]:
    """Byte offset in the UTF-8 ``data`` -> character offset in its text (tree-sitter gives
    byte offsets, Python strings count characters)."""
    if data.isascii():
        return lambda offset: offset
    starts = [i for i, byte in enumerate(data) if byte & 0xC0 != 0x80]
    return lambda offset: bisect.bisect_left(starts, offset)
