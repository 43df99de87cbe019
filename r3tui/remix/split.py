"""A thread's long loop split over several threads (the inverse of coarsening), read from the
parse.

A kernel that gives each thread one element along x (``int row = blockIdx.x * blockDim.x +
threadIdx.x;``) and, for that element, sums over a loop (spmv's row of nonzeros, nbody's other
bodies, a dot product) runs one loop per thread: with few elements most of the GPU's thread
slots stay empty, and each thread walks its loop alone.  The rewrite gives each element
``R3_SPLIT`` neighbouring threads of a warp, a tunable (1 2 4 8 16 32) declared with
``// r3: threads_per_item R3_SPLIT x``: the search launches a grid that many times larger
along x, and 1 is the original, thread for thread.

Those threads share the element's index (``row = (blockIdx.x * blockDim.x + threadIdx.x) /
R3_SPLIT``), so everything before the loop, bound checks included, is the same in each of
them.  Thread ``r3_lane`` of the group runs iterations ``start + r3_lane``, ``+ R3_SPLIT``, and so
on, adding into its own copies of the loop's sums (started at zero in every thread but the
first, which keeps the value the sum had before the loop); after the loop the group adds its
sums together with ``__shfl_xor_sync`` over its own lanes, and only its first thread goes on
(``if (r3_lane != 0) return;``), so what follows the loop, the stores, happens once.
``// r3: require BLOCK_X % R3_SPLIT == 0`` keeps each group within one block and one warp.

The loop must be a ``for`` at the top of the body (or of an ``if (row < n) { ... }`` closing
it) after the index, that declares its counter, tests it with ``<`` or ``<=`` and steps it by
one, and whose only effects are sums: locals declared before it, of a type the shuffle takes,
updated only by ``+=``/``-=`` of what does not read any of them.  It declines, with the
reason, where the threads of a block work together, where the x axis is read elsewhere, where
a statement before the loop writes memory (each thread of the group would), and where the loop
leaves early (``break``, ``return``), writes memory, or carries a value from one iteration to
the next other than through such a sum.  The sums are added in another order, so a
floating-point result may differ in its last bits (the recordings' tolerances decide); integer
sums are exact.  The grid's x extent, times ``R3_SPLIT``, must stay below 2^32 threads.
"""

from __future__ import annotations

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
    counted_loop,
    declared_name,
    grid_indices,
    lvalue_base,
    resolved_type,
    walk,
    write_target,
)
from r3tui.analysis.text import mask

FACTORS = (1, 2, 4, 8, 16, 32)
MACRO, LANE, MASK, OFFSET = "R3_SPLIT", "r3_lane", "r3_mask", "r3_o"

# why a loop cannot be split: the rule declines with it
Declined = Unsupported

# the types __shfl_xor_sync takes (and `= 0` starts)
_SHUFFLED = re.compile(
    r"^(?:(?:unsigned|signed)\s+)?(?:int|long|long\s+long|short|unsigned|float|double)"
    r"(?:\s+int)?$")


def split_loop(source: str, kernel: str, rng: random.Random) -> tuple[str, str]:
    """``source`` with one of ``kernel``'s summing loops split over ``R3_SPLIT`` threads an
    element, chosen by ``rng`` among those that can be (the new text, and what changed);
    :class:`Declined` when none can be."""
    found = kernel_body(source, kernel)
    if found is None:
        raise Declined(f"no __global__ function {kernel!r} is defined in the source")
    body, parsed = found
    check_alone(body, parsed)
    masked = mask(parsed.text(body))
    indices = [ix for ix in grid_indices(body, parsed) if ix.axis == "x"]
    if not indices or not axis_alone(masked, "x"):
        raise Declined("no index `int i = blockIdx.x * blockDim.x + threadIdx.x;` at the top "
                       "of the body whose axis x is read nowhere else (blockIdx, threadIdx, "
                       "blockDim and gridDim)")
    for name in (MACRO, LANE, MASK, OFFSET):
        if re.search(rf"\b{name}\b", source):
            raise Declined(f"{name} is already a name in the source")
    reading = IndexDependence(source, body, parsed, (indices[0],))
    loops, reasons = [], []
    at = next(k for k, n in enumerate(reading.top) if n.id == indices[0].node.id)
    for k, node in enumerate(reading.top):
        if k > at and node.type == "for_statement":
            try:
                loops.append(_Loop(reading, k))
            except Declined as exc:
                reasons.append(f"line {reading.line(node)}: {exc}")
    if not loops:
        raise Declined("no loop to split: " + ("; ".join(reasons) if reasons else
                                              "no `for` at the top of the body after the index"))
    return _rewrite(source, parsed, reading, indices[0], rng.choice(loops))


class _Loop:
    """One ``for`` statement of the top of the body, read as a summing loop: its counter,
    the parts to edit, and its sums (local name -> type)."""

    def __init__(self, reading: IndexDependence, k: int) -> None:
        self.k, self.node = k, reading.top[k]
        self.reading = reading
        loop = counted_loop(reading, self.node)
        self.counter, self.start = loop.counter, loop.start
        self.update, self.body = loop.update, loop.body
        self.sums = self._sums()
        # the loop's start and end are each thread's own, read where the sums already differ
        # between a group's threads (started at zero in all but the first)
        for part, what in ((loop.start, "start"), (loop.condition, "test")):
            if reading.mentions(part, set(self.sums)):
                raise Declined(f"the loop's {what} reads a sum")

    def _sums(self) -> dict[str, str]:
        """Every local the loop's body writes that is declared outside it, each a sum."""
        r, body = self.reading, self.body
        assert body is not None
        for n in walk(body):
            if n.type == "return_statement":
                raise Declined("the loop returns from the kernel")
            left = _target(n) if n.type == "break_statement" else None
            if left is not None and left.id == self.node.id:
                raise Declined("the loop may end early (`break`)")
        if r.writes_memory(body):
            raise Declined("the loop writes memory or calls what might")
        inside = r.declared_within(body)
        sums: dict[str, str] = {}
        for n in walk(body):
            target = write_target(n)
            if target is None:
                continue
            base = lvalue_base(target)
            name = r.text(base) if base is not None else ""
            if name in inside:
                continue
            if name == self.counter:
                raise Declined(f"the loop's body assigns its counter {name}")
            operator = n.child_by_field_name("operator")
            if (n.type != "assignment_expression" or target.type != "identifier"
                    or operator is None or r.text(operator) not in ("+=", "-=")):
                raise Declined(f"{name} is carried from one iteration to the next, not only "
                               "summed (`+=`, `-=`)")
            sums[name] = ""
        if not sums:
            raise Declined("the loop sums into no local")
        for name in sums:
            sums[name] = self._sum_type(name)
        # a sum is read only where it is added to: its terms read none of them
        for n in walk(body):
            if n.type == "identifier" and r.text(n) in sums:
                parent = n.parent
                if (parent is None or parent.type != "assignment_expression"
                        or parent.child_by_field_name("left") is None
                        or parent.child_by_field_name("left").id != n.id):  # type: ignore[union-attr]
                    raise Declined(f"the loop reads the sum {r.text(n)} (line {r.line(n)})")
        return sums

    def _sum_type(self, name: str) -> str:
        """The type of the sum ``name``, declared before the loop at the top of the body."""
        r = self.reading
        for node in r.top[:self.k]:
            if node.type != "declaration" or name not in r.declared_by(node):
                continue
            declarator = next(d for d in node.children_by_field_name("declarator")
                              if (n := declared_name(d)) is not None and r.text(n) == name)
            if declarator.type not in ("init_declarator", "identifier") or (
                    declarator.type == "init_declarator"
                    and declarator.child_by_field_name("declarator").type != "identifier"):  # type: ignore[union-attr]
                raise Declined(f"the sum {name} is not a plain local")
            head = r.parsed.data[node.start_byte:node.children_by_field_name(
                "declarator")[0].start_byte].decode().strip()
            kind = re.sub(r"^(?:const\s+|volatile\s+|register\s+)+", "", head)
            if (not _SHUFFLED.match(resolved_type(kind, r.source))
                    and kind not in _type_parameters(r.body)):
                raise Declined(f"the sum {name} is a {kind}, which a shuffle does not add")
            if re.search(r"\b(?:const|volatile|static)\b", head):
                raise Declined(f"the sum {name} is declared {head}")
            return kind
        raise Declined(f"the sum {name} is not declared at the top of the body before the loop")


def _type_parameters(body: ts.Node) -> set[str]:
    """The names of the template's type parameters, for a templated kernel (a sum of type
    ``T``: whether the shuffle takes the type it is instantiated with, the compile says)."""
    function = body.parent
    template = function.parent if function is not None else None
    if template is None or template.type != "template_declaration":
        return set()
    parameters = template.child_by_field_name("parameters")
    names: set[str] = set()
    for parameter in parameters.named_children if parameters is not None else ():
        if parameter.type == "type_parameter_declaration":
            names.update(c.text.decode() for c in parameter.named_children
                         if c.type == "type_identifier" and c.text is not None)
    return names


def _target(node: ts.Node) -> ts.Node | None:
    """The loop (or switch) a ``break`` leaves."""
    up = node.parent
    while up is not None:
        if up.type in ("for_statement", "while_statement", "do_statement", "for_range_loop",
                       "switch_statement"):
            return up
        up = up.parent
    return None


def _rewrite(source: str, parsed: Parsed, reading: IndexDependence, index: GridIndex,
             loop: _Loop) -> tuple[str, str]:
    top = reading.top
    closing = reading.closing_at() if reading.flattened() else None
    for k, node in enumerate(top[:loop.k]):
        if k == closing or node.id == index.node.id:
            continue
        if reading.writes_memory(node):
            raise Declined(f"line {reading.line(node)}: a statement before the loop writes "
                           "memory, which each thread of an element's group would")
    edits: list[tuple[int, int, str]] = []
    indent = parsed.indent_at(index.node.start_byte)
    factors = " ".join(str(f) for f in FACTORS)
    line_start = parsed.line_start(index.node.start_byte)
    edits.append((line_start, line_start,
                  f"{indent}// r3: tune {MACRO} {factors}\n"
                  f"{indent}// r3: threads_per_item {MACRO} x\n"
                  f"{indent}// r3: require BLOCK_X % {MACRO} == 0\n"
                  f"#ifndef {MACRO}\n#define {MACRO} 1\n#endif\n"))
    value = next(d.child_by_field_name("value")
                 for d in index.node.children_by_field_name("declarator"))
    assert value is not None
    edits.append((value.start_byte, value.end_byte,
                  f"({index.type})((blockIdx.x * blockDim.x + threadIdx.x) / {MACRO})"))
    edits.append((index.node.end_byte, index.node.end_byte,
                  f"\n{indent}const int {LANE} = (int)(threadIdx.x % {MACRO});"))
    # the sums start at zero in every thread but the first, before the loop (and before the
    # pragmas that go with it)
    first = loop.k
    while first > 0 and top[first - 1].type == "preproc_call":
        first -= 1
    at = parsed.line_start(top[first].start_byte)
    loop_indent = parsed.indent_at(loop.node.start_byte)
    zero = " ".join(f"{name} = 0;" for name in loop.sums)
    edits.append((at, at, f"{loop_indent}if ({LANE} != 0) {{ {zero} }}\n"))
    start = reading.text(loop.start)
    if not re.fullmatch(r"\w+", start):
        start = f"({start})"
    edits.append((loop.start.start_byte, loop.start.end_byte, f"{start} + {LANE}"))
    assert loop.update is not None
    edits.append((loop.update.start_byte, loop.update.end_byte,
                  f"{loop.counter} += {MACRO}"))
    inner = loop_indent + "    "
    adds = "\n".join(f"{inner}    {name} += __shfl_xor_sync({MASK}, {name}, {OFFSET}, "
                     f"{MACRO});" for name in loop.sums)
    edits.append((loop.node.end_byte, loop.node.end_byte,
                  f"\n{loop_indent}{{  // the group's sums added together, in every thread\n"
                  f"{inner}// the group's lanes: {MACRO} of them, from a multiple of {MACRO}\n"
                  f"{inner}const unsigned {MASK} = (0xffffffffu >> (32 - {MACRO})) << (\n"
                  f"{inner}    (threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * "
                  f"threadIdx.z)) % 32u / {MACRO} * {MACRO});\n"
                  f"{inner}#pragma unroll\n"
                  f"{inner}for (int {OFFSET} = {MACRO} / 2; {OFFSET} > 0; {OFFSET} /= 2) {{\n"
                  f"{adds}\n{inner}}}\n{loop_indent}}}\n"
                  f"{loop_indent}if ({LANE} != 0) {{\n"
                  f"{inner}return;  // the rest, once an element\n{loop_indent}}}"))
    out = source
    for begin, end, new in sorted(edits, reverse=True):
        out = out[:parsed.char(begin)] + new + out[parsed.char(end):]
    sums = ", ".join(f"{name} ({kind})" for name, kind in loop.sums.items())
    return out, (f"the loop over {loop.counter} (line {reading.line(loop.node)}) split over "
                 f"{MACRO} threads an element, each in {{{factors}}}, its sums {sums} added "
                 "with warp shuffles")
