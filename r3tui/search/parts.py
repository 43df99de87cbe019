"""The plain values a search space is built from, and a config's canonical key.

The engine fills these from the other layers (the compile layer's option table, the recording's
launch, the GPU's limits); the search core never imports those layers.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from r3tui.domain import Dim3, TrialConfig
from r3tui.errors import ConfigError
from r3tui.search.block import BlockFacts

OptionKind = Literal["flag", "choice", "int"]
BlockEncoding = Literal["axes", "shapes"]
# "derived": the ladders of r3tui.search.block; "pow2": powers of two with a volume that is a
# multiple of 32, the rule of spaces described before the derived ladders (recorded tables)
BlockLadder = Literal["derived", "pow2"]
DEFAULT = "default"  # an option's label when it is not sent
ON = "on"  # a flag's label when it is sent
NONE = "none"  # no launch bounds / the toolchain's own pipeline
BLOCK_NAMES = ("BLOCK_X", "BLOCK_Y", "BLOCK_Z", "BLOCK_THREADS")

# What nvcc and NVRTC do when an option is absent, so that the search never sends a value that
# only restates the default (a redundant point costs a compile and a replay).
KNOWN_DEFAULTS: Mapping[str, str] = {
    "ftz": "false", "prec-div": "true", "prec-sqrt": "true", "fmad": "true", "opt-level": "3",
}
FAST_MATH = "use_fast_math"
MATH_PARTS = ("ftz", "prec-div", "prec-sqrt", "fmad")  # what --use_fast_math sets
# maxrregcount as a few useful limits (occupancy steps on 64 K-register SMs) instead of 16..255;
# 255 is left out: it is the hardware limit, i.e. the same as not sending the option.
INT_LADDERS: Mapping[str, tuple[int, ...]] = {"maxrregcount": (32, 64, 96, 128)}
LAUNCH_BOUNDS_MIN_BLOCKS = (1, 2, 4, 8)
STANDARD_PIPELINES: tuple[str, ...] = (
    "default<O1>",
    "default<O2>",
    "default<O3>",
    "sroa,early-cse,instcombine,simplifycfg",
    "sroa,instcombine,loop-mssa(licm),gvn,simplifycfg",
    "sroa,instcombine,loop-simplify,loop-rotate,loop-unroll,instcombine,simplifycfg",
    "default<O3>,slp-vectorizer,instcombine",
)  # each accepted by `opt-19 -passes=...`


class SpaceError(ConfigError):
    """A search space that cannot be built, or a space description that does not validate."""


class OptionSpecLike(Protocol):
    """What :meth:`OptionDim.from_spec` reads (``r3tui.compile.options.OptionSpec`` fits)."""

    @property
    def name(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def values(self) -> tuple[str, ...]: ...
    @property
    def low(self) -> int | None: ...
    @property
    def high(self) -> int | None: ...

    def tokens(self, value: bool | int | str = True) -> tuple[str, ...]: ...


class LaunchInfoLike(Protocol):
    """What :meth:`LaunchSpec.of` reads (``r3tui.record.manifest.LaunchInfo`` fits)."""

    @property
    def block(self) -> Dim3: ...
    @property
    def shared_mem_bytes(self) -> int: ...
    @property
    def work(self) -> Dim3 | None: ...
    @property
    def block_tunable(self) -> bool: ...


@dataclass(frozen=True)
class OptionDim:
    """One compiler option as the search sees it.

    ``values`` are the settings tried besides not sending the option (for ``"int"`` options a
    few points of ``low..high``; for flags ``("on",)``); ``tokens`` maps each to its command-line
    tokens, rendered by the compile layer (:meth:`from_spec`) so the spelling is its canonical
    one.
    """

    name: str
    kind: OptionKind
    values: tuple[str, ...]
    tokens: Mapping[str, tuple[str, ...]]
    low: int | None = None
    high: int | None = None

    def __post_init__(self) -> None:
        missing = [v for v in self.values if v not in self.tokens]
        if missing:
            raise SpaceError(f"option {self.name}: no tokens for {missing}")

    @classmethod
    def from_spec(
        cls, spec: OptionSpecLike, values: Sequence[int | str] | None = None
    ) -> OptionDim:
        kind: OptionKind
        if spec.kind == "flag":
            kind, chosen = "flag", [ON]
        elif spec.kind == "choice":
            kind, chosen = "choice", [str(v) for v in (values or spec.values)]
        elif spec.kind == "int":
            kind = "int"
            chosen = [str(v) for v in (values or _int_ladder(spec.name, spec.low, spec.high))]
        else:
            raise SpaceError(f"option {spec.name}: unknown kind {spec.kind!r}")
        default = KNOWN_DEFAULTS.get(spec.name)
        chosen = [v for v in dict.fromkeys(chosen) if v != default]
        tokens = {v: tuple(spec.tokens(True if kind == "flag" else v)) for v in chosen}
        return cls(spec.name, kind, tuple(chosen), tokens, spec.low, spec.high)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "values": list(self.values),
                "tokens": {v: list(t) for v, t in self.tokens.items()},
                "low": self.low, "high": self.high}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> OptionDim:
        try:
            return cls(str(data["name"]), data["kind"], tuple(str(v) for v in data["values"]),
                       {str(k): tuple(v) for k, v in data["tokens"].items()},
                       data.get("low"), data.get("high"))
        except (KeyError, TypeError, AttributeError) as exc:
            raise SpaceError(f"bad option description {dict(data)!r}: {exc}") from None


def _int_ladder(name: str, low: int | None, high: int | None) -> list[int]:
    if low is None or high is None:
        raise SpaceError(f"integer option {name} needs low and high")
    if high - low < 6:
        return list(range(low, high + 1))
    ladder = INT_LADDERS.get(name) or tuple(2**k for k in range(1, 16))
    chosen = [v for v in ladder if low <= v <= high]
    return chosen[:5] or [low, high]


def option_dims(specs: Sequence[OptionSpecLike]) -> tuple[OptionDim, ...]:
    """:class:`OptionDim` for every spec the search should vary (``tunable``, where present)."""
    return tuple(OptionDim.from_spec(s) for s in specs if getattr(s, "tunable", True))


@dataclass(frozen=True)
class DeviceLimits:
    """The GPU limits a launch must respect (defaults: sm_90, without shared-memory opt-in)."""

    max_threads_per_block: int = 1024
    max_block_dims: tuple[int, int, int] = (1024, 1024, 64)
    max_shared_per_block: int = 48 * 1024
    max_threads_per_sm: int = 2048
    warp_size: int = 32
    sm_count: int = 0  # multiprocessors (0: not known; what needs it is then not done)

    @property
    def resident_threads(self) -> int:
        """Threads the whole device holds at once (0 where its multiprocessors are not known)."""
        return self.sm_count * self.max_threads_per_sm

    def to_json(self) -> dict[str, Any]:
        return {"max_threads_per_block": self.max_threads_per_block,
                "max_block_dims": list(self.max_block_dims),
                "max_shared_per_block": self.max_shared_per_block,
                "max_threads_per_sm": self.max_threads_per_sm, "warp_size": self.warp_size,
                **({"sm_count": self.sm_count} if self.sm_count else {})}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DeviceLimits:
        dims = data.get("max_block_dims", (1024, 1024, 64))
        return cls(int(data.get("max_threads_per_block", 1024)),
                   (int(dims[0]), int(dims[1]), int(dims[2])),
                   int(data.get("max_shared_per_block", 48 * 1024)),
                   int(data.get("max_threads_per_sm", 2048)), int(data.get("warp_size", 32)),
                   int(data.get("sm_count", 0)))


@dataclass(frozen=True)
class LaunchSpec:
    """The recorded launch as the search needs it.

    The block becomes a dimension only when ``block_tunable`` and a ``work`` size exist (the grid
    is then re-derived from the work, so coverage stays the same).  ``shared_mem_per_thread``:
    the kernel sizes its dynamic shared memory by the block volume (bytes = it x threads);
    otherwise the recorded ``shared_mem_bytes`` is launched.  ``static_shared_bytes`` (from the
    baseline's resource report, when known) counts toward the per-block limit.
    ``block_shapes`` replaces the generated block candidates.  ``facts``: what the kernel's
    source says about its block (:func:`r3tui.search.block_source.block_facts`: fixed axes,
    macros tied to axes, its own launch bounds); None: every axis may change.  ``ladder``:
    how axis candidates are drawn (:data:`BlockLadder`).
    """

    block: Dim3
    work: Dim3 | None = None
    block_tunable: bool = False
    shared_mem_bytes: int = 0
    shared_mem_per_thread: int = 0
    static_shared_bytes: int = 0
    block_shapes: tuple[Dim3, ...] | None = None
    facts: BlockFacts | None = None
    ladder: BlockLadder = "derived"

    @classmethod
    def of(cls, info: LaunchInfoLike, **extra: Any) -> LaunchSpec:
        return cls(block=info.block, work=info.work, block_tunable=info.block_tunable,
                   shared_mem_bytes=info.shared_mem_bytes, **extra)

    @property
    def tunes_block(self) -> bool:
        return self.block_tunable and self.work is not None

    @property
    def block_fixed(self) -> str | None:
        """Why the recording alone keeps the block as recorded (None: the source decides)."""
        if not self.block_tunable:
            return "the recording says the kernel hard-codes its block size"
        if self.work is None:
            return "no work size recorded, so no grid can be derived for another block " \
                   "(record the program again)"
        return None

    def to_json(self) -> dict[str, Any]:
        return {"block": list(self.block.as_tuple()),
                "work": list(self.work.as_tuple()) if self.work else None,
                "block_tunable": self.block_tunable, "shared_mem_bytes": self.shared_mem_bytes,
                "shared_mem_per_thread": self.shared_mem_per_thread,
                "static_shared_bytes": self.static_shared_bytes,
                "block_shapes": None if self.block_shapes is None
                else [list(b.as_tuple()) for b in self.block_shapes],
                # only where set: a powers-of-two space describes itself as it always did
                **({"facts": self.facts.to_json()} if self.facts is not None else {}),
                **({"ladder": self.ladder} if self.ladder != "pow2" else {})}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LaunchSpec:
        shapes = data.get("block_shapes")
        return cls(block=Dim3.of(data["block"]),
                   work=Dim3.of(data["work"]) if data.get("work") else None,
                   block_tunable=bool(data.get("block_tunable", False)),
                   shared_mem_bytes=int(data.get("shared_mem_bytes", 0)),
                   shared_mem_per_thread=int(data.get("shared_mem_per_thread", 0)),
                   static_shared_bytes=int(data.get("static_shared_bytes", 0)),
                   block_shapes=None if shapes is None else tuple(Dim3.of(s) for s in shapes),
                   facts=BlockFacts.from_json(data["facts"]) if data.get("facts") else None,
                   # a description without the key was written with powers-of-two ladders
                   ladder="derived" if data.get("ladder") == "derived" else "pow2")


def config_key(config: TrialConfig) -> str:
    """The canonical identity of a config: stable JSON, options sorted, tunables by name.

    Configs made by :meth:`SearchSpace.to_config` render options in one fixed spelling, so
    sorting the tokens is enough; canonicalize other configs' options before comparing keys.
    """
    return json.dumps(
        {"toolchain": config.toolchain, "options": sorted(config.options),
         "block": list(config.block.as_tuple()) if config.block else None,
         "tunables": {k: config.tunables[k] for k in sorted(config.tunables)},
         "launch_bounds": list(config.launch_bounds) if config.launch_bounds else None,
         "pipeline": config.pipeline,
         # only where set, so that keys of configs without it (recorded tables) stay the same
         **({"shared_mem_bytes": config.shared_mem_bytes}
            if config.shared_mem_bytes is not None else {})},
        sort_keys=True, separators=(",", ":"))


def defines_for(config: TrialConfig) -> tuple[tuple[str, str], ...]:
    """``config``'s tunables as the ``-D`` pairs of a compile request."""
    return tuple((name, str(config.tunables[name])) for name in sorted(config.tunables))
