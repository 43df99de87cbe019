"""An application bundle whose kernel is a template in a namespace, defined in a header the
unit includes: the campaign searches its device unit (compiled by real NVRTC), and `r3 apply`
writes a tuned definition into that header, at the kernel's span, leaving the unit alone.

The bundle is written here (no GPU records on this machine); its unit and headers are the small
C++ application of tests/unit/test_device_unit.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from r3tui.cuda.arena import ARENA_BASE
from r3tui.domain import Dim3
from r3tui.engine.apply import _Best, apply_campaign
from r3tui.engine.unit_source import preflight, seed_unit
from r3tui.record.bundle import Bundle, BundleWriter
from r3tui.record.manifest import ArenaInfo, KernelInfo, LaunchInfo, Manifest, SourceFile
from tests.unit.test_device_unit import HEADERS, KERNELS_CUH, MAIN_CU

ENTRY = "_ZN3app7stencilIfLi2EEEvPKT_PS1_NS_4GridEj"
KERNEL = "app::stencil<float, 2>"
LOOP = "  for (int d = -R; d <= R; ++d)\n"


def app_bundle(path: Path, main_cu: str = MAIN_CU, launch: LaunchInfo | None = None,
               recorder: str | None = None) -> Bundle:
    with BundleWriter(path) as w:
        unit = w.add_blob(main_cu.encode())
        headers = tuple(SourceFile(name, w.add_blob(text.encode()))
                        for name, text in sorted(HEADERS.items()))
        manifest = Manifest(
            kernel=KernelInfo(KERNEL, ENTRY, (SourceFile("main.cu", unit),), "nvcc",
                              "nvcc 13.0", ("-O3",), headers=headers, include_dirs=("src",)),
            launch=launch or LaunchInfo(Dim3(16, 16), Dim3(16, 16), 0, Dim3(256, 256), False),
            params=(), allocations=(), arena=ArenaInfo(ARENA_BASE, 2 << 20),
            recorded_at="2026-12-04T07:00:00+00:00", blobs=dict(w.blobs),
            provenance={"recorder": recorder} if recorder else {})
        return w.commit(manifest)


def app_tree(tree: Path) -> Path:
    """The application's source tree: its headers and main.cu."""
    for name, text in {**HEADERS, "src/main.cu": MAIN_CU}.items():
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_text(text)
    return tree


def test_a_campaign_on_a_header_kernel_searches_its_device_unit(tmp_path: Path) -> None:
    seed = seed_unit(app_bundle(tmp_path / "b"))
    assert seed.unit is not None and seed.unit.file == "src/kernels.cuh"
    assert seed.source.confined and seed.source.kernel_name == KERNEL
    assert "int main" not in seed.source.text and "__global__ void stencil" in seed.source.text
    assert "device unit of stencil (defined in src/kernels.cuh" in seed.describe()
    checked = preflight(seed.source, "nvrtc", "sm_90")  # real NVRTC, no fallback needed
    assert checked.toolchain == "nvrtc" and checked.note is None


def test_apply_writes_the_tuned_kernel_into_the_header_that_defines_it(tmp_path: Path) -> None:
    bundle = app_bundle(tmp_path / "b")
    original = seed_unit(bundle).source.text
    tuned = original.replace(LOOP, "  #pragma unroll\n" + LOOP)
    tree = app_tree(tmp_path / "tree")
    best = _Best(7, KERNEL, original, tuned, (), None, (256, 2), {}, "nvrtc", 1.2, bundle.path)
    outcome = apply_campaign(best, tree, {}, {}, 0.5, {})
    assert outcome.file == "src/kernels.cuh" and not outcome.not_applied, outcome
    assert outcome.applied == ["source: kernel definition replaced", "__launch_bounds__(256, 2)"]
    header = (tree / "src/kernels.cuh").read_text()
    assert header.count("#pragma unroll") == 1
    assert "__global__ void __launch_bounds__(256, 2) stencil(" in header
    # everything outside the kernel's definition is as it was, and the unit is untouched
    before = KERNELS_CUH.index("template <typename T, int R>\n__global__")
    assert header[:before] == KERNELS_CUH[:before]
    assert header.endswith(KERNELS_CUH[KERNELS_CUH.index("__global__ void unused_kernel"):])
    assert (tree / "src/main.cu").read_text() == MAIN_CU


def test_a_tuned_unroll_factor_is_written_into_the_kernels_own_define(tmp_path: Path) -> None:
    import random

    from r3tui.remix.rules import apply_rule
    from r3tui.search.source import parse_tunables

    bundle = app_bundle(tmp_path / "b")
    original = seed_unit(bundle).source.text
    made = apply_rule("unroll_pragma", original, KERNEL, random.Random(0))
    assert made.ok and made.source is not None, made.reason
    (tunable,) = parse_tunables(made.source)
    tree = app_tree(tmp_path / "tree")
    flags: dict[str, str] = {}
    best = _Best(7, KERNEL, original, made.source, (), None, None, {tunable.name: 8}, "nvrtc",
                 1.2, bundle.path)
    outcome = apply_campaign(best, tree, flags, {}, 0.5, {})
    assert not outcome.not_applied and flags == {}, outcome  # no flag for the build to read
    assert outcome.applied == ["source: kernel definition replaced",
                               f"tunable {tunable.name}=8 (its #define in {KERNEL})"]
    header = (tree / "src/kernels.cuh").read_text()
    assert f"#define {tunable.name} 8\n" in header and f"#define {tunable.name} 4" not in header


def test_export_patches_the_file_that_defines_the_kernel(tmp_path: Path) -> None:
    from r3tui.engine.report import application_patch

    bundle = app_bundle(tmp_path / "b")
    original = seed_unit(bundle).source.text
    tuned = original.replace(LOOP, "  #pragma unroll\n" + LOOP)
    patch = application_patch(bundle.path, original, tuned, KERNEL)
    assert patch is not None
    assert patch.startswith("--- a/src/kernels.cuh\n+++ b/src/kernels.cuh\n")
    added = [line for line in patch.splitlines() if line.startswith("+") and
             not line.startswith("+++")]
    assert added == ["+  #pragma unroll"]
    # a standalone kernel's campaign, or an unchanged variant: nothing to patch
    assert application_patch(bundle.path, original, original, KERNEL) is None
    assert application_patch(bundle.path, "other source", tuned, KERNEL) is None


def test_a_register_cap_ships_on_the_kernel_alone_where_cuda_allows_it(tmp_path: Path) -> None:
    from r3tui.analysis.device_unit import device_unit
    from r3tui.compile.base import CompileRequest, get_toolchain
    from r3tui.compile.nvrtc import default_include_dirs

    bundle = app_bundle(tmp_path / "b")
    original = seed_unit(bundle).source.text
    tree = app_tree(tmp_path / "tree")
    flags: dict[str, str] = {}
    best = _Best(7, KERNEL, original, original, ("-maxrregcount=24", "--use_fast_math"), None,
                 None, {}, "nvrtc", 1.2, bundle.path)
    outcome = apply_campaign(best, tree, flags, {}, 0.5, {})
    assert any(a.startswith("__maxnreg__(24) on app::stencil<float, 2>") for a in outcome.applied)
    assert "option:maxrregcount" not in flags and "option:use_fast_math" in flags
    header = (tree / "src/kernels.cuh").read_text()
    assert header.count("__maxnreg__(24)") == 1  # app::stencil only, not other::stencil
    # the patched header compiles (real NVRTC) and the cap holds
    unit = device_unit(MAIN_CU, "stencil", {**HEADERS, "src/kernels.cuh": header}, ["src"],
                       cuda_include_dirs=default_include_dirs(), scopes=["app"])
    compiled = get_toolchain("nvrtc").compile(CompileRequest(unit.text, KERNEL))
    assert compiled.ok, compiled.log
    assert compiled.resources.registers is not None and compiled.resources.registers <= 24

    # with __launch_bounds__ on the kernel CUDA refuses __maxnreg__: the unit-wide flag ships
    flags = {}
    (tree / "src/kernels.cuh").write_text(KERNELS_CUH)
    bounded = _Best(8, KERNEL, original, original, ("-maxrregcount=24",), None, (256, 2), {},
                    "nvrtc", 1.2, bundle.path)
    outcome = apply_campaign(bounded, tree, flags, {}, 0.5, {})
    assert flags.get("option:maxrregcount") == "--maxrregcount=24", flags
    assert "__maxnreg__" not in (tree / "src/kernels.cuh").read_text()


MULTI = Path(__file__).resolve().parents[1] / "gpu" / "apps" / "multi_app"


def test_a_tuned_block_ships_through_the_macro_of_the_launch_in_another_file(
        tmp_path: Path) -> None:
    """multi::smooth is defined in include/multi/stencil.cuh and launched from main.cu with
    the #ifndef-guarded SMOOTH_BLOCK: the tuned block is that macro's -D value."""
    import shutil

    with BundleWriter(tmp_path / "b") as w:
        unit = w.add_blob((MULTI / "main.cu").read_bytes())
        headers = tuple(SourceFile(str(p.relative_to(MULTI)), w.add_blob(p.read_bytes()))
                        for p in sorted((MULTI / "include").rglob("*")) if p.is_file())
        manifest = Manifest(
            kernel=KernelInfo("multi::smooth<float, 2>",
                              "_ZN5multi6smoothIfLi2EEEvPKT_PS1_NS_5FieldE",
                              (SourceFile("main.cu", unit),), "nvcc", "nvcc 13.0", ("-O3",),
                              headers=headers, include_dirs=(".", "include")),
            launch=LaunchInfo(Dim3(4096), Dim3(256), 0, Dim3(1048576), True),
            params=(), allocations=(), arena=ArenaInfo(ARENA_BASE, 2 << 20),
            recorded_at="2026-12-04T08:00:00+00:00", blobs=dict(w.blobs))
        bundle = w.commit(manifest)
    original = seed_unit(bundle).source.text
    tree = tmp_path / "tree"
    shutil.copytree(MULTI, tree)
    flags: dict[str, str] = {}
    best = _Best(3, "multi::smooth<float, 2>", original, original, (), (128, 1, 1), None, {},
                 "nvrtc", 1.1, bundle.path)
    outcome = apply_campaign(best, tree, flags, {}, 0.5, {})
    assert outcome.file == "include/multi/stencil.cuh" and not outcome.not_applied, outcome
    assert flags == {"-DSMOOTH_BLOCK=": "128"}


def test_a_winner_that_cannot_ship_whole_ships_nothing(tmp_path: Path) -> None:
    """Rodinia bfs on the H200: the winner ran with block 256 and __launch_bounds__(256, 8);
    the host code launches 512 threads from a plain #define, so only the bounds and the
    options were applied, every launch of the kernel failed and bfs ran on with a wrong
    answer.  A configuration is applied whole or not at all."""
    # a block shape the host code takes neither from a #ifndef macro nor at launches r3
    # apply can rewrite (the host passes dynamic shared memory, which may follow the block)
    sized = MAIN_CU.replace("<<<grid, block>>>", "<<<grid, block, block.x * 4>>>")
    bundle = app_bundle(tmp_path / "b", sized)
    original = seed_unit(bundle).source.text
    tuned = original.replace(LOOP, "  #pragma unroll\n" + LOOP)
    tree = app_tree(tmp_path / "tree")
    (tree / "src/main.cu").write_text(sized)
    flags: dict[str, str] = {}
    reshaped = _Best(7, KERNEL, original, tuned, ("--use_fast_math",), (128, 1, 1), (128, 8),
                     {}, "nvrtc", 1.2, bundle.path)
    outcome = apply_campaign(reshaped, tree, flags, {}, 0.5, {})
    assert outcome.applied == [] and not flags, outcome
    assert outcome.not_applied[0].startswith("nothing: its winner runs with block 128x1x1")
    assert "passes block.x * 4 bytes of dynamic shared memory" in outcome.not_applied[0]
    assert (tree / "src/kernels.cuh").read_text() == HEADERS["src/kernels.cuh"]
    assert (tree / "src/main.cu").read_text() == sized
    # bounds below the threads per block the application launched the kernel with
    bounded = _Best(8, KERNEL, original, tuned, ("--use_fast_math",), None, (128, 8), {},
                    "nvrtc", 1.2, bundle.path)
    outcome = apply_campaign(bounded, tree, flags, {}, 0.5, {}, max_threads=256)
    assert outcome.applied == [] and not flags, outcome
    assert "__launch_bounds__(128) is below the 256 threads" in outcome.not_applied[0]
    assert (tree / "src/kernels.cuh").read_text() == HEADERS["src/kernels.cuh"]
    # at or above them it ships
    outcome = apply_campaign(bounded, tree, flags, {}, 0.5, {}, max_threads=128)
    assert "__launch_bounds__(128, 8)" in outcome.applied and not outcome.not_applied


def test_an_applications_block_is_searched_only_where_r3_apply_could_ship_it(
        tmp_path: Path) -> None:
    """main.cu launches app::stencil with a dim3 built from TILE (no #ifndef macro): its
    block is searched, since r3 apply can rewrite that `<<<grid, block>>>`; where the host
    also passes dynamic shared memory sized from the block, or launches through
    cudaLaunchKernel, the block stays as recorded and the campaign says why; through an
    #ifndef-guarded macro of the launch it is searched."""
    from r3tui.engine.unit_source import searched_launch

    recorded = LaunchInfo(Dim3(16, 1), Dim3(256, 1), 0, Dim3(4096, 1), True)

    def bundle_of(main_cu: str, path: Path, recorder: str = "app interposer") -> Bundle:
        return app_bundle(path, main_cu, recorded, recorder)

    rewritable = bundle_of(MAIN_CU, tmp_path / "rewritable")
    launch, kept = searched_launch(rewritable, seed_unit(rewritable))
    assert launch.block_tunable and kept is None
    sized = MAIN_CU.replace("<<<grid, block>>>", "<<<grid, block, block.x * 4>>>")
    fixed = bundle_of(sized, tmp_path / "fixed")
    launch, kept = searched_launch(fixed, seed_unit(fixed))
    assert not launch.block_tunable and kept is not None
    assert kept.startswith("block 256x1x1 kept: the application's launches"), kept
    assert kept.endswith("bytes of dynamic shared memory, which may follow the block it "
                         "launches"), kept
    api = MAIN_CU.replace(
        "app::stencil<float, 2><<<grid, block>>>(d_in, d_out, g, h.size());",
        "{ size_t n = h.size(); void* args[] = {&d_in, &d_out, &g, &n};\n"
        "    cudaLaunchKernel((void*)app::stencil<float, 2>, grid, block, args, 0, 0); }")
    assert api != MAIN_CU
    through_api = bundle_of(api, tmp_path / "api")
    launch, kept = searched_launch(through_api, seed_unit(through_api))
    assert not launch.block_tunable and kept is not None and "cudaLaunchKernel" in kept, kept
    guarded = MAIN_CU.replace(
        "<<<grid, block>>>", "<<<grid, STENCIL_BLOCK>>>").replace(
        "int main", "#ifndef STENCIL_BLOCK\n#define STENCIL_BLOCK 256\n#endif\nint main", 1)
    assert guarded != MAIN_CU
    tunable = bundle_of(guarded, tmp_path / "tunable")
    launch, kept = searched_launch(tunable, seed_unit(tunable))
    assert launch.block_tunable and kept is None
    # a kernel recorded on its own has no host code to ship through: its block is searched
    standalone = bundle_of(MAIN_CU, tmp_path / "standalone", recorder="kernel recorder")
    launch, kept = searched_launch(standalone, seed_unit(standalone))
    assert launch.block_tunable and kept is None


def test_the_searchs_declarations_stay_out_of_the_applications_file() -> None:
    """expose_tunable declares its tunable inside the kernel's body; r3 apply ships the value
    as -DNAME=v and writes the definition without that declaration."""
    from r3tui.engine.splice import splice_definition

    tree = ("#ifndef TILE\n#define TILE 16\n#endif\n"
            "__global__ void k(float* a) {\n    a[threadIdx.x] *= TILE;\n}\n"
            "int main() { return 0; }\n")
    variant = tree.replace("__global__ void k(float* a) {\n",
                           "__global__ void k(float* __restrict__ a) {\n"
                           "    // r3: tune TILE 8 16 32\n")
    spliced = splice_definition(tree, variant, "k")
    assert spliced is not None and "// r3:" not in spliced
    assert "__global__ void k(float* __restrict__ a) {\n    a[threadIdx.x] *= TILE;" in spliced
    # a declaration the application wrote itself stays
    own = tree.replace("{\n    a[", "{\n    // r3: tune TILE 16 32\n    a[")
    kept = splice_definition(own, own.replace("float* a", "float* __restrict__ a"), "k")
    assert kept is not None and "// r3: tune TILE 16 32" in kept


def test_a_configuration_check_that_cannot_run_is_skipped_with_the_reason(
        tmp_path: Path) -> None:
    """engine.transfer.retime on this CPU-only machine: no worker can start, and the check
    says why instead of ending the tune-app run (the re-timing itself runs in
    tests/gpu/test_gpu_app_search.py and test_gpu_app_apply.py)."""
    from r3tui.domain import TrialConfig
    from r3tui.engine.transfer import retime

    path = tmp_path / "b"
    app_bundle(path)
    speedup, ci, failed, skipped = retime(path, MAIN_CU, TrialConfig(toolchain="nvrtc"),
                                          timeout_s=5)
    if speedup is not None:
        pytest.skip("a GPU is here: the check ran")
    assert (speedup, ci, failed) == (None, None, None)
    assert skipped and "\n" not in skipped
    # no bundle there: skipped with the reason, not raised
    assert retime(tmp_path / "missing", MAIN_CU, TrialConfig())[3]


def test_a_tuned_block_ships_at_the_launches_of_a_header_kernel_built_in_a_variable(
        tmp_path: Path) -> None:
    """app::stencil is defined in src/kernels.cuh and launched from src/main.cu with
    `dim3 block(TILE, TILE)`: the winner's source goes into the header, and its block into
    the launch in main.cu with the grid that covers the same threads (r3_shaped_grid)."""
    from r3tui.engine.splice import SHAPED_GRID

    bundle = app_bundle(tmp_path / "b")
    original = seed_unit(bundle).source.text
    tuned = original.replace(LOOP, "  #pragma unroll\n" + LOOP)
    tree = app_tree(tmp_path / "tree")
    flags: dict[str, str] = {}
    best = _Best(9, KERNEL, original, tuned, (), (64, 4, 1), (256, 4), {}, "nvrtc", 1.3,
                 bundle.path)
    outcome = apply_campaign(best, tree, flags, {}, 0.5, {}, max_threads=256)
    assert outcome.file == "src/kernels.cuh" and not outcome.not_applied, outcome
    assert "block 64x4x1 at its 1 launch(es) in src/main.cu, with the grid that covers the " \
           "same threads (r3_shaped_grid at the top of src/main.cu)" in outcome.applied
    assert "#pragma unroll" in (tree / "src/kernels.cuh").read_text()
    main = (tree / "src/main.cu").read_text()
    launch = (f"app::stencil<float, 2><<<{SHAPED_GRID}(dim3(grid), dim3(block), "
              "dim3(64, 4, 1), 1, 1, 1, 1, 1, 1, 0, 0, 0), dim3(64, 4, 1)>>>")
    assert main.count(launch) == 1 and "<<<grid, block>>>" not in main
    assert not flags  # nothing for the build's flags: the block is in the launch
    # the recorded block itself is not rewritten (nothing to ship for it)
    same = _Best(10, KERNEL, original, tuned, (), (16, 16, 1), None, {}, "nvrtc", 1.3,
                 bundle.path)
    tree2 = app_tree(tmp_path / "tree2")
    outcome = apply_campaign(same, tree2, {}, {}, 0.5, {})
    assert not any(a.startswith("block ") for a in outcome.applied), outcome
    assert (tree2 / "src/main.cu").read_text() == MAIN_CU
