"""An application kernel's variant that covers several elements a thread (coarsen, grid_stride,
stream_axis) or shares one among threads (split_loop) needs another grid: `r3 apply` rescales
the grid at the kernel's ``<<<grid, ...>>>`` launches in the host code, the way replay derived
it from the recorded work, and the campaign offers those rules only where it can.

The application is tests/gpu/apps/multi_app (written here): ``multi::smooth`` is defined in a
header and launched twice from main.cu; ``scale`` is defined and launched in ops.cu.
"""

from __future__ import annotations

import random
import shutil
import subprocess
from pathlib import Path

import pytest

from r3tui.cuda.arena import ARENA_BASE
from r3tui.domain import Dim3
from r3tui.engine.apply import _Best, apply_campaign
from r3tui.engine.inner_loop import grid_fixed_reason
from r3tui.engine.splice import SCALED_GRID, grid_launches, scale_launch_grids
from r3tui.engine.unit_source import seed_unit
from r3tui.record.bundle import Bundle, BundleWriter
from r3tui.record.manifest import ArenaInfo, KernelInfo, LaunchInfo, Manifest, SourceFile
from r3tui.remix.rules import apply_rule
from r3tui.search.source import grid_scaling, parse_tunables

MULTI = Path(__file__).resolve().parents[1] / "gpu" / "apps" / "multi_app"
SMOOTH = "multi::smooth<float, 2>"
N, BLOCK = 1 << 20, 256


def smooth_bundle(path: Path, main_cu: str | None = None) -> Bundle:
    """multi::smooth as the interposer records it: main.cu (launches) and its headers."""
    with BundleWriter(path) as w:
        text = main_cu if main_cu is not None else (MULTI / "main.cu").read_text()
        unit = w.add_blob(text.encode())
        headers = tuple(SourceFile(str(p.relative_to(MULTI)), w.add_blob(p.read_bytes()))
                        for p in sorted((MULTI / "include").rglob("*")) if p.is_file())
        manifest = Manifest(
            kernel=KernelInfo(SMOOTH, "_ZN5multi6smoothIfLi2EEEvPKT_PS1_NS_5FieldE",
                              (SourceFile("main.cu", unit),), "nvcc", "nvcc 13.0", ("-O3",),
                              headers=headers, include_dirs=(".", "include")),
            launch=LaunchInfo(Dim3(N // BLOCK), Dim3(BLOCK), 0, Dim3(N), True),
            params=(), allocations=(), arena=ArenaInfo(ARENA_BASE, 2 << 20),
            recorded_at="2026-12-05T18:00:00+00:00", blobs=dict(w.blobs),
            provenance={"recorder": "app interposer"})
        return w.commit(manifest)


def launched_by_api() -> str:
    """main.cu with smooth's launches made through cudaLaunchKernel (no `<<<>>>` left)."""
    return (MULTI / "main.cu").read_text().replace(
        "multi::smooth<float, RADIUS><<<blocks, SMOOTH_BLOCK>>>(a, b, field);",
        "{ void* args[] = {&a, &b, &field};\n"
        "      cudaLaunchKernel((void*)multi::smooth<float, RADIUS>, dim3(blocks),\n"
        "                       dim3(SMOOTH_BLOCK), args, 0, 0); }")


def coarsened(original: str) -> str:
    made = apply_rule("coarsen", original, SMOOTH, random.Random(0))
    assert made.ok and made.source is not None, made.reason
    return made.source


def test_launches_that_can_be_rescaled_are_found_and_others_named() -> None:
    main = (MULTI / "main.cu").read_text()
    assert grid_launches(main, SMOOTH) == (2, None)
    assert grid_launches((MULTI / "ops.cu").read_text(), "scale") == (1, None)
    assert grid_launches(main, "scale")[1] == "no `scale<<<...>>>` launch in the host code"
    api = "void run(dim3 g) {\n  void* args[] = {&a};\n  cudaLaunchKernel((void*)scale, g, " \
          "dim3(128), args, 0, 0);\n}\n"
    assert grid_launches(api, "scale")[1] == "the host code launches scale through " \
                                             "cudaLaunchKernel"
    # one launch the helper cannot reach is enough to keep the grid
    assert grid_launches(api + "void again() { scale<<<8, 128>>>(p, 1.0f, 9); }\n",
                         "scale")[1] is not None
    # another kernel of the same name in another namespace: its grid must stay, so nothing
    # is rescaled; a launch qualified as the kernel is (or unqualified) is the kernel's
    other = main + "void other_launch(float* p) { other::smooth<<<1, 32>>>(p); }\n"
    assert grid_launches(other, SMOOTH) == (
        3, "the host code also launches other::smooth, another kernel named smooth")
    assert scale_launch_grids(other, SMOOTH, (1, 1, 1), (2, 1, 1)) is None
    assert grid_launches("void f() { ::scale<<<8, 128>>>(p, 1.0f, 9); }\n", "scale") == (1, None)
    # a launch in a comment or a string is no launch
    assert grid_launches('// scale<<<g, b>>>(p)\nconst char* s = "scale<<<1,1>>>";\n',
                         "scale")[0] == 0


def test_every_launch_takes_the_scaled_grid_through_one_helper() -> None:
    main = (MULTI / "main.cu").read_text()
    scaled = scale_launch_grids(main, SMOOTH, (1, 1, 1), (4, 1, 1))
    assert scaled is not None
    text, count = scaled
    assert count == 2
    call = f"<<<{SCALED_GRID}(dim3(blocks), 1, 1, 1, 4, 1, 1), SMOOTH_BLOCK>>>"
    assert text.count(call) == 2
    assert text.count(f"static inline __host__ __device__ dim3 {SCALED_GRID}(") == 1
    # everything but the launches' grids and the helper is as it was
    assert text.split("#endif\n", 1)[1].replace(
        f"{SCALED_GRID}(dim3(blocks), 1, 1, 1, 4, 1, 1)", "blocks") == main
    # a second kernel of the same file gets its own factors and no second helper
    again = scale_launch_grids(text + "void f() { other<<<dim3(3, 2), 64, 0, s>>>(p); }\n",
                               "other", (2, 1, 1), (1, 1, 1))
    helper = f"static inline __host__ __device__ dim3 {SCALED_GRID}("
    assert again is not None and again[0].count(helper) == 1
    assert f"other<<<{SCALED_GRID}(dim3(dim3(3, 2)), 2, 1, 1, 1, 1, 1), 64, 0, s>>>" in again[0]
    assert scale_launch_grids(main, "scale", (1, 1, 1), (4, 1, 1)) is None


def test_the_host_codes_scaled_grid_is_the_one_replay_measured(tmp_path: Path) -> None:
    """The helper's arithmetic (ceil(g * m / d) per axis) against the grid a replay Candidate
    derives from the recorded work for the same factors: the application launches what was
    measured."""
    from r3tui.replay.candidate import Candidate

    def helper(g: int, m: int, d: int) -> int:
        return (g * m + d - 1) // d

    bundle = smooth_bundle(tmp_path / "b")
    for divisor, multiplier in ((4, 1), (8, 1), (1, 2), (3, 1)):
        candidate = Candidate(b"", "k", work_divisor=(divisor, 1, 1),
                              work_multiplier=(multiplier, 1, 1))
        grid, block, _, _ = candidate.resolve(bundle.manifest)
        assert block == Dim3(BLOCK)
        assert grid == Dim3(helper(N // BLOCK, multiplier, divisor)), (divisor, multiplier)


def test_apply_ships_a_coarsened_header_kernel_with_its_launches_rescaled(tmp_path: Path) -> None:
    bundle = smooth_bundle(tmp_path / "b")
    original = seed_unit(bundle).source.text
    variant = coarsened(original)
    (factor,) = [t.name for t in parse_tunables(variant) if t.name.startswith("R3_CF")]
    assert grid_scaling(variant, {factor: 4}) == ((4, 1, 1), (1, 1, 1))
    tree = tmp_path / "tree"
    shutil.copytree(MULTI, tree)
    flags: dict[str, str] = {}
    best = _Best(5, SMOOTH, original, variant, (), None, None, {factor: 4}, "nvrtc", 1.3,
                 bundle.path)
    outcome = apply_campaign(best, tree, flags, {}, 0.5, {})
    assert outcome.file == "include/multi/stencil.cuh" and not outcome.not_applied, outcome
    assert outcome.applied == [
        "source: kernel definition replaced",
        f"tunable {factor}=4 (its #define in {SMOOTH})",
        "grid of its 2 launch(es) in main.cu scaled by 1x1x1 / 4x1x1 "
        f"({SCALED_GRID} at the top of main.cu)"]
    assert flags == {}
    main = (tree / "main.cu").read_text()
    assert main.count(f"{SCALED_GRID}(dim3(blocks), 1, 1, 1, 4, 1, 1)") == 2
    assert f"#define {factor} 4" in (tree / "include/multi/stencil.cuh").read_text()
    assert (tree / "ops.cu").read_text() == (MULTI / "ops.cu").read_text()
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not installed: the patched tree's build is checked where it is")
    built = subprocess.run(["nvcc", "-O3", "-std=c++17", "-arch=sm_90", "-Iinclude", "-c",
                            "main.cu", "-o", "main.o"], cwd=tree, capture_output=True,
                           text=True, timeout=300)
    assert built.returncode == 0, built.stderr


def test_a_grid_apply_cannot_rescale_keeps_the_rules_off_and_the_winner_out(
        tmp_path: Path) -> None:
    main = (MULTI / "main.cu").read_text()
    assert grid_fixed_reason(smooth_bundle(tmp_path / "plain").path) is None
    launched = launched_by_api()
    assert launched != main
    bundle = smooth_bundle(tmp_path / "api", launched)
    assert grid_fixed_reason(bundle.path) == \
        "the host code launches smooth through cudaLaunchKernel"
    assert grid_fixed_reason(tmp_path / "missing") is not None
    original = seed_unit(bundle).source.text
    variant = coarsened(original)
    (factor,) = [t.name for t in parse_tunables(variant) if t.name.startswith("R3_CF")]
    tree = tmp_path / "tree"
    shutil.copytree(MULTI, tree)
    (tree / "main.cu").write_text(launched)
    best = _Best(5, SMOOTH, original, variant, (), None, None, {factor: 2}, "nvrtc", 1.3,
                 bundle.path)
    outcome = apply_campaign(best, tree, {}, {}, 0.5, {})
    assert outcome.applied == [], outcome
    assert outcome.not_applied == [
        "nothing: its winner covers 2 elements a thread with a grid 2 times smaller, and its "
        "grid cannot be rescaled where the application launches it: the host code launches "
        "smooth through cudaLaunchKernel"]
    assert (tree / "main.cu").read_text() == launched
    # at 1 element a thread the coarsened source is the original's work: it ships as is
    same = _Best(5, SMOOTH, original, variant, (), None, None, {factor: 1}, "nvrtc", 1.1,
                 bundle.path)
    outcome = apply_campaign(same, tree, {}, {}, 0.5, {})
    assert not outcome.not_applied and (tree / "main.cu").read_text() == launched


def test_an_application_bundle_keeps_its_grid_only_where_apply_cannot_rescale_it(
        tmp_path: Path) -> None:
    """with_app_limits on bundles under a recording.json (an application's): the block floor
    as before, and grid_fixed only for the unit that launches smooth through
    cudaLaunchKernel."""
    import json

    from r3tui.engine.inner import InnerSettings, with_app_limits

    def recording(directory: Path, main_cu: str | None) -> Path:
        bundle = directory / "bundles" / "smooth-0"
        smooth_bundle(bundle, main_cu)
        config = {"grid": [N // BLOCK, 1, 1], "block": [BLOCK, 1, 1], "shared_mem_bytes": 0,
                  "count": 20, "device_time_s": 0.01, "bundle": "bundles/smooth-0",
                  "replayable": True, "reasons": []}
        kernel = {"entry_point": "_ZN5multi6smoothIfLi2EEEvPKT_PS1_NS_5FieldE", "name": SMOOTH,
                  "launches": 20, "device_time_s": 0.01,
                  "source": {"path": str(MULTI / "main.cu"), "kernel": SMOOTH},
                  "configs": [config]}
        (directory / "recording.json").write_text(json.dumps({
            "format_version": 1, "command": ["./multi"], "cwd": str(MULTI),
            "runtime": "static", "recorded_at": "2026-12-05T18:00:00+00:00", "wall_s": 1.0,
            "exit_code": 0, "reachable": False, "kernels": [kernel],
            "unsupported_allocations": [], "warnings": []}))
        return bundle

    launched = launched_by_api()
    free = with_app_limits(InnerSettings(), recording(tmp_path / "plain", None))
    assert (free.launch_bounds_floor, free.grid_fixed) == (BLOCK, False)
    fixed = with_app_limits(InnerSettings(), recording(tmp_path / "api", launched))
    assert (fixed.launch_bounds_floor, fixed.grid_fixed) == (BLOCK, True)


# cfd's shape as an application: the host pads the work to the block, the kernel never
# bounds its index, and two launches: one the tuned factor divides, one it does not
UNCHECKED_APP = r"""
#include <cstdio>
#define BLOCK 64
__global__ void padded(float* a) {
    const int i = (blockDim.x * blockIdx.x + threadIdx.x);
    a[i] = 2.0f * a[i];
}
int main(int argc, char** argv) {
    int blocks = argc > 1 ? atoi(argv[1]) : 8;
    float* a = nullptr;
    padded<<<blocks, BLOCK>>>(a);
    printf("launched %d\n", blocks);
    return 0;
}
"""


def test_a_kernel_that_never_bounds_its_index_ships_with_grids_that_must_divide(
        tmp_path: Path) -> None:
    from r3tui.engine.inner_loop import exact_axes
    from r3tui.engine.splice import EXACT_GRID

    variant = apply_rule("coarsen", UNCHECKED_APP, "padded", random.Random(0)).source
    assert variant is not None and exact_axes(variant, "padded") == ("x",)
    assert exact_axes(UNCHECKED_APP, "padded") == ("x",)  # read from the original, too
    scaled = scale_launch_grids(UNCHECKED_APP, "padded", (1, 1, 1), (4, 1, 1), ("x",))
    assert scaled is not None and scaled[1] == 1
    text = scaled[0]
    assert f"padded<<<{EXACT_GRID}(dim3(blocks), 1, 1, 1, 4, 1, 1, 1, 0, 0), BLOCK>>>" in text
    assert text.count("#define R3_SCALED_GRID\n") == 1 and text.count(
        "#define R3_EXACT_GRID\n") == 1
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not installed: the patched program's build is checked where it is")
    # the host side alone: a stub in place of the launch, so the program runs without a GPU
    host = text.replace("padded<<<", "probe(").replace(">>>(a);", ");").replace(
        "int main(", "void probe(dim3 g, int) { printf(\"grid %u\\n\", g.x); }\nint main(")
    (tmp_path / "app.cu").write_text(host)
    built = subprocess.run(["nvcc", "-O1", "-std=c++17", "-arch=sm_90", "app.cu", "-o", "app"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    ran = subprocess.run(["./app", "8"], cwd=tmp_path, capture_output=True, text=True)
    assert ran.returncode == 0 and "grid 2\n" in ran.stdout, ran
    stopped = subprocess.run(["./app", "10"], cwd=tmp_path, capture_output=True, text=True)
    assert stopped.returncode != 0 and "grid 3" not in stopped.stdout
    assert "r3 apply: a launch's grid (10, 1, 1) does not divide" in stopped.stderr
