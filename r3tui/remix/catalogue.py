"""The named source transformations a mutation asks for, one small change each.

Small models do far better asked for one concrete, named change than for "make it faster".
Each :class:`Transformation` has a ``family`` from :data:`FAMILIES`, which MAP-Elites uses as a
feature dimension (a variant's family is the family of the change that made it), and, when the
change is mechanical, the name of the deterministic operator in :mod:`r3tui.remix.rules` that
makes it without a model.

Launch bounds are not in the catalogue: the inner loop injects ``__launch_bounds__`` itself
and replaces any the source has, so a source change that adds them is undone by the tuner.
"""

from __future__ import annotations

from dataclasses import dataclass

from r3tui.errors import ConfigError

FAMILIES = ("memory", "tiling", "loops", "parallelism", "tuning")


@dataclass(frozen=True)
class Transformation:
    name: str
    family: str  # one of FAMILIES
    instruction: str  # what the prompt asks for, in one or two short sentences
    rule: str | None = None  # the operator in rules.RULES that makes this change mechanically

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"transformation {self.name}: unknown family {self.family!r}")


CATALOGUE: tuple[Transformation, ...] = (
    Transformation(
        "restrict_const",
        "memory",
        "Declare every pointer parameter that the kernel only reads as `const T* __restrict__`, "
        "so the compiler knows it does not alias the outputs.",
        rule="restrict_const",
    ),
    Transformation(
        "read_only_loads",
        "memory",
        "Load the arrays that the kernel never writes through the read-only data cache: "
        "replace `p[i]` by `__ldg(&p[i])`.",
        rule="ldg_loads",
    ),
    Transformation(
        "vectorized_loads",
        "memory",
        "Load and store 4 consecutive floats (or 2 doubles) at once through `float4` / "
        "`double2` where the index is a multiple of 4 (or 2); handle the remainder separately.",
    ),
    Transformation(
        "hoist_invariant_loads",
        "memory",
        "Move a load or a computation that does not change inside a loop out of the loop, into "
        "a local variable set once before it.",
    ),
    Transformation(
        "shared_memory_tile",
        "tiling",
        "Stage the part of the input that neighbouring threads all read in a `__shared__` "
        "array: load it cooperatively, `__syncthreads()`, compute from it, `__syncthreads()`.",
    ),
    Transformation(
        "register_blocking",
        "tiling",
        "Let each thread compute 2 or 4 neighbouring outputs instead of one, keeping the "
        "partial results in registers and reusing each loaded value for all of them.",
    ),
    Transformation(
        "unroll_inner_loop",
        "loops",
        "Unroll the innermost `for` loop by a factor the tuner chooses: declare "
        "`// r3: tune R3_UNROLL 1 2 4 8 16` with an `#ifndef`-guarded `#define R3_UNROLL 4`, "
        "and put `constexpr int r3_unroll = R3_UNROLL;` and `#pragma unroll r3_unroll` "
        "before the loop.",
        rule="unroll_pragma",
    ),
    Transformation(
        "fuse_loops",
        "loops",
        "Merge two consecutive loops over the same range into one loop, so the data is read once.",
    ),
    Transformation(
        "simplify_index_math",
        "loops",
        "Compute an array offset once and advance it by a constant stride each iteration "
        "instead of recomputing products of indices in every access.",
    ),
    Transformation(
        "warp_shuffle_reduction",
        "parallelism",
        "Finish the reduction inside each warp with `__shfl_down_sync(0xffffffff, v, offset)` "
        "for offset 16, 8, 4, 2, 1 instead of shared memory and `__syncthreads()`.",
        rule="warp_shuffle_reduction",
    ),
    Transformation(
        "grid_stride_loop",
        "parallelism",
        "Let each thread handle several elements with a grid-stride loop "
        "(`for (i = start; i < n; i += gridDim.x * blockDim.x)`).",
    ),
    Transformation(
        "expose_tunable",
        "tuning",
        "Turn one fixed block, tile or unroll size into `#define NAME value` with the line "
        "`// r3: tune NAME v1 v2 v3` above it, so the tuner can try other values.",
        rule="expose_tunable",
    ),
)

_BY_NAME = {t.name: t for t in CATALOGUE}


def transformation(name: str) -> Transformation:
    """The catalogue entry called ``name``; :class:`ConfigError` if there is none."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ConfigError(
            f"unknown transformation {name!r}", hint=f"known: {', '.join(_BY_NAME)}"
        ) from None


def mechanical() -> tuple[Transformation, ...]:
    """The transformations a rule can make without a model."""
    return tuple(t for t in CATALOGUE if t.rule is not None)
