"""The x and y axes of the thread grid exchanged in one kernel (``swap_xy``).

Why: a 2-D kernel that takes a matrix's row from the x thread index (``int r = blockIdx.x *
blockDim.x + threadIdx.x;``, then ``a[r * n + c]``) gives the neighbouring lanes of a warp
neighbouring rows, so no load of the warp coalesces (Rodinia gaussian's ``Fan2`` is written so).
With the axes exchanged the lanes walk along a row, and the launch level can then pick blocks
wide along x (32x8 ...).

What changes: in the body of the kernel's definition and nowhere else (not another kernel, a
device function, a comment or a string), ``threadIdx.x`` becomes ``threadIdx.y`` and the
reverse, and so for ``blockIdx``, ``blockDim`` and ``gridDim``; z stays.  Launched with grid G
and block B, the new kernel computes what the original computes launched with (G.y, G.x) and
(B.y, B.x): the same logical threads, each block with the same members, so ``__syncthreads``
and shared memory keep their meaning.  It covers the recorded work only where that work is as
wide along x as along y, which the engine checks (``MutationContext.square_work``).  Exchanging
twice gives the original back (the campaign's novelty check sees a duplicate).

A warp is made of threads consecutive along x, so after the exchange its lanes are other
logical threads.  The rule declines, with the reason, where that or something else it cannot
follow matters:

- the kernel reads no thread or block index along x, or none along y: nothing to exchange;
- it, or a device function it calls, uses warp-level primitives or lane arithmetic
  (``__shfl*``, votes, ``__match_*``, ``__reduce_*_sync``, ``__syncwarp``, ``warpSize``,
  cooperative groups, ``% 32``, ``& 31``, ``>> 5``, ``volatile`` warp-synchronous memory) or
  inline ``asm`` (it may read ``%laneid`` or ``%tid``);
- a device function it calls, or a macro it names, reads the grid's coordinates itself: only
  the kernel's body is rewritten;
- it reads a coordinate whole (``dim3 t = threadIdx;``);
- it flattens the block or grid itself (``threadIdx.x + blockDim.x * threadIdx.y``): it already
  orders its threads x-major, and exchanged, a warp's consecutive lanes would lie
  ``blockDim.y`` apart in the flat index, undoing the coalescing it was written for;
- the source names an axis of the launch in an ``// r3:`` line (``work_per_thread``,
  ``threads_per_item``, ``exact``, ``BLOCK_X``/``BLOCK_Y`` in a relation), which would then
  name the other one.
"""

from __future__ import annotations

import itertools
import random
import re

import tree_sitter as ts

from r3tui.analysis import ExecutionSpace, parse_translation_unit
from r3tui.analysis.facts import WARP_CALLS, device_callees
from r3tui.analysis.kernels import Parsed, base_name
from r3tui.analysis.per_thread import Unsupported, walk
from r3tui.analysis.text import mask
from r3tui.remix.rule_base import defined_kernel

Declined = Unsupported

_COORDINATES = frozenset({"threadIdx", "blockIdx", "blockDim", "gridDim"})
_WORD = re.compile(r"(?<![\w.])(?:threadIdx|blockIdx|blockDim|gridDim)\b")
_FIELD = re.compile(r"(?<![\w.])(threadIdx|blockIdx|blockDim|gridDim)\s*\.\s*([xyz])\b")
_WARP = re.compile(rf"^(?:{WARP_CALLS}|__ballot|__any|__all|warpSize"
                   r"|cooperative_groups|tiled_partition|thread_block_tile|this_thread_block"
                   r"|coalesced_threads|this_grid|asm|__asm|__asm__|volatile)$")
# a lane or a warp number taken from a thread index: `t % 32`, `t & 31`, `t >> 5`, `t / 32`
_LANE = {"%": {"32"}, "/": {"32"}, "&": {"31", "0x1f"}, ">>": {"5"}}
_AXIS_DECLARATION = re.compile(
    r"^[ \t]*//[ \t]*r3[ \t]*:[ \t]*(?:(?:work_per_thread|threads_per_item|exact)\b.*"
    r"|.*\bBLOCK_[XY]\b.*)$", re.MULTILINE)


def swap_axes(source: str, kernel: str, rng: random.Random) -> tuple[str, str]:
    """``source`` with the x and y coordinates of the grid exchanged in ``kernel``'s body (the
    new text, and what changed); :class:`Declined` where that would change what a warp does
    together or cannot be made in the kernel alone."""
    body, parsed, span = defined_kernel(source, kernel)
    start, end = span.body_open + 1, span.body_end - 1
    masked = mask(source)[start:end]
    fields = list(_FIELD.finditer(masked))
    read = {f.group(2) for f in fields if f.group(1) in ("threadIdx", "blockIdx")}
    if not {"x", "y"} <= read:
        raise Declined("the kernel does not read a thread or block index along both x and y: "
                       "nothing to exchange")
    if len(_WORD.findall(masked)) != len(fields):
        raise Declined("the kernel reads a coordinate of the grid whole (a dim3), whose x and "
                       "y cannot be exchanged one by one")
    declared = _AXIS_DECLARATION.search(source)
    if declared is not None:
        raise Declined(f"the source names an axis of the launch (`{declared.group(0).strip()}`),"
                       " which would then name the other one")
    _check_reached(source, kernel)
    flat = _flattening(body, parsed)
    if flat is not None:
        raise Declined(f"the kernel flattens its threads itself (`{flat}`): x-major already, "
                       "and exchanged, a warp's consecutive lanes would lie blockDim.y apart")
    pieces, at = [], start
    swapped = [f for f in fields if f.group(2) != "z"]
    for f in swapped:
        letter = start + f.start(2)
        pieces += [source[at:letter], "y" if f.group(2) == "x" else "x"]
        at = letter + 1
    out = source[:start] + "".join(pieces) + source[at:]
    return out, (f"x and y of the thread grid exchanged in {base_name(kernel)} "
                 f"({len(swapped)} indices)")


def _check_reached(source: str, kernel: str) -> None:
    """:class:`Declined` where the kernel or a device function it calls works by lane, or such
    a function or a macro the kernel names reads the grid's coordinates."""
    unit = parse_translation_unit(source)
    name = base_name(kernel)
    kernels = [f for f in unit.functions
               if f.name == name and f.space is ExecutionSpace.GLOBAL]
    if not kernels:  # the parse the rule edits by found it; this one must too
        raise Declined(f"the unit's parse does not find the definition of {name}")
    callees = device_callees(kernels, unit.functions)
    named: set[str] = set()
    for item in kernels + callees:
        where = "the kernel" if item in kernels else f"{item.name}, which the kernel calls,"
        words = [t for t in item.text.split(" ") if t]
        named.update(words)
        warp = next((w for w in words if _WARP.match(w)), None)
        lane = next((f"{a} {b}" for a, b in itertools.pairwise(words)
                     if b.lower().rstrip("u") in _LANE.get(a, ())), None)
        if warp is not None or lane is not None:
            raise Declined(f"{where} uses {warp or lane}: a warp is made of consecutive threads "
                           "along x, so after the exchange its lanes would be other threads")
        if item not in kernels and _COORDINATES & set(words):
            raise Declined(f"the device function {where} reads the grid's coordinates "
                           "itself, and only the kernel is rewritten")
    for macro in unit.macros:
        if macro.name in named and _COORDINATES & set(macro.body.split(" ")):
            raise Declined(f"the kernel names the macro {macro.name}, which reads the grid's "
                           "coordinates, and only the kernel is rewritten")


def _flattening(body: ts.Node, parsed: Parsed) -> str | None:
    """The text of a product of one axis's extent and an index along the other (``blockDim.x
    * (threadIdx.y + ...)``, ``threadIdx.y * blockDim.x``) in the body, or None."""
    for node in walk(body):
        operator = node.child_by_field_name("operator")
        if node.type != "binary_expression" or operator is None or operator.type != "*":
            continue
        left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
        if left is None or right is None:
            continue
        for extent, other in ((left, right), (right, left)):
            axis = _coordinate(_bare(extent), parsed, ("blockDim", "gridDim"))
            if axis is not None and any(
                    _coordinate(n, parsed, ("threadIdx", "blockIdx")) == {"x": "y", "y": "x"}
                    .get(axis) for n in walk(other)):
                return " ".join(parsed.text(node).split())
    return None


def _bare(node: ts.Node) -> ts.Node:
    """``node`` without the parentheses and casts around it."""
    while node.type in ("parenthesized_expression", "cast_expression"):
        inner = (node.named_children[-1] if node.type == "parenthesized_expression"
                 else node.child_by_field_name("value"))
        if inner is None:
            break
        node = inner
    return node


def _coordinate(node: ts.Node, parsed: Parsed, words: tuple[str, ...]) -> str | None:
    """The axis of ``node`` where it is one of ``words`` along x or y (``blockDim.x``)."""
    if node.type != "field_expression":
        return None
    found = re.fullmatch(r"(\w+)\s*\.\s*([xy])", parsed.text(node))
    return found.group(2) if found is not None and found.group(1) in words else None
