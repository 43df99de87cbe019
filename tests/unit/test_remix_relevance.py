"""Which catalogue entries the model is offered first: those whose pattern the kernel has."""

from __future__ import annotations

from pathlib import Path

from r3tui.remix.catalogue import CATALOGUE, transformation
from r3tui.remix.relevance import is_relevant, relevant_first

REPO = Path(__file__).resolve().parents[2]


def _source(example: str) -> str:
    return (REPO / "examples" / example / "kernel.cu").read_text()


def test_a_sum_is_offered_its_reductions_and_not_a_stencils_streaming() -> None:
    text = _source("reduce_sum")
    fits = {t.name for t in CATALOGUE if is_relevant(t, text, "reduce_sum")}
    assert {"warp_shuffle_reduction", "accumulate_before_reduce", "restrict_const",
            "simplify_index_math", "hoist_invariant_loads"} <= fits
    assert not fits & {"stream_along_axis", "shared_memory_tile", "fuse_loops"}


def test_a_stencil_is_offered_streaming_and_not_loop_changes_it_has_no_loop_for() -> None:
    text = _source("stencil7")
    assert is_relevant(transformation("stream_along_axis"), text, "stencil7")
    for name in ("warp_shuffle_reduction", "unroll_inner_loop", "hoist_invariant_loads",
                 "fuse_loops"):
        assert not is_relevant(transformation(name), text, "stencil7"), name


def test_the_relevant_come_first_each_part_in_the_bandits_order() -> None:
    text = _source("stencil7")
    order = ("warp_shuffle_reduction", "simplify_index_math", "fuse_loops",
             "stream_along_axis", "not_in_the_catalogue")
    assert relevant_first(order, text, "stencil7") == (
        "simplify_index_math", "stream_along_axis", "warp_shuffle_reduction", "fuse_loops",
        "not_in_the_catalogue")
    # nothing relevant (a kernel the analysis cannot find): the order as drawn
    assert relevant_first(order[:1] + order[2:3], text, "no_such_kernel") == (
        "warp_shuffle_reduction", "fuse_loops")
