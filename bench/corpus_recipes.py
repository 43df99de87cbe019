"""The corpus of bench/corpus.py (issue #18): the twenty programs, each a recipe (files, build,
run arguments, inputs), pinned by suite commit; where sources, state and mirrors live; and the
per-program state files the stages keep."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from corpus_inputs import (  # noqa: E402
    CFD_HELPER_CUDA,
    KMEANS_TEXTURE_SHIM,
    InputFile,
    bfs_graph,
    cfd_mesh,
    hotspot3d_grid,
    kmeans_rows,
)

CORPUS = REPO / "bench" / "work" / "corpus"
STATE = REPO / "bench" / "work" / "corpus-state"
MIRRORS = Path("/work/.mirror")


@dataclass(frozen=True)
class Suite:
    repo: str  # owner/name on GitHub
    commit: str  # pinned: every file is checked against this commit's blob ids

    @property
    def mirror(self) -> Path:
        return MIRRORS / self.repo.replace("/", "+") / "repo"


RODINIA = Suite("yuhc/gpu-rodinia", "9c10d3ea16ddba2ba057cc3951a9efc4c2cc18a4")
HECBENCH = Suite("zjin-lcf/HeCBench", "f27000a5188f8ac79bd43fc95a1b3f890c18823d")
# files outside a program's folder that its build reads, under bench/work/corpus/_deps/
DEPS: dict[str, tuple[Suite, str, tuple[str, ...]]] = {
    "rodinia-util": (RODINIA, "cuda/util", ("timing.h",)),
    "rodinia-hybridsort": (RODINIA, "cuda/hybridsort", ("helper_timer.h", "exception.h")),
}

NVCC_BASE = ("-O3", "-arch=sm_90")
TS = "-DcudaThreadSynchronize=cudaDeviceSynchronize"  # removed in CUDA 12; same semantics


@dataclass(frozen=True)
class Unit:
    """One translation unit: ``src`` relative to the program folder, compiled in ``cwd``."""

    src: str
    flags: tuple[str, ...] = ()  # after NVCC_BASE for nvcc; {deps} and {shims} expand
    tool: str = "nvcc"  # or "gcc" for the C host files the upstream build gives to gcc
    cwd: str = "."


@dataclass(frozen=True)
class Recipe:
    name: str
    suite: Suite
    folder: str  # in the suite
    files: tuple[str, ...]  # relative to folder: only what the build and the run read
    units: tuple[Unit, ...]
    binary: str  # relative to the program folder, where the app runs
    args: tuple[str, ...]
    size_note: str  # where the run arguments come from
    link_flags: tuple[str, ...] = ()
    deps: tuple[str, ...] = ()  # keys of DEPS
    shims: dict[str, str] = field(default_factory=dict)  # file name -> text, in _shims/<name>
    inputs: tuple[InputFile, ...] = ()
    time_key: str | None = None  # a `key: number` line the app prints (parse_output's format)
    notes: str = ""
    # tune budget per kernel at least this many seconds (both arms): a kernel whose device
    # unit only nvcc compiles (1.7 s a compile for su3) gets a handful of trials in 8 s
    min_budget_s: float = 0.0


R = RODINIA
H = HECBENCH
DEP_UTIL = "-I{deps}/rodinia-util"
RECIPES: tuple[Recipe, ...] = (
    Recipe("backprop", R, "cuda/backprop",
           ("backprop.c", "backprop.h", "backprop_cuda.cu", "backprop_cuda_kernel.cu",
            "facetrain.c", "imagenet.c"),
           (Unit("backprop_cuda.cu", (TS,)), Unit("backprop.c", ("-O2",), "gcc"),
            Unit("facetrain.c", ("-O2",), "gcc"), Unit("imagenet.c", ("-O2",), "gcc")),
           "backprop", ("524288",),
           "input layer of 512K units: the run file's 2M fails on the H200 (2M/16 = 131072 "
           "blocks along y, over the 65535 limit: 'bpnn kernel error: invalid argument')",
           link_flags=("-lm",)),
    Recipe("bfs", R, "cuda/bfs", ("bfs.cu", "kernel.cu", "kernel2.cu"),
           (Unit("bfs.cu", (DEP_UTIL, "-DTIMING")),), "bfs.out", ("inputs/graph1MW_6.txt",),
           "1M nodes, 6 edges each: Rodinia's graph1MW_6.txt, generated",
           deps=("rodinia-util",),
           inputs=(InputFile("inputs/graph1MW_6.txt", bfs_graph(1_000_000, 6), True),),
           time_key="Total", notes="Total: ms from before the file read to the end"),
    Recipe("gaussian", R, "cuda/gaussian", ("gaussian.cu",),
           (Unit("gaussian.cu", (TS, "-DclockRate=warpSize",
                                 "-DdeviceOverlap=asyncEngineCount")),),
           "gaussian", ("-s", "4096", "-q"),
           "README's -s mode at 4096 (run file: -s 16); 2x4096 launches"),
    Recipe("lud", R, "cuda/lud",
           ("cuda/lud.cu", "cuda/lud_kernel.cu", "common/common.c", "common/common.h"),
           tuple(Unit(src, ("-I../common", "-DGPU_TIMER", "-use_fast_math"), cwd="cuda")
                 for src in ("cuda/lud.cu", "cuda/lud_kernel.cu", "common/common.c")),
           "cuda/lud_cuda", ("-s", "4096"),
           "run file's -s mode at 4096 (run file: -s 256 -v; -v is an O(n^3) CPU check)",
           link_flags=("-use_fast_math",)),
    Recipe("nw", R, "cuda/nw", ("needle.cu", "needle.h", "needle_kernel.cu"),
           (Unit("needle.cu"),), "needle", ("8192", "10"),
           "run file's penalty 10 at 8192 (run file: 2048)"),
    Recipe("lavaMD", R, "cuda/lavaMD",
           ("main.c", "main.h", "kernel/kernel_gpu_cuda.cu", "kernel/kernel_gpu_cuda_wrapper.cu",
            "kernel/kernel_gpu_cuda_wrapper.h", "util/device/device.cu", "util/device/device.h",
            "util/num/num.c", "util/num/num.h", "util/timer/timer.c", "util/timer/timer.h"),
           (Unit("main.c", ("-O3",), "gcc"), Unit("kernel/kernel_gpu_cuda_wrapper.cu", (TS,)),
            Unit("util/num/num.c", ("-O3",), "gcc"), Unit("util/timer/timer.c", ("-O3",), "gcc"),
            Unit("util/device/device.cu", (TS,))),
           "lavaMD", ("-boxes1d", "30"),
           "README's -boxes1d at 30 (run file: 10), 2.7M particles", link_flags=("-lm",)),
    Recipe("hotspot3D", R, "cuda/hotspot3D", ("3D.cu", "opt1.cu"),
           (Unit("3D.cu"),), "3D",
           ("512", "8", "100", "inputs/power_512x8", "inputs/temp_512x8", "output.out"),
           "run file exactly (512x512x8, 100 iterations); power/temp generated",
           inputs=(InputFile("inputs/power_512x8", hotspot3d_grid(512 * 512 * 8, "power"), True),
                   InputFile("inputs/temp_512x8", hotspot3d_grid(512 * 512 * 8, "temp"), True)),
           notes="upstream builds with -g -G; -O3 here"),
    Recipe("streamcluster", R, "cuda/streamcluster",
           ("streamcluster_cuda_cpu.cpp", "streamcluster_cuda.cu", "streamcluster_header.cu"),
           (Unit("streamcluster_cuda_cpu.cpp", (TS,)), Unit("streamcluster_cuda.cu", (TS,)),
            Unit("streamcluster_header.cu", (TS,))),
           "sc_gpu", ("10", "20", "256", "65536", "65536", "1000", "none", "output.txt", "1"),
           "run file exactly (65536 random points of 256 dims)"),
    Recipe("kmeans", R, "cuda/kmeans",
           ("cluster.c", "getopt.c", "getopt.h", "kmeans.c", "kmeans.h", "kmeans_clustering.c",
            "kmeans_cuda.cu", "kmeans_cuda_kernel.cu", "rmse.c", "unistd.h"),
           (Unit("cluster.c", ("-O2", "-fopenmp"), "gcc"),
            Unit("getopt.c", ("-O2", "-fopenmp"), "gcc"),
            Unit("kmeans.c", ("-O2", "-fopenmp"), "gcc"),
            Unit("kmeans_clustering.c", ("-O2", "-fopenmp"), "gcc"),
            Unit("rmse.c", ("-O2", "-fopenmp"), "gcc"),
            Unit("kmeans_cuda.cu", (TS, "-include", "{shims}/texture_shim.h"))),
           "kmeans", ("-o", "-i", "inputs/204800.txt"),
           "run file's options on 204800 rows x 34 features (Rodinia's 204800.txt size)",
           link_flags=("-Xcompiler", "-fopenmp"),
           shims={"texture_shim.h": KMEANS_TEXTURE_SHIM},
           inputs=(InputFile("inputs/204800.txt", kmeans_rows(204800, 34), True),),
           notes="cudaMemcpyToSymbol(\"c_clusters\") fails silently; cudaSetDevice(1) fails "
                 "on one GPU (upstream behaviour, kept)"),
    Recipe("cfd", R, "cuda/cfd", ("euler3d.cu",),
           (Unit("euler3d.cu", (TS, "-I{shims}", "-I{deps}/rodinia-hybridsort")),),
           "euler3d", ("inputs/mesh.domn.097K",),
           "97,344 elements like fvcorr.domn.097K; 2000 iterations (fixed in the source)",
           deps=("rodinia-hybridsort",), shims={"helper_cuda.h": CFD_HELPER_CUDA},
           inputs=(InputFile("inputs/mesh.domn.097K", cfd_mesh(312, 312), True),)),
    Recipe("jacobi", H, "src/jacobi-cuda", ("main.cu",), (Unit("main.cu"),), "main", (),
           "no arguments (size fixed in the source)"),
    Recipe("heat", H, "src/heat-cuda", ("heat.cu",), (Unit("heat.cu"),), "main",
           ("4096", "1000"), "Makefile's run target exactly"),
    Recipe("convolution3D", H, "src/convolution3D-cuda", ("main.cu", "conv3d_s4.cu"),
           (Unit("main.cu"),), "main", ("32", "32", "64", "26", "26", "5", "100"),
           "Makefile's third run (32 96 256 26 26 5 100) with C=32, M=64: its CPU reference "
           "is 9.5 G MACs there, 0.8 G here"),
    Recipe("gelu", H, "src/gelu-cuda", ("main.cu", "reference.h"),
           (Unit("main.cu", ("-Xcompiler", "-fopenmp")),), "main", ("8", "4096", "2048", "100"),
           "Makefile's second run (the third's OpenMP CPU reference took 16.6 s on 2 cores)",
           link_flags=("-Xcompiler", "-fopenmp")),
    Recipe("adam", H, "src/adam-cuda", ("main.cu", "reference.h"), (Unit("main.cu"),), "main",
           ("10000", "200", "100"),
           "Makefile's run target exactly (its CPU reference: 4.4 s on 2 cores)"),
    Recipe("rmsnorm", H, "src/rmsnorm-cuda",
           ("main.cu", "common.h", "reduce.cuh", "reference.h", "utils.cuh"),
           (Unit("main.cu"),), "main", ("1024", "12288", "1000"), "Makefile's larger run"),
    Recipe("lulesh", H, "src/lulesh-cuda",
           ("lulesh.cu", "lulesh-viz.cu", "lulesh-util.cu", "lulesh-init.cu", "lulesh.h"),
           tuple(Unit(s) for s in ("lulesh.cu", "lulesh-viz.cu", "lulesh-util.cu",
                                   "lulesh-init.cu")),
           "main", ("-i", "500", "-s", "64", "-r", "11", "-b", "1", "-c", "1"),
           "Makefile's run with -s 64 -i 500 (there: -s 128 -i 100, ~1 GB of live device "
           "memory, which every recorded configuration would snapshot)"),
    Recipe("xsbench", H, "src/xsbench-cuda",
           ("Main.cu", "Simulation.cu", "io.cu", "GridInit.cu", "Materials.cu", "XSutils.cu",
            "XSbench_header.h"),
           tuple(Unit(s) for s in ("Main.cu", "Simulation.cu", "io.cu", "GridInit.cu",
                                   "Materials.cu", "XSutils.cu")),
           "main", ("-s", "small", "-m", "event", "-l", "1000000", "-r", "100"),
           "Makefile's run (-s large -m event -r 10) with -s small -l 1000000 -r 100: large "
           "builds a 5.7 GB unionized grid, and every run repeats all lookups on the host for "
           "verification (17M lookups: 20 s on 2 cores)",
           link_flags=("-lm",)),
    Recipe("su3", H, "src/su3-cuda",
           ("su3_nn_bench.cu", "lattice.hpp", "mat_nn_cuda.hpp", "su3.h", "su3.hpp"),
           (Unit("su3_nn_bench.cu", ("-DMILC_COMPLEX",)),), "main",
           ("-i", "1000", "-l", "32", "-t", "128", "-v", "3", "-w", "1"),
           "Makefile's run target exactly", min_budget_s=30),
    Recipe("bezier-surface", H, "src/bezier-surface-cuda", ("main.cu", "input/control.txt"),
           (Unit("main.cu"),), "main", ("-n", "2048"),
           "Makefile's run with -n 2048 (there: 8192, a CPU reference of ~40 s)",
           notes="the kernel's `if (i > RESOLUTIONI) return;` writes one row past the output"),
)
BY_NAME = {r.name: r for r in RECIPES}


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)


def load_state(name: str) -> dict[str, Any]:
    path = STATE / f"{name}.json"
    return json.loads(path.read_text()) if path.is_file() else {"program": name, "steps": {}}
