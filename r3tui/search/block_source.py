"""What a kernel's source says about its block shape, read with the CUDA parser of
:mod:`r3tui.analysis` (pure: text in, :class:`~r3tui.search.block.BlockFacts` out).

For each axis of the recorded block (the kernel and the device functions it calls, read
together):

- tied to a macro: the host launches the kernel with that macro along the axis
  (``dim3 threads(BLOCK_SIZE, BLOCK_SIZE)``, ``<<<grid, BLOCK>>>``) and the kernel names it, or,
  without a launch in the unit, the kernel names exactly one integer macro whose value is the
  recorded extent; a changed extent then compiles with ``-D MACRO=value``;
- fixed, with the reason: the kernel reads ``threadIdx.y`` but not ``blockDim.y`` (it indexes
  with constants that do not follow the block), reads neither (extra threads along the axis
  would repeat work), or two macros equal the extent and the launch does not say which;
- free otherwise (the kernel reads both ``threadIdx`` and ``blockDim`` along it).

Also read: the kernel's own ``__launch_bounds__(N)`` (the block volume may not exceed N), a
``blockDim`` that a loop halves (powers of two only along that axis) and warp-level
primitives (full warps only).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from r3tui.analysis.facts import WARP_CALLS, device_callees
from r3tui.analysis.kernels import base_name
from r3tui.domain import Dim3
from r3tui.search.block import AXES, BlockFacts, BlockTie

if TYPE_CHECKING:
    from r3tui.analysis import Item

_WARP_CALLS = re.compile(rf"^({WARP_CALLS})$")
# cooperative groups: the block's size is read through the group, on every axis
_GROUP_WORDS = {"this_thread_block", "thread_rank", "num_threads", "dim_threads",
                "thread_index", "tiled_partition"}
_INT = re.compile(r"^\(?\s*(\d+)[uUlL]*\s*\)?$")


def block_facts(source: str, kernel: str, block: Dim3,
                defines: Mapping[str, str] | Sequence[tuple[str, str]] = (),
                tunables: Mapping[str, Sequence[int]] | None = None) -> BlockFacts:
    """The facts of ``kernel`` (a base name, ``ns::k<8>`` or a plain name) launched with
    ``block``.  ``defines``: the recording's own ``-D`` values (they override the source's
    ``#define``); ``tunables``: values a ``// r3: tune`` line declares, by macro name."""
    from r3tui.analysis import ExecutionSpace, ItemKind, parse_translation_unit

    unit = parse_translation_unit(source)
    name = base_name(kernel)
    kernels = [f for f in unit.functions if f.name == name and f.space is ExecutionSpace.GLOBAL]
    extents = block.as_tuple()
    if not kernels:
        why = f"the definition of {name} is not in the recorded source, so its use of the " \
              "block is unknown"
        return BlockFacts(fixed=tuple((a, why) for a in range(3)))
    body = _tokens([*kernels, *device_callees(kernels, unit.functions)])
    overrides = dict(defines.items() if isinstance(defines, Mapping) else defines)
    values: dict[str, int] = {}
    for macro in unit.macros:
        text = overrides.get(macro.name, macro.body)
        found = _INT.match(text.strip()) if macro.params is None else None
        if found:
            values[macro.name] = int(found.group(1))
    guarded = {i.name for i in unit.items if i.kind is ItemKind.CONDITIONAL and i.name
               and ("ifndef" in i.text or "! defined" in i.text or "!defined" in i.text)}
    launch = _launch_axes(unit.functions, name, values)
    reads = _reads(body, extents)
    named = set(body)

    ties: dict[str, list[int]] = {}
    fixed: list[tuple[int, str]] = []
    for axis, extent in enumerate(extents):
        a = AXES[axis]
        equal = sorted(m for m in named if values.get(m) == extent) if extent > 1 else []
        host = launch.get(axis)
        tie = host if host in named else (equal[0] if host is None and len(equal) == 1
                                          else None)
        if tie is not None and values.get(tie) == extent:
            ties.setdefault(tie, []).append(axis)
            continue
        tid, dim = ("threadIdx", a) in reads, ("blockDim", a) in reads
        if host is None and len(equal) > 1 and not dim:
            fixed.append((axis, f"macros {' and '.join(equal)} both equal {extent} and the "
                                f"unit has no launch that says which one gives block.{a}"))
        elif not tid and not dim:
            fixed.append((axis, f"the kernel reads neither threadIdx.{a} nor blockDim.{a}: "
                                "more threads along it would repeat its work"))
        elif not dim:
            fixed.append((axis, f"the kernel reads threadIdx.{a} but not blockDim.{a}: it "
                                "indexes with constants that do not follow the block"))
        elif not tid:
            fixed.append((axis, f"the kernel reads blockDim.{a} but not threadIdx.{a}: more "
                                "threads along it would repeat its work"))
    declared = tunables or {}
    block_ties = tuple(
        BlockTie(m, tuple(axes), tuple(int(v) for v in declared.get(m, ())), m in guarded)
        for m, axes in ties.items())
    tied_words = {m for m in ties}
    return BlockFacts(
        fixed=tuple(fixed), ties=block_ties,
        max_threads=_launch_bounds(_tokens(kernels), values, tied_words),
        pow2=tuple(axis for axis in range(3) if ("halves", AXES[axis]) in reads),
        full_warps=next((f"the kernel uses the warp-level primitive {t}" for t in body
                         if _WARP_CALLS.match(t)), None))


def _tokens(items: Iterable[Item]) -> list[str]:
    # item texts are normalised: one space between tokens
    return [t for item in items for t in item.text.split(" ") if t]


def _reads(body: Sequence[str], extents: tuple[int, int, int]) -> set[tuple[str, str]]:
    """("threadIdx"|"blockDim"|"halves", axis letter) the body reads."""
    found: set[tuple[str, str]] = set()
    for i, token in enumerate(body):
        if token in ("threadIdx", "blockDim"):
            if body[i + 1 : i + 2] == ["."] and i + 2 < len(body) and body[i + 2] in AXES:
                found.add((token, body[i + 2]))
                if token == "blockDim" and body[i + 3 : i + 5] in (["/", "2"], [">>", "1"]):
                    found.add(("halves", body[i + 2]))
            elif token == "blockDim":  # the whole dim3: every axis follows the block
                found |= {("blockDim", a) for a in AXES}
        elif token in _GROUP_WORDS:
            found |= {(w, a) for w in ("threadIdx", "blockDim")
                      for a, extent in zip(AXES, extents, strict=True) if extent > 1}
    return found


def _launch_axes(functions: Sequence[Item], kernel: str,
                 values: Mapping[str, int]) -> dict[int, str]:
    """The macro each block axis takes at the unit's launches of ``kernel`` (``<<<g, b>>>``);
    only where every launch agrees."""
    found: list[dict[int, str]] = []
    for function in functions:
        toks = _tokens([function])
        for i, token in enumerate(toks):
            if token != kernel:
                continue
            j = i + 1
            if toks[j : j + 1] == ["<"] and toks[j + 1 : j + 2] != ["<"]:  # template arguments
                depth = 0
                while j < len(toks):
                    depth += {"<": 1, ">": -1}.get(toks[j], 0)
                    j += 1
                    if depth == 0:
                        break
            if toks[j : j + 2] != ["<<", "<"]:
                continue
            args = _split(toks[j + 2 :], end=">>")
            if len(args) < 2:
                continue
            found.append(_block_argument(args[1], toks[:i], values))
    if not found or any(f != found[0] for f in found[1:]):
        return {}
    return found[0]


def _block_argument(arg: list[str], before: list[str], values: Mapping[str, int]
                    ) -> dict[int, str]:
    if len(arg) == 1 and arg[0] in values:
        return {0: arg[0]}
    parts: list[list[str]] = []
    if arg[:2] == ["dim3", "("]:
        parts = _split(arg[2:], end=")")
    elif len(arg) == 1:  # a dim3 variable declared before the launch
        name = arg[0]
        for k in range(len(before) - 2, -1, -1):
            if before[k] == "dim3" and before[k + 1] == name:
                rest = before[k + 2 :]
                if rest[:3] == ["=", "dim3", "("]:
                    rest = rest[2:]
                if rest[:1] in (["("], ["{"]):
                    parts = _split(rest[1:], end=")" if rest[0] == "(" else "}")
                break
    return {axis: p[0] for axis, p in enumerate(parts[:3]) if len(p) == 1 and p[0] in values}


def _split(toks: Sequence[str], end: str) -> list[list[str]]:
    """Top-level comma-separated pieces of ``toks`` up to the closing ``end``."""
    parts: list[list[str]] = [[]]
    depth = 0
    for token in toks:
        if depth == 0 and token == end:
            break
        if token in ("(", "[", "{"):
            depth += 1
        elif token in (")", "]", "}"):
            depth -= 1
        if depth == 0 and token == ",":
            parts.append([])
        else:
            parts[-1].append(token)
    return [p for p in parts if p]


def _launch_bounds(kernel: Sequence[str], values: Mapping[str, int],
                   tied: set[str]) -> int | None:
    """The kernel's own ``__launch_bounds__`` max threads, when it is a number (or an untied
    macro that is one)."""
    for i, token in enumerate(kernel):
        if token == "__launch_bounds__" and kernel[i + 1 : i + 2] == ["("]:
            arg = _split(kernel[i + 2 :], end=")")
            if not arg or len(arg[0]) != 1:
                return None
            word = arg[0][0]
            if word in tied:
                return None
            if word.isdigit():
                return int(word)
            return values.get(word)
    return None
