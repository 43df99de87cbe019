"""Which catalogue entries a kernel gives the model something to do for.

The model is asked for one named transformation at a time (:mod:`r3tui.remix.catalogue`).
Asked for one whose pattern the kernel lacks (streaming a stencil along an axis in a sum,
staging shared tiles in a kernel that already reduces in shared memory), a small model still
answers, and its answer seldom compiles: in the demo's reduce_sum campaign (Qwen2.5-Coder-1.5B,
session 33) the four first answers for stream_along_axis, shared_memory_tile and
vectorized_loads all failed, while those for transformations whose pattern is there verified
3 of 4.  An entry with a rule is relevant where its rule applies to the kernel (the rule's
analysis finds the pattern: a reduction for the warp shuffles, neighbours along an axis for
streaming, reads that threads share for tiles); one without a rule where the kernel has what
its instruction names (a loop to hoist out of or to unroll, two loops to fuse); simplifying
index arithmetic fits any kernel.

Measured on that recording at the same seed (session 34,
``bench/results/2026-12-06-llm-relevance-s34-cpu.txt``), no gain is shown: the asks changed as
meant, and 3 of 8 first answers compiled against 4 of 8 before.  It stays because the model is
then never asked for what the kernel cannot have.
"""

from __future__ import annotations

import random

from r3tui.remix.catalogue import CATALOGUE, Transformation

# entries without a rule: how many ``for`` loops the kernel needs for each (none named: any)
_LOOPS_NEEDED = {"hoist_invariant_loads": 1, "fuse_loops": 2}


def is_relevant(transformation: Transformation, source: str, kernel_name: str) -> bool:
    """Whether ``kernel_name`` in ``source`` has the pattern ``transformation`` changes."""
    from r3tui.analysis.body import for_loops
    from r3tui.remix.rules import apply_rule

    if transformation.rule is not None:
        return apply_rule(transformation.rule, source, kernel_name, random.Random(0)).ok
    needed = _LOOPS_NEEDED.get(transformation.name, 0)
    return needed == 0 or len(for_loops(source, kernel_name)) >= needed


def relevant_first(order: tuple[str, ...], source: str, kernel_name: str) -> tuple[str, ...]:
    """``order`` (catalogue names, the bandit's draw) with the entries relevant to the kernel
    first, each part in its order; all of it as it was where none is relevant."""
    by_name = {t.name: t for t in CATALOGUE}
    fits = {name for name in order
            if name in by_name and is_relevant(by_name[name], source, kernel_name)}
    if not fits:
        return order
    return tuple(n for n in order if n in fits) + tuple(n for n in order if n not in fits)
