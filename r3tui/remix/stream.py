"""A stencil's neighbours along one axis kept in registers while each thread walks that axis
(register streaming), read from the parse.

A kernel that gives each thread one point of a 3-D (or 2-D) grid, with its index along z (or y)
``int k = blockIdx.z * blockDim.z + threadIdx.z;``, a linear index whose term in ``k`` is
``k * S`` (``long long idx = k * sz + j * sy + i;``) and reads of an array it never writes at
``in[idx - S]``, ``in[idx]`` and ``in[idx + S]``, loads each value of that column three times,
once for each point that reads it.  The rewrite gives each thread ``R3_STREAM`` consecutive
points along the axis (a tunable, 1 2 4 8 16, declared with ``// r3: work_per_thread
R3_STREAM z``: the search launches a grid that many times smaller along it) and walks them in a
loop.  ``in[idx]`` of one point is ``in[idx + S]`` of the point before, so the three values
rotate in registers and each point loads one new value, ``in[idx + S]``.

What loads where: at the first point of a thread ``in[idx]`` (every point the bound check lets
through reads it in the original), and ``in[idx - S]`` where ``k > 0``; at every point
``in[idx + S]`` where the point after passes the bound check.  Each is the centre of a point
the original reads the centre of, so nothing is read that the original does not read, and
every point computes with the same values in the same order: the results are the original's
bits.  That needs the bound check on ``k`` to be one that, passed at ``k``, is passed below it
(``k >= n`` or ``k > n`` ending the thread, with the other indices' checks), and ``S`` and the
index never assigned again.

``R3_STREAM`` 1, the default, is one point a thread, as recorded.

It declines where the threads of a block work together, where the axis's index is read
elsewhere (``gridDim``, a second ``blockIdx``), where something other than the grid indices
comes before the bound check, where the check is not such a ``return``, where the index
``idx`` or the stride ``S`` is assigned after its declaration or the array is written, where a
``return`` sits inside a loop or a ``switch``/``goto`` is in the body, and on an application's
kernel (its host code sets the grid).
"""

from __future__ import annotations

import random
import re

import tree_sitter as ts

from r3tui.analysis.kernels import Parsed
from r3tui.analysis.per_thread import (
    GridIndex,
    Unsupported,
    axis_alone,
    check_alone,
    grid_indices,
    single_init,
    statements,
    walk,
    write_target,
)
from r3tui.analysis.text import mask
from r3tui.remix.rule_base import defined_kernel, read_only_arrays
from r3tui.remix.tile import _UNCONDITIONAL

MACRO = "R3_STREAM"
FACTORS = (1, 2, 4, 8, 16)
Declined = Unsupported

_ARITHMETIC = re.compile(
    r"^(?:unsigned\s+|signed\s+)?(?:char|short|int|long|long\s+long|float|double)$")
_LOOPS = ("for_statement", "while_statement", "do_statement", "for_range_loop")


def stream(source: str, kernel: str, rng: random.Random) -> tuple[str, str]:
    """``source`` with ``kernel`` walking ``R3_STREAM`` points a thread along z or y, the
    neighbours along that axis rotating in registers (the new text, and what changed);
    :class:`Declined` when it cannot be."""
    body, parsed, span = defined_kernel(source, kernel)
    check_alone(body, parsed)
    masked = mask(parsed.text(body))
    indices = grid_indices(body, parsed)
    axes = [ix for ix in indices if ix.axis in "yz" and axis_alone(masked, ix.axis)]
    if not axes:
        raise Declined("no index `int k = blockIdx.A * blockDim.A + threadIdx.A;` along z or y "
                       "at the top of the body whose axis is read nowhere else")
    # the arrays the walk may keep in registers: read only, of an arithmetic element type
    readable = read_only_arrays(source, span, lambda t: _ARITHMETIC.match(t) is not None,
                                through_ldg=True)
    reasons = []
    for ix in rng.sample(axes, len(axes)):
        try:
            return _Streaming(source, body, parsed, ix, indices, readable).rewrite()
        except Declined as exc:
            reasons.append(f"{ix.axis}: {exc}")
    raise Declined("; ".join(reasons))


class _Streaming:
    """One rewrite along the axis of ``ix``."""

    def __init__(self, source: str, body: ts.Node, parsed: Parsed, ix: GridIndex,
                 indices: list[GridIndex], readable: dict[str, str]) -> None:
        self.source, self.body, self.parsed, self.ix = source, body, parsed, ix
        self.readable = readable
        for name in (MACRO, "r3_k0", "r3_s"):
            if re.search(rf"\b{name}\b", source):
                raise Declined(f"{name} is already a name in the source")
        self.top = statements(body)
        index_ids = {i.node.id for i in indices}
        self.guard_at = next((n for n, node in enumerate(self.top)
                              if node.type != "comment" and node.id not in index_ids),
                             len(self.top))
        if self.guard_at == len(self.top):
            raise Declined("nothing follows the grid indices")
        self.condition = self._guard(self.top[self.guard_at])
        self.rest = self.top[self.guard_at + 1:]
        if not self.rest:
            raise Declined("nothing follows the bound check")

    def text(self, node: ts.Node) -> str:
        return self.parsed.text(node)

    def at(self, byte: int) -> int:
        return self.parsed.char(byte)

    # ---- the reading ----------------------------------------------------------------------

    def _guard(self, node: ts.Node) -> str:
        """The bound check's condition: ``if (A || k >= n || ...) return;`` where the terms
        that read ``k`` bound it from above and the others do not read it."""
        k = self.ix.name
        consequence = node.child_by_field_name("consequence")
        condition = node.child_by_field_name("condition")
        if (node.type != "if_statement" or condition is None or consequence is None
                or node.child_by_field_name("alternative") is not None):
            raise Declined("the first statement after the grid indices is not a bound check "
                           f"`if (... {k} >= n ...) return;`")
        if re.sub(r"[\s{};]", "", self.text(consequence)) != "return":
            raise Declined("the bound check does more than return")
        cond = condition.named_children[0] if condition.named_children else condition
        bounded = False
        for term in _operands(cond, "||", deep=True):
            if any(n.type in ("call_expression", "subscript_expression", "field_expression",
                              "pointer_expression", "assignment_expression",
                              "update_expression") and not self._grid_field(n)
                   for n in walk(term)):
                raise Declined(f"the bound check reads more than values: {self.text(term)}")
            if not self._reads(term, k):
                continue
            operator = term.child_by_field_name("operator")
            left, right = term.child_by_field_name("left"), term.child_by_field_name("right")
            if (term.type != "binary_expression" or operator is None or left is None
                    or right is None or operator.type not in (">=", ">")
                    or self.text(left).strip() != k or self._reads(right, k)):
                raise Declined(f"the check `{self.text(term)}` on {k} is not `{k} >= n` or "
                               f"`{k} > n`: passed at {k}, it may fail below")
            bounded = True
        if not bounded:
            raise Declined(f"the bound check does not bound {k} from above")
        return self.text(cond)

    def _grid_field(self, node: ts.Node) -> bool:
        return node.type == "field_expression" and re.fullmatch(
            r"(blockIdx|threadIdx|blockDim|gridDim)\s*\.\s*[xyz]", self.text(node)) is not None

    def _reads(self, node: ts.Node, name: str) -> bool:
        return any(n.type == "identifier" and self.text(n) == name for n in walk(node))

    def _assigned(self, nodes: list[ts.Node], name: str) -> bool:
        for node in nodes:
            for n in walk(node):
                target = write_target(n)
                if target is None and n.type == "pointer_expression" and self.text(
                        n).startswith("&"):  # its address taken
                    target = n.child_by_field_name("argument")
                if target is not None and re.sub(r"[\s()]", "", self.text(target)) == name:
                    return True
        return False

    def _linear_index(self) -> tuple[int, str, str]:
        """(where in the rest, the index's name, the stride S) of the first declaration in
        the rest whose value is a sum with one term in ``k``, ``k * S`` or ``S * k``."""
        k = self.ix.name
        for n, node in enumerate(self.rest):
            init = single_init(node)
            if init is None:
                continue
            name, value = init
            terms = _operands(value, "+", deep=True)
            with_k = [t for t in terms if self._reads(t, k)]
            if len(with_k) != 1:
                continue
            factors = _operands(with_k[0], "*", deep=False)
            if len(factors) != 2:
                continue
            stride = [f for f in factors if self.text(f).strip() != k]
            if len(stride) != 1 or stride[0].type != "identifier":
                continue
            return n, self.text(name), self.text(stride[0])
        raise Declined(f"no index declared after the bound check as a sum with the term "
                       f"`{k} * S` (as `long long idx = {k} * sz + j * sy + i;`)")

    # ---- the rewrite ----------------------------------------------------------------------

    def rewrite(self) -> tuple[str, str]:
        k, axis = self.ix.name, self.ix.axis
        for node in self.rest:
            for n in walk(node):
                if n.type in ("switch_statement", "goto_statement"):
                    raise Declined(f"line {n.start_point[0] + 1}: a {n.type.split('_')[0]} "
                                   "in the body (the walk's loop would change what it jumps to)")
                if n.type == "return_statement" and any(
                        a.type in _LOOPS for a in _ancestors(n, self.body)):
                    raise Declined(f"line {n.start_point[0] + 1}: a return inside a loop")
        if self._assigned(self.rest, k):
            raise Declined(f"{k} is assigned in the body")
        at, idx, stride = self._linear_index()
        if any(n.type == "return_statement" for node in self.rest[:at + 1] for n in walk(node)):
            raise Declined(f"a return before {idx} is declared (the walk loads the next "
                           "point's values there, on every point)")
        after = self.rest[at + 1:]
        if self._assigned(after, idx) or self._assigned(self.rest, stride):
            raise Declined(f"{idx} or {stride} is assigned after its declaration")
        forms = {"center": {idx}, "next": {f"{idx}+{stride}", f"{stride}+{idx}"},
                 "prev": {f"{idx}-{stride}"}}
        reads: dict[str, dict[str, list[ts.Node]]] = {}
        for node in after:
            for n in walk(node):
                if n.type != "subscript_expression":
                    continue
                base = n.child_by_field_name("argument")
                index = n.child_by_field_name("indices") or n.child_by_field_name("index")
                if base is None or index is None or base.type != "identifier":
                    continue
                inner = re.sub(r"\s+", "", self.text(index)).strip("[]")
                for role, texts in forms.items():
                    if inner in texts:
                        reads.setdefault(self.text(base), {}).setdefault(role, []).append(n)
        arrays = {}
        for array, roles in reads.items():
            if "center" not in roles or not ({"prev", "next"} & set(roles)):
                continue
            if array in self.readable and self._center_on_every_path(after, roles["center"]):
                arrays[array] = (self.readable[array], roles)
        if not arrays:
            raise Declined(f"no array the kernel only reads at {idx} and {idx} +/- {stride} "
                           "(a parameter of arithmetic type, never written, never taken the "
                           "address of)")
        return self._text(k, axis, idx, stride, arrays, after), (
            f"streamed along {axis}: {MACRO} points a thread, "
            + ", ".join(f"{a}[{idx} - {stride}], {a}[{idx}], {a}[{idx} + {stride}]"
                        for a in arrays) + " rotating in registers")

    def _center_on_every_path(self, after: list[ts.Node], centers: list[ts.Node]) -> bool:
        """Whether every point the bound check lets through reads ``array[idx]``: at the top
        level of the rest, or in each ``if`` that returns before it (then in its block,
        unconditionally, and the block's one return its last statement), so the centre of
        any such point is an element the original reads and the walk may load it for the
        point's neighbours."""
        ids = {n.id for n in centers}

        def unconditional_in(scope: ts.Node) -> bool:
            for n in walk(scope):
                if n.id not in ids:
                    continue
                up = n.parent
                while up is not None and up.id != scope.id and up.type in _UNCONDITIONAL:
                    up = up.parent
                if up is not None and up.id == scope.id:
                    return True
            return False

        for node in after:
            if unconditional_in(node) and node.type != "if_statement":
                return True
            returns = any(n.type == "return_statement" for n in walk(node))
            if not returns:
                continue
            consequence = node.child_by_field_name("consequence")
            if (node.type != "if_statement" or consequence is None
                    or consequence.type != "compound_statement"
                    or node.child_by_field_name("alternative") is not None
                    or not unconditional_in(consequence)):
                return False
            # its one return ends its block: every point that enters reads the centre first
            inside = statements(consequence)
            returns_inside = [n for n in walk(consequence) if n.type == "return_statement"]
            if not inside or returns_inside != [inside[-1]]:
                return False
        return False

    def _text(self, k: str, axis: str, idx: str, stride: str,
              arrays: dict[str, tuple[str, dict[str, list[ts.Node]]]],
              after: list[ts.Node]) -> str:
        src, ix = self.source, self.ix
        indent = self.parsed.indent_at(ix.node.start_byte)
        inner = indent + "    "
        first = self.rest[0]
        last = self.rest[-1]
        decl_end = self.at(self.rest[len(self.rest) - len(after) - 1].end_byte)
        # edits inside the rest, by character offset: (start, end, new text)
        edits: list[tuple[int, int, str]] = []
        names = {}
        for array, (_element, roles) in arrays.items():
            names[array] = {role: f"r3_{role}_{array}" for role in ("prev", "center", "next")}
            for role, nodes in roles.items():
                edits += [(self.at(n.start_byte), self.at(n.end_byte), names[array][role])
                          for n in nodes]
        for node in self.rest:
            edits += [(self.at(n.start_byte), self.at(n.end_byte), "continue;")
                      for n in walk(node) if n.type == "return_statement"]
        live_next = re.sub(rf"\b{k}\b", f"({k} + 1)", self.condition)
        loads = []
        for array, (element, roles) in arrays.items():
            r = names[array]
            zero = f"({element})0"
            first_loads = [f"{r['center']} = {array}[{idx}];"]
            then = []
            if "prev" in roles:
                first_loads.append(f"{r['prev']} = {k} > 0 ? {array}[{idx} - {stride}] : {zero};")
                then.append(f"{r['prev']} = {r['center']};")
            then.append(f"{r['center']} = {r['next']};" if "next" in roles
                        else f"{r['center']} = {array}[{idx}];")
            loads.append(f"{indent}if (r3_s == 0) {{\n"
                         + "".join(f"{inner}{line}\n" for line in first_loads)
                         + f"{indent}}} else {{\n"
                         + "".join(f"{inner}{line}\n" for line in then)
                         + f"{indent}}}\n")
            if "next" in roles:
                loads.append(f"{indent}{r['next']} = !({live_next}) ? "
                             f"{array}[{idx} + {stride}] : {zero};\n")
        edits.append((decl_end, decl_end, "\n" + "".join(loads).rstrip("\n")))
        start, end = self.at(first.start_byte), self.at(last.end_byte)
        rest = src[start:end]
        for a, b, new in sorted(edits, key=lambda e: e[0], reverse=True):
            rest = rest[:a - start] + new + rest[b - start:]
        rest = "\n".join(("    " + line) if line.strip() else line
                         for line in rest.splitlines())
        declared = "".join(
            f"{inner}{element} " + ", ".join(f"{names[a][role]} = ({element})0"
                                             for role in ("prev", "center", "next")) + ";\n"
            for a, (element, _roles) in arrays.items())
        head = (f"// r3: tune {MACRO} {' '.join(map(str, FACTORS))}\n"
                f"{indent}// r3: work_per_thread {MACRO} {axis}\n"
                f"#ifndef {MACRO}\n#define {MACRO} 1\n#endif\n"
                f"{indent}const {ix.type} r3_k0 = (blockIdx.{axis} * blockDim.{axis} + "
                f"threadIdx.{axis}) * {MACRO};")
        guard = self.top[self.guard_at]
        loop = (f"{declared}"
                f"{indent}for (int r3_s = 0; r3_s < {MACRO}; ++r3_s) {{\n"
                f"{inner}{ix.type} {k} = r3_k0 + r3_s;\n"
                f"{inner}if ({self.condition}) break;\n"
                f"{inner}{rest.lstrip()}\n"
                f"{indent}}}")
        out = (src[:self.at(ix.node.start_byte)] + head
               + src[self.at(ix.node.end_byte):self.at(guard.start_byte)]
               + loop.lstrip() + src[end:])
        return out


def _operands(node: ts.Node, operator: str, deep: bool) -> list[ts.Node]:
    """The operands of ``node`` as a chain of ``operator`` (``a + b + c`` -> a, b, c, with
    ``deep``; one level without), parentheses around it dropped; ``[node]`` otherwise."""
    while node.type == "parenthesized_expression" and node.named_children:
        node = node.named_children[0]
    op = node.child_by_field_name("operator")
    left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
    if (node.type != "binary_expression" or op is None or op.type != operator
            or left is None or right is None):
        return [node]
    if not deep:
        return [left, right]
    return _operands(left, operator, deep) + _operands(right, operator, deep)


def _ancestors(node: ts.Node, stop: ts.Node) -> list[ts.Node]:
    out = []
    current = node.parent
    while current is not None and current.id != stop.id:
        out.append(current)
        current = current.parent
    return out
