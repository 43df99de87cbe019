"""A loop's shared reads staged in shared memory, tile by tile (shared-memory tiling), read
from the parse.

Where each thread of a block walks the same loop (``for (int k = 0; k < K; ++k)``, its start
and end the same in every thread) and reads elements that other threads of the block read too,
the rewrite loads those elements once per block into shared memory, ``R3_TILE`` iterations at a
time, and the loop reads them from there.  Which reads are shared follows from their index: a
read whose index depends on the counter and on one of the thread's grid indices (``int row =
blockIdx.y * blockDim.y + threadIdx.y;``) and on nothing else that differs between threads is
the same for every thread of the block with the same ``threadIdx.y``: sgemm's ``A[row * K +
k]`` is read by a whole row of the block, its ``B[k * N + col]`` by a whole column; a read
that depends on the counter alone (nbody's ``pos[j]``) is the same for every thread.

Each such read gets a tile of ``blockDim.A x R3_TILE`` elements (``R3_TILE`` for a read of the
counter alone) in dynamic shared memory, declared with ``// r3: shared`` so the search launches
each point with its own size.  For each tile of iterations every thread of the block, the
ones past the bounds included, takes its share of the loads, then a barrier, the original
loop over the tile's iterations reads the tiles, and a barrier again.  Threads that a bound
check ends (``if (row >= M || col >= N) return;``) still take part in the loads and the
barriers before they return, so every thread reaches every barrier.  Those barriers are
elsewhere in the code than the others' (and a warp may hold threads of both kinds), so they
are PTX's ``barrier.sync`` (``R3_BARRIER()``), which counts each thread where it arrives:
``__syncthreads()`` is the ``.aligned`` form, undefined unless every thread of the block runs
the same one.

A tile's element is loaded only where the original reads it: where the iteration is within
the loop and the thread at that place of the block (the first one along the other axes) passes
the bound checks.  That thread exists and reads the element itself in the original, so a tile
loads nothing the original does not.  The checks must therefore be ones that, passed by a
thread, are passed by every thread before it along each axis (``i >= n``, ``i > n``, ``i !=
0`` ending the thread, or ``i < n``, ``i <= n``, ``i == 0`` around its work), each reading one
index at most and nothing that differs between threads.

``R3_TILE`` is a tunable (0 4 8 16 32 64 128 256); 0, the default, compiles the original
(``#if R3_TILE > 0``), so the variant launches like the recording at its defaults.  The loop
runs in the same order, so every result is the same to the bit.

The loop's start and end may read parameters, macros and locals that every thread holds the
same value in (declared before the bound checks, from those alone, reading no memory and never
assigned again).

A kernel the coarsening rule has register-blocked (each thread computing several outputs held
in arrays) is tiled by :mod:`r3tui.remix.tile_blocked`: the two together are what a fast
naive matrix product needs.

It declines where the block's threads already work together (barriers, shared memory, warp
operations), where a thread's position is read other than through its grid indices, where the
loop's start or end reads memory or another local, where the loop leaves early or writes memory,
where a staged read is conditional (in an ``if``, a ``? :``, after ``&&``) or reads an array
the kernel also writes, where a return before the loop is not such a check, and on an
application's kernel (its host code sets the launch's shared memory).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass

import tree_sitter as ts

from r3tui.analysis.kernels import Parsed
from r3tui.analysis.per_thread import (
    CountedLoop,
    GridIndex,
    IndexDependence,
    Unsupported,
    check_alone,
    counted_loop,
    grid_indices,
    lvalue_base,
    walk,
    write_target,
)
from r3tui.analysis.text import mask
from r3tui.remix.rule_base import defined_kernel, read_only_arrays

TILES = (0, 4, 8, 16, 32, 64, 128, 256)
# the tiles a child first tries (`// r3: first`), larger tiles paying more up to 64 on every
# kernel measured (H100, session 38, bench/rule_gains.py at the recorded block, best over the
# coarsening factors): coarsened sgemm at 2048^3 2.06x with a tile of 8, 2.58x (16), 2.70x (32),
# 2.70x (64); at 1290^3 1.14x, 1.26x, 1.31x, 1.32x; nbody's tile alone 0.87x (4), 1.05x (8),
# 1.45x (32), 1.50x (64), 1.54x (256)
FIRST_TILES = (64, 32)
MACRO, SMEM, STAGE, K0, BARRIER = "R3_TILE", "r3_smem", "r3_stage", "r3_k0", "R3_BARRIER"
# the threads a check ends meet the others at barriers of their own, elsewhere in the code:
# `__syncthreads()` (`bar.sync`, PTX's `barrier.sync.aligned`) is undefined there, where
# `barrier.sync` without `.aligned` (sm_70 and later) counts each thread where it arrives
BARRIER_ASM = 'asm volatile("barrier.sync 0;" ::: "memory")'
MAX_TILES = 4

Declined = Unsupported

# the element types a tile holds, and their sizes in bytes (the `// r3: shared` expression
# needs them as numbers)
SIZES = {
    "char": 1, "unsigned char": 1, "signed char": 1, "short": 2, "unsigned short": 2,
    "int": 4, "unsigned": 4, "unsigned int": 4, "float": 4, "long long": 8,
    "unsigned long long": 8, "long long int": 8, "double": 8, "int2": 8, "uint2": 8,
    "float2": 8, "int4": 16, "uint4": 16, "float4": 16, "double2": 16,
}
_BLOCK = {"x": "BLOCK_X", "y": "BLOCK_Y", "z": "BLOCK_Z"}
# where a staged read may sit between its loop's body and itself: it then runs once in
# every iteration (not under an if, a `? :`, or the right of `&&`/`||`)
_UNCONDITIONAL = frozenset({
    "compound_statement", "expression_statement", "declaration", "init_declarator",
    "assignment_expression", "binary_expression", "parenthesized_expression",
    "cast_expression", "unary_expression", "field_expression", "argument_list",
    "call_expression", "subscript_argument_list", "subscript_expression", "comma_expression",
    "initializer_list", "type_descriptor",
})
_DEAD_OPS = {">=": "up", ">": "up", "!=": "zero"}  # `if (i OP e) return;`
_LIVE_OPS = {"<": "up", "<=": "up", "==": "zero"}  # `if (i OP e) { ... }`
_MIRROR = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "==": "==", "!=": "!="}


@dataclass(frozen=True)
class _Tile:
    """One staged read: the array, its index (as written), the grid axis its index reads (None:
    the counter alone), the element type and where it is read in the loop."""

    array: str
    index: str
    axis: str | None
    element: str
    reads: tuple[ts.Node, ...]

    @property
    def size(self) -> int:
        return SIZES[self.element]


def tile_loop(source: str, kernel: str, rng: random.Random) -> tuple[str, str]:
    """``source`` with one of ``kernel``'s loops reading its shared elements from shared
    memory tiles, chosen by ``rng`` among those that can be (the new text, and what changed);
    :class:`Declined` when none can be."""
    body, parsed, span = defined_kernel(source, kernel)
    from r3tui.remix.tile_blocked import coarsened, tile_coarsened

    if coarsened(source, kernel):  # register-blocked by the coarsening rule: tiles on top
        return tile_coarsened(source, kernel, rng)
    check_alone(body, parsed)
    for name in (MACRO, SMEM, STAGE, K0, BARRIER, *STAGING_NAMES, "r3_e"):
        if re.search(rf"\b{name}\b", source):
            raise Declined(f"{name} is already a name in the source")
    if re.search(r"//\s*r3:\s*shared\b", source):
        raise Declined("the source declares its dynamic shared memory already")
    indices = grid_indices(body, parsed)
    axes = [ix.axis for ix in indices]
    masked = mask(parsed.text(body))
    if len(set(axes)) != len(axes) or len(re.findall(r"\bthreadIdx\b", masked)) != len(axes):
        raise Declined("the body reads threadIdx other than in one index an axis "
                       "(`int i = blockIdx.x * blockDim.x + threadIdx.x;`)")
    reading = IndexDependence(source, body, parsed, tuple(indices))
    names = {ix.name for ix in indices}
    for n in walk(body):
        target = write_target(n)
        if target is None and n.type == "pointer_expression" and parsed.text(n).startswith("&"):
            target = n.child_by_field_name("argument")
        base = lvalue_base(target) if target is not None else None
        if base is not None and parsed.text(base) in names:
            raise Declined(f"line {reading.line(n)}: the body assigns the index "
                           f"{parsed.text(base)}")
    staged = read_only_arrays(source, span, SIZES.__contains__)
    loops, reasons = [], []
    for k, node in enumerate(reading.top):
        if node.type == "for_statement":
            try:
                loops.append(_Loop(reading, k, indices, staged))
            except Declined as exc:
                reasons.append(f"line {reading.line(node)}: {exc}")
    if not loops:
        raise Declined("no loop to tile: " + ("; ".join(reasons) if reasons else
                                             "no `for` at the top of the body"))
    return _rewrite(source, parsed, reading, indices, rng.choice(loops))


class _Loop:
    """A ``for`` of the top of the body whose start and end are the same in every thread,
    read for what its iterations read that other threads read too, and the bound checks
    before it."""

    def __init__(self, reading: IndexDependence, k: int, indices: list[GridIndex],
                 staged: dict[str, str]) -> None:
        self.reading, self.k, self.node = reading, k, reading.top[k]
        self.indices = indices
        r = reading
        loop = self.counted = counted_loop(reading, self.node)
        self.counter, self.counter_type, self.start = loop.counter, loop.counter_type, loop.start
        self.condition, self.op, self.end, self.body = (loop.condition, loop.op, loop.end,
                                                        loop.body)
        uniform = self._uniform_locals()
        for part, what in ((self.start, "start"), (self.end, "end")):
            local = self._local_in(part, uniform)
            if local is not None:
                raise Declined(f"the loop's {what} reads the local {local}, which the "
                               "block's threads may not share")
            if r.touches_memory(part):
                raise Declined(f"the loop's {what} reads memory")
        for n in walk(self.body):
            if n.type in ("return_statement", "break_statement", "continue_statement",
                          "goto_statement"):
                raise Declined(f"the loop may leave an iteration early "
                               f"({r.text(n).rstrip(';')}, line {r.line(n)})")
            target = write_target(n)
            base = lvalue_base(target) if target is not None else None
            if base is not None and r.text(base) == self.counter:
                raise Declined(f"the loop's body assigns its counter {self.counter}")
        if r.writes_memory(self.body):
            raise Declined("the loop writes memory or calls what might")
        # a staged read's names are the index and the counter: a local of the body by one of
        # those names would be another variable under the same name
        hidden = r.declared_within(self.body) & {ix.name for ix in indices}
        if hidden:
            raise Declined(f"the loop's body declares {', '.join(sorted(hidden))}, the name of "
                           "an index")
        self.tiles, why = self._tiles(staged)
        if not self.tiles:
            raise Declined("no read of the loop is shared by the block's threads"
                           + (f" ({'; '.join(why)})" if why else ""))
        self.guards, self.closing = self._guards()

    def _uniform_locals(self) -> set[str]:
        """Locals every thread of the block holds the same value in, declared before any
        bound check (so the threads a check ends know the loop's extent too): computed from
        parameters, macros and such locals only, reading no memory, never assigned again."""
        r = self.reading
        names = {ix.name for ix in self.indices}
        assigned = {r.text(b) for n in walk(r.body) if (t := write_target(n)) is not None
                    and (b := lvalue_base(t)) is not None}
        uniform: set[str] = set()
        for node in r.top[:self.k]:
            if node.type == "if_statement" or any(
                    n.type == "return_statement" for n in walk(node)):
                break  # a bound check (or the closing `if`): the prefix ends
            if node.type != "declaration":
                continue
            for declarator in node.children_by_field_name("declarator"):
                name = declarator.child_by_field_name("declarator")
                value = declarator.child_by_field_name("value")
                if (declarator.type != "init_declarator" or name is None
                        or name.type != "identifier" or value is None):
                    continue
                text = r.text(name)
                if (text in names or text in assigned or text in r.dependent
                        or r.touches_memory(value)
                        or self._local_in(value, uniform) is not None):
                    continue
                uniform.add(text)
        return uniform

    def _local_in(self, node: ts.Node, allowed: set[str] | None = None) -> str | None:
        r = self.reading
        for n in walk(node):
            if n.type == "identifier" and r.text(n) in r.locals and r.text(n) not in (
                    allowed or set()):
                return r.text(n)
        return None

    def _tiles(self, staged: dict[str, str]) -> tuple[list[_Tile], list[str]]:
        r, body = self.reading, self.body
        assert body is not None
        by_name = {ix.name: ix.axis for ix in self.indices}
        found: dict[tuple[str, str], list[ts.Node]] = {}
        axes: dict[tuple[str, str], str | None] = {}
        why: list[str] = []
        for n in walk(body):
            if n.type != "subscript_expression":
                continue
            array = n.child_by_field_name("argument")
            index = n.child_by_field_name("indices")
            if array is None or index is None or array.type != "identifier" \
                    or r.text(array) not in staged:
                continue
            read = f"{r.text(array)}{r.text(index)}"
            if not r.mentions(index, {self.counter}):
                continue
            local = self._local_in(index, {self.counter, *by_name})
            if local is not None:
                why.append(f"{read} reads {local}")
                continue
            if r.touches_memory(index):
                why.append(f"{read}'s index reads memory")
                continue
            read_axes = {by_name[r.text(i)] for i in walk(index)
                         if i.type == "identifier" and r.text(i) in by_name}
            if len(read_axes) > 1:
                why.append(f"{read} reads two of the thread's indices")
                continue
            if not self._unconditional(n):
                why.append(f"{read} is not read in every iteration")
                continue
            key = (r.text(array), re.sub(r"\s+", "", r.text(index)))
            found.setdefault(key, []).append(n)
            axes[key] = next(iter(read_axes), None)
        tiles = [_Tile(array, _index_text(r, reads[0]), axes[(array, key)], staged[array],
                       tuple(reads))
                 for (array, key), reads in found.items()][:MAX_TILES]
        # the widest elements first: each tile then starts at a multiple of its element size
        return sorted(tiles, key=lambda t: -t.size), why

    def _unconditional(self, node: ts.Node) -> bool:
        assert self.body is not None
        child, up = node, node.parent
        while up is not None and up.id != self.body.id:
            if up.type not in _UNCONDITIONAL:
                return False
            if up.type == "binary_expression":
                op = up.child_by_field_name("operator")
                right = up.child_by_field_name("right")
                if op is not None and self.reading.text(op) in ("&&", "||") \
                        and right is not None and right.id == child.id:
                    return False
            if up.type == "call_expression" and not self.reading.pure(up):
                return False
            child, up = up, up.parent
        return up is not None

    def _guards(self) -> tuple[list[ts.Node], ts.Node | None]:
        """The bound checks before the loop (``if (...) return;`` statements) and the
        ``if (...) { ... }`` closing the body around it, each checked for a form that a
        thread's predecessors along every axis pass when it does."""
        r = self.reading
        names = {ix.name for ix in self.indices}
        closing = None
        if r.flattened() and r.closing_at() < self.k:
            closing = r.top[r.closing_at()]
        guards = []
        for node in r.top[:self.k]:
            if closing is not None and node.id == closing.id:
                condition = node.child_by_field_name("condition")
                assert condition is not None
                self._check_condition(condition, "&&", _LIVE_OPS)
                continue
            parts = r.guard_parts(node, names) if node.type == "if_statement" else None
            if parts is not None:
                self._check_condition(parts[0], "||", _DEAD_OPS)
                guards.append(node)
            elif any(n.type == "return_statement" for n in walk(node)):
                raise Declined(f"line {r.line(node)}: a return before the loop that is not a "
                               "bound check")
        return guards, closing

    def _check_condition(self, condition: ts.Node, joiner: str, ops: dict[str, str]) -> None:
        r = self.reading
        names = {ix.name for ix in self.indices}
        for part in _split(condition, joiner, r.parsed):
            text = r.text(part)
            local = self._local_in(part, names)
            if local is not None or r.touches_memory(part):
                raise Declined(f"the bound check `{text}` reads "
                               + (f"the local {local}" if local else "memory"))
            read = {r.text(i) for i in walk(part) if i.type == "identifier"
                    and r.text(i) in names}
            if not read:
                continue  # the same in every thread
            if len(read) > 1 or part.type != "binary_expression":
                raise Declined(f"the bound check `{text}` is not one index against a bound")
            monotone(part, r.text, lambda n: r.text(n) in names,
                     lambda n: r.mentions(n, names), ops)


def monotone(part: ts.Node, text: Callable[[ts.Node], str], is_index: Callable[[ts.Node], bool],
             mentions_index: Callable[[ts.Node], bool], ops: dict[str, str]) -> None:
    """:class:`Declined` unless ``part`` (a comparison reading one index) is an upper bound
    on the index (or ``== 0``, ``!= 0``) of the kind ``ops`` allows: one that a thread's
    predecessors along every axis pass when it does."""
    op = part.child_by_field_name("operator")
    left = part.child_by_field_name("left")
    right = part.child_by_field_name("right")
    assert op is not None and left is not None and right is not None
    operator = text(op)
    if is_index(right):
        left, right, operator = right, left, _MIRROR.get(operator, "")
    kind = ops.get(operator)
    if not is_index(left) or mentions_index(right) or kind is None or (
            kind == "zero" and not re.fullmatch(r"0[uUlL]*", text(right).strip())):
        raise Declined(f"the bound check `{text(part)}` is not an upper bound (or `== 0`) "
                       "on one index, which a thread's predecessors pass when it does")


def _index_text(reading: IndexDependence, read: ts.Node) -> str:
    index = read.child_by_field_name("indices")
    assert index is not None
    return reading.text(index)


def _split(node: ts.Node, joiner: str, parsed: Parsed) -> list[ts.Node]:
    """``a || b || (c || d)`` -> ``[a, b, c, d]`` (parentheses around a part dropped)."""
    while node.type in ("parenthesized_expression", "condition_clause") \
            and len(node.named_children) == 1:
        node = node.named_children[0]
    op = node.child_by_field_name("operator")
    if node.type == "binary_expression" and op is not None and parsed.text(op) == joiner:
        left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
        assert left is not None and right is not None
        return _split(left, joiner, parsed) + _split(right, joiner, parsed)
    return [node]


def _access(tile: _Tile, counter: str) -> str:
    """Where a thread reads its element of ``tile`` in iteration ``counter``."""
    step = f"({counter} - {K0})"
    if tile.axis is None:
        return step
    if tile.axis == "x":
        return f"{step} * blockDim.x + threadIdx.x"
    return f"threadIdx.{tile.axis} * {MACRO} + {step}"


UNROLL = 8  # iterations of a whole tile's loop unrolled at once (a tile has up to 256)


def tile_pass(region: str, offset: int, reads: list[tuple[int, int, str]], loop: CountedLoop,
              indent: str, gate: str | None = None) -> str:
    """One tile's iterations of the loop ``region`` (its text from byte ``offset`` of the
    unit, the loop with any pragmas before it) with its staged ``reads`` replaced: for a whole
    tile (``K0 + R3_TILE`` within the loop's end) the loop counts ``R3_TILE`` iterations, a
    number the compiler knows, under ``#pragma unroll`` (unless the loop has a pragma of its
    own), so each iteration's place in the tiles is a constant; the last, partial tile runs the
    loop with both tests.  The iterations run in the same order either way.  A macro's name
    as ``gate`` makes that the macro's choice: non-zero, whole tiles; 0, every tile runs the
    loop with both tests (code that seldom runs, where the unrolled copy costs registers)."""
    raw = region.encode()
    counter, end = loop.counter, raw[loop.end.start_byte - offset:
                                     loop.end.end_byte - offset].decode()
    start = (loop.start.start_byte, loop.start.end_byte, K0)
    partial = [start, (loop.condition.end_byte, loop.condition.end_byte,
                       f" && {counter} < {K0} + {MACRO}"), *reads]
    whole = [start, (loop.condition.start_byte, loop.condition.end_byte,
                     f"{counter} < {K0} + {MACRO}"), *reads]

    def edited(edits: list[tuple[int, int, str]], pad: str) -> str:
        text = raw
        for begin, stop, new in sorted(edits, reverse=True):
            text = text[:begin - offset] + new.encode() + text[stop - offset:]
        return "\n".join((pad + line if line.strip() else line)
                         for line in text.decode().split("\n"))

    inner = indent + "    "
    unrolled = edited(whole, "        ")
    if not region.lstrip().startswith("#pragma"):
        unrolled = f"{inner}    #pragma unroll {UNROLL}\n{unrolled}"
    fits = f"{K0} + {MACRO} {'<=' if loop.op == '<' else '- 1 <='} ({end})"
    split = (f"{inner}if ({fits}) {{  // a whole tile\n{unrolled}\n{inner}}} else {{\n"
             f"{edited(partial, '        ')}\n{inner}}}")
    if gate is None:
        return split
    return f"#if {gate}\n{split}\n#else\n{edited(partial, '    ')}\n#endif"


def _rewrite(source: str, parsed: Parsed, reading: IndexDependence,
             indices: list[GridIndex], loop: _Loop) -> tuple[str, str]:
    r = reading
    top = r.top
    first = loop.k
    while first > 0 and top[first - 1].type == "preproc_call":
        first -= 1  # pragmas before the loop go with it, into both versions
    region_start = parsed.line_start(top[first].start_byte)
    indent = parsed.indent_at(loop.node.start_byte)
    inner = indent + "    "
    region = parsed.data[region_start:loop.node.end_byte].decode()
    start, end = r.text(loop.start), r.text(loop.end)
    ctype, counter = loop.counter_type, loop.counter

    # the tiled copies of the loop: its start, its test and its staged reads edited
    staged = [(read.start_byte, read.end_byte, f"r3_t{t}[{_access(tile, counter)}]")
              for t, tile in enumerate(loop.tiles) for read in tile.reads]
    tiled = tile_pass(region, region_start, staged, loop.counted, indent)
    outer = (f"{indent}for ({ctype} {K0} = {start}; {K0} {loop.op} {end}; {K0} += {MACRO}) {{\n"
             f"{inner}{STAGE}({K0});\n{inner}{BARRIER}();\n"
             f"{tiled}\n{inner}{BARRIER}();\n{indent}}}")
    edits = [(region_start, loop.node.end_byte,
              f"#if {MACRO} > 0\n{outer}\n#else\n{region}\n#endif")]

    # the threads a check ends take part in the loads and barriers first
    helper = (f"for ({ctype} {K0} = {start}; {K0} {loop.op} {end}; {K0} += {MACRO}) {{ "
              f"{STAGE}({K0}); {BARRIER}(); {BARRIER}(); }}")
    for guard in loop.guards:
        _, consequence = r.guard_parts(guard, {ix.name for ix in indices})  # type: ignore[misc]
        at = parsed.indent_at(guard.start_byte)
        if consequence.type == "return_statement":  # `if (...) return;`: braces around it
            edits.append((consequence.start_byte, consequence.end_byte,
                          f"{{\n#if {MACRO} > 0\n{at}    {helper}\n#endif\n{at}    "
                          f"{r.text(consequence)}\n{at}}}"))
        else:  # `if (...) { ...; return; }`: the loads and barriers before the return
            returns = [n for n in consequence.children if n.type == "return_statement"][-1]
            line = parsed.line_start(returns.start_byte)
            edits.append((line, line, f"#if {MACRO} > 0\n{parsed.indent_at(returns.start_byte)}"
                                      f"{helper}\n#endif\n"))
    if loop.closing is not None:
        at = parsed.indent_at(loop.closing.start_byte)
        edits.append((loop.closing.end_byte, loop.closing.end_byte,
                      f"\n#if {MACRO} > 0\n{at}else {{\n{at}    {helper}\n{at}}}\n#endif"))

    # the tiles and the loads, before the first check (or the loop)
    anchor = min([g.start_byte for g in loop.guards]
                 + ([loop.closing.start_byte] if loop.closing is not None else [])
                 + [top[first].start_byte])
    node = next(n for n in top if n.start_byte == anchor)
    while node.prev_sibling is not None and node.prev_sibling.type == "comment":
        node = node.prev_sibling  # the comments that go with the check stay with it
    at_line = parsed.line_start(node.start_byte)
    edits.append((at_line, at_line, _declarations(parsed.indent_at(node.start_byte), loop,
                                                  indices)))
    out = source
    for begin, stop, new in sorted(edits, key=lambda e: (e[0], e[1]), reverse=True):
        out = out[:parsed.char(begin)] + new + out[parsed.char(stop):]
    reads = ", ".join(f"{t.array}{re.sub(chr(10), ' ', t.index)}"
                      + (f" (shared along {'xyz'.replace(t.axis, '') or '-'})"
                         if t.axis else " (shared by the block)") for t in loop.tiles)
    return out, (f"the loop over {counter} (line {r.line(loop.node)}) reads {reads} from "
                 f"shared memory, {MACRO} iterations a tile, each in "
                 f"{{{' '.join(str(v) for v in TILES)}}} (0: the original)")


# the names the loader declares (a source that has one is declined)
STAGING_NAMES = ("r3_rank", "r3_team", "r3_p", "r3_q", "r3_n", "r3_dp", "r3_dq")


def staging_loop(indent: str, var: str, extent: str, along_axis: bool, counter: str,
                 counter_type: str, inner: list[str]) -> list[str]:
    """The loop by which the block's threads share a tile's ``extent * R3_TILE`` loads: the
    thread of rank ``r3_rank`` takes elements ``var`` = rank, rank + team, ..., each at place
    ``r3_p`` along the axis and iteration ``counter`` of the loop; ``inner``: the lines for one
    element (indented here).

    ``along_axis`` (a tile along x, ``extent`` places wide: neighbouring threads load
    neighbouring places): ``r3_p`` and the iteration ``r3_q`` are counters stepped by the
    team's own place and iteration, with one carry, instead of ``var % extent`` and ``var /
    extent`` for each element: the extent is known only at the launch, and NVRTC emits a
    division for it (PTX ``div.u32`` and ``rem.u32`` in the loop, some twenty instructions
    each): sgemm at 32x8 threads and 2x4 outputs a thread stages 16 elements of B a thread a
    tile of 64, some 640 instructions of division against the tile's 512 multiply-adds.
    Otherwise (a tile along the iterations, ``R3_TILE`` wide) the place and iteration are
    ``var / R3_TILE`` and ``var % R3_TILE``, a shift and a mask."""
    i1 = indent + "    "
    if not along_axis:
        return [f"{indent}for (unsigned {var} = r3_rank; {var} < {extent} * {MACRO}; "
                f"{var} += r3_team) {{",
                f"{i1}const unsigned r3_p = {var} / {MACRO};",
                f"{i1}const {counter_type} {counter} = {K0} + ({counter_type})({var} % {MACRO});",
                *(i1 + line for line in inner), f"{indent}}}"]
    i2 = i1 + "    "
    return [f"{indent}{{",
            f"{i1}const unsigned r3_n = {extent};",
            f"{i1}unsigned r3_p = r3_rank % r3_n, r3_q = r3_rank / r3_n;",
            f"{i1}const unsigned r3_dp = r3_team % r3_n, r3_dq = r3_team / r3_n;",
            f"{i1}for (unsigned {var} = r3_rank; {var} < r3_n * {MACRO}; {var} += r3_team) {{",
            f"{i2}const {counter_type} {counter} = {K0} + ({counter_type})r3_q;",
            *(i2 + line for line in inner),
            f"{i2}r3_p += r3_dp;",
            f"{i2}r3_q += r3_dq;",
            f"{i2}if (r3_p >= r3_n) {{",
            f"{i2}    r3_p -= r3_n;",
            f"{i2}    ++r3_q;",
            f"{i2}}}",
            f"{i1}}}",
            f"{indent}}}"]


def tile_header(indent: str, shared: str,
                first: tuple[int, ...] = FIRST_TILES) -> list[str]:
    """What both tile rules put before their tiles: the tunable, the tiles it tries first
    (``first``), the dynamic shared memory ``shared`` (a ``// r3: shared`` expression), the
    guarded default (0: the original), the barrier and the shared array."""
    return [f"{indent}// r3: tune {MACRO} {' '.join(str(v) for v in TILES)}",
            f"{indent}// r3: first {MACRO} {' '.join(str(v) for v in first)}",
            f"{indent}// r3: shared {shared}",
            f"#ifndef {MACRO}", f"#define {MACRO} 0", "#endif", f"#if {MACRO} > 0",
            f"#ifndef {BARRIER}", f"#define {BARRIER}() {BARRIER_ASM}", "#endif",
            f"{indent}extern __shared__ __align__(16) unsigned char {SMEM}[];"]


def _declarations(indent: str, loop: _Loop, indices: list[GridIndex]) -> str:
    """The tunable, the tiles in dynamic shared memory and the lambda that loads them."""
    r = loop.reading
    lines = tile_header(indent, " + ".join(
        f"{_BLOCK[t.axis] + ' * ' if t.axis else ''}{MACRO} * {t.size}" for t in loop.tiles))
    offset = "0"
    for t, tile in enumerate(loop.tiles):
        extent = f"blockDim.{tile.axis}" if tile.axis else "1u"
        lines.append(f"{indent}{tile.element}* r3_t{t} = reinterpret_cast<{tile.element}*>("
                     f"{SMEM} + {offset});  // {tile.array}{tile.index}")
        offset = (f"{offset} + " if offset != "0" else "") + \
            f"(size_t){extent} * {MACRO} * {tile.size}"
    live = []
    for guard in loop.guards:
        condition = guard.child_by_field_name("condition")
        assert condition is not None
        live.append(f"!{r.text(condition)}" if condition.type == "condition_clause"
                    or r.text(condition).startswith("(") else f"!({r.text(condition)})")
    if loop.closing is not None:
        condition = loop.closing.child_by_field_name("condition")
        assert condition is not None
        live.append(r.text(condition))
    body = indent + "    "
    lines += [f"{indent}auto {STAGE} = [&]({loop.counter_type} {K0}) {{",
              f"{body}const unsigned r3_rank = threadIdx.x + blockDim.x * (threadIdx.y + "
              "blockDim.y * threadIdx.z);",
              f"{body}const unsigned r3_team = blockDim.x * blockDim.y * blockDim.z;"]
    for t, tile in enumerate(loop.tiles):
        extent = f"blockDim.{tile.axis}" if tile.axis else "1u"
        inner = []
        for ix in indices:
            at = "r3_p" if ix.axis == tile.axis else "0u"
            inner.append(f"const {ix.type} {ix.name} = ({ix.type})(blockIdx.{ix.axis}"
                         f" * blockDim.{ix.axis} + {at});")
        test = " && ".join([f"{loop.counter} {loop.op} {r.text(loop.end)}", *live])
        inner += ["(void)r3_p;", f"if ({test}) {{",
                  f"    r3_t{t}[r3_e] = {tile.array}{tile.index};", "}"]
        # along x neighbouring threads load neighbouring places, else neighbouring iterations
        lines += staging_loop(body, "r3_e", extent, tile.axis == "x", loop.counter,
                              loop.counter_type, inner)
    lines += [f"{indent}}};", "#endif", ""]
    return "\n".join(lines)
