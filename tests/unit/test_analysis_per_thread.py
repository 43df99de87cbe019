"""What r3tui.analysis.per_thread reads from real kernels: the grid indices, the locals that
depend on them, and what each top-level statement is to a thread's elements."""

from __future__ import annotations

from pathlib import Path

import pytest

from r3tui.analysis.body import kernel_body
from r3tui.analysis.per_thread import (
    IndexDependence,
    Unsupported,
    axis_alone,
    check_alone,
    grid_indices,
)
from r3tui.analysis.text import mask

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def reading(kernel: str, axes: str) -> IndexDependence:
    source = (EXAMPLES / kernel / "kernel.cu").read_text()
    found = kernel_body(source, kernel)
    assert found is not None
    body, parsed = found
    indices = tuple(ix for ix in grid_indices(body, parsed) if ix.axis in axes)
    return IndexDependence(source, body, parsed, indices)


def test_the_indices_and_which_axes_are_read_once() -> None:
    source = (EXAMPLES / "sgemm" / "kernel.cu").read_text()
    found = kernel_body(source, "sgemm")
    assert found is not None
    body, parsed = found
    indices = grid_indices(body, parsed)
    assert [(ix.axis, ix.name, ix.type) for ix in indices] == [
        ("x", "col", "int"), ("y", "row", "int"), ("z", "layer", "int")]
    assert all(axis_alone(mask(parsed.text(body)), a) for a in "xyz")
    check_alone(body, parsed)  # no barrier, shared memory or warp operation


def test_what_depends_on_the_row_of_sgemm() -> None:
    along_y = reading("sgemm", "y")
    assert along_y.dependent == {"row", "sum", "idx"}  # sum: assigned where row is read
    kinds = [along_y.kind(n, along_y.dependent, top=True) for n in along_y.top]
    # col, row, layer, the bound check, sum, the k loop, idx, the store
    assert kinds == ["plain", "declaration", "plain", "guard", "declaration", "kept",
                     "declaration", "each"]
    loop = along_y.top[5]
    assert not along_y.mentions(along_y.header(loop)[1], along_y.dependent)


def test_nbody_keeps_its_loop_over_the_other_bodies() -> None:
    along_x = reading("nbody", "x")
    assert {"i", "pi", "ax", "ay", "az", "phi", "dx", "r2", "s"} <= along_x.dependent
    assert "pj" not in along_x.dependent  # loaded once for all of a thread's bodies


def test_a_block_reduction_is_not_read() -> None:
    source = (EXAMPLES / "reduce_sum" / "kernel.cu").read_text()
    found = kernel_body(source, "reduce_sum")
    assert found is not None
    with pytest.raises(Unsupported, match="do not each work alone"):
        check_alone(*found)


@pytest.mark.parametrize(("guard", "single"), [
    ("if (row >= M || col >= N || layer != 0) {\n        return;\n    }", {"z"}),
    ("if (layer != 0) return;", {"z"}),
    ("if ((0 != layer) || row >= M) return;", {"z"}),
    # an order, a test that does not end the thread, a boundary: several elements work
    ("if (row >= M || col >= N || layer >= 4) return;", set()),
    ("if (layer != 0) { acc = 1.0f; }", set()),
    ("if (layer != 0) if (acc > 0.0f) return;", set()),
    ("float w = (layer == 0) ? 0.5f : 1.0f;", set()),
])
def test_an_axis_whose_index_must_equal_a_constant_has_one_element(
        guard: str, single: set[str]) -> None:
    from r3tui.analysis.per_thread import single_element_axes

    source = (
        'extern "C" __global__ void k(int M, int N, float* out, float acc)\n{\n'
        "    int col = blockIdx.x * blockDim.x + threadIdx.x;\n"
        "    int row = blockIdx.y * blockDim.y + threadIdx.y;\n"
        "    int layer = blockIdx.z * blockDim.z + threadIdx.z;\n"
        f"    {guard}\n"
        "    out[row * N + col] = acc;\n}\n")
    found = kernel_body(source, "k")
    assert found is not None
    body, parsed = found
    assert single_element_axes(body, parsed, grid_indices(body, parsed)) == single
