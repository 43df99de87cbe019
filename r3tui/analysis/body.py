"""What a kernel's body does with its pointer parameters and where its loops are, read from the
parse: the facts the rule operators rewrite by (:mod:`r3tui.remix.rules`).

A use of a pointer parameter ``p`` is one of

- ``read``: an element read, ``p[i]`` (or ``p[i].x``, ``p[i][j]``) used as a value; also the
  argument of ``__ldg(&p[i])``, which reads the element (``in_ldg``);
- ``const_alias``: the initializer of a ``const`` pointer, through pointer arithmetic
  (``const T* q = p;``, ``const T* row = p + r * n;``);
- ``other``: anything else -- written (``p[i] = ``, ``p[i] += ``, ``++p[i]``), its address
  taken (``&p[i]`` outside ``__ldg``), ``*p``, ``p + i``, passed on, or inside code the parser
  could not read (an error node).  The rules count it as a write: conservative.

Offsets are character offsets into the text given.
"""

from __future__ import annotations

from dataclasses import dataclass

import tree_sitter as ts

from r3tui.analysis.kernels import Parsed, base_name, declared_kernels


@dataclass(frozen=True)
class PointerUse:
    start: int  # the name
    kind: str  # "read", "const_alias" or "other"
    index_open: int | None = None  # a read's '['
    index_close: int | None = None  # and its ']'
    in_ldg: bool = False  # a read already made through __ldg(&p[i])


@dataclass(frozen=True)
class ForLoop:
    start: int  # the ``for`` keyword
    innermost: bool  # no for, while or do loop in its body
    # every loop in its body is a for loop under ``#pragma unroll`` (so after unrolling it is
    # straight-line code: rmsnorm's grid-stride loops around their unrolled element loops)
    inner_unrolled: bool = False
    # a statement of a ``{ }`` block, so a declaration may go on the line before it (not the
    # single statement of a brace-less ``if``, ``else``, ``for`` or ``while``)
    in_block: bool = True


def kernel_body(source: str, kernel: str) -> tuple[ts.Node, Parsed] | None:
    """The body of the first definition of ``kernel`` (``k``, or a qualified name such as
    ``ns::k<8>``, as a campaign on a templated kernel names it) in the parse of ``source``,
    with that parse's text (None: no definition)."""
    found, parsed = declared_kernels(source, base_name(kernel))
    for node, declaration in found:
        body = node.child_by_field_name("body")
        if declaration.defined and body is not None:
            return body, parsed
    return None


def _descendants(node: ts.Node, kind: str) -> list[ts.Node]:
    out, stack = [], [node]
    while stack:
        current = stack.pop()
        if current.type == kind:
            out.append(current)
        stack.extend(reversed(current.children))
    return out


def pointer_uses(source: str, kernel: str, name: str) -> list[PointerUse]:
    """Every use of the identifier ``name`` in the body of ``kernel``, in source order."""
    found = kernel_body(source, kernel)
    if found is None:
        return []
    body, parsed = found
    uses = [_classify(node, parsed) for node in _descendants(body, "identifier")
            if parsed.text(node) == name]
    return sorted(uses, key=lambda u: u.start)


def _classify(node: ts.Node, parsed: Parsed) -> PointerUse:
    at = parsed.char(node.start_byte)
    if _in_error(node):
        return PointerUse(at, "other")
    parent = node.parent
    assert parent is not None
    if parent.type == "subscript_expression" and parent.child_by_field_name("argument") == node:
        indices = parent.child_by_field_name("indices")
        if indices is None:
            return PointerUse(at, "other")
        open_at, close_at = parsed.char(indices.start_byte), parsed.char(indices.end_byte) - 1
        outer = parent  # through members and further subscripts: p[i].x, p[i][j]
        while outer.parent is not None and (
                (outer.parent.type == "field_expression"
                 and outer.parent.child_by_field_name("argument") == outer)
                or (outer.parent.type == "subscript_expression"
                    and outer.parent.child_by_field_name("argument") == outer)):
            outer = outer.parent
        above = outer.parent
        if above is None:
            return PointerUse(at, "other")
        if above.type == "assignment_expression" and above.child_by_field_name("left") == outer:
            return PointerUse(at, "other", open_at, close_at)
        if above.type == "update_expression":
            return PointerUse(at, "other", open_at, close_at)
        if above.type == "pointer_expression" and _operator(above, parsed) == "&":
            if outer is parent and _is_ldg_argument(above, parsed):
                return PointerUse(at, "read", open_at, close_at, in_ldg=True)
            return PointerUse(at, "other", open_at, close_at)
        return PointerUse(at, "read", open_at, close_at)
    value = node  # through pointer arithmetic: const T* row = p + r * n;
    while value.parent is not None and (
            value.parent.type == "parenthesized_expression"
            or (value.parent.type == "binary_expression"
                and _operator(value.parent, parsed) in ("+", "-"))):
        value = value.parent
    parent = value.parent
    assert parent is not None
    if parent.type == "init_declarator" and parent.child_by_field_name("value") == value:
        declarator = parent.child_by_field_name("declarator")
        declaration = parent.parent
        if (declarator is not None and declarator.type == "pointer_declarator"
                and declaration is not None and declaration.type == "declaration"
                and any(c.type == "type_qualifier" and parsed.text(c) == "const"
                        for c in declaration.children)):
            return PointerUse(at, "const_alias")
    return PointerUse(at, "other")


def _in_error(node: ts.Node) -> bool:
    """Inside an error node, or in a statement the parser could not read whole."""
    current: ts.Node | None = node
    statement_seen = False
    while current is not None and current.type != "function_definition":
        if current.type == "ERROR" or current.is_missing:
            return True
        if not statement_seen and (current.type.endswith("_statement")
                                   or current.type == "declaration"):
            if current.has_error:
                return True
            statement_seen = True
        current = current.parent
    return False


def _operator(node: ts.Node, parsed: Parsed) -> str:
    op = node.child_by_field_name("operator")
    return parsed.text(op) if op is not None else ""


def _is_ldg_argument(address: ts.Node, parsed: Parsed) -> bool:
    """``address`` (``&p[i]``) is the only argument of a call to ``__ldg``."""
    arguments = address.parent
    if arguments is None or arguments.type != "argument_list" or arguments.named_child_count != 1:
        return False
    call = arguments.parent
    function = call.child_by_field_name("function") if call is not None else None
    return function is not None and parsed.text(function) == "__ldg"


def for_loops(source: str, kernel: str) -> list[ForLoop]:
    """The ``for`` loops of ``kernel``'s body, in source order."""
    found = kernel_body(source, kernel)
    if found is None:
        return []
    body, parsed = found
    loops = []
    for loop in _descendants(body, "for_statement"):
        inner = loop.child_by_field_name("body")
        nested = [] if inner is None else [
            n for kind in ("for_statement", "while_statement", "do_statement", "for_range_loop")
            for n in _descendants(inner, kind)]
        unrolled = bool(nested) and all(
            n.type == "for_statement" and _under_unroll_pragma(n, parsed) for n in nested)
        parent = loop.parent
        loops.append(ForLoop(parsed.char(loop.start_byte), not nested, unrolled,
                             parent is not None and parent.type == "compound_statement"))
    return sorted(loops, key=lambda f: f.start)


def _under_unroll_pragma(loop: ts.Node, parsed: Parsed) -> bool:
    before = loop.prev_named_sibling
    return (before is not None and before.type == "preproc_call"
            and parsed.text(before).split()[:2] == ["#pragma", "unroll"])


def body_identifiers(source: str, kernel: str) -> set[str]:
    """The identifiers ``kernel``'s body names (macros included, as the parser reads them):
    whether a ``#define`` reaches the kernel."""
    found = kernel_body(source, kernel)
    if found is None:
        return set()
    body, parsed = found
    kinds = ("identifier", "type_identifier", "field_identifier")
    return {parsed.text(n) for kind in kinds for n in _descendants(body, kind)}


def scalar_aliases(source: str) -> dict[str, str]:
    """``typedef double Real_t;`` and ``using Index_t = int;`` of ``source``: alias -> the
    type it names, followed through aliases of aliases (LULESH's element types)."""
    import re

    from r3tui.analysis.cuda import ItemKind, parse_translation_unit

    aliases: dict[str, str] = {}
    for item in parse_translation_unit(source).items:
        if item.kind is not ItemKind.ALIAS or not item.name:
            continue
        text = " ".join(item.text.split())
        match = (re.fullmatch(rf"typedef (.+) {re.escape(item.name)} ;", text)
                 or re.fullmatch(rf"using {re.escape(item.name)} = (.+) ;", text))
        if match and "{" not in match.group(1) and "(" not in match.group(1):
            aliases[item.name] = match.group(1)
    for name in list(aliases):
        seen = {name}
        while aliases[name] in aliases and aliases[name] not in seen:
            seen.add(aliases[name])
            aliases[name] = aliases[aliases[name]]
    return aliases


def declared_names(snippet: str) -> set[str]:
    """The names that ``snippet`` (statements of a function body, as a worked example shows
    them) declares: its locals, ``for`` counters and ``__shared__`` arrays."""
    from r3tui.analysis.per_thread import declared_name

    wrapper = "r3_snippet"
    found = kernel_body(f"__global__ void {wrapper}()\n{{\n{snippet}\n}}\n", wrapper)
    if found is None:
        return set()
    body, parsed = found
    names = set()
    for declaration in _descendants(body, "declaration"):
        for declarator in declaration.children_by_field_name("declarator"):
            name = declared_name(declarator)
            if name is not None:
                names.add(parsed.text(name))
    return names
