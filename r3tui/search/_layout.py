"""Builds a :class:`~r3tui.search.space.SearchSpace`'s dimensions and constraints, and maps a
:class:`~r3tui.domain.TrialConfig` back to dimension indices (the inverse of ``to_config``)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from r3tui.domain import Dim3, TrialConfig
from r3tui.search.expressions import Relation
from r3tui.search.parts import (
    BLOCK_NAMES,
    DEFAULT,
    FAST_MATH,
    LAUNCH_BOUNDS_MIN_BLOCKS,
    MATH_PARTS,
    NONE,
    ON,
    OptionDim,
    SpaceError,
)
from r3tui.search.space import _Constraint, _Dim, _View

if TYPE_CHECKING:
    from r3tui.search.space import SearchSpace


def build(space: SearchSpace, max_block_shapes: int) -> None:
    _options(space)
    block_dims = _block(space, max_block_shapes)
    _tunables(space, block_dims)
    _shared(space, block_dims)
    _launch_bounds(space, block_dims)
    if space.pipelines:
        choices: tuple[Any, ...] = (None, *space.pipelines)
        space.dims.append(_Dim("pipeline", "pipeline", choices, False, 0, (NONE, *space.pipelines)))
    names = [d.name for d in space.dims]
    if len(set(names)) != len(names):
        raise SpaceError(f"two dimensions share a name: {sorted(names)}")


def _options(space: SearchSpace) -> None:
    math_dims: list[int] = []
    seen: set[str] = set()
    for option in space.options:
        if option.name in seen:
            raise SpaceError(f"option {option.name} is given twice")
        seen.add(option.name)
        if not option.values:
            continue
        labels = (DEFAULT, *option.values)
        if option.kind == "int":
            # Ordered, with "not sent" last: for opt-level and maxrregcount it is the largest.
            labels = (*option.values, DEFAULT)
            dim = _Dim(f"opt.{option.name}", "option", labels, True, len(labels) - 1, labels,
                       option)
        else:
            role = "fast" if option.name == FAST_MATH else (
                "part" if option.name in MATH_PARTS else "option")
            dim = _Dim(f"opt.{option.name}", role, labels, False, 0, labels, option)
            if role != "option":
                math_dims.append(len(space.dims))
        space.dims.append(dim)
    roles = {space.dims[i].role for i in math_dims}
    if {"fast", "part"} <= roles:
        # --use_fast_math sets ftz/prec-div/prec-sqrt/fmad itself: never send both.
        def consistent(view: _View) -> bool:
            return view.math.get(FAST_MATH) != ON or all(
                view.math.get(p, DEFAULT) == DEFAULT for p in MATH_PARTS)

        space.constraints.append(_Constraint(
            frozenset(math_dims), "--use_fast_math with an explicit ftz/prec-div/prec-sqrt/fmad",
            consistent))


def _pow2_upto(limit: int, low: int = 1) -> list[int]:
    return [2**k for k in range(int(math.log2(max(limit, 1))) + 1) if 2**k >= low]


def _axis_values(space: SearchSpace) -> list[list[int]]:
    launch, limits = space.launch, space.limits
    assert launch.work is not None
    out = []
    for axis, (work, recorded) in enumerate(
        zip(launch.work.as_tuple(), launch.block.as_tuple(), strict=True)
    ):
        top = min(limits.max_block_dims[axis], limits.max_threads_per_block,
                  2 ** math.ceil(math.log2(max(work, 1))))
        low = 4 if axis == 0 and work >= limits.warp_size else 1
        out.append(sorted({*_pow2_upto(top, low), recorded}))
    return out


def _block(space: SearchSpace, max_block_shapes: int) -> list[int]:
    launch, limits = space.launch, space.limits
    recorded = launch.block

    def shape_ok(block: Dim3) -> bool:
        volume = block.volume
        if volume > limits.max_threads_per_block:
            return False
        if any(a > m for a, m in zip(block.as_tuple(), limits.max_block_dims, strict=True)):
            return False
        warp = limits.warp_size
        return block == recorded or (volume >= warp and volume % warp == 0)

    dims: list[int] = []
    if launch.tunes_block:
        if launch.block_shapes is not None or space.block_encoding == "shapes":
            shapes = list(launch.block_shapes or _shapes(space, shape_ok, max_block_shapes))
            if recorded not in shapes:
                shapes.insert(0, recorded)
            labels = tuple("x".join(map(str, s.as_tuple())) for s in shapes)
            dims.append(len(space.dims))
            space.dims.append(_Dim("block", "block", tuple(shapes), False,
                                   shapes.index(recorded), labels))
        else:
            for axis, values in enumerate(_axis_values(space)):
                if len(values) > 1:
                    dims.append(len(space.dims))
                    rec = recorded.as_tuple()[axis]
                    space.dims.append(_Dim(f"block.{'xyz'[axis]}", f"block_{'xyz'[axis]}",
                                           tuple(values), True, values.index(rec)))
    space.constraints.append(_Constraint(
        frozenset(dims),
        f"block must have a multiple of {limits.warp_size} threads, at most "
        f"{limits.max_threads_per_block} (device limit)",
        lambda view: shape_ok(view.block), device=True))
    return dims


def _shared(space: SearchSpace, block_dims: list[int]) -> None:
    """The per-block shared memory limit; where the dynamic size is an expression, the
    dimensions it names are tied to it (a negative size, or one dividing by zero, is invalid)."""
    launch, limits = space.launch, space.limits
    expression = space.shared_expression()
    dims: set[int] = set()
    if expression is not None:
        numeric = {t.name for t in space.tunables if t.numeric}
        unknown = expression.names - numeric - set(BLOCK_NAMES)
        if unknown:
            raise SpaceError(
                f"shared memory size {expression.text!r} names {', '.join(sorted(unknown))}",
                hint=f"it may use the numeric tunables ({', '.join(sorted(numeric)) or 'none'})"
                f" and {', '.join(BLOCK_NAMES)}")
        dims = {i for i, d in enumerate(space.dims)
                if d.role == "tunable" and d.name.split(".", 1)[1] in expression.names}
        if expression.names & set(BLOCK_NAMES):
            dims |= set(block_dims)

    def shared_ok(view: _View) -> bool:
        dynamic = space.shared_bytes(view)
        return (dynamic is not None and dynamic >= 0
                and launch.static_shared_bytes + dynamic <= limits.max_shared_per_block)

    what = "shared memory per block" if expression is None else (
        f"shared memory per block ({expression.text} dynamic bytes)")
    space.constraints.append(_Constraint(
        frozenset(dims),
        f"{what} exceeds the device limit {limits.max_shared_per_block}, or is negative",
        shared_ok, device=True))


def _shapes(space: SearchSpace, shape_ok: Any, limit: int) -> list[Dim3]:
    axes = _axis_values(space)
    shapes = [Dim3(x, y, z) for x in axes[0] for y in axes[1] for z in axes[2]]
    shapes = [s for s in shapes if shape_ok(s)]
    # Too many shapes make a categorical the model cannot learn: keep ~256-thread, wide-x ones.
    shapes.sort(key=lambda s: (abs(math.log2(s.volume) - 8), -s.x, s.y, s.z))
    return sorted(shapes[:limit], key=lambda s: (s.volume, s.x, s.y, s.z))


def _tunables(space: SearchSpace, block_dims: list[int]) -> None:
    by_name: dict[str, int] = {}
    for tunable in space.tunables:
        if tunable.name in by_name:
            raise SpaceError(f"tunable {tunable.name} is declared twice")
        if tunable.name in BLOCK_NAMES:
            raise SpaceError(f"tunable name {tunable.name} is reserved for the block shape")
        by_name[tunable.name] = -1
        if len(tunable.values) < 2:
            continue
        values = tunable.values
        baseline = values.index(tunable.default) if tunable.default in values else 0
        by_name[tunable.name] = len(space.dims)
        space.dims.append(_Dim(f"tune.{tunable.name}", "tunable", values, tunable.numeric,
                               baseline, tuple(str(v) for v in values)))
    numeric = {t.name for t in space.tunables if t.numeric}
    for relation in space.relations:
        unknown = relation.names - numeric - set(BLOCK_NAMES)
        if unknown:
            raise SpaceError(
                f"relation {relation.text!r} names {', '.join(sorted(unknown))}",
                hint=f"it may use the numeric tunables ({', '.join(sorted(numeric)) or 'none'})"
                f" and {', '.join(BLOCK_NAMES)}")
        dims = {by_name[n] for n in relation.names if by_name.get(n, -1) >= 0}
        if relation.names & set(BLOCK_NAMES):
            dims |= set(block_dims)
        space.constraints.append(_Constraint(
            frozenset(dims), f"relation {relation.text!r} does not hold", _holds(relation)))


def _holds(relation: Relation) -> Callable[[_View], bool]:
    return lambda view: relation.holds(view.env())


def _launch_bounds(space: SearchSpace, block_dims: list[int]) -> None:
    if not space.include_launch_bounds:
        return
    limits = space.limits
    threads: tuple[Any, ...] = (*_pow2_upto(limits.max_threads_per_block, limits.warp_size), None)
    first = len(space.dims)
    space.dims.append(_Dim("launch_bounds.max_threads", "lb_threads", threads, True,
                           len(threads) - 1))
    space.dims.append(_Dim("launch_bounds.min_blocks", "lb_min_blocks",
                           LAUNCH_BOUNDS_MIN_BLOCKS, True, 0))
    dims = frozenset({first, first + 1, *block_dims})

    def bounds_ok(view: _View) -> bool:
        if view.bounds is None:
            return view.lb_min_blocks == LAUNCH_BOUNDS_MIN_BLOCKS[0]
        max_threads, min_blocks = view.bounds
        return (max_threads >= view.block.volume
                and max_threads * min_blocks <= limits.max_threads_per_sm)

    space.constraints.append(_Constraint(
        dims, "__launch_bounds__ max threads below the block volume, or more threads than an SM "
        "holds", bounds_ok))


# ----------------------------------------------------------------------------------------
# config -> indices

def _option_labels(space: SearchSpace, options: Sequence[str]) -> dict[str, str] | None:
    candidates: list[tuple[tuple[str, ...], OptionDim, str]] = [
        (tokens, option, value)
        for option in space.options for value, tokens in option.tokens.items() if tokens
    ]
    found: dict[str, str] = {}
    pos = 0
    tokens = list(options)
    while pos < len(tokens):
        for want, option, value in candidates:
            if tuple(tokens[pos : pos + len(want)]) == want:
                if found.get(option.name, value) != value:
                    return None
                found[option.name] = value
                pos += len(want)
                break
        else:
            return None
    return found


def _choice_index(choices: Sequence[Any], value: Any) -> int | None:
    for i, choice in enumerate(choices):
        if choice == value or (choice is not None and value is not None
                               and str(choice) == str(value)):
            return i
    return None


def indices_of(space: SearchSpace, config: TrialConfig) -> tuple[int, ...] | None:
    if config.toolchain != space.toolchain:
        return None
    labels = _option_labels(space, config.options)
    if labels is None:
        return None
    block = config.block or space.launch.block
    if not space.launch.tunes_block and block != space.launch.block:
        return None
    if set(config.tunables) - {t.name for t in space.tunables}:
        return None
    if config.launch_bounds is not None and not space.include_launch_bounds:
        return None
    if config.pipeline is not None and not space.pipelines:
        return None
    out: list[int] = []
    for dim in space.dims:
        index: int | None
        if dim.option is not None:
            index = _choice_index(dim.labels, labels.pop(dim.option.name, DEFAULT))
        elif dim.role == "block":
            index = _choice_index(dim.choices, block)
        elif dim.role.startswith("block_"):
            index = _choice_index(dim.choices, block.as_tuple()["xyz".index(dim.role[-1])])
        elif dim.role == "tunable":
            name = dim.name.split(".", 1)[1]
            tunable = space._tunable(name)
            index = _choice_index(dim.choices, config.tunables.get(name, tunable.default))
        elif dim.role == "lb_threads":
            index = _choice_index(dim.choices, config.launch_bounds[0]
                                  if config.launch_bounds else None)
        elif dim.role == "lb_min_blocks":
            index = _choice_index(dim.choices, config.launch_bounds[1]
                                  if config.launch_bounds else LAUNCH_BOUNDS_MIN_BLOCKS[0])
        elif dim.role == "pipeline":
            index = _choice_index(dim.choices, config.pipeline)
        else:
            raise AssertionError(dim.role)
        if index is None:
            return None
        out.append(index)
    if labels:  # an option the space does not vary
        return None
    view = space._view(out)
    if view.block != block:  # an axis the space keeps fixed was changed
        return None
    for tunable in space.tunables:
        given = config.tunables.get(tunable.name, tunable.default)
        if given is None or str(view.tunables[tunable.name]) != str(given):
            return None
    recorded = space.launch.shared_mem_bytes
    wanted = recorded if config.shared_mem_bytes is None else config.shared_mem_bytes
    if wanted != space.shared_bytes(view):  # a size the point does not launch with
        return None
    return tuple(out)
