"""Shared-memory tiles for a kernel the coarsening rule has register-blocked: the two
transformations that, together, make a naive matrix product fast (each thread computes a small
block of outputs from tiles of its inputs that the whole block loads once).

:func:`r3tui.remix.coarsen.coarsen` gives each thread ``R3_CF_A`` outputs along an axis,
held in arrays (``col[r3_e]``), and writes the code after its guards twice: once for a thread
whose elements are all within the work (``if (r3_all)``), once checking each element's
``r3_live`` flag.  No thread returns early.  Applied to such a kernel, the tiling rule
(:func:`r3tui.remix.tile.tile_loop`) lands here: the same loop in both copies reads its shared
elements from the same tiles, ``R3_TILE`` iterations at a time.

The block's outputs along an axis are the contiguous range ``[base, base + span)`` with
``base = blockIdx.A * blockDim.A * R3_CF_A`` and ``span = blockDim.A * R3_CF_A`` (coarsening
interleaves x by the block and keeps y and z contiguous per thread; both cover that range).  A
read whose index depends on the counter and on one axis's position (an element array
``col[r3_e]``, or a grid index the coarsening left alone) gets a tile of ``span x R3_TILE``
elements, one of the counter alone ``R3_TILE``; ``// r3: shared`` sums them with the
coarsening factors, so the search launches each point with its own size.

A tile's element at place ``p`` is loaded only where the iteration is within the loop and the
output at ``base + p`` of that axis and the block's first output along the others passes the
coarsened guards (``r3_live`` cleared where ``row[r3_e] >= M``, ...).  The guards must be
checks a position's predecessors along every axis pass when it does (as the tiling rule
requires), so that output exists in the block and reads the element itself.  Every thread runs
one of the two copies, each with the same barriers, and each thread's barriers count where it
arrives (``R3_BARRIER()``, PTX ``barrier.sync``).  The iterations keep their order, so every
result is the same to the bit.

It declines a kernel that is not in the coarsening rule's form, a guard that is not such a
check, a loop whose start or end reads a local or memory, a loop that leaves early or writes
memory, and a read that reads another local, two positions, or is conditional other than on
its own element's flag.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass

import tree_sitter as ts

from r3tui.analysis.body import kernel_body
from r3tui.analysis.per_thread import (
    IndexDependence,
    Unsupported,
    check_alone,
    counted_loop,
    grid_indices,
    lvalue_base,
    statements,
    walk,
    write_target,
)
from r3tui.remix.rule_base import defined_kernel, read_only_arrays
from r3tui.remix.tile import (
    _BLOCK,
    _DEAD_OPS,
    _LIVE_OPS,
    _UNCONDITIONAL,
    BARRIER,
    FIRST_TILES,
    K0,
    MACRO,
    MAX_TILES,
    SIZES,
    SMEM,
    STAGE,
    STAGING_NAMES,
    TILES,
    _split,
    monotone,
    staging_loop,
    tile_header,
    tile_pass,
)

Declined = Unsupported

# where the tiles lie along two axes of coarsened outputs (a matrix product), a child's first
# steps set the coarsening factors the tiles pay with, although its parent's change declared
# them (`// r3: first R3_CF_X 4 2`, the first axis's values; every other axis keeps 4), and try
# a tile of 32 iterations first.  sgemm at 1290^3, recorded 16x16, two stages, on an H100
# (session 43, bench/rule_gains.py): 4x4 outputs with a tile of 32 ran 2.117x [2.115, 2.123]
# (356 us), 2x4 2.094x, 4x8 1.843x, 2x8 1.535x; 4x8 at 2048^3 on an H200 4.105x (session 42).
# Their parents' factors had been tuned without a tile: the campaigns' coarsened children kept
# one axis (R3_CF_Y 2 or 4, 494-530 us), and their tile children started there (session 43).
BLOCK_FIRST = ((4, 2), (4,))
# whole tiles, unrolled, in the copy of the blocks at the work's edge too (1; 0: every tile
# there runs the loop with both tests).  Those blocks set the kernel's time where they run
# longest: sgemm's 4x4 outputs with a tile of 32 took 356 us at 1290^3, with edge blocks,
# against 250 us at 1280^3, with none, for 0.8 % fewer outputs (H100, session 43).  Unrolled,
# that copy raises the kernel's registers (ptxas for sm_90, 4x4 and a tile of 32: 64 to 80;
# 4x8: 128 to 163), which can cost a block a multiprocessor everywhere: which pays is the
# search's to measure, and a child first keeps 0, the code measured until now
EDGE_TILES = "R3_EDGE_TILES"
BLOCK_FIRST_TILES = (32, 64)

# 1: each thread's outputs along x are neighbours (0: the coarsening's, blockDim.x apart)
CONTIGUOUS = "R3_X_CONTIGUOUS"
# tiles in flight: 1 loads a tile, then computes on it; 2 loads the next tile into a second
# buffer (cp.async on sm_80 and later) while the block computes on this one
STAGES = "R3_STAGES"
_ASYNC_NAMES = ("R3_COPY", "R3_COMMIT", "R3_WAIT_ONE", "r3_buf", "r3_bytes", "r3_off")
# cp.async copies 4, 8 or 16 bytes; a tile of other elements is stored as it is loaded
_ASYNC_SIZES = (4, 8, 16)
_ASYNC = (
    "#ifndef R3_COPY",
    f"#if {STAGES} > 1 && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800",
    '#define R3_COPY(dst, src, n) asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" '
    ':: "r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src), "n"(n) : "memory")',
    '#define R3_COMMIT() asm volatile("cp.async.commit_group;" ::: "memory")',
    '#define R3_WAIT_ONE() asm volatile("cp.async.wait_group 1;" ::: "memory")',
    "#else",
    "#define R3_COPY(dst, src, n) (void)(*(dst) = *(src))",
    "#define R3_COMMIT() ((void)0)",
    "#define R3_WAIT_ONE() ((void)0)",
    "#endif",
    "#endif",
)
_ELEMENT_LOOP = re.compile(
    r"for\s*\(\s*int\s+r3_e\s*=\s*0\s*;\s*r3_e\s*<\s*r3_cf\s*;\s*\+\+r3_e\s*\)")
_FACTOR = re.compile(r"//\s*r3:\s*work_per_thread\s+(R3_CF_[XYZ])\s+([xyz])\b")


def coarsened(source: str, kernel: str) -> bool:
    """Whether ``kernel`` is in the form :func:`~r3tui.remix.coarsen.coarsen` writes."""
    found = kernel_body(source, kernel)
    if found is None:
        return False
    text = found[1].text(found[0])
    return ("constexpr int r3_cf" in text and "bool r3_live[r3_cf];" in text
            and re.search(r"\bif\s*\(\s*r3_all\s*\)", text) is not None)


@dataclass(frozen=True)
class _Position:
    """How a thread's output position along an axis is read: an element array of the
    coarsening (``col``, read ``col[r3_e]``, ``factor`` its tunable) or a grid index it left
    alone (``row``, no factor)."""

    axis: str
    name: str
    factor: str | None

    @property
    def base(self) -> str:
        return f"r3_base_{self.axis}"

    @property
    def span(self) -> str:
        return f"r3_span_{self.axis}"

    def declarations(self, indent: str, spanned: bool) -> list[str]:
        """Where the block's outputs along the axis start (every guard reads that), and how
        many there are (where a tile lies along the axis)."""
        scale = f" * {self.factor}" if self.factor else ""
        return [f"{indent}const int {self.base} = (int)(blockIdx.{self.axis} * "
                f"blockDim.{self.axis}{scale});"] + (
            [f"{indent}const int {self.span} = (int)(blockDim.{self.axis}{scale});"]
            if spanned else [])

    @property
    def shared(self) -> str:
        return _BLOCK[self.axis] + (f" * {self.factor}" if self.factor else "")


@dataclass(frozen=True)
class _Tile:
    array: str
    key: str  # the index, spaces removed
    index: ts.Node  # its index in the first copy (the loader's expression)
    shown: str  # the read as written, for people
    position: _Position | None  # None: the counter alone
    element: str

    @property
    def size(self) -> int:
        return SIZES[self.element]


class _Reading:
    """The coarsened kernel: its positions, guards and the two copies of its code."""

    def __init__(self, source: str, kernel: str) -> None:
        self.body, self.parsed, span = defined_kernel(source, kernel)
        self.source = source
        check_alone(self.body, self.parsed)
        plain = grid_indices(self.body, self.parsed)
        self.reading = IndexDependence(source, self.body, self.parsed, tuple(plain))
        text = self.parsed.text(self.body)
        factors = {axis: macro for macro, axis in _FACTOR.findall(text)}
        self.top = [n for n in statements(self.body) if n.type != "comment"]
        self.positions: dict[str, _Position] = {}
        # the x element array's value where the coarsening interleaves x by the block, its
        # factor, and which element of it the value is (``r3_e % R3_CF_X``)
        self.interleaved_x: tuple[ts.Node, str, str] | None = None
        self._arrays(factors)
        for ix in plain:
            if ix.axis in factors:
                raise Declined(f"axis {ix.axis} is read both coarsened and as {ix.name}")
            self.positions[ix.name] = _Position(ix.axis, ix.name, None)
        axes = [p.axis for p in self.positions.values()]
        if len(set(axes)) != len(axes) or \
                len(re.findall(r"\bthreadIdx\b", text)) != len(axes):
            raise Declined("the body reads threadIdx other than in one position an axis")
        self.staged = read_only_arrays(source, span, SIZES.__contains__)
        self.guards = self._guards()
        self.branch = self._branch()

    def text(self, node: ts.Node) -> str:
        return self.parsed.text(node)

    def _element_loops(self) -> list[ts.Node]:
        return [n for n in self.top if n.type == "for_statement"
                and _ELEMENT_LOOP.match(self.text(n))]

    def _arrays(self, factors: dict[str, str]) -> None:
        """The element arrays, from the loop that sets them (and every flag) first."""
        loops = [n for n in self._element_loops() if "r3_live[r3_e] = true;" in self.text(n)]
        if not loops:
            raise Declined("no loop setting each element's position and flag")
        for n in walk(loops[0]):
            target = write_target(n)
            if target is None or target.type != "subscript_expression":
                continue
            name = self.text(lvalue_base(target) or target)
            if name == "r3_live":
                continue
            value = n.child_by_field_name("right")
            assert value is not None
            got = re.sub(r"\s+", "", self.text(value))
            for axis, macro in factors.items():
                a = re.escape(axis)
                forms = (rf"\(blockIdx\.{a}\*{macro}\+r3_e(%{macro})?\)\*blockDim\.{a}"
                         rf"\+threadIdx\.{a}",
                         rf"\(blockIdx\.{a}\*blockDim\.{a}\+threadIdx\.{a}\)\*{macro}"
                         rf"\+r3_e(/\([A-Z0-9_*]+\))?(%{macro})?")
                if any(re.fullmatch(f, got) for f in forms):
                    self.positions[name] = _Position(axis, name, macro)
                    interleaved = re.fullmatch(forms[0], got)
                    if axis == "x" and interleaved is not None:
                        self.interleaved_x = (value, macro, f"r3_e % {macro}"
                                              if interleaved.group(1) else "r3_e")
                    break
            else:
                raise Declined(f"{name}[r3_e] is not set as the coarsening sets a position")

    def position_of(self, node: ts.Node) -> _Position | None:
        """The position ``node`` reads: ``col[r3_e]`` of an element array, or a grid index."""
        if node.type == "identifier":
            found = self.positions.get(self.text(node))
            return found if found is not None and found.factor is None else None
        if node.type == "subscript_expression":
            array = node.child_by_field_name("argument")
            index = node.child_by_field_name("indices")
            if array is not None and index is not None and \
                    re.fullmatch(r"\[\s*r3_e\s*\]", self.text(index)):
                found = self.positions.get(self.text(array))
                return found if found is not None and found.factor is not None else None
        return None

    def positions_in(self, node: ts.Node) -> list[ts.Node]:
        """The nodes of ``node`` that read a position (outermost)."""
        out: list[ts.Node] = []
        stack = [node]
        while stack:
            n = stack.pop()
            if self.position_of(n) is not None:
                out.append(n)
            else:
                stack.extend(n.children)
        return sorted(out, key=lambda n: n.start_byte)

    def other_local(self, node: ts.Node, allowed: set[str]) -> str | None:
        """A local ``node`` reads apart from the positions and ``allowed``."""
        inside = {n.id for p in self.positions_in(node) for n in walk(p)}
        for n in walk(node):
            if n.type == "identifier" and n.id not in inside and \
                    self.text(n) in self.reading.locals and self.text(n) not in allowed:
                return self.text(n)
        return None

    def _guards(self) -> list[tuple[ts.Node, bool]]:
        """Each guard's condition and whether it ends the element when true (``i >= n``) or
        keeps it (``!(i < n)`` of a closing ``if``), checked for a monotone form."""
        guards = []
        for loop in self._element_loops():
            text = self.text(loop)
            if "r3_live[r3_e] = false" not in text:
                continue
            ifs = [n for n in walk(loop) if n.type == "if_statement"]
            condition = ifs[0].child_by_field_name("condition") if len(ifs) == 1 else None
            inner = condition.named_children[0] if condition is not None and \
                condition.named_children else None
            right = inner.child_by_field_name("right") if inner is not None else None
            left = inner.child_by_field_name("left") if inner is not None else None
            if inner is None or right is None or left is None or \
                    re.sub(r"\s+", "", self.text(left)) != "r3_live[r3_e]":
                raise Declined("a guard is not `r3_live[r3_e] && (CHECK)`")
            ends = True
            if right.type == "unary_expression" and self.text(right).startswith("!"):
                argument = right.child_by_field_name("argument")
                assert argument is not None
                right, ends = argument, False
            self._check(right, "||" if ends else "&&", _DEAD_OPS if ends else _LIVE_OPS)
            guards.append((right, ends))
        return guards

    def _check(self, condition: ts.Node, joiner: str, ops: dict[str, str]) -> None:
        for part in _split(condition, joiner, self.parsed):
            text = self.text(part)
            local = self.other_local(part, set())
            if local is not None or self.reading.touches_memory(part):
                raise Declined(f"the bound check `{text}` reads "
                               + (f"the local {local}" if local else "memory"))
            read = self.positions_in(part)
            if not read:
                continue
            if len(read) > 1 or part.type != "binary_expression":
                raise Declined(f"the bound check `{text}` is not one position against a bound")
            monotone(part, self.text, _node_is(read[0]), lambda n: bool(self.positions_in(n)),
                     ops)

    def _branch(self) -> tuple[ts.Node, ts.Node, ts.Node]:
        """``if (r3_all) { FAST } else { CHECKED }``: the statement and its two blocks."""
        for n in self.top:
            condition = n.child_by_field_name("condition") if n.type == "if_statement" else None
            if condition is not None and re.fullmatch(r"\(\s*r3_all\s*\)", self.text(condition)):
                fast = n.child_by_field_name("consequence")
                other = n.child_by_field_name("alternative")
                checked = next((c for c in other.named_children
                                if c.type == "compound_statement"), None) if other else None
                if fast is not None and checked is not None:
                    return n, fast, checked
        raise Declined("no `if (r3_all) { ... } else { ... }` after the guards")


def _node_is(node: ts.Node) -> Callable[[ts.Node], bool]:
    return lambda n: n.id == node.id


class _Loop:
    """One loop of a copy: its counted header and the reads it stages."""

    def __init__(self, r: _Reading, node: ts.Node) -> None:
        self.r, self.node = r, node
        loop = self.counted = counted_loop(r.reading, node)
        self.counter, self.counter_type, self.start = loop.counter, loop.counter_type, loop.start
        self.condition, self.op, self.end, self.body = (loop.condition, loop.op, loop.end,
                                                        loop.body)
        for part, what in ((self.start, "start"), (self.end, "end")):
            local = r.other_local(part, set())
            if local is not None or r.positions_in(part):
                raise Declined(f"the loop's {what} reads {local or 'a position'}, which the "
                               "block's threads may not share")
            if r.reading.touches_memory(part):
                raise Declined(f"the loop's {what} reads memory")
        for n in walk(self.body):
            if n.type in ("return_statement", "break_statement", "continue_statement",
                          "goto_statement"):
                raise Declined(f"the loop may leave an iteration early ({r.text(n)})")
            target = write_target(n)
            base = lvalue_base(target) if target is not None else None
            if base is not None and r.text(base) == self.counter:
                raise Declined(f"the loop's body assigns its counter {self.counter}")
        if r.reading.writes_memory(self.body):
            raise Declined("the loop writes memory or calls what might")
        if r.reading.declared_within(self.body) & set(r.positions):
            raise Declined("the loop's body declares a name of a position")
        self.reads = self._reads()

    def _reads(self) -> dict[tuple[str, str], list[ts.Node]]:
        r = self.r
        found: dict[tuple[str, str], list[ts.Node]] = {}
        for n in walk(self.body):
            array = n.child_by_field_name("argument") if n.type == "subscript_expression" \
                else None
            index = n.child_by_field_name("indices") if array is not None else None
            if array is None or index is None or array.type != "identifier" or \
                    r.text(array) not in r.staged or not r.reading.mentions(index,
                                                                           {self.counter}):
                continue
            if r.other_local(index, {self.counter}) is not None or r.reading.touches_memory(index):
                continue
            if len({r.position_of(p) for p in r.positions_in(index)}) > 1:
                continue
            if not self._unconditional(n):
                continue
            key = (r.text(array), re.sub(r"\s+", "", r.text(index)))
            found.setdefault(key, []).append(n)
        return found

    def _unconditional(self, node: ts.Node) -> bool:
        """Read in every iteration, for every live element: under nothing but the element
        loop and its own element's flag."""
        r = self.r
        child, up = node, node.parent
        while up is not None and up.id != self.body.id:
            if up.type == "for_statement" and _ELEMENT_LOOP.match(r.text(up)):
                pass
            elif up.type == "if_statement":
                condition = up.child_by_field_name("condition")
                if condition is None or not re.fullmatch(
                        r"\(\s*r3_live\[r3_e\]\s*\)", r.text(condition)) or \
                        up.child_by_field_name("alternative") is not None:
                    return False
            elif up.type not in _UNCONDITIONAL:
                return False
            elif up.type == "binary_expression":
                op = up.child_by_field_name("operator")
                right = up.child_by_field_name("right")
                if op is not None and r.text(op) in ("&&", "||") and right is not None \
                        and right.id == child.id:
                    return False
            elif up.type == "call_expression" and not r.reading.pure(up):
                return False
            child, up = up, up.parent
        return up is not None


def tile_coarsened(source: str, kernel: str, rng: random.Random) -> tuple[str, str]:
    """``source`` with one loop of coarsened ``kernel``, in both its copies, reading its
    shared elements from shared memory tiles (the new text, and what changed)."""
    for name in (MACRO, SMEM, STAGE, K0, BARRIER, *STAGING_NAMES, "r3_s", "r3_base_",
                 "r3_span_", CONTIGUOUS, STAGES, *_ASYNC_NAMES):
        if re.search(rf"\b{name}", source):
            raise Declined(f"{name} is already a name in the source")
    if re.search(r"//\s*r3:\s*shared\b", source):
        raise Declined("the source declares its dynamic shared memory already")
    r = _Reading(source, kernel)
    _, fast, checked = r.branch
    pairs = list(zip([n for n in statements(fast) if n.type == "for_statement"
                      and not _ELEMENT_LOOP.match(r.text(n))],
                     [n for n in statements(checked) if n.type == "for_statement"
                      and not _ELEMENT_LOOP.match(r.text(n))], strict=False))
    choices, reasons = [], []
    for a, b in pairs:
        try:
            first, second = _Loop(r, a), _Loop(r, b)
        except Declined as exc:
            reasons.append(f"line {r.reading.line(a)}: {exc}")
            continue
        keys = [k for k in first.reads if k in second.reads][:MAX_TILES]
        if keys:
            choices.append((first, second, keys))
        else:
            reasons.append(f"line {r.reading.line(a)}: no read the block's threads share")
    if not choices:
        raise Declined("no loop of the coarsened copies to tile: "
                       + ("; ".join(reasons) if reasons else "no `for` in them"))
    first, second, keys = rng.choice(choices)
    tiles = []
    for array, key in keys:
        read = first.reads[(array, key)][0]
        index = read.child_by_field_name("indices")
        assert index is not None
        found = r.positions_in(index)
        tiles.append(_Tile(array, key, index, re.sub(r"\s+", " ", r.text(read)),
                           r.position_of(found[0]) if found else None, r.staged[array]))
    tiles.sort(key=lambda t: -t.size)  # each tile starts at a multiple of its element size
    return _rewrite(r, (first, second), tiles)


def _access(r: _Reading, tile: _Tile, read: ts.Node, counter: str) -> str:
    step = f"({counter} - {K0})"
    index = read.child_by_field_name("indices")
    assert index is not None
    if tile.position is None:
        return step
    node = r.positions_in(index)[0]
    place = f"({r.text(node)} - {tile.position.base})"
    if tile.position.axis == "x":
        return f"{step} * {tile.position.span} + {place}"
    return f"{place} * {MACRO} + {step}"


def _substitute(r: _Reading, node: ts.Node, values: dict[str, str]) -> str:
    """``node``'s text with each position read replaced by its value for the loader (the
    axis of ``values``: the place loaded; the others: the block's first output)."""
    text = r.parsed.data[node.start_byte:node.end_byte]
    for n in sorted(r.positions_in(node), key=lambda n: -n.start_byte):
        position = r.position_of(n)
        assert position is not None
        value = values.get(position.axis, position.base)
        text = (text[:n.start_byte - node.start_byte] + f"({value})".encode()
                + text[n.end_byte - node.start_byte:])
    return text.decode()


def _rewrite(r: _Reading, loops: tuple[_Loop, _Loop], tiles: list[_Tile]) -> tuple[str, str]:
    parsed = r.parsed
    edits: list[tuple[int, int, str]] = []
    for copy, loop in enumerate(loops):
        node = loop.node
        indent = parsed.indent_at(node.start_byte)
        inner = indent + "    "
        start_at = parsed.line_start(node.start_byte)
        region = parsed.data[start_at:node.end_byte].decode()
        shared = [(t, tile, read) for t, tile in enumerate(tiles)
                 for read in loop.reads[(tile.array, tile.key)]]
        staged = [(read.start_byte, read.end_byte,
                   f"r3_t{t}[{_access(r, tile, read, loop.counter)}]") for t, tile, read in shared]
        if copy == 1:  # a dead element's sum from the tiles: harmless, and no guard
            staged += _unguarded(r, loop.body, {read.id for _, _, read in shared})
        # the checked copy runs in the blocks at the work's edge only; unrolled where
        # EDGE_TILES says (a tunable: see its declaration)
        tiled = tile_pass(region, start_at, staged, loop.counted, indent,
                          gate=EDGE_TILES if copy == 1 else None)
        start, end, op = r.text(loop.start), r.text(loop.end), loop.op
        outer = "\n".join([
            f"#if {STAGES} > 1", f"{indent}{STAGE}({start}, 0u);", f"{indent}R3_COMMIT();",
            "#endif",
            f"{indent}for ({loop.counter_type} {K0} = {start}; {K0} {op} {end}; "
            f"{K0} += {MACRO}) {{",
            f"{inner}const unsigned r3_buf = (unsigned)(({K0} - ({start})) / {MACRO}) "
            f"% {STAGES};",
            f"#if {STAGES} > 1",  # the next tile on its way while this one is read
            f"{inner}if ({K0} + {MACRO} {op} {end}) {{",
            f"{inner}    {STAGE}({K0} + {MACRO}, r3_buf ^ 1u);", f"{inner}}}",
            f"{inner}R3_COMMIT();", f"{inner}R3_WAIT_ONE();", "#else",
            f"{inner}{STAGE}({K0}, 0u);", "#endif",
            f"{inner}{BARRIER}();", *_views(tiles, inner), tiled, f"{inner}{BARRIER}();",
            f"{indent}}}"])
        edits.append((start_at, node.end_byte, f"#if {MACRO} > 0\n{outer}\n#else\n{region}\n"
                                               "#endif"))
    # the checked copy's element flags kept from the start of its tiled loop (its sums set
    # for every element, as the loop now adds to every element's)
    _, _, checked = r.branch
    before = [n for n in statements(checked) if n.end_byte <= loops[1].node.start_byte]
    edits += [e for n in before for e in _unguarded(r, n, set())]
    contiguous = _contiguous_x(r, tiles)
    edits += contiguous
    anchor = next(n for n in r.top if n.type == "declaration" and "r3_all" in r.text(n))
    at = parsed.line_start(anchor.start_byte)
    edits.append((at, at, _declarations(r, loops[0], tiles,
                                        parsed.indent_at(anchor.start_byte))))
    out = r.source
    for begin, stop, new in sorted(edits, key=lambda e: (e[0], e[1]), reverse=True):
        out = out[:parsed.char(begin)] + new + out[parsed.char(stop):]
    reads = ", ".join(t.shown for t in tiles)
    layout = (f"; {CONTIGUOUS} 1 gives each thread neighbouring outputs along x (its reads "
              "of a tile row become vector loads)" if contiguous else "")
    return out, (f"the coarsened loop over {loops[0].counter} (both copies) reads {reads} "
                 f"from shared memory, {MACRO} iterations a tile, each in "
                 f"{{{' '.join(str(v) for v in TILES)}}} (0: the original){layout}")


def _unguarded(r: _Reading, node: ts.Node, staged: set[int]) -> list[tuple[int, int, str]]:
    """Edits that take the element flag's guard (``if (r3_live[r3_e]) { ... }``, no else)
    off each statement of ``node`` that, its ``staged`` reads aside (they become reads of a
    shared tile, whose places lie within the block's span for a dead element too), touches no
    memory: what it computes for a dead element is never stored.

    In the checked copy (the threads with an element beyond the work's edge) the guard kept
    the compiler from sharing each tile read among the elements that read it: sgemm at
    1290^3 on an H100 (session 43), four by eight outputs with tiles of 32 took 939 us, 3.7
    times its 250 us at 1280^3, where no block has an edge."""
    edits: list[tuple[int, int, str]] = []
    for n in walk(node):
        if n.type != "if_statement" or n.child_by_field_name("alternative") is not None:
            continue
        condition = n.child_by_field_name("condition")
        consequence = n.child_by_field_name("consequence")
        if condition is None or consequence is None or \
                consequence.type != "compound_statement" or \
                not re.fullmatch(r"\(\s*r3_live\[r3_e\]\s*\)", r.text(condition)):
            continue
        if r.reading.touches_memory(consequence, staged) or \
                r.reading.writes_memory(consequence):
            continue
        edits.append((n.start_byte, consequence.start_byte + 1, "{"))
    return edits


def _contiguous_x(r: _Reading, tiles: list[_Tile]) -> list[tuple[int, int, str]]:
    """Where a tile lies along x and the coarsening interleaves x by the block, the tunable
    :data:`CONTIGUOUS` (0 1) and the x elements' value choosing by it (the edits).

    Interleaved (0, the coarsening's), a thread's ``R3_CF_X`` outputs are ``blockDim.x``
    apart, so that a warp's loads of each coalesce; its reads of a tile row are then
    ``R3_CF_X`` scalar loads.  Contiguous (1), they are neighbours, and the reads of a row
    are one vector load (the B tile of sgemm: NVRTC's PTX for 4x4 outputs and tiles of 64
    has 17 ``ld.shared.v4.f32`` and 36 scalar, against 8 and 72), at the cost of the
    untiled reads' and the stores' coalescing.  Either layout covers the block's range
    ``[base, base + span)`` once, so the guards, the loader and the tiles are the same."""
    if r.interleaved_x is None or not any(t.position is not None and t.position.axis == "x"
                                          for t in tiles):
        return []
    value, macro, element = r.interleaved_x
    choice = (f"{CONTIGUOUS} ? (blockIdx.x * blockDim.x + threadIdx.x) * {macro} + {element}"
              f" : {r.text(value)}")
    # declared before the element count (the loops that read it follow)
    count = next(n for n in r.top if n.type == "declaration"
                 and re.search(r"\br3_cf\s*=", r.text(n)))
    at = r.parsed.line_start(count.start_byte)
    indent = r.parsed.indent_at(count.start_byte)
    # a child's first steps keep the interleaved layout (`// r3: first ... 0`): contiguous x
    # lost at every point measured (sgemm at 1290^3 on an H100, session 40, rule_gains: two
    # by four outputs, tile 64, two stages, 1.620x [1.588, 1.675] against 1.751x [1.743,
    # 1.796] interleaved; four by four 1.030x against 1.345x); a climb still tries it
    declared = (f"{indent}// r3: tune {CONTIGUOUS} 0 1\n{indent}// r3: first {CONTIGUOUS} 0\n"
                f"#ifndef {CONTIGUOUS}\n#define {CONTIGUOUS} 0\n#endif\n")
    return [(at, at, declared), (value.start_byte, value.end_byte, choice)]


def _views(tiles: list[_Tile], indent: str) -> list[str]:
    """Each tile's pointer into buffer ``r3_buf`` (the names the loader writes and the loop's
    reads read)."""
    return [f"{indent}{t.element}* r3_t{k} = reinterpret_cast<{t.element}*>({SMEM} + "
            f"r3_buf * r3_bytes + r3_off{k});" for k, t in enumerate(tiles)]


def _declarations(r: _Reading, loop: _Loop, tiles: list[_Tile], indent: str) -> str:
    """The tunable, the tiles, each position's block range and the lambda that loads."""
    one = " + ".join(
        f"{t.position.shared + ' * ' if t.position else ''}{MACRO} * {t.size}" for t in tiles)
    # tiles along two axes of coarsened outputs: a matrix product's register block
    factors = sorted({t.position.factor for t in tiles
                      if t.position is not None and t.position.factor is not None})
    block = len({t.position.axis for t in tiles if t.position is not None}) > 1
    lines = tile_header(indent, f"({one}) * {STAGES}",
                        BLOCK_FIRST_TILES if block and factors else FIRST_TILES)
    if block:
        lines += [f"{indent}// r3: first {f} {' '.join(map(str, BLOCK_FIRST[i > 0]))}"
                  for i, f in enumerate(factors)]
    lines += [f"{indent}// r3: tune {STAGES} 1 2", f"#ifndef {STAGES}", f"#define {STAGES} 1",
              "#endif", *_ASYNC,
              f"{indent}// r3: tune {EDGE_TILES} 0 1", f"{indent}// r3: first {EDGE_TILES} 0",
              f"#ifndef {EDGE_TILES}", f"#define {EDGE_TILES} 0", "#endif"]
    for position in sorted(set(r.positions.values()), key=lambda p: p.axis):
        lines += position.declarations(indent, any(t.position == position for t in tiles))
    offset = "0"
    for t, tile in enumerate(tiles):  # where each tile starts in a buffer
        extent = tile.position.span if tile.position else "1"
        lines.append(f"{indent}const size_t r3_off{t} = {offset};  // {tile.shown}")
        offset = (f"{offset} + " if offset != "0" else "") + \
            f"(size_t){extent} * {MACRO} * {tile.size}"
    lines.append(f"{indent}const size_t r3_bytes = {offset};  // a buffer: the tiles of a step")
    body = indent + "    "
    lines += [f"{indent}auto {STAGE} = [&]({loop.counter_type} {K0}, unsigned r3_buf) {{",
              f"{body}const unsigned r3_rank = threadIdx.x + blockDim.x * (threadIdx.y + "
              "blockDim.y * threadIdx.z);",
              f"{body}const unsigned r3_team = blockDim.x * blockDim.y * blockDim.z;"]
    lines += _views(tiles, body)
    for t, tile in enumerate(tiles):
        extent = f"(unsigned){tile.position.span}" if tile.position else "1u"
        values_at = ({tile.position.axis: f"{tile.position.base} + (int)r3_p"}
                     if tile.position else {})
        live = [(f"!({_substitute(r, c, values_at)})" if ends
                 else f"({_substitute(r, c, values_at)})") for c, ends in r.guards]
        test = " && ".join([f"{loop.counter} {loop.op} {r.text(loop.end)}", *live])
        source = f"{tile.array}[{_substitute(r, tile.index, values_at).strip()[1:-1]}]"
        store = (f"R3_COPY(&r3_t{t}[r3_s], &{source}, {tile.size});"
                 if tile.size in _ASYNC_SIZES else f"r3_t{t}[r3_s] = {source};")
        inner = ["(void)r3_p;", f"if ({test}) {{", f"    {store}", "}"]
        along = tile.position is not None and tile.position.axis == "x"
        lines += staging_loop(body, "r3_s", extent, along, loop.counter, loop.counter_type,
                              inner)
    lines += [f"{indent}}};", "#endif", ""]
    return "\n".join(lines)
