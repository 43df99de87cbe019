"""The inner search space of one kernel variant: compiler options, launch shape, tunables.

The caller (the engine) turns what the other layers know into plain values —
:class:`OptionDim` from the compile layer's option table, :class:`LaunchSpec` from the
recording's launch, :class:`~r3tui.search.source.Tunable` and relations from the variant's
source, :class:`DeviceLimits` from the GPU — and :meth:`SearchSpace.from_parts` builds the
dimensions.  This module imports no other layer and does no I/O; scikit-optimize is imported only
inside :meth:`SearchSpace.dimensions`.

Points are lists in skopt's original space, one entry per dimension: an ``int`` index for an
ordinal dimension (block axes, integer options, numeric tunables, launch bounds: their values are
ordered, which a Gaussian process can use) and a ``str`` label for a categorical one.  Most of the
space is valid by construction: values a toolchain would contradict are not offered (an option at
its default is "default", i.e. not sent; ``--use_fast_math`` excludes explicit ftz/prec-div/
prec-sqrt/fmad settings), and every remaining constraint (threads per block, shared memory,
``__launch_bounds__`` >= block volume, declared relations) is one predicate,
:meth:`SearchSpace.is_valid_point`, that the optimizer's sampler also uses.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from r3tui.domain import Dim3, TrialConfig
from r3tui.search.block import BlockFacts, BlockTie
from r3tui.search.expressions import Relation
from r3tui.search.parts import (
    BLOCK_NAMES,
    DEFAULT,
    FAST_MATH,
    INT_LADDERS,
    KNOWN_DEFAULTS,
    LAUNCH_BOUNDS_MIN_BLOCKS,
    MATH_PARTS,
    NONE,
    ON,
    STANDARD_PIPELINES,
    BlockEncoding,
    BlockLadder,
    DeviceLimits,
    LaunchInfoLike,
    LaunchSpec,
    OptionDim,
    OptionKind,
    OptionSpecLike,
    SpaceError,
    config_key,
    defines_for,
    option_dims,
)
from r3tui.search.source import Tunable, TunableValue, block_env

__all__ = [
    "BLOCK_NAMES", "DEFAULT", "FAST_MATH", "INT_LADDERS", "KNOWN_DEFAULTS",
    "LAUNCH_BOUNDS_MIN_BLOCKS", "MATH_PARTS", "NONE", "ON", "STANDARD_PIPELINES",
    "BlockEncoding", "BlockFacts", "BlockLadder", "BlockTie", "DeviceLimits",
    "LaunchInfoLike", "LaunchSpec", "OptionDim", "OptionKind",
    "OptionSpecLike", "SearchSpace", "SpaceError", "config_key", "defines_for", "option_dims",
]


@dataclass(frozen=True)
class _Dim:
    """One search dimension: ``choices`` are the semantic values, indexed by position."""

    name: str
    role: str  # "option", "fast", "part", "block_x|y|z", "block", "tie", "tunable", ...
    choices: tuple[Any, ...]
    ordinal: bool
    baseline: int  # index of the recorded / not-sent choice
    labels: tuple[str, ...] = ()  # categorical labels (str)
    option: OptionDim | None = None
    tie: BlockTie | None = None  # role "tie": the macro that gives block axes

    def label_index(self) -> dict[str, int]:
        return {label: i for i, label in enumerate(self.labels)}


@dataclass(frozen=True)
class _Constraint:
    dims: frozenset[int]
    why: str
    check: Callable[[_View], bool]
    device: bool = False  # a device limit (the recorded launch must satisfy it)


@dataclass
class _View:
    """A point's semantic values, as the constraints read them."""

    block: Dim3
    tunables: dict[str, TunableValue]
    bounds: tuple[int, int] | None
    lb_min_blocks: int  # the min-blocks dimension's value, also where there are no bounds
    math: dict[str, str]  # role "fast"/"part" dims: option name -> label

    def env(self) -> dict[str, int]:
        env = {k: v for k, v in self.tunables.items() if isinstance(v, int)}
        env.update(block_env(self.block))
        return env


@dataclass
class SearchSpace:
    """Dimensions, constraints and the point <-> :class:`TrialConfig` mapping of one variant."""

    toolchain: str
    options: tuple[OptionDim, ...]
    launch: LaunchSpec
    tunables: tuple[Tunable, ...]
    relations: tuple[Relation, ...]
    limits: DeviceLimits
    include_launch_bounds: bool
    pipelines: tuple[str, ...] | None
    block_encoding: BlockEncoding
    shared: Relation | None = None  # the source's `// r3: shared EXPR` (dynamic bytes)
    # injected __launch_bounds__ max threads at least this (the application's largest block)
    launch_bounds_floor: int = 0
    dims: list[_Dim] = field(default_factory=list)
    constraints: list[_Constraint] = field(default_factory=list)
    _labels: list[dict[str, int] | None] = field(default_factory=list, repr=False)
    _sizes: list[int] = field(default_factory=list, repr=False)
    _groups: list[tuple[int, ...]] | None = field(default=None, repr=False)
    _group_points: dict[int, list[tuple[int, ...]]] = field(default_factory=dict, repr=False)
    _checks: list[tuple[tuple[int, ...], set[tuple[int, ...]] | None, list[_Constraint]]] | None \
        = field(default=None, repr=False)
    _shared_expression: Relation | None = field(default=None, repr=False)
    _launch_notes: list[str] = field(default_factory=list, repr=False)
    _keys: dict[tuple[int, ...], str] = field(default_factory=dict, repr=False, compare=False)

    # -- construction --------------------------------------------------------------------
    @classmethod
    def from_parts(
        cls,
        options: Sequence[OptionDim],
        launch: LaunchSpec,
        tunables: Sequence[Tunable] = (),
        relations: Sequence[Relation | str] = (),
        limits: DeviceLimits | None = None,
        include_launch_bounds: bool = False,
        pipelines: Sequence[str] | None = None,
        *,
        toolchain: str = "nvrtc",
        block_encoding: BlockEncoding = "axes",
        max_block_shapes: int = 48,
        shared: Relation | str | None = None,
        launch_bounds_floor: int = 0,
    ) -> SearchSpace:
        """``shared``: the dynamic shared memory bytes as an expression of the numeric
        tunables and the block (a source's ``// r3: shared EXPR``); every point launches with
        its own size.  Without it the recorded size is launched (or ``shared_mem_per_thread``
        times the block volume, where the launch gives that)."""
        space = cls(
            toolchain=toolchain, options=tuple(options), launch=launch, tunables=tuple(tunables),
            relations=tuple(r if isinstance(r, Relation) else Relation.parse(r)
                            for r in relations),
            limits=limits or DeviceLimits(), include_launch_bounds=include_launch_bounds,
            pipelines=None if pipelines is None else tuple(dict.fromkeys(pipelines)),
            block_encoding=block_encoding,
            shared=Relation.parse(shared) if isinstance(shared, str) else shared,
            launch_bounds_floor=launch_bounds_floor,
        )
        space._shared_expression = space.shared or (
            Relation.parse(f"BLOCK_THREADS * {launch.shared_mem_per_thread}")
            if launch.shared_mem_per_thread else None)
        from r3tui.search import _layout  # the dimension builders, kept in their own module

        _layout.build(space, max_block_shapes)
        space._labels = [None if d.ordinal else d.label_index() for d in space.dims]
        space._sizes = [len(d.choices) for d in space.dims]
        view = space._view([d.baseline for d in space.dims])
        broken = [c.why for c in space.constraints if c.device and not c.check(view)]
        if broken:
            raise SpaceError("the recorded launch violates the device limits: " + "; ".join(broken))
        at_baseline = space.shared_bytes(view)
        if space.shared is not None and at_baseline != launch.shared_mem_bytes:
            raise SpaceError(
                f"'// r3: shared {space.shared.text}' gives {at_baseline} bytes at the "
                f"source's defaults and the recorded block, but the recording launched with "
                f"{launch.shared_mem_bytes}",
                hint="the expression must reproduce the recorded launch's dynamic shared memory")
        return space

    def launch_notes(self) -> tuple[str, ...]:
        """What the space does with the block, one line each: why shapes are fixed, which
        macros give axes, the ladders (``block.x: 32 64 [80] ...``)."""
        return tuple(self._launch_notes)

    def ties(self) -> tuple[BlockTie, ...]:
        """The block macros that are search dimensions."""
        return tuple(d.tie for d in self.dims if d.tie is not None)

    def shared_expression(self) -> Relation | None:
        """What sizes the dynamic shared memory: the declared expression, or the launch's
        bytes per thread (None: the recorded size, whatever the point)."""
        return self._shared_expression

    def shared_bytes(self, view: _View) -> int | None:
        """Dynamic shared memory bytes of a point (None: its expression divides by zero)."""
        expression = self.shared_expression()
        return self.launch.shared_mem_bytes if expression is None else expression.value(
            view.env())

    # -- skopt ---------------------------------------------------------------------------
    def dimensions(self) -> list[Any]:
        """The skopt dimensions (``Integer`` for ordinal dims, ``Categorical`` otherwise)."""
        from skopt.space import Categorical, Integer

        return [Integer(0, len(d.choices) - 1, name=d.name) if d.ordinal
                else Categorical(list(d.labels), name=d.name) for d in self.dims]

    @property
    def names(self) -> list[str]:
        return [d.name for d in self.dims]

    # -- points --------------------------------------------------------------------------
    def _indices(self, point: Sequence[Any]) -> tuple[int, ...] | None:
        # Hot: skopt calls the constraint on every sampled candidate (numpy scalars).
        if len(point) != len(self.dims):
            return None
        out = []
        for size, labels, value in zip(self._sizes, self._labels, point, strict=True):
            if labels is None:
                try:
                    index = value.__index__()  # int and numpy integers; not str or float
                except AttributeError:
                    return None
                if not 0 <= index < size:
                    return None
                out.append(index)
            else:
                try:
                    found = labels.get(value)
                except TypeError:
                    return None
                if found is None:
                    return None
                out.append(found)
        return tuple(out)

    def indices(self, point: Sequence[Any]) -> tuple[int, ...] | None:
        """``point`` as one choice index per dimension, or None when it is not a point."""
        return self._indices(point)

    def from_indices(self, indices: Sequence[int]) -> list[Any]:
        """The point whose choice indices are ``indices`` (valid or not)."""
        return self._point([int(i) for i in indices])

    def normalize(self, point: Sequence[Any]) -> list[Any] | None:
        """``point`` with plain Python values (skopt hands out numpy scalars), or None when it
        is not a point of this space."""
        indices = self._indices(point)
        return None if indices is None else self._point(indices)

    def _point(self, indices: Sequence[int]) -> list[Any]:
        return [int(i) if d.ordinal else d.labels[i]
                for d, i in zip(self.dims, indices, strict=True)]

    def _view(self, indices: Sequence[int]) -> _View:
        block = self.launch.block
        axes = list(block.as_tuple())
        tunables: dict[str, TunableValue] = {}
        bounds_threads: int | None = None
        min_blocks = 1
        math_labels: dict[str, str] = {}
        for dim, i in zip(self.dims, indices, strict=True):
            value = dim.choices[i]
            if dim.role == "block":
                axes = list(value.as_tuple())
            elif dim.role.startswith("block_"):
                axes["xyz".index(dim.role[-1])] = value
            elif dim.tie is not None:
                for axis in dim.tie.axes:
                    axes[axis] = value
                tunables[dim.tie.macro] = value
            elif dim.role == "tunable":
                tunables[dim.name.split(".", 1)[1]] = value
            elif dim.role == "lb_threads":
                bounds_threads = value
            elif dim.role == "lb_min_blocks":
                min_blocks = value
            elif dim.role in ("fast", "part"):
                math_labels[dim.option.name if dim.option else dim.name] = dim.labels[i]
        for tunable in self.tunables:
            if tunable.name not in tunables:
                tunables[tunable.name] = (tunable.default if tunable.default is not None
                                          else tunable.values[0])
        bounds = None if bounds_threads is None else (bounds_threads, min_blocks)
        return _View(Dim3(*axes), tunables, bounds, min_blocks, math_labels)

    def violations(self, point: Sequence[Any]) -> list[str]:
        """Why ``point`` is invalid (empty when it is valid)."""
        indices = self._indices(point)
        if indices is None:
            return ["not a point of this space"]
        view = self._view(indices)
        return [c.why for c in self.constraints if not c.check(view)]

    def is_valid_point(self, point: Sequence[Any]) -> bool:
        """Every constraint holds (the predicate skopt's ``space_constraint`` also gets: it is
        called for every sampled candidate, so groups of dimensions that constraints tie
        together are checked against their precomputed valid combinations)."""
        indices = self._indices(point)
        if indices is None:
            return False
        if self._checks is None:
            self._checks = self._build_checks()
        slow = []
        for members, valid, inside in self._checks:
            if valid is None:
                slow.extend(inside)
            elif tuple(indices[i] for i in members) not in valid:
                return False
        if slow:
            view = self._view(indices)
            return all(c.check(view) for c in slow)
        return True

    def _build_checks(self) -> list[tuple[tuple[int, ...], set[tuple[int, ...]] | None,
                                          list[_Constraint]]]:
        checks: list[tuple[tuple[int, ...], set[tuple[int, ...]] | None, list[_Constraint]]] = []
        constant = [c for c in self.constraints if not c.dims]
        if constant:
            checks.append(((), None, constant))
        for g, members in enumerate(self._group_list()):
            inside = [c for c in self.constraints if c.dims and c.dims <= set(members)]
            if not inside:
                continue
            raw = math.prod(len(self.dims[i].choices) for i in members)
            valid = set(self._valid_in_group(g)) if raw <= 200_000 else None
            checks.append((members, valid, inside))
        return checks

    def baseline_point(self) -> list[Any]:
        return self._point([d.baseline for d in self.dims])

    # -- configs -------------------------------------------------------------------------
    def to_config(self, point: Sequence[Any]) -> TrialConfig:
        """The config of ``point`` with plain Python values (numpy scalars converted)."""
        indices = self._indices(point)
        if indices is None:
            raise SpaceError(f"{list(point)!r} is not a point of this space")
        view = self._view(indices)
        options: list[str] = []
        tunables: dict[str, TunableValue] = {}
        pipeline: str | None = None
        for dim, i in zip(self.dims, indices, strict=True):
            if dim.option is not None and dim.labels[i] not in (DEFAULT,):
                options.extend(dim.option.tokens[dim.labels[i]])
            elif dim.role == "tunable":
                name = dim.name.split(".", 1)[1]
                if dim.choices[i] != self._tunable(name).default:
                    tunables[name] = dim.choices[i]
            elif dim.tie is not None and i != dim.baseline:
                tunables[dim.tie.macro] = dim.choices[i]
            elif dim.role == "pipeline" and dim.choices[i] is not None:
                pipeline = str(dim.choices[i])
        for tunable in self.tunables:  # without a default the source needs a -D
            if tunable.default is None and tunable.name not in tunables:
                tunables[tunable.name] = view.tunables[tunable.name]
        block = None if view.block == self.launch.block else view.block
        shared = self.shared_bytes(view)
        return TrialConfig(toolchain=self.toolchain, options=tuple(options), block=block,
                           tunables=tunables, launch_bounds=view.bounds, pipeline=pipeline,
                           shared_mem_bytes=None if shared == self.launch.shared_mem_bytes
                           else shared)

    def _tunable(self, name: str) -> Tunable:
        return next(t for t in self.tunables if t.name == name)

    def from_config(self, config: TrialConfig) -> list[Any] | None:
        """The point of ``config``, or None when it is outside the space (or invalid)."""
        from r3tui.search import _layout

        indices = _layout.indices_of(self, config)
        if indices is None:
            return None
        point = self._point(indices)
        return point if self.is_valid_point(point) else None

    def completed(self, config: TrialConfig) -> TrialConfig | None:
        """``config`` with what the space derives from its choices set as the space sets it
        (the dynamic shared memory a tile's size gives), or None when it is not a valid point.
        A parent's configuration with a child's new tunables changed launches with the
        child's shared memory, not the parent's."""
        from r3tui.search import _layout

        indices = _layout.indices_of(self, config, derive_shared=True)
        if indices is None:
            return None
        point = self._point(indices)
        return self.to_config(point) if self.is_valid_point(point) else None

    def unchecked_point(self, config: TrialConfig) -> list[Any] | None:
        """The point of ``config`` even when a constraint rejects it (None: not representable)."""
        from r3tui.search import _layout

        indices = _layout.indices_of(self, config)
        return None if indices is None else self._point(indices)

    def baseline_config(self) -> TrialConfig:
        """The recorded configuration: no extra options, recorded block, source defaults.

        It is a point of the space unless a declared relation excludes it."""
        return self.to_config(self.baseline_point())

    def key(self, point: Sequence[Any]) -> str:
        """``config_key`` of the point's config, kept per point of the space: a search asks it
        of thousands of acquisition candidates a campaign (0.3 s of JSON in a 200-trial one)."""
        indices = self._indices(point)
        if indices is None:
            return config_key(self.to_config(point))
        found = self._keys.get(indices)
        if found is None:
            found = self._keys[indices] = config_key(self.to_config(point))
        return found

    def check(self, config: TrialConfig) -> list[str]:
        """Why ``config`` cannot be sent (empty when it is a valid point of this space)."""
        from r3tui.search import _layout

        indices = _layout.indices_of(self, config)
        if indices is None:
            return ["outside the search space (an option, value or shape it does not offer)"]
        return self.violations(self._point(indices))

    def dynamic_shared_bytes(self, config: TrialConfig) -> int:
        """Dynamic shared memory to launch ``config`` with."""
        if config.shared_mem_bytes is not None:
            return config.shared_mem_bytes
        return self.launch.shared_mem_bytes

    def grid_for(self, config: TrialConfig) -> Dim3 | None:
        """The grid ``config`` launches with (None: the recorded grid)."""
        if config.block is None or self.launch.work is None:
            return None
        return config.block.grid_for(self.launch.work)

    # -- counting, enumeration, uniform sampling -----------------------------------------
    def _group_list(self) -> list[tuple[int, ...]]:
        if self._groups is None:
            parent = list(range(len(self.dims)))

            def root(i: int) -> int:
                while parent[i] != i:
                    parent[i] = parent[parent[i]]
                    i = parent[i]
                return i

            for constraint in self.constraints:
                members = sorted(constraint.dims)
                for other in members[1:]:
                    parent[root(other)] = root(members[0])
            groups: dict[int, list[int]] = {}
            for i in range(len(self.dims)):
                groups.setdefault(root(i), []).append(i)
            self._groups = [tuple(g) for g in groups.values()]
        return self._groups

    def _valid_in_group(self, g: int) -> list[tuple[int, ...]]:
        """The valid index combinations of group ``g`` (constraints touching only it)."""
        if g not in self._group_points:
            members = self._group_list()[g]
            inside = [c for c in self.constraints if c.dims <= set(members)]
            base = [d.baseline for d in self.dims]
            found = []
            for combo in itertools.product(*(range(len(self.dims[i].choices)) for i in members)):
                for i, value in zip(members, combo, strict=True):
                    base[i] = value
                view = self._view(base)
                if all(c.check(view) for c in inside):
                    found.append(combo)
            self._group_points[g] = found
        return self._group_points[g]

    def valid_groups(self, limit: int = 200_000
                     ) -> list[tuple[tuple[int, ...], list[tuple[int, ...]]]] | None:
        """The groups of dimensions that constraints tie together, each with its valid index
        combinations: a point is valid exactly when each group's combination is, so drawing
        one combination per group uniformly draws a valid point uniformly.  None when a group
        has more than ``limit`` raw combinations to check."""
        groups = self._group_list()
        if any(math.prod(len(self.dims[i].choices) for i in members) > limit
               for members in groups):
            return None
        return [(members, self._valid_in_group(g)) for g, members in enumerate(groups)]

    def size(self) -> int:
        """How many valid points the space has."""
        return math.prod(len(self._valid_in_group(g)) for g in range(len(self._group_list())))

    def point_at(self, index: int) -> list[Any]:
        """The ``index``-th valid point (mixed radix over the independent groups)."""
        indices = [0] * len(self.dims)
        for g in reversed(range(len(self._group_list()))):
            valid = self._valid_in_group(g)
            index, digit = divmod(index, len(valid))
            for i, value in zip(self._group_list()[g], valid[digit], strict=True):
                indices[i] = value
        return self._point(indices)

    def enumerate(self, limit: int | None = 100_000) -> Iterator[TrialConfig]:
        """Every valid config, in a fixed order (:class:`SpaceError` beyond ``limit``)."""
        total = self.size()
        if limit is not None and total > limit:
            raise SpaceError(f"the space has {total} valid points, more than {limit} to list")
        for index in range(total):
            yield self.to_config(self.point_at(index))

    def sample(self, rng: random.Random, n: int = 1) -> list[list[Any]]:
        """``n`` valid points drawn uniformly (rejection from the product of the dimensions)."""
        out: list[list[Any]] = []
        for _ in range(1000 * max(n, 1)):
            if len(out) >= n:
                break
            point = self._point([rng.randrange(len(d.choices)) for d in self.dims])
            if self.is_valid_point(point):
                out.append(point)
        while len(out) < n:  # a space that is mostly invalid: draw by index instead
            out.append(self.point_at(rng.randrange(self.size())))
        return out

    # -- description ---------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        """Everything :meth:`from_description` needs to rebuild this space (JSON-ready)."""
        return {"toolchain": self.toolchain, "options": [o.to_json() for o in self.options],
                "launch": self.launch.to_json(), "tunables": [t.to_json() for t in self.tunables],
                "relations": [r.text for r in self.relations], "limits": self.limits.to_json(),
                "include_launch_bounds": self.include_launch_bounds,
                "pipelines": None if self.pipelines is None else list(self.pipelines),
                "block_encoding": self.block_encoding,
                "shared": None if self.shared is None else self.shared.text,
                **({"launch_bounds_floor": self.launch_bounds_floor}
                   if self.launch_bounds_floor else {})}

    @classmethod
    def from_description(cls, data: Mapping[str, Any]) -> SearchSpace:
        try:
            return cls.from_parts(
                [OptionDim.from_json(o) for o in data.get("options", [])],
                LaunchSpec.from_json(data["launch"]),
                [Tunable.from_json(t) for t in data.get("tunables", [])],
                list(data.get("relations", [])),
                DeviceLimits.from_json(data.get("limits", {})),
                bool(data.get("include_launch_bounds", False)),
                data.get("pipelines"),
                toolchain=str(data.get("toolchain", "nvrtc")),
                block_encoding=data.get("block_encoding", "axes"),
                shared=data.get("shared"),
                launch_bounds_floor=int(data.get("launch_bounds_floor", 0)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise SpaceError(f"bad search-space description: {exc!r}") from None
