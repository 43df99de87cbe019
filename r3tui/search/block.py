"""Which block shapes a kernel may launch with: the per-axis ladders of candidate extents, and
what the kernel's source says about its block (:class:`BlockFacts`).

A block axis becomes an ordinal dimension whose values are a short sorted ladder
(:data:`AXIS_LADDER_MAX` values at most) drawn from:

- the recorded extent and its neighbours (half and double it);
- the divisors of the work size along the axis, so that the grid covers the work exactly
  (a kernel without a bounds check stays correct);
- the multiples of 16 and 32 up to the device limit (full warps, half warps);
- powers of two.

Where there are more, divisors that are multiples of 32 (or powers of two on y and z) go
first, then divisors that are multiples of 16, then other multiples of 32, other divisors,
other multiples of 16; within one kind the values with more factors of two, then those
closest to the recorded extent.  A block volume that is not a multiple of 32 is allowed
(48, 80, 16x1 run in real programs); the ladder prefers full warps by what it keeps.

A macro that the source ties to the block (``dim3 threads(BLOCK_SIZE, BLOCK_SIZE)`` with
``__shared__ float tile[BLOCK_SIZE][BLOCK_SIZE]`` in the kernel) is one dimension over the
values the macro may take (a ``// r3: tune`` line's values, else the same ladder): the block
follows it on every axis it gives, and each point compiles with ``-D MACRO=value``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

AXIS_LADDER_MAX = 12  # values per block axis (or per block macro), so BO can learn the axis
AXES = "xyz"


def _trailing_zeros(value: int) -> int:
    return (value & -value).bit_length() - 1


def _divisors(n: int, top: int) -> set[int]:
    found: set[int] = set()
    for d in range(1, math.isqrt(n) + 1):
        if n % d == 0:
            found.update(v for v in (d, n // d) if v <= top)
    return found


def axis_ladder(recorded: int, work: int, limit: int, *, low: int = 1, axis: int = 0,
                pow2_only: bool = False, bound: int = AXIS_LADDER_MAX,
                exact: int | None = None) -> tuple[int, ...]:
    """The sorted candidate extents of one block axis (see the module docstring).

    ``limit``: the most threads the axis may have (device limit, or the square root of the
    threads per block for a macro that gives two axes); ``low``: the smallest extent offered
    besides the recorded one; ``pow2_only``: the kernel needs a power of two along the axis;
    ``exact``: the number whose divisors give exact grids (default ``work``).
    """
    work = max(work, 1)
    exact = max(exact or work, 1)
    # a block wider than the work along an axis only adds idle threads
    top = max(min(limit, work if work <= 16 else 16 * -(-work // 16)), 1)
    candidates = {2**k for k in range(top.bit_length()) if 2**k <= top}
    candidates |= set(range(16, top + 1, 16)) | _divisors(exact, top)
    candidates |= {v for v in (recorded // 2 if recorded % 2 == 0 else 0, 2 * recorded)
                   if 0 < v <= top}
    candidates = {v for v in candidates if v >= low}
    if pow2_only:
        candidates = {v for v in candidates if v & (v - 1) == 0}
    essential = {recorded} | ({recorded // 2, 2 * recorded} & candidates)

    def kind(v: int) -> int:
        divides = exact % v == 0
        if divides and (v % 32 == 0 or (axis > 0 and v & (v - 1) == 0)):
            return 0
        if divides and v % 16 == 0:
            return 1
        if v % 32 == 0:
            return 2
        return 3 if divides else 4

    rest = sorted(candidates - essential, key=lambda v: (
        kind(v), -min(_trailing_zeros(v), 7), abs(math.log2(v / max(recorded, 1)))))
    return tuple(sorted([*essential, *rest[: max(bound - len(essential), 0)]]))


@dataclass(frozen=True)
class BlockTie:
    """A macro the kernel's source gives its block by: the block's extent along each of
    ``axes`` (0 = x, 1 = y, 2 = z) is the macro's value, and a point that changes it compiles
    with ``-D macro=value`` (the engine guards a bare ``#define`` so that the ``-D`` wins).

    ``values``: what the macro may take (a ``// r3: tune`` line's); empty: derived from the
    work like an axis.  ``guarded``: the source's ``#define`` already sits in ``#ifndef``, so
    a build can ship the value as ``-D`` unchanged.
    """

    macro: str
    axes: tuple[int, ...]
    values: tuple[int, ...] = ()
    guarded: bool = True

    def to_json(self) -> dict[str, Any]:
        return {"macro": self.macro, "axes": list(self.axes), "values": list(self.values),
                "guarded": self.guarded}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BlockTie:
        return cls(str(data["macro"]), tuple(int(a) for a in data["axes"]),
                   tuple(int(v) for v in data.get("values", ())), bool(data.get("guarded", True)))

    def describe(self) -> str:
        return ", ".join(f"block.{AXES[a]}" for a in self.axes) + f" = {self.macro}"


@dataclass(frozen=True)
class BlockFacts:
    """What a kernel's source says about its block, as the launch space uses it.

    ``fixed``: axes that keep their recorded extent, each with the reason; ``ties``: macros
    that give block axes; ``max_threads``: the source's ``__launch_bounds__`` (the block
    volume may not exceed it unless the search injects its own); ``pow2``: axes the kernel
    needs a power of two along (it halves ``blockDim`` in a loop); ``full_warps``: why the
    block volume must be a multiple of the warp size (warp shuffles, votes), or None.
    """

    fixed: tuple[tuple[int, str], ...] = ()
    ties: tuple[BlockTie, ...] = ()
    max_threads: int | None = None
    pow2: tuple[int, ...] = ()
    full_warps: str | None = None

    def fixed_reason(self, axis: int) -> str | None:
        return next((why for a, why in self.fixed if a == axis), None)

    def tie_of(self, axis: int) -> BlockTie | None:
        return next((t for t in self.ties if axis in t.axes), None)

    def to_json(self) -> dict[str, Any]:
        return {"fixed": [[a, why] for a, why in self.fixed],
                "ties": [t.to_json() for t in self.ties], "max_threads": self.max_threads,
                "pow2": list(self.pow2), "full_warps": self.full_warps}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BlockFacts:
        bound = data.get("max_threads")
        return cls(tuple((int(a), str(why)) for a, why in data.get("fixed", ())),
                   tuple(BlockTie.from_json(t) for t in data.get("ties", ())),
                   None if bound is None else int(bound),
                   tuple(int(a) for a in data.get("pow2", ())), data.get("full_warps"))


def ladder_note(name: str, values: Sequence[int], recorded: int) -> str:
    """``block.x: 32 64 [80] 96 ...`` (the recorded value in brackets)."""
    return f"{name}: " + " ".join(f"[{v}]" if v == recorded else str(v) for v in values)
