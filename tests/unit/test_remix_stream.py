"""The streaming rule (a stencil's neighbours along z or y in registers while each thread walks
that axis, r3tui.remix.stream): stencil7 along z and y and a 2-D column stencil written here
print the original's bits at every factor on ragged grids, compiled with g++ and run on this
CPU under AddressSanitizer (a load past what the original reads shows as a fault:
tests/unit/cpu_grid.py); the variants compile with real NVRTC for sm_90; the rule declines
where the walk could read or compute something else."""

from __future__ import annotations

import random
import re

import pytest

from r3tui.compile import CompileRequest, get_toolchain
from r3tui.remix.rules import apply_rule
from r3tui.remix.stream import FACTORS, MACRO, Declined, stream
from r3tui.search.source import parse_tunables, parse_work_per_thread
from tests.unit import cpu_grid
from tests.unit.test_remix_coarsen import _DIVISORS, DRIVERS, example


def along(source: str, kernel: str, axis: str) -> str:
    for seed in range(20):
        out, detail = stream(source, kernel, random.Random(seed))
        if f"along {axis}:" in detail:
            return out
    raise AssertionError(f"the rule never streamed {kernel} along {axis}")


COLUMN = r"""
extern "C" __global__ void column(const float* __restrict__ in, float* out, int n, int m)
{
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    int row = blockIdx.y * blockDim.y + threadIdx.y;
    if (col >= n || row >= m) return;
    int at = row * n + col;
    if (row == 0 || row == m - 1) {
        out[at] = 2.0f * in[at];
        return;
    }
    out[at] = in[at - n] + 0.5f * in[at] + in[at + n];
}
"""
COLUMN_DRIVER = _DIVISORS + r"""
int main() {
    const int n = 7, m = 23;
    std::vector<float> in(n * m), out(n * m, -5.0f);
    for (int i = 0; i < n * m; ++i) in[i] = (float)((i * 29) % 53) / 9.0f;
    dim3 block(BX, BY, BZ);
    dim3 grid(r3_cover(n, DX, BX), r3_cover(m, DY, BY), 1);
    launch(grid, block, [&] { column(in.data(), out.data(), n, m); });
    for (float v : out) printf("%a\n", v);
}
"""


@pytest.mark.parametrize(("kernel", "axis", "block"), [
    ("stencil7", "z", (4, 3, 2)), ("stencil7", "z", (3, 2, 3)), ("stencil7", "y", (5, 2, 1)),
    ("column", "y", (4, 3, 1))])
def test_every_factor_prints_the_originals_bits_without_reading_past_it(
        kernel: str, axis: str, block: tuple[int, int, int], tmp_path: object) -> None:
    source, driver = ((COLUMN, COLUMN_DRIVER) if kernel == "column"
                      else (example(kernel), DRIVERS[kernel][0]))
    bx, by, bz = block
    sizes = {"BX": bx, "BY": by, "BZ": bz}
    expected = cpu_grid.run(source, driver, tmp_path, sizes, "original")  # type: ignore[arg-type]
    assert len(expected.splitlines()) > 100
    variant = along(source, kernel, axis)
    assert parse_work_per_thread(variant) == {axis: MACRO}
    (tunable,) = [t for t in parse_tunables(variant) if t.name == MACRO]
    assert tunable.values == FACTORS and tunable.default == 1
    for factor in FACTORS:
        defines = {**sizes, f"D{axis.upper()}": factor, MACRO: factor}
        got = cpu_grid.run(variant, driver, tmp_path, defines,  # type: ignore[arg-type]
                           f"{kernel}{axis}{factor}", sanitize=True)
        assert got == expected, f"{kernel} along {axis} at {factor}:\n{variant}"


def test_the_check_can_fail_a_wrong_rotation(tmp_path: object) -> None:
    """A walk that forgets to rotate (each point keeps the first point's centre) prints other
    numbers: the comparison above would see a wrong rewrite."""
    variant = along(example("stencil7"), "stencil7", "z")
    broken = variant.replace("r3_center_in = r3_next_in;", "")
    assert broken != variant
    driver = DRIVERS["stencil7"][0]
    sizes = {"BX": 4, "BY": 3, "BZ": 2}
    expected = cpu_grid.run(example("stencil7"), driver, tmp_path, sizes,  # type: ignore[arg-type]
                            "original")
    got = cpu_grid.run(broken, driver, tmp_path,  # type: ignore[arg-type]
                       {**sizes, "DZ": 4, MACRO: 4}, "broken")
    assert got != expected


def test_each_point_loads_one_value_of_the_column() -> None:
    """In the variant stencil7's z neighbours come from registers: the three reads of the
    column are one load a point, where the x and y neighbours stay loads."""
    variant = along(example("stencil7"), "stencil7", "z")
    body = variant[variant.index("for (int r3_s"):]
    assert re.findall(r"\bin\[idx \+ sz\]", body) == ["in[idx + sz]"]  # the next point's
    assert re.findall(r"\bin\[idx - sz\]", body) == ["in[idx - sz]"]  # a thread's first
    assert "in[idx - 1]" in body and "in[idx + sy]" in body
    # the sum reads the registers where the original read the column, in the same order
    assert re.search(r"in\[idx \+ sy\] \+ r3_prev_in\s*\+ r3_next_in", body)


@pytest.mark.parametrize("axis", ["z", "y"])
def test_variants_compile_with_nvrtc_for_sm_90(axis: str) -> None:
    variant = along(example("stencil7"), "stencil7", axis)
    for factor in (1, 16):
        compiled = get_toolchain("nvrtc").compile(CompileRequest(
            variant, "stencil7", arch="sm_90", defines=((MACRO, str(factor)),)))
        assert compiled.ok, compiled.log


@pytest.mark.parametrize(("change", "reason"), [
    # a check that passed at k may fail below it: the point before is not known to exist
    (("if (col >= n || row >= m) return;", "if (col >= n || row != 3) return;"),
     "is not `row >= n`"),
    # the array is written: a value kept in a register could be stale
    (("out[at] = in[at - n]", "((float*)in)[at] = 1.0f; out[at] = in[at - n]"),
     "no array the kernel only reads"),
    # a return inside a loop would become a continue of that loop
    (("out[at] = in[at - n]", "for (int q = 0; q < 2; ++q) { if (q) return; }\n"
      "    out[at] = in[at - n]"), "a return inside a loop"),
    # the stride is assigned: at is no longer row * n + col at the next point
    (("int at = row * n + col;", "int at = row * n + col; n += 0;"), "assigned"),
    # the centre is read on one path only: the next point's centre may be an element the
    # original never reads
    (("out[at] = 2.0f * in[at];", "out[at] = 2.0f;"), "no array the kernel only reads"),
    # ... or a return inside that block may leave before the centre is read
    (("out[at] = 2.0f * in[at];", "if (col == 1) return;\n        out[at] = 2.0f * in[at];"),
     "no array the kernel only reads"),
])
def test_the_rule_declines_where_the_walk_could_differ(change: tuple[str, str],
                                                        reason: str) -> None:
    old, new = change
    assert old in COLUMN
    with pytest.raises(Declined, match=re.escape(reason)):
        stream(COLUMN.replace(old, new), "column", random.Random(0))


def test_a_kernel_without_a_stencil_or_an_axis_to_walk_declines() -> None:
    for name in ("reduce_sum", "nbody", "spmv_csr"):
        result = apply_rule("stream_axis", example(name), name, random.Random(0))
        assert not result.ok and result.reason
