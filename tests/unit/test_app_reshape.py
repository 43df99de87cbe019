"""A tuned block shape for an application kernel whose host code builds its block in a variable
(``dim3 block(4, 4); k<<<grid, block>>>``, as most of the corpus's programs launch): `r3
apply` rewrites each launch to the tuned block and the grid that covers the threads the
application's own grid and block did (``r3_shaped_grid``), which is the grid replay derived
from the recorded work and measured.

The program here is written for the test: a 2-D kernel launched with blocks of 4x4 threads, as
Rodinia gaussian's Fan2 is.  nvcc builds its host side with the launch replaced by a probe that
prints the grid and block it is given, so the helper's arithmetic runs without a GPU.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from r3tui.cuda.arena import ARENA_BASE
from r3tui.domain import Dim3
from r3tui.engine.splice import SHAPED_GRID, reshape_reason, scale_launch_grids
from r3tui.record.bundle import BundleWriter
from r3tui.record.manifest import ArenaInfo, KernelInfo, LaunchInfo, Manifest, SourceFile
from r3tui.replay.candidate import Candidate

APP = """\
#include <cstdio>
#include <cstdlib>

__global__ void rows(float *a, int n) {
  int r = blockIdx.x * blockDim.x + threadIdx.x;
  int c = blockIdx.y * blockDim.y + threadIdx.y;
  if (r < n && c < n) a[r * n + c] += 1.0f;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 64;
  float *a = nullptr;
  dim3 block(4, 4), grid((n + 3) / 4, (n + 3) / 4);
  rows<<<grid, block>>>(a, n);
  return 0;
}
"""
LAUNCH = "rows<<<grid, block>>>(a, n);"


def test_a_launch_with_a_block_variable_takes_the_tuned_block_and_its_grid() -> None:
    assert reshape_reason(APP, "rows") is None
    shaped = scale_launch_grids(APP, "rows", (1, 1, 1), (1, 1, 1), (), block=(32, 8, 1))
    assert shaped is not None and shaped[1] == 1
    text = shaped[0]
    call = (f"rows<<<{SHAPED_GRID}(dim3(grid), dim3(block), dim3(32, 8, 1), 1, 1, 1, 1, 1, 1, "
            "0, 0, 0), dim3(32, 8, 1)>>>(a, n);")
    assert call in text
    # everything but the launch and the helper at the top is as it was
    assert text.split("}\n#endif\n", 1)[1].replace(call, LAUNCH) == APP
    again = scale_launch_grids(text, "rows", (1, 1, 1), (1, 1, 1), (), block=(16, 16, 1))
    assert again is not None and again[0].count("#define R3_SHAPED_GRID\n") == 1
    # a launch whose dynamic shared memory the host computes (it may follow the block), or a
    # stream with none, and launches through the runtime API
    sized = APP.replace(LAUNCH, "rows<<<grid, block, block.x * block.y * 4>>>(a, n);")
    reason = reshape_reason(sized, "rows")
    assert reason is not None and reason.startswith("its launch at line 14 passes block.x")
    assert scale_launch_grids(sized, "rows", (1, 1, 1), (1, 1, 1), (), block=(32, 8, 1)) is None
    assert reshape_reason(APP.replace(LAUNCH, "rows<<<grid, block, 0, 0>>>(a, n);"),
                          "rows") is None
    api = APP.replace(LAUNCH, "void *args[] = {&a, &n};\n"
                      "  cudaLaunchKernel((void *)rows, grid, block, args, 0, 0);")
    assert reshape_reason(api, "rows") == "the host code launches rows through cudaLaunchKernel"


def _manifest(tmp_path: Path, n: int) -> Manifest:
    grid = Dim3((n + 3) // 4, (n + 3) // 4)
    with BundleWriter(tmp_path / f"b{n}") as w:
        unit = w.add_blob(APP.encode())
        manifest = Manifest(
            kernel=KernelInfo("rows", "_Z4rowsPfi", (SourceFile("app.cu", unit),), "nvcc",
                              "nvcc 13.0", ("-O3",)),
            launch=LaunchInfo(grid, Dim3(4, 4), 0, Dim3(grid.x * 4, grid.y * 4), True),
            params=(), allocations=(), arena=ArenaInfo(ARENA_BASE, 2 << 20),
            recorded_at="2026-12-07T11:00:00+00:00", blobs=dict(w.blobs),
            provenance={"recorder": "app interposer"})
        return w.commit(manifest).manifest


def _probe(text: str, tmp_path: Path, name: str) -> Path:
    """``text``'s host side built by nvcc with the launch replaced by a probe that prints the
    grid and block it is given."""
    host = text.replace("rows<<<", "probe(").replace(">>>(a, n);", ");").replace(
        "int main(", 'void probe(dim3 g, dim3 b) {\n  printf("grid %u %u %u block %u %u %u\\n",'
        " g.x, g.y, g.z, b.x, b.y, b.z);\n}\n\nint main(")
    (tmp_path / f"{name}.cu").write_text(host)
    built = subprocess.run(["nvcc", "-O1", "-std=c++17", "-arch=sm_90", f"{name}.cu", "-o", name],
                           cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    return tmp_path / name


@pytest.mark.parametrize(("block", "divisors", "exact"), [
    ((32, 8, 1), (1, 1, 1), ()),
    ((8, 32, 1), (1, 1, 1), ()),
    ((64, 2, 1), (1, 2, 1), ()),  # a variant covering two elements a thread along y
    ((16, 16, 1), (1, 1, 1), ("x", "y")),  # a kernel that never bounds its index
])
def test_the_host_codes_shaped_grid_is_the_one_replay_measured(
        tmp_path: Path, block: tuple[int, int, int], divisors: tuple[int, int, int],
        exact: tuple[str, ...]) -> None:
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not installed: the patched program's build is checked where it is")
    shaped = scale_launch_grids(APP, "rows", (1, 1, 1), divisors, exact, block=block)
    assert shaped is not None
    program = _probe(shaped[0], tmp_path, "shaped")
    for n in (64, 66, 256):
        candidate = Candidate(b"", "rows", block=Dim3(*block), work_divisor=divisors)
        grid, launched, _, _ = candidate.resolve(_manifest(tmp_path, n))
        ran = subprocess.run([str(program), str(n)], capture_output=True, text=True)
        work = 4 * ((n + 3) // 4)
        if exact and any(work % b for b in block[:2]):
            # the recorded work does not divide into the tuned block: the program stops
            assert ran.returncode != 0 and "grid" not in ran.stdout, ran
            assert f"r3 apply: a launch of ({work // 4}, {work // 4}, 1) blocks" in ran.stderr
            continue
        assert ran.returncode == 0, ran.stderr
        assert ran.stdout == (f"grid {grid.x} {grid.y} {grid.z} block {launched.x} "
                              f"{launched.y} {launched.z}\n"), (n, ran.stdout)


def test_the_axes_are_exchanged_only_where_the_recorded_work_is_square() -> None:
    """The campaign offers swap_xy (SQUARE_WORK_RULES) only where the recorded work is as wide
    along x as along y: the swapped kernel's x index then runs over the y extent."""
    from r3tui.engine.proposals import square_work

    assert square_work(LaunchInfo(Dim3(256, 256), Dim3(4, 4), 0, Dim3(1024, 1024), True))
    assert square_work(LaunchInfo(Dim3(32, 128), Dim3(32, 8), 0, None, True))  # its threads
    assert not square_work(LaunchInfo(Dim3(256, 128), Dim3(4, 4), 0, Dim3(1024, 512), True))
    assert not square_work(LaunchInfo(Dim3(4096), Dim3(256), 0, Dim3(1 << 20), True))
    assert not square_work(LaunchInfo(Dim3(1), Dim3(1), 0, Dim3(1), True))


def test_a_swapped_variant_starts_from_its_parents_blocks_transposed(tmp_path: Path) -> None:
    """What the parent ran along x a swap_xy child runs along y: its warm start and its prior
    are the parent's configurations with the block's x and y exchanged; a grandchild by
    another change keeps its parent's (already swapped) orientation and transposes its
    grandparent's."""
    from db import repository as repo
    from db.session import open_database
    from r3tui.domain import TrialConfig, Variant, VariantOrigin
    from r3tui.engine.lineage import ancestor_trials, transposed
    from tests.db.factories import ok, seed_campaign

    recorded = Dim3(4, 4)
    assert transposed(TrialConfig(block=Dim3(2, 128)), recorded).block == Dim3(128, 2)
    unset = TrialConfig(options=("-O3",))
    assert transposed(unset, recorded) == unset  # the recorded square block
    assert transposed(unset, Dim3(32, 8)).block == Dim3(8, 32)
    with open_database(tmp_path / "r3.sqlite", create=True, upgrade=True) as database, \
            database.session_scope() as s:
        _, cid, seed = seed_campaign(s)
        swap = repo.add_variant(s, Variant(campaign_id=cid, source="a", parent_id=seed,
                                           origin=VariantOrigin.RULE, operator="swap_xy"))
        child = repo.add_variant(s, Variant(campaign_id=cid, source="b", parent_id=swap,
                                            origin=VariantOrigin.RULE, operator="coarsen"))
        repo.insert_trial(s, cid, seed, TrialConfig(block=Dim3(2, 128)), ok(1e-4))
        repo.insert_trial(s, cid, swap, TrialConfig(block=Dim3(64, 4)), ok(5e-5))
        variants = {v.id: v for v in repo.campaign_variants(s, cid)}
        (of_swap,) = ancestor_trials(s, variants[swap], 3, recorded)
        assert [r.config.block for r in of_swap] == [Dim3(128, 2)]
        near, far = ancestor_trials(s, variants[child], 3, recorded)
        assert [r.config.block for r in near] == [Dim3(64, 4)]
        assert [r.config.block for r in far] == [Dim3(128, 2)]
        # without the recorded block, as before: every ancestor as it ran
        (as_ran,) = ancestor_trials(s, variants[swap], 3)
        assert [r.config.block for r in as_ran] == [Dim3(2, 128)]
