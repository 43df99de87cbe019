"""The loop-splitting rule (r3tui.remix.split): on the example kernels and on small C++ kernels
written here, every number of threads an element computes what the original computes (compiled
with g++ and run on this CPU with each block's threads at once, warp shuffles exchanged between
real threads: tests/unit/cpu_grid.py), and compiles with real NVRTC for sm_90; the rule declines
where splitting could change what the kernel does."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from r3tui.compile import CompileRequest, get_toolchain
from r3tui.domain import Dim3
from r3tui.remix.rules import LAUNCH_RULES, apply_rule
from r3tui.remix.split import FACTORS, Declined, split_loop
from r3tui.replay.candidate import Candidate
from r3tui.search.source import (
    DeclarationError,
    grid_scaling,
    grid_tunables,
    parse_grid_scaling,
    parse_relations,
    parse_tunables,
    work_multipliers,
)
from tests.unit import cpu_grid

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def example(name: str) -> str:
    return (EXAMPLES / name / "kernel.cu").read_text()


# A kernel written here: templated, in a namespace, its work in an `if (i < n) { ... }`
# closing the body, an integer sum (exact in any order) and a sum of T started from memory
# and taken from with -=, a `continue`, a `<=` test and a post-increment.
MIX = r"""
namespace r3t {
template <typename T, int K>
__global__ void mix(const int* idx, const T* w, long long* count, T* dot, int n, int m) {
    const int i = threadIdx.x + blockIdx.x * blockDim.x;
    if (i < n) {
        long long c = 0;
        T d = w[i];
        for (int k = 0; k <= m - 1; k++) {
            int j = idx[(i * 7 + k) % n];
            if (j % 3 == 0) continue;
            c += (long long)j * K;
            d -= w[j % n] * (T)k;
        }
        count[i] = c;
        dot[i] = d;
    }
}
}  // namespace r3t
"""

# Drivers: ragged sizes, deterministic data, the grid as the replay derives it (the work's
# extent along x times SX threads an element, over the block), every output printed exactly.
_SPLIT = """
#ifndef SX
#define SX 1
#endif
"""

DRIVERS = {
    "spmv_csr": _SPLIT + r"""
int main() {
    const int nrows = 45, ncols = 61;
    std::vector<int> rowptr(nrows + 1), cols;
    std::vector<double> vals, x(ncols), y(nrows, -3.0);
    for (int r = 0; r < nrows; ++r) {
        rowptr[r] = (int)cols.size();
        for (int k = 0; k < (r * 13) % 41; ++k) {  // 0 to 40 nonzeros: fewer than, and more
            cols.push_back((r * 11 + k * 5) % ncols);  // than, the threads of a row
            vals.push_back((double)(r - k) / 3.0);
        }
    }
    rowptr[nrows] = (int)cols.size();
    for (int i = 0; i < ncols; ++i) x[i] = 1.0 + i * 0.5;
    dim3 block(BX, BY, BZ);
    dim3 grid(r3_cover(nrows * SX, 1, BX), 1, 1);
    launch_threads(grid, block, [&] {
        spmv_csr(nrows, rowptr.data(), cols.data(), vals.data(), x.data(), y.data()); });
    for (double v : y) printf("%a\n", v);
}
""",
    "nbody": _SPLIT + r"""
int main() {
    const int n = 45;
    std::vector<float4> pos(n), acc(n, float4{-1, -1, -1, -1});
    for (int i = 0; i < n; ++i)
        pos[i] = make_float4(i * 0.37f, (i % 7) * 1.1f, (i % 5) * -0.6f, 1.0f + (i % 3));
    dim3 block(BX, BY, BZ);
    dim3 grid(r3_cover(n * SX, 1, BX), 1, 1);
    launch_threads(grid, block, [&] { nbody(pos.data(), acc.data(), n, 0.01f); });
    for (float4 v : acc) printf("%a\n%a\n%a\n%a\n", v.x, v.y, v.z, v.w);
}
""",
    "sgemm": _SPLIT + r"""
int main() {
    const int M = 13, N = 11, K = 37;
    std::vector<float> A(M * K), B(K * N), C(M * N);
    for (int i = 0; i < M * K; ++i) A[i] = (float)((i * 7) % 11) * 0.25f - 1.0f;
    for (int i = 0; i < K * N; ++i) B[i] = (float)((i * 5) % 13) * 0.125f - 0.5f;
    for (int i = 0; i < M * N; ++i) C[i] = (float)(i % 17) * 0.5f;
    dim3 block(BX, BY, BZ);
    dim3 grid(r3_cover(N * SX, 1, BX), r3_cover(M, 1, BY), 1);
    launch_threads(grid, block, [&] { sgemm(M, N, K, 1.5f, A.data(), B.data(), 0.5f,
                                            C.data()); });
    for (float v : C) printf("%a\n", v);
}
""",
    "mix": _SPLIT + r"""
int main() {
    const int n = 53, m = 71;
    std::vector<int> idx(n);
    std::vector<double> w(n), dot(n, -1.0);
    std::vector<long long> count(n, -1);
    for (int i = 0; i < n; ++i) { idx[i] = (i * 29 + 3) % 97; w[i] = 0.5 + (i % 9) * 0.75; }
    dim3 block(BX, BY, BZ);
    dim3 grid(r3_cover(n * SX, 1, BX), 1, 1);
    launch_threads(grid, block, [&] {
        r3t::mix<double, 3>(idx.data(), w.data(), count.data(), dot.data(), n, m); });
    for (int i = 0; i < n; ++i) printf("%lld\n%a\n", count[i], dot[i]);
}
""",
}
SOURCES = {"spmv_csr": example("spmv_csr"), "nbody": example("nbody"),
           "sgemm": example("sgemm"), "mix": MIX}
# blocks whose x extent every factor up to 32 divides, and one that is not a whole warp and
# holds several rows (sgemm's 2-D block: a warp's lanes span rows, each group within one)
BLOCKS = {"spmv_csr": (32, 1, 1), "nbody": (64, 1, 1), "sgemm": (32, 2, 1), "mix": (96, 1, 1)}
# how far a sum added in another order may be from the original's (the examples' recordings
# verify nbody's accelerations with an L2 rtol of 2e-5)
RTOL = {"spmv_csr": 1e-12, "nbody": 2e-5, "sgemm": 1e-5, "mix": 1e-12}


def _run(source: str, kernel: str, tmp: Path, block: tuple[int, int, int], split: int,
         name: str) -> list[float]:
    bx, by, bz = block
    out = cpu_grid.run(source, DRIVERS[kernel], tmp, {"BX": bx, "BY": by, "BZ": bz,
                                                      "SX": split, "R3_SPLIT": split}, name)
    return [float.fromhex(v) if "0x" in v else float(int(v)) for v in out.split()]


def _close(a: list[float], b: list[float], rtol: float) -> bool:
    import math

    diff = math.sqrt(sum((x - y) ** 2 for x, y in zip(a, b, strict=True)))
    return diff <= rtol * math.sqrt(sum(y * y for y in b))


@pytest.mark.parametrize("kernel", sorted(DRIVERS))
def test_every_split_computes_what_the_original_does(kernel: str, tmp_path: Path) -> None:
    original = SOURCES[kernel]
    block = BLOCKS[kernel]
    expected = _run(original, kernel, tmp_path, block, 1, "original")
    assert len(expected) > 40
    variant, detail = split_loop(original, kernel, random.Random(0))
    assert "split over R3_SPLIT threads" in detail
    for split in FACTORS:
        got = _run(variant, kernel, tmp_path, block, split, f"split{split}")
        if split == 1:  # one thread an element: the original's sums in the original's order
            assert got == expected, kernel
        else:
            assert _close(got, expected, RTOL[kernel]), (kernel, split)
    if kernel == "mix":  # the integer sums are exact whatever the order
        got = _run(variant, kernel, tmp_path, block, 32, "split32")
        assert got[0::2] == expected[0::2]


def test_a_wrong_split_shows_in_the_output(tmp_path: Path) -> None:
    """The comparison can fail: a split whose threads do not add their sums together, or a
    grid that covers only the elements' first threads, prints other numbers."""
    variant, _ = split_loop(SOURCES["spmv_csr"], "spmv_csr", random.Random(0))
    expected = _run(SOURCES["spmv_csr"], "spmv_csr", tmp_path, (32, 1, 1), 1, "original")
    unshuffled = variant.replace("sum += __shfl_xor_sync", "sum += 0 * __shfl_xor_sync")
    got = _run(unshuffled, "spmv_csr", tmp_path, (32, 1, 1), 4, "unshuffled")
    assert not _close(got, expected, 1e-6)
    short = cpu_grid.run(variant, DRIVERS["spmv_csr"].replace("nrows * SX", "nrows"), tmp_path,
                         {"BX": 32, "BY": 1, "BZ": 1, "SX": 4, "R3_SPLIT": 4}, "short")
    assert short.split()[-1] == "-0x1.8p+1"  # the last row never computed: still -3.0


def test_the_shuffle_emulation_stops_a_mask_that_leaves_out_a_lane(tmp_path: Path) -> None:
    """The CPU harness holds a kernel to the shuffle's rule: a lane reading from one outside
    the mask aborts the run (as it is undefined on the GPU)."""
    variant, _ = split_loop(SOURCES["spmv_csr"], "spmv_csr", random.Random(0))
    narrow = variant.replace("(0xffffffffu >> (32 - R3_SPLIT))", "(0xffffffffu >> (33 - R3_SPLIT))")
    with pytest.raises(AssertionError, match="outside mask"):
        _run(narrow, "spmv_csr", tmp_path, (32, 1, 1), 4, "narrow")


@pytest.mark.parametrize("kernel", sorted(SOURCES))
def test_the_variant_compiles_with_nvrtc_and_declares_its_threads(kernel: str) -> None:
    nvrtc = get_toolchain("nvrtc")
    variant, _ = split_loop(SOURCES[kernel], kernel, random.Random(0))
    assert parse_grid_scaling(variant) == {("threads_per_item", "x"): "R3_SPLIT"}
    assert grid_tunables(variant) == {"R3_SPLIT"}
    (tunable,) = [t for t in parse_tunables(variant) if t.name == "R3_SPLIT"]
    assert tunable.values == FACTORS and tunable.default == 1
    (relation,) = parse_relations(variant)
    assert relation.holds({"BLOCK_X": 96, "R3_SPLIT": 32})
    assert not relation.holds({"BLOCK_X": 48, "R3_SPLIT": 32})
    assert work_multipliers(variant, {"R3_SPLIT": 8}) == (8, 1, 1)
    assert work_multipliers(variant, {}) == (1, 1, 1)  # the source's default
    assert grid_scaling(variant, {"R3_SPLIT": "16"}) == ((1, 1, 1), (16, 1, 1))
    name = "r3t::mix<double, 3>" if kernel == "mix" else kernel
    for split in (1, 32):
        compiled = nvrtc.compile(CompileRequest(variant, name, arch="sm_90",
                                                defines=(("R3_SPLIT", str(split)),)))
        assert compiled.ok, f"{kernel} {split}:\n{variant}\n{compiled.log}"


def test_the_replay_multiplies_the_grid_along_x() -> None:
    candidate = Candidate(b"cubin", "k", work_multiplier=(8, 1, 1))
    assert candidate.rescales
    assert candidate._covered(Dim3(45, 3, 1)) == Dim3(360, 3, 1)
    assert Dim3(64, 1, 1).grid_for(candidate._covered(Dim3(45, 3, 1))) == Dim3(6, 3, 1)
    both = Candidate(b"cubin", "k", work_divisor=(1, 4, 1), work_multiplier=(2, 1, 1))
    assert both._covered(Dim3(45, 37, 1)) == Dim3(90, 10, 1)


def test_an_axis_takes_one_grid_declaration() -> None:
    text = ("// r3: tune A 1 2\n// r3: tune B 1 2\n// r3: work_per_thread A x\n"
            "// r3: threads_per_item B x\n")
    with pytest.raises(DeclarationError, match="scales already"):
        parse_grid_scaling(text)
    with pytest.raises(DeclarationError, match="names no tunable"):
        parse_grid_scaling("// r3: threads_per_item C y\n")
    assert parse_grid_scaling("// r3: tune B 1 2\n// r3: threads_per_item B y\n") == {
        ("threads_per_item", "y"): "B"}


def test_the_rule_is_offered_only_where_the_search_launches_the_grid() -> None:
    assert "split_loop" in LAUNCH_RULES
    made = apply_rule("split_loop", example("spmv_csr"), "spmv_csr", random.Random(0))
    assert made.ok and made.source is not None and made.detail
    for name in ("reduce_sum", "softmax"):  # shared memory: threads work together
        declined = apply_rule("split_loop", example(name), name, random.Random(0))
        assert not declined.ok and "__shared__" in (declined.reason or "")
    again = apply_rule("split_loop", made.source, "spmv_csr", random.Random(0))
    assert not again.ok and "__shfl_xor_sync" in (again.reason or "")  # split already


_DECLINE = r"""
__global__ void k(const float* a, float* out, int n, int m) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    BEFORE
    float s = 0.0f;
    float4 v = make_float4(0, 0, 0, 0);
    for (int j = 0; j < m; ++j) {
        BODY
    }
    out[i] = s + v.x;
}
"""


@pytest.mark.parametrize(("before", "body", "reason"), [
    ("", "s += a[j]; if (a[j] < 0) break;", "break"),
    ("", "s += a[j]; if (a[j] < 0) return;", "returns"),
    ("", "s += a[j]; out[j] = s;", "writes memory"),
    ("", "s += a[j] * s;", "reads the sum s"),
    ("", "if (s > 1.0f) s += a[j];", "reads the sum s"),
    ("", "s = s * 0.5f + a[j];", "not only summed"),
    ("", "v.x += a[j];", "writes memory"),  # a field of a local: read as memory
    ("", "s += a[j]; j += 1;", "assigns its counter"),
    ("", "float t = a[j]; (void)t;", "sums into no local"),
    ("out[i] = 0.0f;", "s += a[j];", "before the loop writes memory"),
    ("", "s += a[j]; atomicAdd(out, 1.0f);", "writes memory or calls"),
])
def test_the_rule_declines_what_splitting_could_change(before: str, body: str,
                                                       reason: str) -> None:
    source = _DECLINE.replace("BEFORE", before).replace("BODY", body)
    with pytest.raises(Declined, match=reason):
        split_loop(source, "k", random.Random(0))


@pytest.mark.parametrize(("source", "reason"), [
    (_DECLINE.replace("BEFORE", "").replace("BODY", "s += a[j];").replace(
        "for (int j = 0; j < m; ++j)", "for (int j = 0; j < m; j += 2)"), "step j by one"),
    (_DECLINE.replace("BEFORE", "int j;").replace("BODY", "s += a[j];").replace(
        "for (int j = 0;", "for (j = 0;"), "declare its counter"),
    (_DECLINE.replace("BEFORE", "").replace("BODY", "s += a[j];").replace(
        "j < m;", "j != m;"), "test is not"),
    (_DECLINE.replace("BEFORE", "").replace("BODY", "s += a[j];").replace(
        "j < m;", "j < m + (int)s;"), "test reads a sum"),
    (_DECLINE.replace("BEFORE", "").replace("BODY", "s += a[j];").replace(
        "int j = 0;", "int j = (int)s;"), "start reads a sum"),
    (_DECLINE.replace("BEFORE", "").replace("BODY", "c += a[j] > 0;").replace(
        "float s = 0.0f;", "char c = 0; float s = 0.0f;"), "which a shuffle does not add"),
    (_DECLINE.replace("BEFORE", "").replace("BODY", "s += a[j];").replace(
        "blockIdx.x * blockDim.x + threadIdx.x", "blockIdx.y * blockDim.y + threadIdx.y"),
     "no index"),
    (_DECLINE.replace("BEFORE", "int g = gridDim.x;").replace("BODY", "s += a[j] * g;"),
     "no index"),
])
def test_the_rule_declines_loops_and_indices_it_cannot_read(source: str, reason: str) -> None:
    with pytest.raises(Declined, match=reason):
        split_loop(source, "k", random.Random(0))


def test_export_writes_the_threads_an_element_the_winner_launches_with(tmp_path: Path) -> None:
    """`r3 export` of a split variant: launch.json says how many threads share an element
    (the grid that many times larger), next to its elements per thread."""
    import json
    from dataclasses import replace

    from db import repository as repo
    from db.session import open_database
    from r3tui.domain import Campaign, Variant, VariantOrigin
    from r3tui.engine.report import export_variant
    from tests.db.factories import config, ok, recording

    original = example("spmv_csr")
    variant, _ = split_loop(original, "spmv_csr", random.Random(0))
    database = open_database(tmp_path / "r3.sqlite", create=True, upgrade=True)
    with database.session_scope() as s:
        rid = repo.add_recording(s, recording("spmv_csr"), {})
        cid = repo.create_campaign(s, Campaign("remix", rid, seed=0))
        seed = repo.add_variant(s, Variant(cid, original, VariantOrigin.SEED))
        vid = repo.add_variant(s, Variant(cid, variant, VariantOrigin.RULE, parent_id=seed))
        repo.insert_trial(s, cid, seed, replace(config(block=64), tunables={}), ok(2e-4))
        repo.insert_trial(s, cid, vid, replace(config(block=64), tunables={"R3_SPLIT": 8}),
                          ok(5e-5))
    with database.session_scope() as s:
        files = export_variant(s, cid, vid, tmp_path / "export")
    database.close()
    launch = json.loads(next(p for p in files if p.name == "launch.json").read_text())
    assert launch["tunables"] == {"R3_SPLIT": 8}
    assert launch["threads_per_item"] == [8, 1, 1]
    assert launch["work_per_thread"] == [1, 1, 1]


def test_a_sum_of_a_type_named_through_typedefs_is_shuffled() -> None:
    """lulesh's sums are `Real_t`: `typedef real8 Real_t;`, `typedef double real8;`."""
    from r3tui.analysis.per_thread import arithmetic_type, resolved_type

    prelude = "typedef double real8;\ntypedef real8 Real_t;\n#define WORD unsigned int\n"
    assert resolved_type("Real_t", prelude) == "double"
    assert resolved_type("WORD", prelude) == "unsigned int"
    assert arithmetic_type("Real_t", prelude) and not arithmetic_type("Other", prelude)
    source = prelude + _DECLINE.replace("BEFORE", "").replace("BODY", "t += a[j];").replace(
        "float s = 0.0f;", "float s = 0.0f; Real_t t = 0;").replace("s + v.x", "s + v.x + t")
    made, _ = split_loop(source, "k", random.Random(0))
    assert "__shfl_xor_sync" in made
    compiled = get_toolchain("nvrtc").compile(CompileRequest(made, "k", arch="sm_90"))
    assert compiled.ok, compiled.log
    # a type the source names as something that is no number still declines
    other = source.replace("typedef real8 Real_t;", "struct Real_t { double v; };")
    with pytest.raises(Declined, match="which a shuffle does not add"):
        split_loop(other, "k", random.Random(0))
