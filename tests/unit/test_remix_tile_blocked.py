"""Shared-memory tiles on a register-blocked kernel (r3tui.remix.tile_blocked): the coarsening
rule's variant of sgemm, nbody and a kernel written here, tiled, computes what the original
computes, to the bit, at every coarsening factor, tile and block shape tried, with every thread
reaching every barrier and no read outside the arrays (g++ with AddressSanitizer, each block's
threads at once with shared memory between them: tests/unit/cpu_grid.py); the variants compile
with real NVRTC for sm_90 and declare the shared memory each point launches with."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from r3tui.compile import CompileRequest, get_toolchain
from r3tui.domain import Dim3
from r3tui.remix.coarsen import coarsen
from r3tui.remix.rules import apply_rule
from r3tui.remix.tile import MACRO, Declined, tile_loop
from r3tui.remix.tile_blocked import CONTIGUOUS, EDGE_TILES, STAGES, coarsened
from r3tui.search.source import shared_bytes_at
from tests.unit import cpu_grid
from tests.unit.test_remix_split import DRIVERS, example

# Written here: the work in a closing `if (i < n) { ... }`, a read along x and one of the
# counter alone.
ROWDOT = r"""
__global__ void rowdot(int n, int m, const double* a, const double* b, double* out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        double s = 0.0;
        for (int j = 0; j < m; ++j) {
            s += a[(long long)j * n + i] * b[j];
        }
        out[i] = s;
    }
}
"""

_DIVISORS = """
#ifndef DX
#define DX 1
#endif
#ifndef DY
#define DY 1
#endif
"""
# the examples' drivers, the grid divided by the elements a thread computes (as the replay
# derives it from `// r3: work_per_thread`)
BLOCKED_DRIVERS = {
    "sgemm": _DIVISORS + DRIVERS["sgemm"].replace("r3_cover(N * SX, 1, BX)",
                                                  "r3_cover(N, DX, BX)").replace(
        "r3_cover(M, 1, BY)", "r3_cover(M, DY, BY)"),
    "nbody": _DIVISORS + DRIVERS["nbody"].replace("r3_cover(n * SX, 1, BX)",
                                                  "r3_cover(n, DX, BX)"),
    "rowdot": _DIVISORS + r"""
int main() {
    const int n = 29, m = 23;
    std::vector<double> a((size_t)n * m), b(m), out(n, -2.0);
    for (int i = 0; i < n * m; ++i) a[i] = (double)((i * 7) % 19) / 8.0 - 1.0;
    for (int j = 0; j < m; ++j) b[j] = 0.25 * j - 2.0;
    dim3 block(BX, BY, BZ);
    dim3 grid(r3_cover(n, DX, BX), 1, 1);
    launch_threads(grid, block, [&] { rowdot(n, m, a.data(), b.data(), out.data()); });
    for (double v : out) printf("%a\n", v);
}
""",
}
SOURCES = {"sgemm": example("sgemm"), "nbody": example("nbody"), "rowdot": ROWDOT}
# (R3_CF_X, R3_CF_Y, R3_TILE[, R3_STAGES[, R3_X_CONTIGUOUS]]) each built once; blocks run at
# run time
POINTS: dict[str, list[tuple[int, ...]]] = {
    "sgemm": [(2, 2, 4), (4, 2, 16), (1, 4, 64), (2, 1, 0), (4, 2, 8, 1, 1), (2, 2, 0, 1, 1),
              (2, 2, 8, 2), (4, 1, 4, 2, 1), (2, 2, 8, 1, 0, 1), (4, 2, 4, 2, 1, 1)],
    "nbody": [(2, 1, 8), (4, 1, 64), (2, 1, 16, 2), (2, 1, 8, 2, 0, 1)],
    "rowdot": [(2, 1, 4), (8, 1, 16), (4, 1, 8, 1, 1), (2, 1, 4, 2, 1), (4, 1, 8, 1, 1, 1)],
}
BLOCKS = {
    "sgemm": [(4, 4, 1), (8, 2, 2), (3, 5, 1)],
    "nbody": [(8, 1, 1), (5, 1, 1)],
    "rowdot": [(4, 1, 1), (3, 2, 1)],
}
_AT_RUN = {axis: cpu_grid.RUNTIME.format(axis) for axis in ("BX", "BY", "BZ")}


def blocked(kernel: str, axes: int) -> str:
    """The coarsening rule's variant of ``kernel`` along ``axes`` axes (the first seed that
    gives that many)."""
    for seed in range(40):
        variant, _ = coarsen(SOURCES[kernel], kernel, random.Random(seed))
        if sum(f"R3_CF_{a}" in variant for a in "XYZ") == axes:
            return variant
    raise AssertionError(f"no coarsening of {kernel} along {axes} axes")


AXES = {"sgemm": 2, "nbody": 1, "rowdot": 1}


@pytest.mark.parametrize("kernel", sorted(BLOCKED_DRIVERS))
def test_tiles_on_a_coarsened_kernel_compute_what_the_original_does(
        kernel: str, tmp_path: Path) -> None:
    coarse = blocked(kernel, AXES[kernel])
    assert coarsened(coarse, kernel) and not coarsened(SOURCES[kernel], kernel)
    variant, detail = tile_loop(coarse, kernel, random.Random(0))
    assert "coarsened loop" in detail and "both copies" in detail
    assert variant.count("R3_BARRIER();") == 4  # two barriers in each copy
    # a whole tile's loop unrolled in the copy of the blocks within the work, and at its edge
    # where the tunable says so (its default: not)
    assert variant.count("// a whole tile") == 2 and variant.count("#pragma unroll 8") == 2
    assert f"#if {EDGE_TILES}\n" in variant and f"#define {EDGE_TILES} 0\n" in variant
    driver = BLOCKED_DRIVERS[kernel]
    expected_exe = cpu_grid.build(SOURCES[kernel], driver, tmp_path, _AT_RUN, "original", True)
    for fx, fy, tile, *more in POINTS[kernel]:
        defines: dict[str, int | str] = {**_AT_RUN, "R3_CF_X": fx, "DX": fx, MACRO: tile}
        if "R3_CF_Y" in variant:
            defines.update({"R3_CF_Y": fy, "DY": fy})
        if more:  # two tiles in flight: the next loaded while this one is read
            defines[STAGES] = more[0]
        if more[1:]:  # each thread's outputs along x neighbours (the kernel tiles along x)
            assert CONTIGUOUS in variant or not more[1]
            defines[CONTIGUOUS] = more[1]
        if more[2:]:  # whole tiles, unrolled, in the edge blocks' copy too
            defines[EDGE_TILES] = more[2]
        exe = cpu_grid.build(variant, driver, tmp_path, defines,
                             f"v{fx}{fy}{tile}{''.join(map(str, more))}", True)
        for bx, by, bz in BLOCKS[kernel]:
            block = {"BX": bx, "BY": by, "BZ": bz}
            expected = cpu_grid.execute(expected_exe, block).split()
            assert len(expected) > 20 and not any("nan" in v for v in expected)
            assert cpu_grid.execute(exe, block).split() == expected, (kernel, fx, fy, tile,
                                                                      block)


def test_a_tile_that_skips_loads_shows_in_the_output(tmp_path: Path) -> None:
    """The comparison can fail: half the threads not loading leaves tile elements unwritten
    (NaN), and a loader whose live test is dropped reads past the arrays (AddressSanitizer)."""
    variant, _ = tile_loop(blocked("sgemm", 2), "sgemm", random.Random(0))
    driver = BLOCKED_DRIVERS["sgemm"]
    defines = {"BX": 4, "BY": 4, "BZ": 1, "R3_CF_X": 2, "DX": 2, "R3_CF_Y": 2, "DY": 2,
               MACRO: 8}
    expected = cpu_grid.run(SOURCES["sgemm"], driver, tmp_path, defines, "original").split()
    lazy = variant.replace("r3_s += r3_team", "r3_s += 2 * r3_team")
    assert lazy != variant
    assert cpu_grid.run(lazy, driver, tmp_path, defines, "lazy").split() != expected
    # the whole tiles' loop runs (K = 37: four whole tiles of 8, then a partial one)
    short = variant.replace("; k < r3_k0 + R3_TILE; ++k)", "; k < r3_k0 + R3_TILE - 1; ++k)")
    assert short != variant
    assert cpu_grid.run(short, driver, tmp_path, defines, "short").split() != expected
    unchecked = variant.replace("if (k < K && !(", "if (k < K + 8 && !(")
    assert unchecked != variant
    with pytest.raises(AssertionError, match="AddressSanitizer"):
        cpu_grid.run(unchecked, driver, tmp_path, defines, "unchecked", sanitize=True)


def test_the_variants_compile_with_nvrtc_and_declare_their_shared_memory() -> None:
    nvrtc = get_toolchain("nvrtc")
    variant, _ = tile_loop(blocked("sgemm", 2), "sgemm", random.Random(0))
    # A: 16 rows x 2 elements a thread x 32 iterations; B: 16 columns x 4 x 32; floats
    assert shared_bytes_at(variant, Dim3(16, 16, 1),
                           {"R3_CF_X": 4, "R3_CF_Y": 2, MACRO: 32}) == (32 + 64) * 32 * 4
    assert shared_bytes_at(variant, Dim3(16, 16, 1), {}) == 0  # R3_TILE's default: untiled
    for fx, fy, tile in ((1, 1, 0), (2, 2, 16), (4, 4, 32), (8, 1, 256)):
        compiled = nvrtc.compile(CompileRequest(
            variant, "sgemm", arch="sm_90",
            defines=(("R3_CF_X", str(fx)), ("R3_CF_Y", str(fy)), (MACRO, str(tile)))))
        assert compiled.ok, f"{fx} {fy} {tile}:\n{compiled.log}"
    nbody, _ = tile_loop(blocked("nbody", 1), "nbody", random.Random(0))
    assert shared_bytes_at(nbody, Dim3(64, 1, 1), {"R3_CF_X": 4, MACRO: 64}) == 64 * 16
    compiled = nvrtc.compile(CompileRequest(nbody, "nbody", arch="sm_90",
                                            defines=(("R3_CF_X", "4"), (MACRO, "64"))))
    assert compiled.ok, compiled.log


def _ptx(source: str, defines: dict[str, int]) -> str:
    """NVRTC's PTX of ``source`` for sm_90 (the vector loads are chosen before ptxas)."""
    from cuda.bindings import nvrtc

    err, program = nvrtc.nvrtcCreateProgram(source.encode(), b"variant.cu", 0, [], [])
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS
    options = [b"-arch=compute_90", *(f"-D{k}={v}".encode() for k, v in defines.items())]
    (err,) = nvrtc.nvrtcCompileProgram(program, len(options), options)
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS, err
    err, size = nvrtc.nvrtcGetPTXSize(program)
    text = b" " * size
    (err,) = nvrtc.nvrtcGetPTX(program, text)
    nvrtc.nvrtcDestroyProgram(program)
    return text.decode()


def test_neighbouring_outputs_along_x_read_a_tile_row_as_vectors() -> None:
    """A tile along x (sgemm's B) gives the variant R3_X_CONTIGUOUS: 1 makes each thread's
    R3_CF_X outputs neighbours, and NVRTC then reads a tile row as float4s where the
    coarsening's interleaved layout reads R3_CF_X scalars; a tile of the counter alone
    (nbody's bodies) has no such tunable."""
    from r3tui.search.source import parse_tunables

    variant, detail = tile_loop(blocked("sgemm", 2), "sgemm", random.Random(0))
    tunables = {t.name: t.values for t in parse_tunables(variant)}
    assert tunables[CONTIGUOUS] == (0, 1) and CONTIGUOUS in (detail or "")
    point = {"R3_CF_X": 4, "R3_CF_Y": 4, MACRO: 64}
    vectors = [_ptx(variant, {**point, CONTIGUOUS: v}).count("ld.shared.v4.f32")
               for v in (0, 1)]
    scalars = [_ptx(variant, {**point, CONTIGUOUS: v}).count("ld.shared.f32") for v in (0, 1)]
    assert vectors[1] > vectors[0] and scalars[1] < scalars[0], (vectors, scalars)
    nbody, _ = tile_loop(blocked("nbody", 1), "nbody", random.Random(0))
    assert CONTIGUOUS not in nbody


def test_two_tiles_in_flight_load_with_cp_async_into_twice_the_shared_memory() -> None:
    """R3_STAGES 2: the next tile is copied with cp.async (sm_80 and later) into a second
    buffer while the block computes on this one; the variant declares twice the bytes.  On
    the CPU the copies are plain stores (the bit-for-bit test above runs both)."""
    variant, _ = tile_loop(blocked("sgemm", 2), "sgemm", random.Random(0))
    point = {"R3_CF_X": 4, "R3_CF_Y": 2, MACRO: 32}
    one = shared_bytes_at(variant, Dim3(16, 16, 1), point)
    assert one == (32 + 64) * 32 * 4  # the default: one tile of each in flight
    assert shared_bytes_at(variant, Dim3(16, 16, 1), {**point, STAGES: 2}) == 2 * one
    staged = _ptx(variant, {**point, STAGES: 2})
    assert "cp.async.ca.shared.global" in staged and "cp.async.wait_group 1" in staged
    assert "cp.async" not in _ptx(variant, {**point, STAGES: 1})
    nvrtc = get_toolchain("nvrtc")
    for stages in (1, 2):
        compiled = nvrtc.compile(CompileRequest(variant, "sgemm", arch="sm_90", defines=tuple(
            (k, str(v)) for k, v in {**point, STAGES: stages}.items())))
        assert compiled.ok and not compiled.resources.spill_stores_bytes, compiled.log


def test_the_rule_composes_in_either_order_of_the_campaign() -> None:
    """Coarsening first, then tiling, is the composition; a tiled kernel is not coarsened
    (its threads work together), so the other order declines with the reason."""
    coarse = apply_rule("coarsen", SOURCES["sgemm"], "sgemm", random.Random(3))
    assert coarse.ok and coarse.source is not None
    both = apply_rule("tile_shared", coarse.source, "sgemm", random.Random(0))
    assert both.ok and both.detail is not None and "coarsened loop" in both.detail
    tiled = apply_rule("tile_shared", SOURCES["sgemm"], "sgemm", random.Random(0))
    assert tiled.ok and tiled.source is not None
    again = apply_rule("coarsen", tiled.source, "sgemm", random.Random(0))
    assert not again.ok


@pytest.mark.parametrize(("edit", "reason"), [
    # the loop's end read from an element array: the block's threads may not share it
    (("for (int k = 0; k < K; ++k)", "for (int k = 0; k < col[0]; ++k)"), "reads"),
    # a guard that is not an upper bound: a position's predecessors may fail it
    (("row[r3_e] >= M ||", "row[r3_e] <= M ||"), "not an upper bound"),
    # a position set otherwise than the coarsening sets it
    (("* R3_CF_Y + r3_e / (R3_CF_X) % R3_CF_Y", "* R3_CF_Y + 1"), "not set as the coarsening"),
])
def test_it_declines_what_would_change_what_the_kernel_reads(edit: tuple[str, str],
                                                             reason: str) -> None:
    coarse = blocked("sgemm", 2)
    assert edit[0] in coarse
    with pytest.raises(Declined, match=reason):
        tile_loop(coarse.replace(*edit), "sgemm", random.Random(0))


def test_the_loader_along_x_steps_its_place_and_iteration_without_dividing() -> None:
    """A tile along x (sgemm's B, ``span_x`` places wide, known only at the launch) is loaded
    with the element's place and iteration kept as counters, one carry a step: NVRTC's
    ``div.u32``/``rem.u32`` for ``r3_s % span`` and ``r3_s / span`` cost more instructions
    than sgemm's multiply-adds (session 38, PTX of the 2x4 variant).  The counters follow
    ``divmod`` for every rank, team and width (the loop run here in Python as written)."""
    import itertools

    from r3tui.remix.tile import staging_loop

    variant, _ = tile_loop(blocked("sgemm", 2), "sgemm", random.Random(0))
    loader = variant[variant.index("auto r3_stage"):variant.index("};", variant.index(
        "auto r3_stage"))]
    along = loader[loader.index("const unsigned r3_n"):]
    body = along[along.index("for ("):]
    assert "r3_s %" not in body and "r3_s /" not in body and "r3_p += r3_dp;" in body
    lines = staging_loop("", "r3_s", "(unsigned)r3_span_x", True, "k", "int", ["LOAD;"])
    assert lines[1:4] == ["    const unsigned r3_n = (unsigned)r3_span_x;",
                          "    unsigned r3_p = r3_rank % r3_n, r3_q = r3_rank / r3_n;",
                          "    const unsigned r3_dp = r3_team % r3_n, r3_dq = r3_team / r3_n;"]
    for n, team, tile in itertools.product((1, 3, 16, 48, 64), (1, 5, 32, 96, 256), (4, 64)):
        for rank in range(team):
            p, q = rank % n, rank // n
            dp, dq = team % n, team // n
            for s in range(rank, n * tile, team):
                assert (q, p) == divmod(s, n), (n, team, tile, rank, s)
                p, q = p + dp, q + dq
                if p >= n:
                    p, q = p - n, q + 1


def test_the_edge_copy_shares_each_tile_read_among_its_elements(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """In the copy for threads with an element beyond the work's edge, the tiled loop adds to
    every element's sum (a dead one's is never stored), so NVRTC reads each tile value once for
    the elements that share it, as in the other copy; under the element's flag it read each
    element's own (sgemm at 1290^3, H100, session 43: 4x8 outputs, tiles of 32, 939 us against
    250 us at 1280^3, where no block has an edge).  The stores keep their flag."""
    from r3tui.remix import tile_blocked

    variant, _ = tile_loop(blocked("sgemm", 2), "sgemm", random.Random(0))
    checked = variant[variant.index("if (r3_all)"):].split("\n    } else {\n", 1)[1]
    tiled, untiled = checked.split("#if R3_TILE > 0", 1)[1].split("#else", 1)
    assert "r3_live" not in tiled
    assert "if (r3_live[r3_e])" in untiled  # R3_TILE 0: the original's reads, flagged
    assert "if (r3_live[r3_e]) {\n                idx[r3_e]" in checked  # the stores
    monkeypatch.setattr(tile_blocked, "_unguarded", lambda *args: [])
    flagged, _ = tile_loop(blocked("sgemm", 2), "sgemm", random.Random(0))
    assert "r3_live" in flagged[flagged.index("if (r3_all)"):].split("#if R3_TILE > 0")[2]
    point = {"R3_CF_X": 4, "R3_CF_Y": 8, MACRO: 32}
    reads = [_ptx(v, point).count("ld.shared") for v in (variant, flagged)]
    assert reads[0] < reads[1], reads
