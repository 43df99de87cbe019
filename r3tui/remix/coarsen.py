"""Thread coarsening with the kernel's loops jammed (register blocking), read from the parse.

A kernel that gives each thread one output along an axis of the grid
(``int row = blockIdx.y * blockDim.y + threadIdx.y;``, then a bound check) is rewritten so
that each thread computes ``R3_CF_Y`` outputs along that axis, a tunable (1 2 4 8) declared
with ``// r3: work_per_thread R3_CF_Y y``: the search launches a grid that many times smaller
along y, and 1 is the original's work, thread for thread.

The rewrite is *unroll-and-jam*, not a loop around the body.  The index and every local that
depends on it (through its initializer, or by being assigned where the index is read) become
arrays of ``R3_CF`` elements; a statement that reads them runs once per element in a fully
unrolled loop (``r3_cy``), innermost: a loop whose header does not depend on the index
stays one loop, so what its iterations load that does not depend on the index (sgemm's row of
``B``, nbody's other body) is loaded once for all ``R3_CF`` outputs, which then sit in
registers.  A ``return`` that ends a thread's work (``if (row >= M) return;``, or an
``if (i < n) { ... }`` around the rest of the body) clears that element's ``r3_live`` flag
instead, and the statements after the last such guard are written twice: once for a thread
whose elements are all live (no flag checks, so the loads they share can be merged) and once
that checks each element's flag.

It declines, with the reason, where the threads of a block work together (barriers, shared
memory, warp operations), where the grid's extent along the axis is read elsewhere
(``gridDim``, a second ``blockIdx``), where the index is ordered against something but has no
upper bound check (a grid covering more elements could run past the work), where a statement
that depends on the index leaves the thread early from anywhere but such a guard, or where code
the parser could not read is in the body (:mod:`r3tui.analysis.per_thread` reads all of that
from the parse). An index the kernel orders nowhere (``unchecked_axes``: the host sized the
work to the grid) is coarsened without live flags, and the variant declares ``// r3: exact A``:
the search and ``r3 apply`` keep its grids covering the work exactly. Everything here is a text
transform on ``source``; nothing is compiled.
"""

from __future__ import annotations

import itertools
import random
import re

import tree_sitter as ts

from r3tui.analysis.body import kernel_body
from r3tui.analysis.kernels import Parsed
from r3tui.analysis.per_thread import (
    GridIndex,
    IndexDependence,
    Unsupported,
    axis_alone,
    check_alone,
    declared_name,
    grid_indices,
    single_element_axes,
    statements,
    unchecked_axes,
    walk,
)
from r3tui.analysis.text import mask

FACTORS = (1, 2, 4, 8)

# why a kernel cannot be coarsened: the rule declines with it
Declined = Unsupported


def coarsen(source: str, kernel: str, rng: random.Random,
            axes: str | None = None) -> tuple[str, str]:
    """``source`` with ``kernel`` coarsened along two axes, or one where no two can be,
    chosen by ``rng`` among those it can be (the new text, and what changed);
    :class:`Declined` when it cannot be.  ``axes`` ("y", "x, y"): those axes only.

    Two axes come first: each factor's values include 1, so a two-axis variant holds both
    one-axis ones, and the search sizes each factor.  The rule does not coarsen a coarsened
    kernel again, so a child coarsened along one axis never gets the other: sgemm's rule
    drew x, y and x+y a third each, and over session 42's six campaigns (H200) the two seeds
    whose x+y child came early reached 0.34 of cuBLAS, the four others 0.24-0.29.  At the
    campaigns' size (1290^3, H100, session 43, the recorded 16x16, tiles of 32, e3b5971):
    4x4 outputs 2.117x [2.115, 2.123], 2x4 2.094x [2.086, 2.113], four along y alone 1.468x
    [1.465, 1.472] (bench/results/2026-12-07-gpu-s43-h100.txt, calls 6 and 5)."""
    found = kernel_body(source, kernel)
    if found is None:
        raise Declined(f"no __global__ function {kernel!r} is defined in the source")
    body, parsed = found
    check_alone(body, parsed)
    masked = mask(parsed.text(body))
    indices = [ix for ix in grid_indices(body, parsed) if axis_alone(masked, ix.axis)]
    # an axis with one element of work (``if (... || layer != 0) return;``) gains nothing
    # from more elements a thread; sgemm's choices along z behaved as their other axis alone
    # (H200, session 42: 6 of 23 coarsened children in six campaigns were x+z or y+z, and
    # the two seeds whose x+y child came early reached 0.34 of cuBLAS, the others 0.24-0.29)
    single = single_element_axes(body, parsed, indices)
    if single and len(single) < len(indices):
        indices = [ix for ix in indices if ix.axis not in single]
    # axes whose index nothing bounds: the grid covers the work exactly (host code sized it)
    unchecked = frozenset(unchecked_axes(source, kernel))
    if not indices:
        raise Declined("no index `int i = blockIdx.A * blockDim.A + threadIdx.A;` at the top "
                       "of the body whose axis A is read nowhere else (blockIdx, threadIdx, "
                       "blockDim and gridDim)")
    # two axes at once (a tile of elements a thread) before one; a choice that declines
    # leaves the others to try
    pairs = list(itertools.combinations(indices, 2))
    singles = [(ix,) for ix in indices]
    ordered = rng.sample(pairs, len(pairs)) + rng.sample(singles, len(singles))
    if axes is not None:
        ordered = [c for c in ordered if ", ".join(ix.axis for ix in c) == axes]
        if not ordered:
            raise Declined(f"no axes {axes} to coarsen along")
    reasons = []
    for chosen in ordered:
        try:
            return _Coarsening(source, body, parsed, chosen, unchecked).rewrite()
        except Declined as exc:
            reasons.append(f"{', '.join(ix.axis for ix in chosen)}: {exc}")
    raise Declined("; ".join(reasons))


class _Coarsening(IndexDependence):
    """One rewrite: the text the analysis gives for the indices ``indices``."""

    def __init__(self, source: str, body: ts.Node, parsed: Parsed,
                 indices: tuple[GridIndex, ...], unchecked: frozenset[str] = frozenset()
                 ) -> None:
        self.factors = {ix.axis: f"R3_CF_{ix.axis.upper()}" for ix in indices}
        # chosen axes whose index the kernel never bounds: every element is within the work
        # when the grid covers it exactly, which the variant declares (`// r3: exact A`)
        self.exact = tuple(ix.axis for ix in indices if ix.axis in unchecked)
        # the elements a thread: r3_cf of them, element r3_e
        self.factor, self.c, self.live, self.all = "r3_cf", "r3_e", "r3_live", "r3_all"
        for name in (*self.factors.values(), self.factor, self.c, self.live, self.all):
            if re.search(rf"\b{name}\b", source):
                raise Declined(f"{name} is already a name in the source")
        super().__init__(source, body, parsed, indices)

    # ---- the rewrite ----------------------------------------------------------------------

    def rewrite(self) -> tuple[str, str]:
        names = self.dependent
        kinds = [self.kind(n, names, top=True) for n in self.top]
        where = {ix.node.id for ix in self.indices}
        at = next(k for k, n in enumerate(self.top) if n.id in where)
        guards = [k for k, kind in enumerate(kinds) if kind == "guard"]
        closing = self.top[self.closing_at()] if self.flattened() else None
        conditions = [(k, self.guard_parts(self.top[k], names)) for k in guards]
        first = at  # where every chosen index has been bounded
        for ix in self.indices:
            bounding = [k for k, parts in conditions if parts is not None
                        and self.bounds(parts[0], enclosing=False, name=ix.name)]
            if closing is not None:
                condition = closing.child_by_field_name("condition")
                if condition is not None and self.bounds(condition, enclosing=True,
                                                          name=ix.name):
                    bounding.append(self.closing_at())
            if not bounding:
                if ix.axis in self.exact:
                    continue  # nothing bounds it anywhere: the grid will cover it exactly
                raise Declined(f"no guard bounds {ix.name} from above (`if ({ix.name} >= n) "
                               f"return;` or `if ({ix.name} < n) {{ ... }}`): a grid covering "
                               "more elements would run past the work")
            first = max(first, min(bounding))
        for k in range(at + 1, first):
            if kinds[k] in ("each", "declaration", "kept") and self.touches_memory(self.top[k]):
                raise Declined(f"line {self.line(self.top[k])}: memory is accessed with the "
                               "index before its bound is checked")
        stops = sorted(set(guards) | ({self.closing_at()} if closing is not None else set()))
        if not stops:  # no guard at all: every element is within the (exactly covered) work
            return self._unguarded(at)
        last = stops[-1]
        lines = self._indent(self.indices[0].node)
        # the element count first: a dependent local declared before the index (`int i, j;
        # float mu;` at the top of an older kernel) is an array of that many
        parts: list[str] = [self._factor_text(lines)]
        for k, node in enumerate(self.top):
            if k > last:
                break
            parts.extend(self._leading(node, lines))
            if k == at:
                parts.append(self._index_text(lines))
            elif node.id in where:
                continue  # declared with the first
            elif closing is not None and k == self.closing_at():
                condition = closing.child_by_field_name("condition")
                assert condition is not None
                parts.append(self._loop(
                    lines, f"if ({self.live}[{self.c}] && !{self._each(condition)}) "
                           f"{{ {self.live}[{self.c}] = false; }}"))
            elif kinds[k] == "guard":
                parts.append(self._guard_text(node, lines))
            else:
                parts.append(self._emit(node, kinds[k], live=k > stops[0], indent=lines))
        rest = [(n, kinds[k]) for k, n in enumerate(self.top) if k > last]
        if rest:
            inner = lines + "    "
            fast = self._block(rest, live=False, indent=inner)
            slow = self._block(rest, live=True, indent=inner, comments=False)
            parts.append(
                f"{lines}bool {self.all} = true;\n"
                + self._loop(lines, f"{self.all} = {self.all} && {self.live}[{self.c}];")
                + f"{lines}if ({self.all}) {{  // every element is within the work: no checks\n"
                + "\n".join(t.rstrip("\n") for t in fast)
                + f"\n{lines}}} else {{\n"
                + "\n".join(t.rstrip("\n") for t in slow) + f"\n{lines}}}")
        return self._finish(parts)

    def _unguarded(self, at: int) -> tuple[str, str]:
        """The rewrite of a kernel that bounds none of the chosen indices: the statements
        after the index run for every element, without flags."""
        lines = self._indent(self.indices[0].node)
        parts = [self._factor_text(lines)]
        where = {ix.node.id for ix in self.indices}
        for k, node in enumerate(self.top[:at + 1]):
            parts.extend(self._leading(node, lines))
            if k == at:
                parts.append(self._index_text(lines))
            elif node.id not in where:
                parts.append(self._emit(node, self.kind(node, self.dependent, top=True),
                                        live=False, indent=lines))
        rest = [(n, self.kind(n, self.dependent, top=True)) for n in self.top[at + 1:]]
        parts.extend(self._block(rest, live=False, indent=lines))
        return self._finish(parts)

    def _finish(self, parts: list[str]) -> tuple[str, str]:
        names = self.dependent
        closing_indent = self.parsed.indent_at(self.body.end_byte - 1)
        new_body = ("{\n" + "".join(p.rstrip("\n") + "\n" for p in parts) + closing_indent + "}")
        begin, end = self.parsed.char(self.body.start_byte), self.parsed.char(self.body.end_byte)
        out = self.source[:begin] + new_body + self.source[end:]
        axes = ", ".join(ix.axis for ix in self.indices)
        exact = (f"; the grid covers the work exactly along {', '.join(self.exact)} (nothing "
                 "bounds the index there)" if self.exact else "")
        return out, (f"{', '.join(ix.name for ix in self.indices)} coarsened along {axes}: "
                     f"{' x '.join(self.factors.values())} elements a thread, each in "
                     f"{{{' '.join(map(str, FACTORS))}}}, the loops jammed "
                     f"({len(names) - len(self.indices)} locals held per element){exact}")

    def _leading(self, node: ts.Node, indent: str) -> list[str]:
        """The comments on the lines just before ``node``, at ``indent``."""
        out: list[str] = []
        previous = node.prev_sibling
        while previous is not None and previous.type == "comment":
            out.append(indent + self.text(previous))
            previous = previous.prev_sibling
        return out[::-1]

    def _indent(self, node: ts.Node) -> str:
        return self.parsed.indent_at(node.start_byte)

    def _loop(self, indent: str, inner: str) -> str:
        inner = inner.rstrip()
        shifted = "\n".join(indent + "    " + line if line.strip() else ""
                            for line in inner.split("\n"))
        return (f"{indent}#pragma unroll\n"
                f"{indent}for (int {self.c} = 0; {self.c} < {self.factor}; ++{self.c}) {{\n"
                f"{shifted}\n{indent}}}\n")

    def _factor_text(self, indent: str) -> str:
        """The tunables and the element count."""
        factors = " ".join(str(f) for f in FACTORS)
        out = []
        for ix in self.indices:
            macro = self.factors[ix.axis]
            out.append(f"{indent}// r3: tune {macro} {factors}\n"
                       f"{indent}// r3: work_per_thread {macro} {ix.axis}\n"
                       + (f"{indent}// r3: exact {ix.axis}\n" if ix.axis in self.exact else "")
                       + f"#ifndef {macro}\n#define {macro} 1\n#endif\n")
        out.append(f"{indent}constexpr int {self.factor} = "
                   f"{' * '.join(self.factors.values())};\n")
        return "".join(out)

    def _index_text(self, indent: str) -> str:
        """Each index's elements and their live flags."""
        out = []
        inner, stride = [], ""
        for ix in self.indices:
            a, macro = ix.axis, self.factors[ix.axis]
            element = self.c + (f" / ({stride})" if stride else "") + (
                f" % {macro}" if len(self.indices) > 1 else "")
            if a == "x":  # consecutive threads keep consecutive elements: loads coalesce
                value = f"(blockIdx.x * {macro} + {element}) * blockDim.x + threadIdx.x"
            else:  # one thread's elements are neighbours along the axis
                value = f"(blockIdx.{a} * blockDim.{a} + threadIdx.{a}) * {macro} + {element}"
            out.append(f"{indent}{ix.type} {ix.name}[{self.factor}];\n")
            inner.append(f"{ix.name}[{self.c}] = {value};")
            stride = f"{stride} * {macro}" if stride else macro
        out.append(f"{indent}bool {self.live}[{self.factor}];\n")
        inner.append(f"{self.live}[{self.c}] = true;")
        return "".join(out) + self._loop(indent, "\n".join(inner))

    def _guard_text(self, node: ts.Node, indent: str) -> str:
        parts = self.guard_parts(node, self.dependent)
        assert parts is not None
        condition, consequence = parts
        stop = f"{self.live}[{self.c}] = false;"
        if consequence.type == "return_statement":
            inner = stop
        else:
            held = statements(consequence)
            inner = "\n".join(self._each(n, replace={held[-1].id: stop}
                                         if n.id == held[-1].id else None)
                              if n.type != "comment" else self.text(n) for n in held)
            for n in held[:-1]:
                if n.type != "comment":
                    self.check_each(n)
        return self._loop(indent, f"if ({self.live}[{self.c}] && {self._each(condition)}) {{\n"
                                  f"    {inner.replace(chr(10), chr(10) + '    ')}\n}}")

    def _each(self, node: ts.Node, replace: dict[int, str] | None = None) -> str:
        """``node``'s text with each dependent local read as its element ``[r3_c]``."""
        held = self.dependent
        inside = self.declared_within(node)
        edits: list[tuple[int, int, str]] = []
        replace = replace or {}
        stack = [node]
        while stack:
            n = stack.pop()
            if n.id in replace:
                edits.append((n.start_byte, n.end_byte, replace[n.id]))
                continue
            if n.type == "identifier" and self.text(n) in held and self.text(n) not in inside:
                edits.append((n.end_byte, n.end_byte, f"[{self.c}]"))
            stack.extend(n.children)
        data = self.parsed.data
        out, cursor = [], node.start_byte
        for start, end, new in sorted(edits):
            out.append(data[cursor:start].decode())
            out.append(new)
            cursor = end
        out.append(data[cursor:node.end_byte].decode())
        return "".join(out)

    def _block(self, items: list[tuple[ts.Node, str]], *, live: bool, indent: str,
               comments: bool = True) -> list[str]:
        """The rewritten statements of one block: each run of statements that run per element
        (and declarations of dependent locals) becomes one loop over the elements, the
        run's arrays declared before it."""
        out: list[str] = []
        arrays: list[str] = []
        each: list[str] = []

        def flush() -> None:
            out.extend(arrays)
            if each:
                inner = "\n".join(each)
                if live:
                    inner = (f"if ({self.live}[{self.c}]) {{\n    "
                             + inner.replace("\n", "\n    ") + "\n}")
                out.append(self._loop(indent, inner).rstrip("\n"))
            arrays.clear()
            each.clear()

        for k, (node, kind) in enumerate(items):
            notes = [t.strip() for t in self._leading(node, "")] if comments else []
            following = items[k + 1][1] if k + 1 < len(items) else None
            if node.type == "preproc_call" and following == "each":
                each.append(self.text(node).strip())  # a pragma goes with its loop
            elif kind == "each":
                self.check_each(node)
                each.extend(notes)
                each.append(self._reindent(self._each(node), node, ""))
            elif kind == "declaration":
                declared, assignments = self._declaration(node)
                arrays.extend(indent + d for d in declared)
                if assignments:
                    each.extend(notes)
                    each.extend(assignments)
            else:
                flush()
                out.extend(indent + t for t in notes)
                out.append(self._emit(node, kind, live=live, indent=indent))
        flush()
        return out

    def _emit(self, node: ts.Node, kind: str, *, live: bool, indent: str) -> str:
        """The rewritten text of one statement of a block, at ``indent``."""
        if kind == "plain":
            if live and self.writes_memory(node):
                raise Declined(f"line {self.line(node)}: a statement after the bound check "
                               "writes memory without depending on the index (a thread "
                               "whose elements are all past the work would make it)")
            return indent + self._reindent(self.text(node).rstrip(), node, indent)
        if kind == "each":
            self.check_each(node)
            inner = self._each(node)
            inner = self._reindent(inner, node, "")
            if live:
                inner = f"if ({self.live}[{self.c}]) {{\n    " + inner.replace(
                    "\n", "\n    ") + "\n}"
            return self._loop(indent, inner).rstrip("\n")
        if kind == "declaration":
            return "\n".join(self._block([(node, kind)], live=live, indent=indent))
        assert kind == "kept"
        return indent + self._kept(node, live=live, indent=indent)

    def _reindent(self, text: str, node: ts.Node, indent: str) -> str:
        """A multi-line statement's later lines moved from its own indentation to
        ``indent``."""
        own = self._indent(node)
        lines = text.split("\n")
        return "\n".join([lines[0]] + [indent + (ln[len(own):] if ln.startswith(own)
                                                 else ln.lstrip())
                                       for ln in lines[1:]])

    def _kept(self, node: ts.Node, *, live: bool, indent: str) -> str:
        """A statement that runs once, with the blocks it holds rewritten."""
        data = self.parsed.data
        out, cursor = [], node.start_byte
        for block in self.blocks(node):
            out.append(data[cursor:block.start_byte].decode())
            inner = ([n for n in statements(block) if n.type != "comment"]
                     if block.type == "compound_statement" else [block])
            texts = self._block([(n, self.kind(n, self.dependent)) for n in inner], live=live,
                                indent=indent + "    ")
            out.append("{\n" + "\n".join(t.rstrip("\n") for t in texts) + f"\n{indent}}}")
            cursor = block.end_byte
        out.append(data[cursor:node.end_byte].decode())
        return "".join(out)

    def _declaration(self, node: ts.Node) -> tuple[list[str], list[str]]:
        """A declaration of dependent locals: each declared as an array of one value per
        element, with the assignment of its initializer to one element; a name it declares
        that does not depend on the index keeps a declaration of its own (several names:
        ``Real_t ax, ay, az;``, ``float mu, nu, b;``)."""
        declarators = node.children_by_field_name("declarator")
        if not declarators:
            raise Declined(f"line {self.line(node)}: a declaration the rule cannot read")
        data = self.parsed.data
        head = data[node.start_byte:declarators[0].start_byte].decode()
        if re.search(r"\b(?:auto|static|extern|constexpr)\b", head):
            raise Declined(f"line {self.line(node)}: an `auto`, static or constexpr local "
                           "that depends on the index")
        declared: list[str] = []
        assignments: list[str] = []
        for declarator in declarators:
            name = declared_name(declarator)
            if name is None:
                raise Declined(f"line {self.line(node)}: a declaration the rule cannot read")
            if self.text(name) not in self.dependent:
                value = declarator.child_by_field_name("value")
                if value is not None and any(n.type == "call_expression" and not self.pure(n)
                                             for n in walk(value)):
                    raise Declined(f"line {self.line(node)}: a declaration of several locals "
                                   "with a call among their initializers")
                declared.append(f"{head.rstrip()} {self.text(declarator)};")
                continue
            array, assignment = self._element_array(node, head, declarator, name)
            declared.append(array)
            if assignment is not None:
                assignments.append(assignment)
        return declared, assignments

    def _element_array(self, node: ts.Node, head: str, declarator: ts.Node, name: ts.Node
                       ) -> tuple[str, str | None]:
        """One dependent local as an array of one value per element, and the assignment of
        its initializer to one element (None without one)."""
        value = declarator.child_by_field_name("value") if (
            declarator.type == "init_declarator") else None
        inner = (declarator.child_by_field_name("declarator")
                 if declarator.type == "init_declarator" else declarator)
        if inner is None:
            raise Declined(f"line {self.line(node)}: a declaration the rule cannot read")
        if any(n.type in ("reference_declarator", "function_declarator")
               for n in walk(inner)):
            raise Declined(f"line {self.line(node)}: a reference that depends on the index")
        zeroed = False  # `double v[5] = {0};`: every element's array starts zeroed
        if value is not None and inner.type == "array_declarator" and re.fullmatch(
                r"\{\s*(?:0+(?:\.0*)?[fF]?\s*)?\}", self.text(value)):
            zeroed, value = True, None
        if value is not None and (inner.type == "array_declarator"
                                  or declarator.type != "init_declarator"):
            raise Declined(f"line {self.line(node)}: an initialized array that depends on "
                           "the index")
        if value is not None and value.type == "argument_list" and len(
                value.named_children) != 1:
            raise Declined(f"line {self.line(node)}: a constructor call that depends on the "
                           "index")
        data = self.parsed.data
        if inner.type in ("identifier", "array_declarator"):
            head = re.sub(r"\bconst\b\s*", "", head)
        declared = (data[inner.start_byte:name.end_byte].decode() + f"[{self.factor}]"
                    + data[name.end_byte:inner.end_byte].decode())
        if inner.type == "pointer_declarator":
            declared = re.sub(r"\*\s*const\b", "*", declared)
        # a brace initializer of a struct or a scalar is assigned as it is (an aggregate's
        # assignment from a braced list); an array's was declined above
        assignment = (f"{self.text(name)}[{self.c}] = {self._each(value)};"
                      if value is not None else None)
        return f"{head.rstrip()} {declared}{' = {}' if zeroed else ''};", assignment
