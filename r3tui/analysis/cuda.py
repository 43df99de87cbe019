"""Facts about a CUDA C++ translation unit, read from a tree-sitter parse.

:func:`parse_translation_unit` gives the items at namespace scope in order (functions with their
execution space, variables with their memory space, types, preprocessor lines), the variables
that outlive a launch, the calls and inline ``asm`` in each function, the includes, and where
the parse failed; it decides nothing (:mod:`r3tui.analysis.safety` does).  Item texts are
normalised (comments dropped, one space between tokens) so that layout never counts as a change.
Spaces are read from the tokens before the declarator with the unit's object-like macros
expanded (``#define DEVICE __device__ __forceinline__`` is common), never from comments.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from functools import cache, lru_cache

import tree_sitter as ts
import tree_sitter_cuda

from r3tui.analysis.facts import (
    _WORD,
    Call,
    ExecutionSpace,
    Include,
    InlineAsm,
    Item,
    ItemKind,
    Macro,
    MemorySpace,
    ParseError,
    TranslationUnit,
    Variable,
    _compact,
    _join,
    normalize,
    tokens,
    words,
)


@lru_cache(maxsize=64)
def parse_translation_unit(source: str) -> TranslationUnit:
    """The facts of one unit.  Cached: a campaign checks every candidate against one original."""
    data = source.encode("utf-8", errors="replace")
    tree = _parser().parse(_GRAMMAR_GAPS.sub(_blank, data))
    return _UnitReader(data, tree.root_node).read()


# CUDA spellings the grammar does not know and that derail the parse of what follows:
# `struct __align__(16) S` reads as a function, `[=] __device__ (...)` as an error.  They are
# blanked (same length, so positions hold) in the text given to the parser only; item texts
# still come from the source.  None of them decides where code runs.
_GRAMMAR_GAPS = re.compile(
    rb"(?:__align__|__maxnreg__|__cluster_dims__)\s*\([^()]*\)"
    rb"|\](?:\s*(?:__device__|__host__))+"
)


def _blank(match: re.Match[bytes]) -> bytes:
    text = match.group(0)
    kept = b"]" if text.startswith(b"]") else b""  # a lambda's capture list stays
    return kept + re.sub(rb"[^\n]", b" ", text[len(kept):])


_QUERY_SOURCE = """
(call_expression function: (_) @callee)
(new_expression) @new
(delete_expression) @delete
(gnu_asm_expression) @asm
(lambda_expression) @lambda
(compound_literal_expression) @construct
(declaration (storage_class_specifier)) @local
[(preproc_def) (preproc_function_def)] @macro
(preproc_include) @include
"""


@cache
def _language() -> ts.Language:
    return ts.Language(tree_sitter_cuda.language())


@cache
def _query() -> ts.Query:
    return ts.Query(_language(), _QUERY_SOURCE)


# A Parser keeps state between calls, so each thread (the compile pool's) gets its own.
_LOCAL = threading.local()


def _parser() -> ts.Parser:
    if not hasattr(_LOCAL, "parser"):
        _LOCAL.parser = ts.Parser(_language())
    parser: ts.Parser = _LOCAL.parser
    return parser


_TextOf = Callable[[ts.Node | None], str]




def _line(node: ts.Node) -> int:
    return node.start_point[0] + 1


# the directive of each conditional; "" where the first child says (#ifdef or #ifndef)
_CONDITIONALS = {"preproc_if": "#if", "preproc_ifdef": "", "preproc_elif": "#elif",
                 "preproc_elifdef": "", "preproc_else": "#else"}
_ALIASES = {"type_definition", "alias_declaration", "using_declaration",
            "namespace_alias_definition"}
_RECORDS = {"struct_specifier", "class_specifier", "union_specifier", "enum_specifier"}
_NAME_LEAVES = {"identifier", "field_identifier", "type_identifier", "operator_name",
                "destructor_name", "namespace_identifier"}
# managed first: `__device__ __managed__` is managed memory
_MEMORY_WORDS = (("__managed__", MemorySpace.MANAGED), ("__constant__", MemorySpace.CONSTANT),
                 ("__shared__", MemorySpace.SHARED), ("__device__", MemorySpace.DEVICE))


class _UnitReader:
    """One pass over a tree: items in order, and the facts inside each."""

    def __init__(self, data: bytes, root: ts.Node) -> None:
        self.data = data
        self.root = root
        self.items: list[Item] = []
        self.variables: list[Variable] = []
        self.statics: list[Variable] = []
        self.asm: list[InlineAsm] = []
        self.includes: list[Include] = []
        self.macros: list[Macro] = []
        # every definition of each object-like macro (#ifndef defaults give several)
        self.expansions: Expansions = {}

    def read(self) -> TranslationUnit:
        # anywhere, a function body included: an #include there is as much an include
        everywhere = ts.QueryCursor(_query()).captures(self.root)
        for node in _in_order(everywhere.get("macro", [])):
            self._macro(node)
        for node in _in_order(everywhere.get("include", [])):
            path = node.child_by_field_name("path")
            raw = self._text(path).strip()
            quoted = path is not None and path.type in ("system_lib_string", "string_literal")
            system = path is not None and path.type == "system_lib_string"
            self.includes.append(Include(raw[1:-1] if quoted else raw, system, _line(node)))
        self._walk(self.root, "")
        return TranslationUnit(
            items=tuple(self.items), variables=tuple(self.variables),
            statics=tuple(self.statics), asm=tuple(self.asm), includes=tuple(self.includes),
            macros=tuple(self.macros), parse_errors=tuple(self._errors(self.root)))

    def _text(self, node: ts.Node | None) -> str:
        data = self.data[node.start_byte : node.end_byte] if node is not None else b""
        return data.decode("utf-8", errors="replace")

    # -- macros and qualifiers -----------------------------------------------------------------

    def _macro(self, node: ts.Node) -> None:
        name = self._text(node.child_by_field_name("name"))
        params = node.child_by_field_name("parameters")
        body = tokens(self._text(node.child_by_field_name("value")))
        if params is None:
            self.expansions.setdefault(name, []).append(body)
        self.macros.append(Macro(
            name=name, body=" ".join(body), line=_line(node),
            params=None if params is None else tuple(
                self._text(p) for p in params.named_children)))

    def _head_words(self, node: ts.Node, end: ts.Node | None) -> tuple[set[str], set[str]]:
        """Words before ``end`` with macros expanded: those every expansion gives, and those
        some expansion gives.  A device qualifier counts when it is certain and a host one
        when it is possible, so that a doubtful function is taken as host code."""
        stop = end.start_byte if end is not None else node.end_byte
        return head_words(self.data[node.start_byte : stop].decode("utf-8", errors="replace"),
                          self.expansions)

    def _space(self, node: ts.Node, end: ts.Node | None) -> ExecutionSpace:
        certain, possible = self._head_words(node, end)
        if "__global__" in certain:
            return ExecutionSpace.GLOBAL
        if "__device__" in certain:
            return ExecutionSpace.HOST_DEVICE if "__host__" in possible else ExecutionSpace.DEVICE
        return ExecutionSpace.HOST

    def _variables(self, node: ts.Node) -> Iterator[tuple[ts.Node, str, MemorySpace | None, bool]]:
        """(declarator, name, memory space, const) of each variable a declaration declares."""
        declarators = node.children_by_field_name("declarator")
        certain, _ = self._head_words(node, declarators[0] if declarators else None)
        memory = next((space for word, space in _MEMORY_WORDS if word in certain), None)
        for declarator in declarators:
            if not _is_function_declarator(declarator):
                name = _declarator_name(declarator, self._text) or "(unnamed)"
                yield declarator, name, memory, _is_const(declarator, certain)

    # -- items ---------------------------------------------------------------------------------

    def _walk(self, node: ts.Node, scope: str, in_error: bool = False) -> None:
        for child in node.named_children:
            self._item(child, scope, child, in_error)

    def _item(self, node: ts.Node, scope: str, outer: ts.Node, in_error: bool = False) -> None:
        kind = node.type
        body = node.child_by_field_name("body")
        if kind == "function_definition":
            self._function(node, scope, outer)
        elif kind == "linkage_specification" and body is not None:
            if body.type == "declaration_list":
                self._walk(body, scope, in_error)
            else:
                self._item(body, scope, node, in_error)
        elif kind == "namespace_definition" and body is not None:
            name = self._text(node.child_by_field_name("name")) or "(anonymous)"
            self._walk(body, _join(scope, name), in_error)
        elif kind == "template_declaration":
            inner = _templated(node)
            if inner is not None:
                self._item(inner, scope, outer, in_error)
        elif kind in _RECORDS:
            self._record(node, scope, outer)
        elif kind == "declaration":
            self._declaration(node, scope, outer)
        elif kind in _ALIASES:
            self._nested_record(node, scope)
            named = node.child_by_field_name("name") or node.child_by_field_name("declarator")
            self._add(ItemKind.ALIAS, self._text(named) or None, scope, outer)
        elif kind in ("static_assert_declaration", "template_instantiation"):
            self._add(ItemKind(kind.removesuffix("_declaration")), None, scope, outer)
        elif kind.startswith("preproc_"):
            self._directive(node, scope, in_error)
        elif kind == "ERROR":
            if not in_error:
                self._add(ItemKind.ERROR, None, scope, node)
            self._walk(node, scope, in_error=True)
        elif kind == "comment" or in_error:
            return  # inside an error only whole items are taken, not their fragments
        elif kind == "expression_statement" and any(
                c.type == "gnu_asm_expression" for c in node.named_children):
            self._add(ItemKind.ASM, None, scope, outer)
        else:
            self._add(ItemKind.STATEMENT, None, scope, outer)

    def _add(self, kind: ItemKind, name: str | None, scope: str, outer: ts.Node, *,
             space: ExecutionSpace | None = None, defines_main: bool = False,
             memory_space: MemorySpace | None = None, prototype: bool = False,
             dynamic_init: str | None = None, calls: tuple[Call, ...] = ()) -> None:
        self.items.append(Item(
            kind=kind, name=name, scope=scope, line=_line(outer),
            text=normalize(self._text(outer)), space=space, defines_main=defines_main,
            memory_space=memory_space, prototype=prototype, dynamic_init=dynamic_init,
            calls=calls, start=outer.start_byte, end=outer.end_byte))

    def _directive(self, node: ts.Node, scope: str, in_error: bool) -> None:
        kind = node.type
        if kind == "preproc_include":
            path = self._text(node.child_by_field_name("path")).strip()
            self._add(ItemKind.INCLUDE, path or None, scope, node)
        elif kind in ("preproc_def", "preproc_function_def"):
            self._add(ItemKind.DEFINE, self._text(node.child_by_field_name("name")), scope, node)
        elif kind == "preproc_call":
            word = self._text(node.child_by_field_name("directive")).strip()
            if word == "#pragma":  # named by its first word: "unroll", "once"
                argument = tokens(self._text(node.child_by_field_name("argument")))
                self._add(ItemKind.PRAGMA, argument[0] if argument else None, scope, node)
            else:
                self._add(ItemKind.DIRECTIVE, word, scope, node)
        elif kind in _CONDITIONALS:
            keyword = _CONDITIONALS[kind] or self._text(node.children[0]).strip()
            condition = node.child_by_field_name("condition") or node.child_by_field_name("name")
            name = normalize(self._text(condition)) or None
            self.items.append(Item(kind=ItemKind.CONDITIONAL, name=name, scope=scope,
                                   line=_line(node), text=f"{keyword} {name or ''}".strip()))
            # both branches: which one is compiled depends on macros set at build time
            for index, child in enumerate(node.children):
                if child.is_named and node.field_name_for_child(index) not in ("condition",
                                                                               "name"):
                    self._item(child, scope, child, in_error)

    def _function(self, node: ts.Node, scope: str, outer: ts.Node) -> None:
        declarator = node.child_by_field_name("declarator")
        body = node.child_by_field_name("body")
        if body is None:
            return  # `= default` / `= delete`: part of its type's text, no code of its own
        name = (_declarator_name(declarator, self._text) if declarator else None) or "(unnamed)"
        space = self._space(node, declarator)
        calls = self._scan_body(body, _join(scope, name), space)
        self._add(ItemKind.FUNCTION, name, scope, outer, space=space,
                  defines_main=name == "main" and scope == "", calls=calls)

    def _declaration(self, node: ts.Node, scope: str, outer: ts.Node) -> None:
        self._nested_record(node, scope)
        type_node = node.child_by_field_name("type")
        names: list[str] = []
        calls: list[Call] = []
        dynamic: str | None = None
        memory: MemorySpace | None = None
        for declarator, name, memory, const in self._variables(node):
            names.append(name)
            if memory is not None:
                self.variables.append(Variable(name, _line(declarator), memory, const, scope))
            value = declarator.child_by_field_name("value")
            if declarator.type == "init_declarator" and value is not None:
                found, value_calls = self._initializer(value, declarator, type_node, scope)
                calls.extend(value_calls)
                # constexpr initializers are evaluated by the compiler, never at load time
                if dynamic is None and "constexpr" not in words(self._text(node)):
                    dynamic = found
        declarators = node.children_by_field_name("declarator")
        first = names[0] if names else (
            _declarator_name(declarators[0], self._text) if declarators else None)
        self._add(ItemKind.DECLARATION, first, scope, outer, memory_space=memory,
                  prototype=bool(declarators) and not names, dynamic_init=dynamic,
                  calls=tuple(calls))

    def _initializer(self, value: ts.Node, declarator: ts.Node, type_node: ts.Node | None,
                     scope: str) -> tuple[str | None, list[Call]]:
        """What in an initializer runs code when the variable is created, and its calls."""
        captures = ts.QueryCursor(_query()).captures(value)
        calls = [self._call(c, scope, None) for c in _in_order(captures.get("callee", []))]
        named = [c.name for c in calls if c.name]
        if calls:
            return (f"a call to '{named[0]}'" if named else "a call"), calls
        if captures.get("lambda") or captures.get("new"):
            return ("a lambda" if captures.get("lambda") else "a new expression"), calls
        direct = not any(c.type == "=" for c in declarator.children)
        class_type = type_node is not None and type_node.type not in (
            "primitive_type", "sized_type_specifier")
        if value.type == "argument_list" or captures.get("construct") or (
                direct and value.type == "initializer_list" and class_type):
            return "a constructor call", calls
        return None, calls

    def _nested_record(self, node: ts.Node, scope: str) -> None:
        """`struct S {...} s;` and `typedef struct {...} T;` define a type inside."""
        type_node = node.child_by_field_name("type")
        if type_node is not None and type_node.type in _RECORDS and \
                type_node.child_by_field_name("body") is not None:
            self._record(type_node, scope, type_node)

    def _record(self, node: ts.Node, scope: str, outer: ts.Node) -> None:
        name = self._text(node.child_by_field_name("name")) or None
        body = node.child_by_field_name("body")
        if body is None or node.type == "enum_specifier":
            self._add(ItemKind.TYPE, name, scope, outer)
            return
        at = len(self.items)  # the type comes before its members
        fields: list[tuple[str | None, list[Call]]] = []
        self._members(body, _join(scope, name or "(anonymous)"), fields)
        # a default member initializer runs whenever an object is constructed, on the host too
        dynamic = next((found for found, _ in fields if found not in (None, "a constructor call")),
                       None)
        self._add(ItemKind.TYPE, name, scope, outer, dynamic_init=dynamic,
                  calls=tuple(c for _, calls in fields for c in calls))
        self.items.insert(at, self.items.pop())

    def _members(self, body: ts.Node, scope: str,
                 fields: list[tuple[str | None, list[Call]]]) -> None:
        for child in body.named_children:
            inner = _templated(child) if child.type == "template_declaration" else child
            if inner is None:
                continue
            if inner.type == "function_definition":
                self._function(inner, scope, child)
            elif inner.type in _RECORDS:
                self._record(inner, scope, child)
            elif inner.type == "friend_declaration":
                for friend in inner.named_children:
                    if friend.type == "function_definition":
                        self._function(friend, scope, friend)
            elif inner.type == "field_declaration":
                self._nested_record(inner, scope)
                value = inner.child_by_field_name("default_value")
                if value is not None:
                    fields.append(self._initializer(value, inner, None, scope))
            elif inner.type in _CONDITIONALS:
                self._members(inner, scope, fields)

    # -- inside function bodies ----------------------------------------------------------------

    def _scan_body(self, body: ts.Node, function: str, space: ExecutionSpace) -> tuple[Call, ...]:
        captures = ts.QueryCursor(_query()).captures(body)
        found: list[tuple[ts.Node, Call]] = [
            (c, self._call(c, function, space)) for c in captures.get("callee", [])]
        for node in captures.get("new", []) + captures.get("delete", []):
            # placement new builds an object in memory the caller already has: no allocation
            name = ("operator delete" if node.type == "delete_expression" else "placement new"
                    if node.child_by_field_name("placement") is not None else "operator new")
            found.append((node, Call(name, name, _line(node), function, space)))
        for node in _in_order(captures.get("asm", [])):
            self.asm.append(InlineAsm(self._asm_text(node), _line(node), function, space))
        for node in _in_order(captures.get("local", [])):
            storage = [c for c in node.named_children if c.type == "storage_class_specifier"]
            if any(self._text(c) == "static" for c in storage):
                for declarator, name, memory, const in self._variables(node):
                    self.statics.append(Variable(name, _line(declarator), memory, const,
                                                 function=function))
        found.sort(key=lambda pair: _order(pair[0]))
        return tuple(call for _, call in found)

    def _call(self, callee: ts.Node, function: str, space: ExecutionSpace | None) -> Call:
        return Call(callee=_compact(self._text(callee)), name=_callee_name(callee, self._text),
                    line=_line(callee), function=function, space=space)

    def _asm_text(self, node: ts.Node) -> str:
        parts: list[str] = []
        stack = [node.child_by_field_name("assembly_code")]
        while stack:
            leaf = stack.pop()
            if leaf is None:
                continue
            if leaf.type in ("string_content", "escape_sequence", "raw_string_content"):
                parts.append(self._text(leaf))
            elif leaf.type == "identifier":  # a macro holding (part of) the assembly text
                for body in self.expansions.get(self._text(leaf), []):
                    parts.extend(t[1:-1] if t.startswith('"') else t for t in body)
            stack.extend(reversed(leaf.children))
        return "".join(parts)

    def _errors(self, node: ts.Node) -> Iterator[ParseError]:
        if node.is_error:
            yield ParseError(_line(node), normalize(self._text(node)))
        elif node.is_missing:
            yield ParseError(_line(node), f"missing {node.type}")
        elif node.has_error:
            for child in node.children:
                yield from self._errors(child)


Expansions = dict[str, list[list[str]]]  # object-like macro -> the tokens of each definition


def head_words(head: str, expansions: Expansions) -> tuple[set[str], set[str]]:
    """The words of ``head`` with object-like macros expanded: those every definition of a
    macro gives (certain), and those some definition gives (possible)."""
    certain: set[str] = set()
    possible: set[str] = set()
    for word in (t for t in tokens(head) if _WORD.fullmatch(t)):
        sure, maybe = _expand(word, expansions, 0)
        certain |= sure
        possible |= maybe
    return certain, possible


def _expand(word: str, expansions: Expansions, depth: int) -> tuple[set[str], set[str]]:
    alternatives = expansions.get(word)
    if not alternatives or depth > 4:
        return {word}, {word}
    per_alternative: list[set[str]] = []
    possible = {word}
    for body in alternatives:
        here: set[str] = set()
        for token in filter(_WORD.fullmatch, body):
            sure, maybe = _expand(token, expansions, depth + 1)
            here |= sure
            possible |= maybe
        per_alternative.append(here)
    return {word} | set.intersection(*per_alternative), possible


def _order(node: ts.Node) -> tuple[int, int]:
    """Source order, an enclosing node before the nodes inside it (query captures are not)."""
    return node.start_byte, -node.end_byte


def _in_order(nodes: list[ts.Node]) -> list[ts.Node]:
    return sorted(nodes, key=_order)


def _templated(node: ts.Node) -> ts.Node | None:
    """The function, type or variable a template declaration declares."""
    inner = [c for c in node.named_children if c.type != "template_parameter_list"]
    return inner[-1] if inner else None


def _unwrap(declarator: ts.Node) -> ts.Node | None:
    """The next declarator inward: through pointers, references, arrays and initializers."""
    inner = declarator.child_by_field_name("declarator")
    if inner is not None:
        return inner
    # a reference_declarator names its inner declarator without a field
    named = [c for c in declarator.named_children if c.type != "type_qualifier"]
    return named[-1] if declarator.type == "reference_declarator" and named else None


def _declarator_name(declarator: ts.Node, text: _TextOf) -> str | None:
    node: ts.Node | None = declarator
    while node is not None:
        if node.type in _NAME_LEAVES or node.type == "qualified_identifier":
            return _compact(text(node))
        if node.type == "template_function":
            return _compact(text(node.child_by_field_name("name"))) or None
        node = _unwrap(node)
    return None


def _is_function_declarator(declarator: ts.Node) -> bool:
    node: ts.Node | None = declarator
    while node is not None and node.type in ("pointer_declarator", "reference_declarator"):
        node = _unwrap(node)
    if node is None or node.type != "function_declarator":
        return False
    # `Foo g(n)` is a prototype or a variable made by a constructor; only the second has
    # arguments that cannot be parameters (literals, expressions)
    params = node.child_by_field_name("parameters")
    return params is None or all(
        p.type.endswith("parameter_declaration") or p.type == "comment"
        for p in params.named_children)


def _is_const(declarator: ts.Node, certain: set[str]) -> bool:
    node: ts.Node | None = declarator
    if node is not None and node.type == "init_declarator":
        node = node.child_by_field_name("declarator")
    if node is not None and node.type == "pointer_declarator":
        # `const T* p` is a mutable pointer; `T* const p` is not
        return any(c.type == "type_qualifier" and c.text in (b"const", b"constexpr")
                   for c in node.named_children)
    return bool(certain & {"const", "constexpr"})


def _callee_name(callee: ts.Node, text: _TextOf) -> str:
    node: ts.Node | None = callee
    while node is not None:
        if node.type in _NAME_LEAVES:
            return _compact(text(node))
        if node.type in ("qualified_identifier", "template_function"):
            node = node.child_by_field_name("name")
        elif node.type == "field_expression":
            node = node.child_by_field_name("field")
        else:
            return ""
    return ""
