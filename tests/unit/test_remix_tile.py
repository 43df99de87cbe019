"""The shared-memory tiling rule (r3tui.remix.tile): on the example kernels and on small C++
kernels written here, every tile size computes what the original computes, to the bit, with
every thread reaching every barrier and no read outside the arrays (compiled with g++ and
AddressSanitizer, run on this CPU with each block's threads at once and shared memory between
them: tests/unit/cpu_grid.py); every variant compiles with real NVRTC for sm_90 and declares
its shared memory; the rule declines where staging could change what the kernel reads."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from r3tui.compile import CompileRequest, get_toolchain
from r3tui.domain import Dim3
from r3tui.remix.rules import LAUNCH_RULES, apply_rule
from r3tui.remix.tile import MACRO, TILES, Declined, tile_loop
from r3tui.search.source import parse_shared, parse_tunables, shared_bytes_at
from tests.unit import cpu_grid
from tests.unit.test_remix_split import DRIVERS, example

# Written here: templated, in a namespace, its work in an `if (r < m && c < n) { ... }`
# closing the body, a `<=` test from a parameter, a pragma before the loop, three staged reads
# (along y, along x, and of the counter alone: doubles and ints) and a read that is not staged
# (it runs in some iterations only).
BAND = r"""
namespace r3t {
template <int S>
__global__ void band(const double* a, const int* b, const double* w, double* out, int m,
                     int n, int lo, int hi) {
    const int c = threadIdx.x + blockIdx.x * blockDim.x;
    const int r = blockIdx.y * blockDim.y + threadIdx.y;
    if (r < m && c < n) {
        double s = 0.0;
        long long t = 0;
#pragma unroll 4
        for (int k = lo; k <= hi; k++) {
            double v = a[r * (hi + 1) + k];
            t += b[k * n + c] * S;
            s += v * w[k] + (double)t;
            s += (k % 2 == 0) ? w[k + 1] : 0.0;
        }
        out[r * n + c] = s;
    }
}
}  // namespace r3t
"""

# Written here: a bare `if (i >= n) return;` and a column read along x.
ROWDOT = r"""
__global__ void rowdot(const float* x, const float* v, float* y, int n, int m) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float acc = 0.0f;
    for (int k = 0; k < m; ++k) acc += x[(long long)k * n + i] * v[k];
    y[i] = acc;
}
"""

TILE_DRIVERS = {
    "sgemm": DRIVERS["sgemm"],
    "nbody": DRIVERS["nbody"],
    "band": r"""
int main() {
    const int m = 19, n = 23, lo = 3, hi = 40;
    std::vector<double> a(m * (hi + 1)), w(hi + 2), out(m * n, -2.0);
    std::vector<int> b((hi + 1) * n);
    for (size_t i = 0; i < a.size(); ++i) a[i] = (double)((i * 7) % 13) * 0.25 - 1.0;
    for (size_t i = 0; i < b.size(); ++i) b[i] = (int)((i * 5) % 11) - 4;
    for (size_t i = 0; i < w.size(); ++i) w[i] = 0.5 + (double)(i % 9) * 0.75;
    dim3 block(BX, BY, BZ);
    dim3 grid(r3_cover(n, 1, BX), r3_cover(m, 1, BY), 1);
    launch_threads(grid, block, [&] {
        r3t::band<3>(a.data(), b.data(), w.data(), out.data(), m, n, lo, hi); });
    for (double v : out) printf("%a\n", v);
}
""",
    "rowdot": r"""
int main() {
    const int n = 37, m = 29;
    std::vector<float> x((size_t)m * n), v(m), y(n, -1.0f);
    for (size_t i = 0; i < x.size(); ++i) x[i] = (float)((i * 3) % 17) * 0.125f - 1.0f;
    for (int k = 0; k < m; ++k) v[k] = 1.0f + (float)(k % 5) * 0.5f;
    dim3 block(BX, BY, BZ);
    dim3 grid(r3_cover(n, 1, BX), 1, 1);
    launch_threads(grid, block, [&] { rowdot(x.data(), v.data(), y.data(), n, m); });
    for (float u : y) printf("%a\n", u);
}
""",
}
# Written here: the loop's end a local every thread holds the same value in, computed before
# the bound check.
ROWDOT_LOCAL = ROWDOT.replace("    if (i >= n) return;", "    const int mm = m - 3, unused = 0;\n"
                              "    int last = mm;\n    if (i >= n) return;").replace(
    "k < m;", "k < last;").replace("rowdot(", "rowdot_local(")
TILE_DRIVERS["rowdot_local"] = TILE_DRIVERS["rowdot"].replace("rowdot(", "rowdot_local(")
SOURCES = {"sgemm": example("sgemm"), "nbody": example("nbody"), "band": BAND,
           "rowdot": ROWDOT, "rowdot_local": ROWDOT_LOCAL}
NAMES = {"band": "r3t::band<3>"}
# blocks of every shape the tiles meet: square, wide, tall, a 3-D block whose threads past the
# first layer only help to load (sgemm ends them), and sizes that divide nothing
BLOCKS = {
    "sgemm": [(16, 16, 1), (8, 4, 2), (32, 1, 1), (1, 32, 1), (5, 3, 1)],
    "nbody": [(64, 1, 1), (24, 1, 1)],
    "band": [(8, 4, 1), (3, 5, 1), (32, 1, 1)],
    "rowdot": [(16, 1, 1), (8, 2, 1)],
    "rowdot_local": [(16, 1, 1)],
}


def _run(source: str, kernel: str, tmp: Path, block: tuple[int, int, int], tile: int,
         name: str) -> list[str]:
    bx, by, bz = block
    out = cpu_grid.run(source, TILE_DRIVERS[kernel], tmp,
                       {"BX": bx, "BY": by, "BZ": bz, MACRO: tile}, name, sanitize=True)
    return out.split()


_BLOCK_AT_RUN = {axis: cpu_grid.RUNTIME.format(axis) for axis in ("BX", "BY", "BZ")}


@pytest.mark.parametrize("kernel", sorted(TILE_DRIVERS))
def test_every_tile_computes_what_the_original_does(kernel: str, tmp_path: Path) -> None:
    original = SOURCES[kernel]
    variant, detail = tile_loop(original, kernel, random.Random(0))
    assert "from shared memory" in detail
    # whole tiles run a loop of R3_TILE iterations, unrolled by 8 unless the loop has a
    # pragma of its own (band's `#pragma unroll 4`, before both copies); band tests `<=`
    assert variant.count("// a whole tile") == 1
    assert variant.count("#pragma unroll 8") == (kernel != "band")
    if kernel == "band":
        assert "if (r3_k0 + R3_TILE - 1 <= (hi)) {" in variant
        assert variant.count("#pragma unroll 4") == 3  # untiled, whole and partial tiles
    driver = TILE_DRIVERS[kernel]
    built = cpu_grid.build(original, driver, tmp_path, _BLOCK_AT_RUN, "original", True)
    tiled = {tile: cpu_grid.build(variant, driver, tmp_path, {**_BLOCK_AT_RUN, MACRO: tile},
                                  f"tile{tile}", True) for tile in (0, 4, 16, 64)}
    for bx, by, bz in BLOCKS[kernel]:
        block = {"BX": bx, "BY": by, "BZ": bz}
        expected = cpu_grid.execute(built, block).split()
        assert len(expected) > 20 and not any("nan" in v for v in expected)
        for tile, exe in tiled.items():
            assert cpu_grid.execute(exe, block).split() == expected, (kernel, block, tile)


def test_a_wrong_tile_shows_in_the_output(tmp_path: Path) -> None:
    """The comparison can fail: a tile whose loads skip threads that a check ends (they help
    to load), or a kernel that lets those threads skip the barriers, is caught."""
    variant, _ = tile_loop(SOURCES["sgemm"], "sgemm", random.Random(0))
    block = (8, 4, 2)
    expected = _run(SOURCES["sgemm"], "sgemm", tmp_path, block, 0, "original")
    # the threads of the second layer never load: half of each tile is never written (NaN)
    lazy = variant.replace("r3_e += r3_team", "r3_e += 2 * r3_team")
    assert _run(lazy, "sgemm", tmp_path, block, 16, "lazy") != expected
    # a whole tile's unrolled loop that stops one iteration short
    short = variant.replace("; k < r3_k0 + R3_TILE; ++k)", "; k < r3_k0 + R3_TILE - 1; ++k)")
    assert short != variant
    assert _run(short, "sgemm", tmp_path, block, 16, "short") != expected
    skipped = variant.replace("{ r3_stage(r3_k0); R3_BARRIER(); R3_BARRIER(); }", "{}")
    with pytest.raises(AssertionError, match="barriers"):
        _run(skipped, "sgemm", tmp_path, block, 16, "skipped")


def test_the_sanitizer_stops_a_load_outside_the_array(tmp_path: Path) -> None:
    """A tile that loads past the iterations' end reads outside the driver's array: the
    sanitized run stops, so the loads' bounds are checked by every run above."""
    variant, _ = tile_loop(ROWDOT, "rowdot", random.Random(0))
    unbounded = variant.replace("if (k < m && ", "if (k < m + 16 && ")
    assert unbounded != variant
    with pytest.raises(AssertionError, match="AddressSanitizer"):
        _run(unbounded, "rowdot", tmp_path, (16, 1, 1), 16, "unbounded")


@pytest.mark.parametrize("kernel", sorted(SOURCES))
def test_the_variant_compiles_with_nvrtc_and_declares_its_shared_memory(kernel: str) -> None:
    nvrtc = get_toolchain("nvrtc")
    variant, _ = tile_loop(SOURCES[kernel], kernel, random.Random(0))
    (tunable,) = [t for t in parse_tunables(variant) if t.name == MACRO]
    assert tunable.values == TILES and tunable.default == 0
    shared = parse_shared(variant)
    assert shared is not None
    block = {"BLOCK_X": 16, "BLOCK_Y": 8, "BLOCK_Z": 1, "BLOCK_THREADS": 128}
    assert shared.value({**block, MACRO: 0}) == 0  # the default launches like the recording
    bytes_at_16 = {"sgemm": (8 + 16) * 16 * 4, "nbody": 16 * 16,
                   "band": 8 * 16 * 8 + 16 * 16 * 4 + 16 * 8, "rowdot": (16 + 1) * 16 * 4,
                   "rowdot_local": (16 + 1) * 16 * 4}
    assert shared.value({**block, MACRO: 16}) == bytes_at_16[kernel]
    assert shared_bytes_at(variant, Dim3(16, 8, 1), {MACRO: 16}) == bytes_at_16[kernel]
    assert shared_bytes_at(variant, Dim3(16, 8, 1), {}) == 0  # R3_TILE's default
    assert shared_bytes_at(SOURCES[kernel], Dim3(16, 8, 1), {}) is None  # no declaration
    for tile in (0, 16, 256):
        compiled = nvrtc.compile(CompileRequest(variant, NAMES.get(kernel, kernel),
                                                arch="sm_90", defines=((MACRO, str(tile)),)))
        assert compiled.ok, f"{kernel} {tile}:\n{variant}\n{compiled.log}"


def test_the_rule_is_offered_only_where_the_search_sets_the_launch() -> None:
    assert "tile_shared" in LAUNCH_RULES
    made = apply_rule("tile_shared", example("sgemm"), "sgemm", random.Random(0))
    assert made.ok and made.source is not None and made.detail
    again = apply_rule("tile_shared", made.source, "sgemm", random.Random(0))
    # tiled already: its barriers (inline PTX) and its tiles are threads working together
    assert not again.ok and any(w in (again.reason or "") for w in ("__shared__", "asm"))
    for name, reason in (("reduce_sum", "__shared__"), ("softmax", "__shared__"),
                         ("stencil7", "no `for`"), ("spmv_csr", "start reads")):
        declined = apply_rule("tile_shared", example(name), name, random.Random(0))
        assert not declined.ok and reason in (declined.reason or ""), (name, declined.reason)


_DECLINE = r"""
__global__ void k(const float* a, const float* b, float* out, int n, int m) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    GUARD
    float s = 0.0f;
    for (int j = 0; j < m; ++j) {
        BODY
    }
    out[i] = s;
    AFTER
}
"""


@pytest.mark.parametrize(("guard", "body", "after", "reason"), [
    ("if (i >= n) return;", "s += a[j]; if (s > 4.0f) break;", "", "break"),
    ("if (i >= n) return;", "s += a[j]; out[j] = s;", "", "writes memory"),
    ("if (i >= n) return;", "if (b[i] > 0) s += a[j];", "", "not read in every iteration"),
    ("if (i >= n) return;", "s += b[i] > 0 ? a[j] : 0.0f;", "", "not read in every iteration"),
    ("if (i >= n) return;", "s += b[i] > 0 && a[j] > 0;", "", "not read in every iteration"),
    ("if (i >= n) return;", "s += a[j];", "((float*)a)[i] = s;", "no read of the loop"),
    ("if (i >= n) return;", "s += a[j + (int)s];", "", "reads s"),
    ("if (i >= n) return;", "s += a[(int)out[j]];", "", "reads memory"),
    ("if (i >= n) return;", "s += a[j]; j += 1;", "", "assigns its counter"),
    ("if (i >= n) return;", "{ int i = j % n; s += b[i + j]; }", "", "declares i"),
    ("if (i < 4) return;", "s += a[j];", "", "not an upper bound"),
    ("if (i >= n || b[i] > 0) return;", "s += a[j];", "", "reads memory"),
    ("if (n == 0) return;", "s += a[j];", "", "not a bound check"),
    ("int t = threadIdx.x; if (t >= n) return;", "s += a[j];", "", "threadIdx"),
])
def test_the_rule_declines_what_staging_could_change(guard: str, body: str, after: str,
                                                     reason: str) -> None:
    source = _DECLINE.replace("GUARD", guard).replace("BODY", body).replace("AFTER", after)
    with pytest.raises(Declined, match=reason):
        tile_loop(source, "k", random.Random(0))


@pytest.mark.parametrize(("old", "new", "reason"), [
    ("j < m;", "j < i;", "end reads the local i"),
    ("j < m;", "j < e;", "end reads the local e"),  # assigned again below
    ("j < m;", "j < h;", "end reads the local h"),  # declared after the bound check
    ("j < m;", "j < q;", "end reads the local q"),  # read from memory
    ("int j = 0;", "int j = (int)a[0];", "start reads memory"),
    ("++j", "j += 2", "step j by one"),
    ("j < m;", "j != m;", "test is not"),
    ("int i = blockIdx.x * blockDim.x + threadIdx.x;",
     "int i = blockIdx.x * blockDim.x + threadIdx.x; int r = blockIdx.y * blockDim.y + "
     "threadIdx.y; if (r * n + i >= m) return;", "not one index against a bound"),
])
def test_the_rule_declines_loops_and_checks_it_cannot_read(old: str, new: str,
                                                           reason: str) -> None:
    source = _DECLINE.replace("GUARD", "int e = m; e += 1; const int q = (int)a[0]; "
                                       "if (i >= n) return; int h = m;").replace(
        "BODY", "s += a[j];").replace("AFTER", "").replace(old, new, 1)
    with pytest.raises(Declined, match=reason):
        tile_loop(source, "k", random.Random(0))


def test_the_search_launches_each_tile_with_its_shared_memory() -> None:
    """The variant's space: R3_TILE is a dimension, the recorded launch (tile 0) asks no
    shared memory, a tile asks what it declares at its block, and a point whose tiles pass the
    device's shared memory a block is not valid."""
    from dataclasses import replace

    from r3tui.domain import TrialConfig
    from r3tui.engine import KernelSource, build_space
    from r3tui.engine.inner import InnerSettings
    from r3tui.record.manifest import LaunchInfo
    from r3tui.search import DeviceLimits

    variant, _ = tile_loop(SOURCES["sgemm"], "sgemm", random.Random(0))
    launch = LaunchInfo(grid=Dim3(64, 64), block=Dim3(16, 16), work=Dim3(1024, 1024),
                        block_tunable=True)
    space = build_space(launch, KernelSource(variant, "sgemm"),
                        InnerSettings(launch_bounds=False), DeviceLimits())
    assert f"tune.{MACRO}" in space.names
    assert space.baseline_config().shared_mem_bytes is None  # the recorded 0 bytes
    tiled = TrialConfig(tunables={MACRO: 16}, shared_mem_bytes=(16 + 16) * 16 * 4)
    point = space.from_config(tiled)
    assert point is not None
    assert space.to_config(point) == replace(tiled, toolchain=space.toolchain)
    assert space.from_config(replace(tiled, shared_mem_bytes=None)) is None  # not its size
    too_much = replace(tiled, tunables={MACRO: 256}, block=Dim3(32, 32),
                       shared_mem_bytes=(32 + 32) * 256 * 4)
    assert space.from_config(too_much) is None
    assert any("shared memory" in why for why in space.check(too_much))


@pytest.mark.parametrize(("rule", "source", "qualified"), [
    ("tile_shared", BAND, "r3t::band<3>"),
    ("coarsen", BAND, "r3t::band<3>"),
    ("split_loop", ROWDOT, "ns::rowdot<float>"),
])
def test_the_parsed_rules_find_a_kernel_by_the_name_a_campaign_gives_it(
        rule: str, source: str, qualified: str) -> None:
    """A campaign on a templated kernel in a namespace names it as compiled (``ns::k<8>``):
    the rules that read the parse find its definition by that name as by its own."""
    plain = apply_rule(rule, source, qualified.split("<")[0].split("::")[-1], random.Random(0))
    named = apply_rule(rule, source, qualified, random.Random(0))
    assert plain.ok, plain.reason
    assert named.ok and named.source == plain.source, named.reason


def test_export_writes_the_shared_memory_the_winner_launches_with(tmp_path: Path) -> None:
    """`r3 export` of a tiled variant: launch.json gives the dynamic shared memory its tiles
    take at the winner's block and tile (null for a variant launched as recorded)."""
    import json
    from dataclasses import replace

    from db import repository as repo
    from db.session import open_database
    from r3tui.domain import Campaign, Variant, VariantOrigin
    from r3tui.engine.report import export_variant
    from tests.db.factories import config, ok, recording

    original = SOURCES["sgemm"]
    variant, _ = tile_loop(original, "sgemm", random.Random(0))
    tiled = replace(config(block=16), block=Dim3(16, 16, 1), tunables={MACRO: 16},
                    launch_bounds=None, shared_mem_bytes=(16 + 16) * 16 * 4)
    database = open_database(tmp_path / "r3.sqlite", create=True, upgrade=True)
    with database.session_scope() as s:
        rid = repo.add_recording(s, recording("sgemm"), {})
        cid = repo.create_campaign(s, Campaign("remix", rid, seed=0))
        seed = repo.add_variant(s, Variant(cid, original, VariantOrigin.SEED))
        vid = repo.add_variant(s, Variant(cid, variant, VariantOrigin.RULE, parent_id=seed))
        repo.insert_trial(s, cid, seed, replace(config(block=256), tunables={}), ok(2e-4))
        repo.insert_trial(s, cid, vid, tiled, ok(5e-5))
    with database.session_scope() as s:
        files = export_variant(s, cid, vid, tmp_path / "tiled")
        plain = export_variant(s, cid, seed, tmp_path / "plain")
    database.close()
    launch = json.loads(next(p for p in files if p.name == "launch.json").read_text())
    assert launch["tunables"] == {MACRO: 16} and launch["block"] == [16, 16, 1]
    assert launch["shared_mem_bytes"] == 2048
    assert shared_bytes_at(variant, Dim3(16, 16, 1), launch["tunables"]) == 2048
    recorded = json.loads(next(p for p in plain if p.name == "launch.json").read_text())
    assert recorded["shared_mem_bytes"] is None
