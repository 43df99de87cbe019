"""Builds a :class:`~r3tui.search.space.SearchSpace`'s dimensions and constraints, and maps a
:class:`~r3tui.domain.TrialConfig` back to dimension indices (the inverse of ``to_config``)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from r3tui.domain import Dim3, TrialConfig
from r3tui.search.block import AXES, BlockFacts, BlockTie, axis_ladder, ladder_note
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
    _launch_bounds_cap(space, block_dims)
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
    """Each axis's candidate extents (one value: the axis keeps its recorded extent)."""
    launch, limits = space.launch, space.limits
    assert launch.work is not None
    facts = launch.facts or BlockFacts()
    out = []
    for axis, (work, recorded) in enumerate(
        zip(launch.work.as_tuple(), launch.block.as_tuple(), strict=True)
    ):
        limit = min(limits.max_block_dims[axis], limits.max_threads_per_block)
        low = 4 if axis == 0 and work >= limits.warp_size else 1
        if launch.ladder == "pow2":
            top = min(limit, 2 ** math.ceil(math.log2(max(work, 1))))
            out.append(sorted({*_pow2_upto(top, low), recorded}))
        elif facts.fixed_reason(axis) is not None or facts.tie_of(axis) is not None:
            out.append([recorded])
        else:
            out.append(list(axis_ladder(recorded, work, _capped(space, limit), low=low,
                                        axis=axis, pow2_only=axis in facts.pow2)))
    return out


def _capped(space: SearchSpace, limit: int) -> int:
    """``limit`` within the source's own ``__launch_bounds__`` where the search keeps it."""
    bound = space.launch.facts.max_threads if space.launch.facts else None
    return limit if bound is None or space.include_launch_bounds else min(limit, bound)


def _tie_values(space: SearchSpace, tie: BlockTie) -> tuple[int, ...]:
    launch, limits = space.launch, space.limits
    assert launch.work is not None
    recorded = launch.block.as_tuple()[tie.axes[0]]
    if tie.values:
        return tuple(sorted({*tie.values, recorded}))
    works = [launch.work.as_tuple()[a] for a in tie.axes]
    # n axes of v threads each: v ** n threads per block at most
    root = int(_capped(space, limits.max_threads_per_block) ** (1 / len(tie.axes)) + 1e-9)
    limit = min(root, *(limits.max_block_dims[a] for a in tie.axes))
    low = 4 if min(works) >= limits.warp_size else 1
    return axis_ladder(recorded, min(works), limit, low=low, axis=max(tie.axes),
                       exact=math.gcd(*works))


def _block(space: SearchSpace, max_block_shapes: int) -> list[int]:
    launch, limits = space.launch, space.limits
    recorded = launch.block
    facts = launch.facts or BlockFacts()
    warp = limits.warp_size
    full_warps = launch.ladder == "pow2" or facts.full_warps is not None

    def shape_ok(block: Dim3) -> bool:
        volume = block.volume
        if volume > limits.max_threads_per_block:
            return False
        if any(a > m for a, m in zip(block.as_tuple(), limits.max_block_dims, strict=True)):
            return False
        if block == recorded:
            return True
        if full_warps:
            return volume >= warp and volume % warp == 0
        # at least a warp (or as many threads as the recording had): a smaller block leaves
        # most of each warp's lanes idle
        return volume >= min(warp, recorded.volume)

    dims: list[int] = []
    notes = space._launch_notes
    if not launch.tunes_block:
        notes.append(f"block fixed at {_shape(recorded)}: {launch.block_fixed}")
    elif launch.block_shapes is not None or space.block_encoding == "shapes":
        shapes = list(launch.block_shapes or _shapes(space, shape_ok, max_block_shapes))
        if recorded not in shapes:
            shapes.insert(0, recorded)
        labels = tuple(_shape(s) for s in shapes)
        dims.append(len(space.dims))
        space.dims.append(_Dim("block", "block", tuple(shapes), False,
                               shapes.index(recorded), labels))
        notes.append(f"block: {len(shapes)} shapes, " + " ".join(labels))
    else:
        dims = _block_dims(space, facts)
    if launch.tunes_block and facts.max_threads is not None:
        notes.append(f"block volume at most {facts.max_threads}: the kernel declares "
                     f"__launch_bounds__({facts.max_threads})"
                     + (" (unless the search injects its own)" if space.include_launch_bounds
                        else ""))
    if dims and facts.full_warps is not None:
        notes.append(f"block volume a multiple of {warp}: {facts.full_warps}")
    space.constraints.append(_Constraint(
        frozenset(dims),
        (f"block must have a multiple of {warp} threads, at most " if full_warps
         else f"block must have at least {min(warp, recorded.volume)} threads, at most ")
        + f"{limits.max_threads_per_block} (device limit)",
        lambda view: shape_ok(view.block), device=True))
    return dims


def _block_dims(space: SearchSpace, facts: BlockFacts) -> list[int]:
    """One ordinal dimension per free axis and per block macro; notes on each axis."""
    launch, notes = space.launch, space._launch_notes
    assert launch.work is not None
    dims: list[int] = []
    fixed: list[str] = []
    for axis, values in enumerate(_axis_values(space)):
        rec = launch.block.as_tuple()[axis]
        why = facts.fixed_reason(axis)
        if why is not None and (rec > 1 or launch.work.as_tuple()[axis] > 1):
            fixed.append(f"block.{AXES[axis]} fixed at {rec}: {why}")
        if len(values) > 1:
            dims.append(len(space.dims))
            space.dims.append(_Dim(f"block.{AXES[axis]}", f"block_{AXES[axis]}",
                                   tuple(values), True, values.index(rec)))
            notes.append(ladder_note(f"block.{AXES[axis]}", values, rec))
    if launch.ladder == "derived":
        for tie in facts.ties:
            tie_values = _tie_values(space, tie)
            rec = launch.block.as_tuple()[tie.axes[0]]
            if len(tie_values) > 1:
                dims.append(len(space.dims))
                space.dims.append(_Dim(f"block.{tie.macro}", "tie", tie_values, True,
                                       tie_values.index(rec), tie=tie))
            notes.append(ladder_note(tie.describe(), tie_values, rec) + f" (-D{tie.macro}=value"
                         + ("" if tie.guarded else "; its #define has no #ifndef guard, so "
                            "shipping a new value needs one") + ")")
    if not dims:
        notes.insert(0, f"block fixed at {_shape(launch.block)}: "
                     + ("; ".join(fixed) or "no other extent fits the work and the device"))
    else:
        notes.extend(fixed)
    notes.extend(f"block.{AXES[a]}: powers of two only, the kernel halves blockDim.{AXES[a]}"
                 for a in facts.pow2 if facts.fixed_reason(a) is None)
    return dims


def _shape(block: Dim3) -> str:
    return "x".join(map(str, block.as_tuple()))


def _launch_bounds_cap(space: SearchSpace, block_dims: list[int]) -> None:
    """The source's own ``__launch_bounds__(N)``: the block volume may not exceed N unless
    the point injects its own bounds (which replace it)."""
    bound = space.launch.facts.max_threads if space.launch.facts else None
    if bound is None or not block_dims:
        return
    dims = {*block_dims, *(i for i, d in enumerate(space.dims) if d.role == "lb_threads")}
    space.constraints.append(_Constraint(
        frozenset(dims), f"block volume above the kernel's own __launch_bounds__({bound})",
        lambda view: view.bounds is not None or view.block.volume <= bound))


def _shared(space: SearchSpace, block_dims: list[int]) -> None:
    """The per-block shared memory limit; where the dynamic size is an expression, the
    dimensions it names are tied to it (a negative size, or one dividing by zero, is invalid)."""
    launch, limits = space.launch, space.limits
    expression = space.shared_expression()
    dims: set[int] = set()
    if expression is not None:
        ties = {t.macro for t in space.ties()}
        numeric = {t.name for t in space.tunables if t.numeric} | ties
        unknown = expression.names - numeric - set(BLOCK_NAMES)
        if unknown:
            raise SpaceError(
                f"shared memory size {expression.text!r} names {', '.join(sorted(unknown))}",
                hint=f"it may use the numeric tunables ({', '.join(sorted(numeric)) or 'none'})"
                f" and {', '.join(BLOCK_NAMES)}")
        dims = {i for i, d in enumerate(space.dims)
                if d.role == "tunable" and d.name.split(".", 1)[1] in expression.names}
        if expression.names & (set(BLOCK_NAMES) | ties):
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
    ties = {t.macro for t in space.ties()}
    for tunable in space.tunables:
        if tunable.name in by_name:
            raise SpaceError(f"tunable {tunable.name} is declared twice")
        if tunable.name in BLOCK_NAMES:
            raise SpaceError(f"tunable name {tunable.name} is reserved for the block shape")
        by_name[tunable.name] = -1
        if len(tunable.values) < 2 or tunable.name in ties:  # a block macro is its own dim
            continue
        values = tunable.values
        baseline = values.index(tunable.default) if tunable.default in values else 0
        by_name[tunable.name] = len(space.dims)
        space.dims.append(_Dim(f"tune.{tunable.name}", "tunable", values, tunable.numeric,
                               baseline, tuple(str(v) for v in values)))
    numeric = {t.name for t in space.tunables if t.numeric} | ties
    for relation in space.relations:
        unknown = relation.names - numeric - set(BLOCK_NAMES)
        if unknown:
            raise SpaceError(
                f"relation {relation.text!r} names {', '.join(sorted(unknown))}",
                hint=f"it may use the numeric tunables ({', '.join(sorted(numeric)) or 'none'})"
                f" and {', '.join(BLOCK_NAMES)}")
        dims = {by_name[n] for n in relation.names if by_name.get(n, -1) >= 0}
        if relation.names & (set(BLOCK_NAMES) | ties):
            dims |= set(block_dims)
        space.constraints.append(_Constraint(
            frozenset(dims), f"relation {relation.text!r} does not hold", _holds(relation)))


def _holds(relation: Relation) -> Callable[[_View], bool]:
    return lambda view: relation.holds(view.env())


def _launch_bounds(space: SearchSpace, block_dims: list[int]) -> None:
    if not space.include_launch_bounds:
        return
    limits = space.limits
    # bounds below the largest block the application launches the kernel with would make
    # those launches fail in the application: r3 apply could not ship them
    floor = space.launch_bounds_floor
    threads: tuple[Any, ...] = (
        *(t for t in _pow2_upto(limits.max_threads_per_block, limits.warp_size) if t >= floor),
        None)
    if floor > 1 and len(threads) > 1:
        space._launch_notes.append(
            f"__launch_bounds__ max threads from {threads[0]}: the application launches this "
            f"kernel with up to {floor} threads per block")
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


def indices_of(space: SearchSpace, config: TrialConfig, *, derive_shared: bool = False
               ) -> tuple[int, ...] | None:
    """The indices of ``config``'s point (None: not a point of ``space``); ``derive_shared``:
    its dynamic shared memory is whatever the point's expression gives, not checked."""
    if config.toolchain != space.toolchain:
        return None
    labels = _option_labels(space, config.options)
    if labels is None:
        return None
    block = config.block or space.launch.block
    if not space.launch.tunes_block and block != space.launch.block:
        return None
    ties = space.ties()
    if set(config.tunables) - {t.name for t in space.tunables} - {t.macro for t in ties}:
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
        elif dim.tie is not None:
            index = _choice_index(dim.choices, block.as_tuple()[dim.tie.axes[0]])
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
    for tie in ties:  # the macro's -D and the block it gives must agree
        recorded = space.launch.block.as_tuple()[tie.axes[0]]
        if str(config.tunables.get(tie.macro, recorded)) != str(view.tunables[tie.macro]):
            return None
    recorded = space.launch.shared_mem_bytes
    wanted = recorded if config.shared_mem_bytes is None else config.shared_mem_bytes
    if not derive_shared and wanted != space.shared_bytes(view):  # not the point's size
        return None
    return tuple(out)
