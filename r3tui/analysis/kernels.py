"""Where a ``__global__`` function is declared and defined in a unit, read from the parse.

One answer for every layer that edits or looks up a kernel by name: the remix layer's rules and
edits (:func:`r3tui.remix.edits.find_kernel`), ``__launch_bounds__`` injection
(:func:`r3tui.search.source.inject_launch_bounds`), and the record layer's source association
and ``r3 apply``'s splice (:func:`r3tui.record.sources.definitions`).  Offsets are character
offsets into the text given; namespaces are named as a demangler names them (an anonymous one
is ``(anonymous namespace)``).  Execution spaces are read from the tokens before the
declarator with the unit's object-like macros expanded, as :mod:`r3tui.analysis.cuda` does.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import lru_cache

import tree_sitter as ts

from r3tui.analysis.cuda import (
    _GRAMMAR_GAPS,
    Expansions,
    _blank,
    _parser,
    head_words,
    parse_translation_unit,
)
from r3tui.analysis.facts import char_index, tokens

ANONYMOUS = "(anonymous namespace)"


@dataclass(frozen=True)
class KernelDeclaration:
    """A declaration (``defined`` False: a prototype) or the definition of a kernel."""

    name: str
    scopes: tuple[str, ...]  # enclosing namespaces, plus a written qualification (ns::k)
    start: int  # the declaration's first character (a template header included)
    name_at: int  # the kernel's name
    params_open: int  # the '('
    params_close: int  # the ')'
    params: tuple[tuple[int, int], ...]  # each parameter's text, without surrounding blanks
    defined: bool
    body_open: int = -1  # the '{' of a definition
    end: int = -1  # after the definition's '}' or the declaration's ';'
    # C linkage (``extern "C"`` on it or around it): its symbol is its name; otherwise the
    # mangled symbol spells each parameter's type, the pointee's const/volatile included
    extern_c: bool = False


def kernel_declarations(source: str, name: str) -> list[KernelDeclaration]:
    """Every declaration and definition of the ``__global__`` function ``name`` (unqualified,
    no template arguments) in ``source``, in source order."""
    return [d for _, d in declared_kernels(source, name)[0]]


@dataclass(frozen=True)
class Parsed:
    """A parse of a text: its bytes, and byte offset -> character offset."""

    data: bytes
    char: Callable[[int], int]

    def text(self, node: ts.Node) -> str:
        return self.data[node.start_byte:node.end_byte].decode("utf-8", "replace")

    def line_start(self, byte: int) -> int:
        """Where the line holding ``byte`` starts (a byte offset)."""
        return self.data.rfind(b"\n", 0, byte) + 1

    def indent_at(self, byte: int) -> str:
        """The blanks that start the line holding ``byte``, up to ``byte``."""
        line = self.data[self.line_start(byte):byte].decode()
        return line[:len(line) - len(line.lstrip(" \t"))]


def base_name(kernel_name: str) -> str:
    """``"axpy<float>"`` -> ``"axpy"``, ``"ns::k<8>"`` -> ``"k"`` (a mangled name is left as
    it is): the name a kernel's definition has in its source."""
    return kernel_name.split("<", 1)[0].strip().split("::")[-1].strip()


@lru_cache(maxsize=32)
def declared_kernels(source: str, name: str
                     ) -> tuple[tuple[tuple[ts.Node, KernelDeclaration], ...], Parsed]:
    """:func:`kernel_declarations` with each declaration's node in the parse (a definition's
    ``body`` field is its body), for the analyses of a body (:mod:`r3tui.analysis.body`).
    Cached: a rule asks about every parameter of one kernel of one source."""
    data = source.encode("utf-8")
    root = _parser().parse(_BOUNDS_AFTER.sub(_blank_after_paren,
                                             _GRAMMAR_GAPS.sub(_blank, data))).root_node
    char = char_index(data)
    expansions = _expansions(source)
    found: list[tuple[ts.Node, KernelDeclaration]] = []
    for node, declarator, defined in _functions(root):
        named = declarator.child_by_field_name("declarator")
        if named is None or _leaf_name(named, data) != name:
            continue
        head = data[_outer(node).start_byte:declarator.start_byte].decode("utf-8", "replace")
        if "__global__" not in head_words(head, expansions)[1]:  # possible: any definition
            continue
        params = declarator.child_by_field_name("parameters")
        if params is None:
            continue
        outer = _outer(node)
        body = node.child_by_field_name("body") if defined else None
        found.append((node, KernelDeclaration(
            name=name,
            scopes=_scopes(node, data) + _written_scopes(named, data),
            start=char(outer.start_byte),
            name_at=char(named.start_byte),
            params_open=char(params.start_byte),
            params_close=char(params.end_byte - 1),
            params=tuple((char(p.start_byte), char(p.end_byte)) for p in params.named_children
                         if p.type != "comment"),
            defined=defined,
            body_open=char(body.start_byte) if body is not None else -1,
            end=char(outer.end_byte),
            extern_c=_c_linkage(node, data),
        )))
    return tuple(found), Parsed(data, char)


def _c_linkage(node: ts.Node, data: bytes) -> bool:
    """Whether the innermost linkage specification around ``node`` says ``"C"``."""
    parent = node.parent
    while parent is not None:
        if parent.type == "linkage_specification":
            value = parent.child_by_field_name("value")
            return value is not None and data[value.start_byte:value.end_byte] == b'"C"'
        parent = parent.parent
    return False


# `k(...) __launch_bounds__(256) {`: the attribute after the parameters, which the grammar
# does not know; blanked (same length) in what the parser reads
_BOUNDS_AFTER = re.compile(rb"\)\s*__launch_bounds__\s*\([^()]*\)")


def _blank_after_paren(match: re.Match[bytes]) -> bytes:
    return b")" + re.sub(rb"[^\n]", b" ", match.group(0)[1:])


def kernel_definitions(source: str, name: str) -> list[KernelDeclaration]:
    return [d for d in kernel_declarations(source, name) if d.defined]


# -- the tree --------------------------------------------------------------------------------

def _functions(root: ts.Node) -> Iterator[tuple[ts.Node, ts.Node, bool]]:
    """(node, function declarator, is a definition) for every function definition and every
    prototype, at any depth but never inside a function body."""
    stack = [root]
    while stack:
        node = stack.pop()
        if node.type == "function_definition":
            declarator = _function_declarator(node.child_by_field_name("declarator"))
            if declarator is not None and node.child_by_field_name("body") is not None:
                yield node, declarator, True
            continue  # nothing inside a body is a kernel
        if node.type in ("declaration", "field_declaration"):
            for child in node.children_by_field_name("declarator"):
                declarator = _function_declarator(child)
                if declarator is not None:
                    yield node, declarator, False
            continue
        stack.extend(reversed(node.named_children))


def _function_declarator(node: ts.Node | None) -> ts.Node | None:
    while node is not None and node.type in ("pointer_declarator", "reference_declarator",
                                             "attributed_declarator"):
        inner = node.child_by_field_name("declarator")
        node = inner if inner is not None else (node.named_children[-1]
                                                 if node.named_children else None)
    return node if node is not None and node.type == "function_declarator" else None


def _leaf_name(node: ts.Node, data: bytes) -> str:
    while node.type in ("qualified_identifier", "template_function"):
        inner = node.child_by_field_name("name")
        if inner is None:
            break
        node = inner
    return data[node.start_byte:node.end_byte].decode("utf-8", "replace").strip()


def _written_scopes(node: ts.Node, data: bytes) -> tuple[str, ...]:
    """``a::b::k`` written at the definition: ("a", "b")."""
    scopes: list[str] = []
    while node.type == "qualified_identifier":
        scope = node.child_by_field_name("scope")
        if scope is not None:
            scopes.append(data[scope.start_byte:scope.end_byte].decode("utf-8", "replace"))
        inner = node.child_by_field_name("name")
        if inner is None:
            break
        node = inner
    return tuple(s for part in scopes for s in part.split("::") if s)


def _outer(node: ts.Node) -> ts.Node:
    """The declaration with its template header and its ``extern "C"``, when it has them
    (not a linkage block ``extern "C" { ... }``, which holds more than this declaration)."""
    while node.parent is not None and (
            node.parent.type == "template_declaration"
            or (node.parent.type == "linkage_specification"
                and node.parent.child_by_field_name("body") == node)):
        node = node.parent
    return node


def _scopes(node: ts.Node, data: bytes) -> tuple[str, ...]:
    scopes: list[str] = []
    parent = node.parent
    while parent is not None:
        if parent.type == "namespace_definition":
            named = parent.child_by_field_name("name")
            text = data[named.start_byte:named.end_byte].decode() if named is not None else ""
            scopes.extend(reversed(text.split("::")) if text else [ANONYMOUS])
        parent = parent.parent
    return tuple(reversed(scopes))


# -- macros ----------------------------------------------------------------------------------

def _expansions(source: str) -> Expansions:
    found: Expansions = {}
    for macro in parse_translation_unit(source).macros:
        if macro.params is None:
            found.setdefault(macro.name, []).append(tokens(macro.body))
    return found
