"""The corpus benchmark (issue #18): twenty unmodified third-party CUDA programs, built,
recorded, tuned (`r3 tune-app`) and patched (`r3 apply`) as a user would, resumably.

    python bench/corpus.py prepare [--only P,...] [--build-only] [--all-inputs] [-j N]
    python bench/corpus.py run --stage record|tune|apply|tune-bo|all [--only ...] [--deadline-s 540]
    python bench/corpus.py import DIR
    python bench/corpus.py report [--out FILE]
    python bench/corpus.py clean [--only ...]

`prepare` brings each program's files from the pinned commit of its suite (the bare mirrors
the `fetch` tool leaves under /work/.mirror, read with `git cat-file`, never changed), checks
every file against the commit's blob ids, writes a GNUmakefile (the build below; it reads
r3-flags.txt as `r3 apply` expects) and a compile_commands.json per program, writes the
inputs, builds in parallel and prints one line per program.  `--build-only` (on the GPU
machine, where there is no mirror) skips the extraction but re-checks the files against the
manifest.  Sources live in bench/work/corpus/<program>/ (git-ignored); the run state, the
recordings, the patched trees and the R3 database in bench/work/corpus-state/, outside the
tree the device tool carries, so carrying the sources again never wipes a finished step.

Each device stage keeps bench/work/corpus-state/<program>.json, skips finished steps and
starts no step it cannot finish before --deadline-s, so one call fits a 10-minute command.
The build of every program: `nvcc -O3 -arch=sm_90` plus only the fixes of
/work/shared/CORPUS.md, each named in its recipe; docs/corpus.md lists them and the sizes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import random
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
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
           "Makefile's run target exactly"),
    Recipe("bezier-surface", H, "src/bezier-surface-cuda", ("main.cu", "input/control.txt"),
           (Unit("main.cu"),), "main", ("-n", "2048"),
           "Makefile's run with -n 2048 (there: 8192, a CPU reference of ~40 s)",
           notes="the kernel's `if (i > RESOLUTIONI) return;` writes one row past the output"),
)
BY_NAME = {r.name: r for r in RECIPES}


# -- extraction ----------------------------------------------------------------------------
def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _git(suite: Suite, *args: str, data: bytes | None = None) -> bytes:
    run = subprocess.run(["git", "--git-dir", str(suite.mirror), *args], input=data,
                         capture_output=True, check=False)
    if run.returncode != 0:
        raise RuntimeError(f"git {args[0]} in {suite.mirror}: {run.stderr.decode().strip()}")
    return run.stdout


def tree_blobs(suite: Suite, folder: str) -> dict[str, str]:
    """path (relative to folder) -> blob id, at the pinned commit."""
    out = _git(suite, "ls-tree", "-r", "-z", suite.commit, "--", folder + "/")
    blobs: dict[str, str] = {}
    for entry in out.decode().split("\0"):
        if entry:
            meta, path = entry.split("\t", 1)
            blobs[path[len(folder) + 1:]] = meta.split()[2]
    return blobs


def extract(suite: Suite, folder: str, files: Sequence[str], dest: Path) -> dict[str, str]:
    """Write ``files`` of ``folder`` at the pinned commit under ``dest`` file by file (a
    missing large blob elsewhere in the tree does not matter); returns path -> blob id."""
    blobs = tree_blobs(suite, folder)
    missing = [f for f in files if f not in blobs]
    if missing:
        raise RuntimeError(f"{suite.repo}@{suite.commit[:10]}:{folder} has no {missing}")
    for rel in files:
        data = _git(suite, "cat-file", "blob", blobs[rel])
        if git_blob_id(data) != blobs[rel]:
            raise RuntimeError(f"{folder}/{rel}: content does not match blob {blobs[rel]}")
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return {rel: blobs[rel] for rel in files}


def manifest_path(name: str) -> Path:
    return CORPUS / "_manifest" / f"{name}.json"


def verify(name: str, root: Path) -> list[str]:
    """Files under ``root`` that differ from the manifest's blob ids (empty: all match)."""
    path = manifest_path(name)
    if not path.is_file():
        return [f"no manifest {path}"]
    manifest = json.loads(path.read_text())
    bad = []
    for rel, blob in manifest["files"].items():
        file = root / rel
        if not file.is_file() or git_blob_id(file.read_bytes()) != blob:
            bad.append(rel)
    return bad


def fetch_sources(recipe: Recipe) -> None:
    root = CORPUS / recipe.name
    if root.exists():
        shutil.rmtree(root)
    files = extract(recipe.suite, recipe.folder, recipe.files, root)
    for dep in recipe.deps:
        suite, folder, dep_files = DEPS[dep]
        dep_root = CORPUS / "_deps" / dep
        blobs = extract(suite, folder, dep_files, dep_root)
        write_json(manifest_path(dep), {"repo": suite.repo, "commit": suite.commit,
                                        "folder": folder, "files": blobs})
    write_json(manifest_path(recipe.name), {"repo": recipe.suite.repo,
                                            "commit": recipe.suite.commit,
                                            "folder": recipe.folder, "files": files})


# -- the build -----------------------------------------------------------------------------
def nvcc_path() -> str:
    found = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc"
                                     if Path("/usr/local/cuda/bin/nvcc").exists() else None)
    if found is None:
        raise SystemExit("no nvcc on PATH")
    return found


def _expand(flags: Sequence[str], recipe: Recipe) -> list[str]:
    deps, shims = str(CORPUS / "_deps"), str(CORPUS / "_shims" / recipe.name)
    return [f.replace("{deps}", deps).replace("{shims}", shims) for f in flags]


def unit_command(recipe: Recipe, unit: Unit, nvcc: str) -> tuple[list[str], str, str]:
    """(argv, source relative to the unit's cwd, object relative to the program folder)."""
    root = CORPUS / recipe.name
    src = os.path.relpath(root / unit.src, root / unit.cwd)
    obj = str(Path(src).with_suffix(".o"))
    head = [nvcc, *NVCC_BASE] if unit.tool == "nvcc" else ["gcc"]
    argv = [*head, *_expand(unit.flags, recipe), "-c", src, "-o", obj]
    return argv, src, os.path.normpath(os.path.join(unit.cwd, obj))


def write_build(recipe: Recipe, nvcc: str) -> None:
    """GNUmakefile (make prefers it to the upstream Makefile, and r3 apply looks for
    r3-flags.txt in it) and compile_commands.json, with this machine's absolute paths."""
    root = CORPUS / recipe.name
    for file, text in recipe.shims.items():
        shim = CORPUS / "_shims" / recipe.name / file
        shim.parent.mkdir(parents=True, exist_ok=True)
        shim.write_text(text)
    sources = " ".join(sorted(recipe.files))
    lines = [
        "# Written by bench/corpus.py for the R3 corpus; the upstream build is in Makefile.",
        "# r3-flags.txt (written by `r3 apply`) adds nvcc options to every nvcc command.",
        "R3_FLAGS := $(shell cat r3-flags.txt 2>/dev/null)",
        f"SOURCES := {sources}",
        f"all: {recipe.binary}", ".PHONY: all", "",
    ]
    entries, objects = [], []
    for unit in recipe.units:
        argv, src, obj = unit_command(recipe, unit, nvcc)
        objects.append(obj)
        extra = " $(R3_FLAGS)" if unit.tool == "nvcc" else ""
        shell = shlex.join(argv[:-4]) + extra + " " + shlex.join(argv[-4:])
        lines += [f"{obj}: $(SOURCES) GNUmakefile $(wildcard r3-flags.txt)",
                  f"\tcd {shlex.quote(unit.cwd)} && {shell}", ""]
        if unit.tool == "nvcc":
            entries.append({"directory": str(root / unit.cwd), "arguments": argv,
                            "file": str((root / unit.cwd / src).resolve()),
                            "output": str((root / obj).resolve())})
    link = [nvcc, *NVCC_BASE, *_expand(recipe.link_flags, recipe), *objects, "-o", recipe.binary]
    lines += [f"{recipe.binary}: {' '.join(objects)}",
              f"\t{shlex.join(link[:-2 - len(objects)])} $(R3_FLAGS) "
              f"{shlex.join(link[-2 - len(objects):])}", ""]
    (root / "GNUmakefile").write_text("\n".join(lines))
    write_json(root / "compile_commands.json", entries)


def write_inputs(recipe: Recipe, large: bool) -> list[str]:
    written = []
    for spec in recipe.inputs:
        path = CORPUS / recipe.name / spec.path
        if path.exists() or (spec.large and not large):
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        spec.write(tmp)
        tmp.replace(path)
        written.append(spec.path)
    return written


def build(recipe: Recipe, jobs: int) -> tuple[bool, str, float]:
    started = time.perf_counter()
    run = subprocess.run(["make", f"-j{jobs}"], cwd=CORPUS / recipe.name, capture_output=True,
                         text=True, check=False)
    wall = time.perf_counter() - started
    if run.returncode == 0:
        return True, "", wall
    text = (run.stderr + run.stdout).splitlines()
    first = next((ln for ln in text if "error" in ln.lower()), text[-1] if text else "?")
    return False, first.strip(), wall


def cmd_prepare(args: argparse.Namespace) -> int:
    recipes = selected(args.only)
    nvcc = nvcc_path()
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True,
                             check=False).stdout.strip().splitlines()
    print(f"# bench/corpus.py prepare on {platform.node()}: {version[-1] if version else nvcc}")
    print(f"# pinned: {RODINIA.repo}@{RODINIA.commit}, {HECBENCH.repo}@{HECBENCH.commit}")
    for recipe in recipes:
        root = CORPUS / recipe.name
        if not args.build_only:
            fetch_sources(recipe)
        bad = verify(recipe.name, root) + [
            f"{dep}/{f}" for dep in recipe.deps for f in verify(dep, CORPUS / "_deps" / dep)]
        if bad:
            raise SystemExit(f"{recipe.name}: files differ from the pinned commit: {bad[:3]}")
        write_build(recipe, nvcc)
        write_inputs(recipe, large=args.all_inputs or args.build_only)

    def one(recipe: Recipe) -> tuple[Recipe, tuple[bool, str, float]]:
        return recipe, build(recipe, max(1, args.jobs // 4))

    built = 0
    with ThreadPoolExecutor(max_workers=min(len(recipes), max(1, args.jobs // 2))) as pool:
        for recipe, (ok, first, wall) in pool.map(one, recipes):
            built += ok
            print(f"{recipe.name:<15} built: {'yes' if ok else 'no '} {wall:6.1f} s"
                  + ("" if ok else f"  {first}"), flush=True)
    print(f"corpus_built: {built}/{len(recipes)}")
    return 0 if built == len(recipes) else 1


def cmd_clean(args: argparse.Namespace) -> int:
    """Remove what the build, the runs and the large inputs left in the program folders: the
    tree the device tool carries is then the sources, the build files and small inputs."""
    for recipe in selected(args.only):
        root = CORPUS / recipe.name
        if not root.is_dir():
            continue
        keep = set(recipe.files) | {"GNUmakefile", "compile_commands.json"}
        keep |= {s.path for s in recipe.inputs if not s.large}
        for path in sorted(root.rglob("*"), reverse=True):
            rel = path.relative_to(root).as_posix()
            if path.is_file() and rel not in keep:
                path.unlink()
            elif path.is_dir() and not any(path.iterdir()):
                path.rmdir()
    return 0


# -- device stages -------------------------------------------------------------------------
def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)


def load_state(name: str) -> dict[str, Any]:
    path = STATE / f"{name}.json"
    return json.loads(path.read_text()) if path.is_file() else {"program": name, "steps": {}}


def r3_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "r3tui", *args]


def run_step(argv: Sequence[str], cwd: Path, timeout_s: float) -> dict[str, Any]:
    """One command, as data: rc (None on timeout), wall time, the last lines of its output."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("R3_")}
    path = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.update({"NO_COLOR": "1", "COLUMNS": "200", "PYTHONPATH": path})
    started = time.perf_counter()
    # its own process group: on timeout the application under r3 goes too, not only r3
    proc = subprocess.Popen(list(argv), cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    rc: int | None
    try:
        output, _ = proc.communicate(timeout=max(1.0, timeout_s))
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        rc = None
    wall = time.perf_counter() - started
    status = "timeout" if rc is None else ("ok" if rc == 0 else "failed")
    return {"status": status, "rc": rc, "wall_s": round(wall, 4), "command": shlex.join(argv),
            "at": time.strftime("%Y-%m-%d %H:%M:%S"), "tail": output.splitlines()[-25:],
            "stdout_tail": output.splitlines()[-200:]}


def parse_key(lines: Sequence[str], key: str | None) -> float | None:
    from r3tui.engine.app_run import parse_output

    return parse_output("\n".join(lines)).get(key) if key else None


def budget_seconds(budget: str) -> float:
    """A tune-app budget in seconds per kernel (trials counted at ~3 s each)."""
    b = budget.strip().lower()
    if b.endswith("m"):
        return float(b[:-1]) * 60
    if b.endswith("s"):
        return float(b[:-1])
    return float(b) * 3


@dataclass(frozen=True)
class StageContext:
    args: argparse.Namespace
    deadline: float  # perf_counter value after which no step starts or runs

    def left(self) -> float:
        return self.deadline - time.perf_counter()


def app_argv(recipe: Recipe) -> list[str]:
    return ["./" + recipe.binary, *recipe.args]


def stage_record(recipe: Recipe, state: dict[str, Any], ctx: StageContext) -> str | None:
    root, work = CORPUS / recipe.name, STATE / recipe.name
    if not (root / recipe.binary).is_file():
        return "not built (run prepare --build-only)"
    missing = [s.path for s in recipe.inputs if not (root / s.path).is_file()]
    if missing:
        return f"inputs missing: {missing}"
    steps = state["steps"]
    if steps.get("plain", {}).get("status") != "ok":
        runs = []
        for _ in range(ctx.args.plain_runs):
            if ctx.left() < 30:
                return "deadline"
            runs.append(run_step(app_argv(recipe), root, min(ctx.left(), 300)))
            if runs[-1]["status"] != "ok":
                break
        walls = [r["wall_s"] for r in runs if r["status"] == "ok"]
        keys = [parse_key(r["stdout_tail"], recipe.time_key) for r in runs]
        steps["plain"] = {
            "status": "ok" if len(walls) == len(runs) else runs[-1]["status"],
            "walls_s": walls, "median_wall_s": statistics.median(walls) if walls else None,
            "time_key": recipe.time_key, "key_values": [k for k in keys if k is not None],
            "runs": [{k: v for k, v in r.items() if k != "stdout_tail"} for r in runs],
            "stdout_tail": runs[-1]["stdout_tail"][-60:] if runs else [],
        }
    estimate = 60 + 10 * (steps["plain"].get("median_wall_s") or 3)
    if ctx.args.stage == "all":  # the whole program, now that its wall time is known
        estimate = program_estimate(state, ctx.args)
    if ctx.left() < estimate:
        return "deadline"
    rec = work / "rec"
    argv = r3_argv("record", "app", "--out", str(rec), "--compile-db",
                   str(root / "compile_commands.json"), "--force", "--db",
                   str(STATE / "r3.sqlite"), *ctx.args.record_args,
                   "--", *app_argv(recipe))
    steps["record"] = run_step(argv, root, ctx.left())
    steps["record"]["recording"] = str(rec)
    steps["record"]["summary"] = recording_summary(rec)
    return None


def recording_summary(rec: Path) -> dict[str, Any] | None:
    """What the report needs of recording.json, kept in the state so that the report holds
    after the recording itself is gone (the device machine's disk is not kept)."""
    path = rec / "recording.json"
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    kernels = data.get("kernels", [])
    return {"kernels": len(kernels),
            "replayable": sum(any(c.get("replayable") for c in k.get("configs", []))
                              for k in kernels),
            "warnings": data.get("warnings", []), "exit_code": data.get("exit_code", 0)}


def _tune(step: str, extra: Sequence[str]) -> Callable[
        [Recipe, dict[str, Any], StageContext], str | None]:
    """`r3 tune-app` on the recording into ``steps[step]``: "tune" (the full campaign, the
    one `apply` ships) or "tune_bo" (`--inner-only`: BO alone at the same budget, for
    corpus_r3_over_bo_only)."""

    def stage(recipe: Recipe, state: dict[str, Any], ctx: StageContext) -> str | None:
        steps = state["steps"]
        if steps.get("record", {}).get("status") != "ok":
            return "not recorded"
        rec = Path(steps["record"]["recording"])
        estimate = 60 + budget_seconds(ctx.args.budget) * ctx.args.top * 1.5
        if ctx.left() < estimate:
            return "deadline"
        argv = r3_argv("tune-app", str(rec), "--budget", ctx.args.budget, "--top",
                       str(ctx.args.top), "--db", str(STATE / "r3.sqlite"), *extra,
                       *ctx.args.tune_args)
        plan = rec / "tune-app.json"
        plan.unlink(missing_ok=True)  # what is read below is this run's plan, or none
        steps[step] = run_step(argv, STATE, ctx.left())
        if plan.is_file():
            steps[step]["plan"] = json.loads(plan.read_text())
            ids = [int(k["campaign_id"]) for k in steps[step]["plan"].get("kernels", [])
                   if k.get("campaign_id")]
            steps[step]["facts"] = {str(c): f for c, f in campaign_facts(ids).items()}
        return None

    return stage


def stage_apply(recipe: Recipe, state: dict[str, Any], ctx: StageContext) -> str | None:
    steps = state["steps"]
    plan = steps.get("tune", {}).get("plan")
    if steps.get("tune", {}).get("status") != "ok" or not plan:
        return "not tuned"
    campaigns = [str(k["campaign_id"]) for k in plan["kernels"] if k.get("campaign_id")]
    if not campaigns:
        steps["apply"] = {"status": "ok", "skipped": "tune-app made no campaign"}
        return None
    wall = steps.get("plain", {}).get("median_wall_s") or 3
    # r3 apply runs plain and timed (interposer) pairs of both trees until the intervals are
    # narrow or --max-runs pairs of each; the timed runs cost about three plain ones
    estimate = 90 + 2 * (1 + 3) * ctx.args.max_runs * wall
    if ctx.left() < estimate:
        return "deadline"
    into = STATE / recipe.name / "patched"
    for stale in (into, into.with_name("patched.original")):
        if stale.exists():
            shutil.rmtree(stale)
    argv = r3_argv("apply", *campaigns, "--into", str(into), "--source-tree",
                   str(CORPUS / recipe.name), "--build", f"make -j{ctx.args.jobs}",
                   "--run", shlex.join(app_argv(recipe)), "--runs", str(ctx.args.runs),
                   "--max-runs", str(ctx.args.max_runs),
                   "--time-key", recipe.time_key or "wall_s", "--db", str(STATE / "r3.sqlite"),
                   *ctx.args.apply_args)
    steps["apply"] = run_step(argv, STATE, ctx.left())
    summary = into / "r3-apply.json"
    if summary.is_file():
        steps["apply"]["summary"] = json.loads(summary.read_text())
    return None


STAGES: dict[str, tuple[str, Callable[[Recipe, dict[str, Any], StageContext], str | None]]] = {
    "record": ("record", stage_record),
    "tune": ("tune", _tune("tune", ())),
    "tune-bo": ("tune_bo", _tune("tune_bo", ("--inner-only",))),
    "apply": ("apply", stage_apply),
}
PIPELINE = ("record", "tune", "tune-bo", "apply")


def program_estimate(state: dict[str, Any], args: argparse.Namespace) -> float:
    """Seconds one program's whole pipeline needs at most (the stages' own estimates)."""
    # from the H200 (2026-12-04): record 4-24 s, tune 12-19 s at --budget 8s --top 1,
    # apply 42 s (backprop, 0.7 s a run) and 80 s (bfs, 1.2 s) at 10 pairs, a timed run
    # costing about twice a plain one; each with a margin
    wall = state["steps"].get("plain", {}).get("median_wall_s") or 3
    tune = 20 + budget_seconds(args.budget) * args.top * 1.5
    return (30 + 10 * wall) + 2 * tune + (30 + 2 * (1 + 2) * args.max_runs * wall)


def stage_all(recipe: Recipe, state: dict[str, Any], ctx: StageContext) -> str | None:
    """Every stage of one program back to back, so that a program finished on one machine
    needs nothing of that machine again: its state file holds every figure of the report.
    A program left half-done by an earlier machine starts again from its recording, which
    (with the database its campaigns are in) did not survive that machine."""
    steps = state["steps"]
    rec = Path(steps.get("record", {}).get("recording", "/nonexistent"))
    if steps.get("record", {}).get("status") == "ok" and not (rec / "recording.json").is_file():
        for step in ("record", "tune", "tune_bo", "apply"):
            steps.pop(step, None)
    if "plain" in steps and ctx.left() < program_estimate(state, ctx.args):
        return "deadline"
    for name in PIPELINE:
        step, stage = STAGES[name]
        if steps.get(step, {}).get("status") in ("ok", "failed", "timeout"):
            continue
        why = stage(recipe, state, ctx)
        write_json(STATE / f"{recipe.name}.json", state)
        if why == "deadline":
            return why
        if why is not None:  # an earlier stage failed: the program is as far as it goes
            steps["all"] = {"status": "ok", "stopped": f"{name}: {why}"}
            return None
        result = steps[step]
        print(f"{recipe.name:<15} {step}: {result['status']} in {result.get('wall_s', 0):.1f} s"
              + ("" if result["status"] == "ok" else f"  | {' / '.join(result['tail'][-2:])}"),
              flush=True)
    steps["all"] = {"status": "ok"}
    return None


STAGES["all"] = ("all", stage_all)


def cmd_run(args: argparse.Namespace) -> int:
    ctx = StageContext(args, time.perf_counter() + args.deadline_s)
    step, stage = STAGES[args.stage]
    STATE.mkdir(parents=True, exist_ok=True)
    for recipe in selected(args.only):
        state = load_state(recipe.name)
        done = state["steps"].get(step, {}).get("status")
        if done in ("ok", "failed") and not args.force:
            print(f"{recipe.name:<15} {step}: {done} earlier, skipped")
            continue
        if args.force:
            state["steps"].pop(step, None)
        why = stage(recipe, state, ctx)
        write_json(STATE / f"{recipe.name}.json", state)
        if why is not None:
            print(f"{recipe.name:<15} {step}: not started ({why})", flush=True)
            if why == "deadline" and step != "all":
                break
            continue  # a whole program that does not fit: a shorter one after it may
        if step == "all":
            continue  # each stage printed its own line
        result = state["steps"][step]
        print(f"{recipe.name:<15} {step}: {result['status']} in {result.get('wall_s', 0):.1f} s"
              + ("" if result["status"] == "ok" else f"  | {' / '.join(result['tail'][-2:])}"),
              flush=True)
    if args.export:
        export(args.export)
    return 0


def export(dest: Path) -> None:
    """The state files (which hold the plans and apply summaries), each patched tree's
    r3-apply.json and patch, and a report, for $OUT: one archive, since the device tool
    brings back only so many files."""
    import tarfile

    dest.mkdir(parents=True, exist_ok=True)
    (dest / "corpus-report.txt").write_text("\n".join(report_lines()) + "\n")
    with tarfile.open(dest / "corpus-state.tgz", "w:gz") as tar:
        for path in sorted(STATE.glob("*.json")):
            tar.add(path, arcname=path.name)
        for path in sorted(STATE.glob("*/patched/r3-apply.*")):
            tar.add(path, arcname=str(path.relative_to(STATE)))


def cmd_import(args: argparse.Namespace) -> int:
    """Take the state files an earlier machine exported: per program, its steps join the
    local ones, an exported step replacing the local step of the same name (it is newer:
    a finished step is never run again, so only an unfinished one is redone)."""
    import tarfile
    import tempfile

    STATE.mkdir(parents=True, exist_ok=True)
    source = args.source
    if source.is_file():  # the archive export wrote
        unpacked = Path(tempfile.mkdtemp(prefix="corpus-state-"))
        with tarfile.open(source) as tar:
            tar.extractall(unpacked, filter="data")
        for path in unpacked.glob("*/patched/r3-apply.*"):
            target = STATE / path.relative_to(unpacked)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
        source = unpacked
    taken = 0
    for path in sorted(source.glob("*.json")):
        if path.stem not in BY_NAME:
            continue
        incoming = json.loads(path.read_text())
        state = load_state(path.stem)
        state["steps"].update(incoming.get("steps", {}))
        write_json(STATE / path.name, state)
        taken += 1
        print(f"{path.stem:<15} " + " ".join(
            f"{k}={v.get('status')}" for k, v in state["steps"].items()))
    print(f"imported {taken} program state(s) from {args.source}")
    return 0 if taken else 2


# -- the report ----------------------------------------------------------------------------
def bootstrap_ratio(a: Sequence[float], b: Sequence[float], seed: int = 18,
                    n: int = 2000) -> tuple[float, float] | None:
    """95% percentile-bootstrap interval of median(a) / median(b)."""
    if len(a) < 2 or len(b) < 2:
        return None
    rng = random.Random(seed)
    ratios = sorted(
        statistics.median(rng.choices(a, k=len(a))) / statistics.median(rng.choices(b, k=len(b)))
        for _ in range(n))
    return ratios[int(0.025 * n)], ratios[int(0.975 * n) - 1]


def campaign_facts(campaign_ids: Sequence[int]) -> dict[int, dict[str, Any]]:
    """Per campaign from the R3 database (read only): which levels it searched, verified
    variants per origin, and the level of its re-timed winner."""
    db = STATE / "r3.sqlite"
    if not campaign_ids or not db.is_file():
        return {}
    from db import repository as repo
    from db.session import open_database
    from r3tui.domain import TrialConfig, VariantOrigin, VariantStatus

    good = {VariantStatus.VERIFIED, VariantStatus.IMPROVED}
    facts: dict[int, dict[str, Any]] = {}
    with open_database(db, readonly=True, create=False) as database, \
            database.session_scope() as s:
        for cid in campaign_ids:
            campaign = repo.get_campaign(s, cid)
            if campaign is None:
                continue
            recording = repo.get_recording(s, campaign.recording_id)
            recorded_block = recording.launch.block.as_tuple() if recording else None
            variants = {v.id: v for v in repo.campaign_variants(s, cid)}
            trials = repo.finished_trials(s, cid)
            source = any(variants[t.variant_id].origin is not VariantOrigin.SEED
                         for t in trials if t.variant_id in variants)
            options = {tuple(t.config.options) for t in trials}
            blocks = {(t.config.block.as_tuple() if t.config.block else recorded_block,
                       t.config.launch_bounds) for t in trials}
            yields: dict[str, list[int]] = {}
            for v in variants.values():
                if v.origin is VariantOrigin.SEED:
                    continue
                counts = yields.setdefault(v.origin.value, [0, 0])
                counts[0] += v.status in good
                counts[1] += 1
            level = None
            finals = [e.data for e in repo.events(s, cid, limit=1_000_000)
                      if e.data and e.data.get("speedup") and e.kind in ("final", "inner_done")
                      and (e.data.get("config") or e.data.get("winner"))]
            # the remix campaign's re-timed best, else the best inner search (as r3 apply)
            chosen = ([d for d in finals if "config" in d] or
                      sorted(finals, key=lambda d: float(d["speedup"]))[-1:])
            if chosen:
                data = chosen[-1]
                config = TrialConfig.from_json(data.get("config") or data["winner"])
                winner = variants.get(int(data.get("variant_id") or 0))
                parts = [p for p, on in (
                    ("source", winner is not None and winner.origin is not VariantOrigin.SEED),
                    ("compiler", bool(config.options) or bool(config.tunables)),
                    ("launch", (config.block is not None
                                and config.block.as_tuple() != recorded_block)
                     or config.launch_bounds is not None)) if on]
                level = "+".join(parts) or "original"
            facts[cid] = {"levels": {"source": source, "compiler": len(options) > 1,
                                     "launch": len(blocks) > 1},
                          "yield": yields, "best_level": level}
    return facts


def _fmt(x: float | str | None, ci: Sequence[float] | None = None) -> str:
    if x is None or isinstance(x, str):
        return x or "-"
    return f"{x:.3f}" + (f" [{ci[0]:.3f},{ci[1]:.3f}]" if ci else "")


def program_row(recipe: Recipe, state: dict[str, Any],
                facts: dict[int, dict[str, Any]]) -> dict[str, Any]:
    steps = state["steps"]
    plain, record = steps.get("plain", {}), steps.get("record", {})
    tune, apply = steps.get("tune", {}), steps.get("apply", {})
    row: dict[str, Any] = {"name": recipe.name, "recorded": record.get("status") == "ok"}
    recording = record.get("summary") or recording_summary(
        Path(record.get("recording", "/nonexistent")))
    if recording:
        row["replayable"] = f"{recording['replayable']}/{recording['kernels']}"
        warnings = " ".join(recording.get("warnings", [])).lower()
        plain_ok = plain.get("status") == "ok"
        plain_out = " ".join(plain.get("stdout_tail", [])).upper()
        rec_out = " ".join(record.get("stdout_tail", [])).upper()
        row["fault"] = plain_ok and (recording.get("exit_code", 0) != 0 or "fault" in warnings
                                     or "captur" in warnings
                                     or ("FAIL" in rec_out and "FAIL" not in plain_out))
    elif plain.get("status") == "ok" and record.get("status") == "failed":
        # no recording: a fault only where r3 says the application faulted under it
        row["fault"] = "fault" in " ".join(record.get("tail", [])).lower()
    row["wall"] = plain.get("median_wall_s")
    for name, step in (("plain run", plain), ("record", record), ("tune-app", tune),
                       ("apply", apply)):
        if step.get("status") in ("failed", "timeout"):
            last = next((ln for ln in reversed(step.get("tail", [])) if ln.strip()), "")
            row["note"] = f"{name} {step['status']}: {last.strip()[:90]}"
            break
    plan = tune.get("plan") or {}
    ids = [int(k["campaign_id"]) for k in plan.get("kernels", []) if k.get("campaign_id")]
    # the facts taken when the step ran (its database may be on a machine long gone)
    facts = {**facts, **{int(c): f for c, f in (tune.get("facts") or {}).items()}}
    mine = [facts[c] for c in ids if c in facts]
    row["levels"] = ("".join(
        letter if all(f["levels"][lv] for f in mine) else "-"
        for letter, lv in (("S", "source"), ("C", "compiler"), ("L", "launch")))
        if mine else None)
    yields: dict[str, list[int]] = {}
    for f in mine:
        for origin, (ok, total) in f["yield"].items():
            acc = yields.setdefault(origin, [0, 0])
            acc[0] += ok
            acc[1] += total
    row["yield"] = " ".join(f"{o} {a}/{b}" for o, (a, b) in sorted(yields.items())) or None
    best = max((k for k in plan.get("kernels", []) if k.get("speedup")),
               key=lambda k: k["speedup"], default=None)
    if best:
        level = facts.get(int(best["campaign_id"]), {}).get("best_level")
        row["best"] = f"{_fmt(best['speedup'], best.get('ci'))} {level or '?'}"
    bo = max((k["speedup"] for k in (steps.get("tune_bo", {}).get("plan") or {}).get(
        "kernels", []) if k.get("speedup")), default=None)
    row["r3_over_bo"] = best["speedup"] / bo if best and bo else None
    row["kernel_pred"] = plan.get("predicted_kernel_speedup", plan.get("predicted_app_speedup"))
    row["wall_pred"] = plan.get("predicted_wall_speedup", "n/a" if plan else None)
    summary = apply.get("summary") or {}
    row["shipped"] = any(c.get("applied") for c in summary.get("campaigns", []))
    # figures of a tree that ships nothing are of the reverted candidate: not shown as results
    measured = (summary.get("measured") or {}) if row["shipped"] else {}
    if summary and not row["shipped"] and "note" not in row:
        why = next((n for c in summary.get("campaigns", []) for n in c.get("not_applied", [])),
                   "no campaign applied anything")
        row["note"] = f"nothing shipped: {why[:110]}"
    row["kernel_meas"] = measured.get("kernel_speedup", "n/a" if measured else None)
    row["kernel_meas_ci"] = measured.get("kernel_speedup_ci")
    row["wall_meas"] = measured.get("wall_speedup")
    row["wall_meas_ci"] = measured.get("wall_speedup_ci") or bootstrap_ratio(
        measured.get("original_wall_s", []), measured.get("patched_wall_s", []))
    return row


def report_lines() -> list[str]:
    states = {r.name: load_state(r.name) for r in RECIPES}
    ids = [int(k["campaign_id"]) for st in states.values()
           for k in (st["steps"].get("tune", {}).get("plan") or {}).get("kernels", [])
           if k.get("campaign_id") and "facts" not in st["steps"]["tune"]]
    facts = campaign_facts(ids)
    rows = [program_row(r, states[r.name], facts) for r in RECIPES]
    out = [f"# bench/corpus.py report on {platform.node()}, {time.strftime('%Y-%m-%d %H:%M')}; "
           f"state {STATE}",
           "# levels: S source, C compiler options, L launch shape (all campaigns of the "
           "program); best: re-timed winner over the recorded configuration [95% CI] and the "
           "level it came from; wall CI: bootstrap of r3 apply's interleaved runs",
           f"{'program':<15} {'wall s':>6} {'rec':>3} {'replay':>6} {'lvl':>3}  {'yield':<22} "
           f"{'best kernel speedup':<30} {'kernel pred/meas':<24} {'wall pred/meas':<30} note"]
    if any(r["wall_pred"] == "n/a" for r in rows):
        out.append("# wall pred n/a: tune-app.json has no predicted_wall_speedup yet")
    if any(r["kernel_meas"] == "n/a" for r in rows):
        out.append("# kernel meas n/a: r3-apply.json's measured has no kernel_speedup yet")
    for r in rows:
        kernel = f"{_fmt(r['kernel_pred'])} / {_fmt(r['kernel_meas'], r['kernel_meas_ci'])}"
        wall = f"{_fmt(r['wall_pred'])} / {_fmt(r['wall_meas'], r['wall_meas_ci'])}"
        plain_wall = f"{r['wall']:6.2f}" if r.get("wall") else f"{'-':>6}"
        out.append(f"{r['name']:<15} {plain_wall} {'yes' if r['recorded'] else 'no':>3} "
                   f"{r.get('replayable') or '-':>6} {r['levels'] or '-':>3}  "
                   f"{r['yield'] or '-':<22} {r.get('best') or '-':<30} {kernel:<24} {wall:<30} "
                   f"{r.get('note', '')}")
    n = len(RECIPES)
    out.append(f"corpus_recorded: {sum(r['recorded'] for r in rows)}/{n}")
    out.append(f"corpus_searched_all_levels: {sum(r['levels'] == 'SCL' for r in rows)}/{n}")
    recorded = [r for r in rows if "fault" in r]
    out.append(f"corpus_recording_faults_introduced: {sum(r['fault'] for r in recorded)}"
               if recorded else "corpus_recording_faults_introduced: n/a (nothing recorded yet)")
    shipped = [r for r in rows if r["shipped"]]
    with_ci = [r for r in shipped if r["wall_meas_ci"]]
    out.append("corpus_regressions_shipped: "
               + (f"{sum(r['wall_meas_ci'][1] < 1 for r in with_ci)} (of {len(shipped)} "
                  "shipped; wall-time interval below 1)" if with_ci
                  else "n/a (no shipped change with measured runs yet)"))
    errors = [abs(r["kernel_meas"] / r["kernel_pred"] - 1) * 100 for r in shipped
              if isinstance(r["kernel_meas"], float) and r["kernel_pred"]]
    out.append(f"corpus_prediction_error_pct: {max(errors):.1f}" if errors else
               "corpus_prediction_error_pct: n/a (no shipped program has a measured kernel time)"
               if shipped else "corpus_prediction_error_pct: n/a (nothing shipped yet)")
    bests = [float(r["best"].split()[0]) for r in rows if r.get("best")]
    out.append(f"corpus_median_kernel_speedup: {statistics.median(bests):.3f}" if bests else
               "corpus_median_kernel_speedup: n/a (no tuned kernel yet)")
    ratios = [r["r3_over_bo"] for r in rows if r["r3_over_bo"]]
    out.append(f"corpus_r3_over_bo_only: {statistics.median(ratios):.3f} (median over "
               f"{len(ratios)} programs of best full-campaign / best BO-only kernel speedup)"
               if ratios else "corpus_r3_over_bo_only: n/a (run --stage tune-bo as well)")
    return out


def cmd_report(args: argparse.Namespace) -> int:
    lines = report_lines()
    print("\n".join(lines))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines) + "\n")
    return 0


# -- the command line ----------------------------------------------------------------------
def selected(only: str | None) -> list[Recipe]:
    if not only:
        return list(RECIPES)
    names = [n.strip() for n in only.split(",") if n.strip()]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        raise SystemExit(f"unknown program(s) {unknown}; known: {', '.join(BY_NAME)}")
    return [BY_NAME[n] for n in names]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="extract, check, write inputs and build files, build")
    p.add_argument("--only", help="comma-separated program names")
    p.add_argument("--build-only", action="store_true",
                   help="no extraction (no mirror here): check, build files, all inputs, build")
    p.add_argument("--all-inputs", action="store_true", help="also write the large inputs")
    p.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 4)
    p.set_defaults(handler=cmd_prepare)
    r = sub.add_parser("run", help="one device stage, resumable")
    r.add_argument("--stage", choices=tuple(STAGES), required=True)
    r.add_argument("--only", help="comma-separated program names")
    r.add_argument("--deadline-s", type=float, default=540)
    r.add_argument("--force", action="store_true", help="redo finished steps")
    r.add_argument("--plain-runs", type=int, default=3, help="plain runs before recording")
    r.add_argument("--budget", default="20s", help="tune-app --budget (per kernel)")
    r.add_argument("--top", type=int, default=2, help="tune-app --top")
    r.add_argument("--runs", type=int, default=5, help="r3 apply --runs")
    r.add_argument("--max-runs", type=int, default=10, help="r3 apply --max-runs")
    r.add_argument("-j", "--jobs", type=int, default=8, help="make -j for r3 apply's builds")
    for name in ("record", "tune", "apply"):
        r.add_argument(f"--{name}-args", type=shlex.split, default=[],
                       help=f"more options for r3 {name} (one quoted string)")
    r.add_argument("--export", type=Path, help="copy the state and a report here (e.g. $OUT)")
    r.set_defaults(handler=cmd_run)
    imp = sub.add_parser("import", help="join the state files an earlier machine exported")
    imp.add_argument("source", type=Path,
                     help="the archive (or a folder of state files) `run --export` wrote")
    imp.set_defaults(handler=cmd_import)
    rep = sub.add_parser("report", help="one row per program and the corpus_* figures")
    rep.add_argument("--out", type=Path)
    rep.set_defaults(handler=cmd_report)
    c = sub.add_parser("clean", help="remove build outputs, run outputs and large inputs")
    c.add_argument("--only")
    c.set_defaults(handler=cmd_clean)
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    return handler(args)


if __name__ == "__main__":
    raise SystemExit(main())
