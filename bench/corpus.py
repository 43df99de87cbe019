"""The corpus benchmark (issue #18): twenty unmodified third-party CUDA programs, built,
recorded, tuned (`r3 tune-app`) and patched (`r3 apply`) as a user would, resumably.

    python bench/corpus.py prepare [--only P,...] [--build-only] [--all-inputs] [-j N]
    python bench/corpus.py run --stage record|tune|apply|tune-bo|all [--only ...] [--deadline-s 540]
    python bench/corpus.py import DIR
    python bench/corpus.py keep [--only ...] [--into bench/results/corpus-state]
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
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from corpus_recipes import (  # bench/ is on sys.path: this script's own directory
    BY_NAME,
    CORPUS,
    DEPS,
    HECBENCH,
    NVCC_BASE,
    RECIPES,
    RODINIA,
    STATE,
    Recipe,
    Suite,
    Unit,
    load_state,
    write_json,
)
from corpus_report import cmd_report, report_lines
from corpus_stages import (
    PIPELINE,
    STAGES,
    StageContext,
    remember_walls,
    run_step,
    stage_apply,
)

# where `keep` puts the state files, which git keeps across sessions
REPO_STATE_KEPT = CORPUS.parent.parent / "results" / "corpus-state"

# what bench/device_units.py and the tests take from this script
__all__ = ["CORPUS", "RECIPES", "STATE", "StageContext", "main", "run_step", "stage_apply"]


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


# -- device runs (the stages are in corpus_stages.py) --------------------------------------
def cmd_run(args: argparse.Namespace) -> int:
    from r3tui.search.winner import pairs_for

    if args.stage in ("apply", "all") and args.max_runs < pairs_for(0.95):
        # r3 apply refuses it; failing here keeps a device call from recording 20 failures
        print(f"corpus.py: error: --max-runs ({args.max_runs}) is below the "
              f"{pairs_for(0.95)} pairs r3 apply's 95% interval needs", file=sys.stderr)
        return 2
    ctx = StageContext(args, time.perf_counter() + args.deadline_s)
    step, stage = STAGES[args.stage]
    STATE.mkdir(parents=True, exist_ok=True)
    for recipe in selected(args.only):
        state = load_state(recipe.name)
        done = state["steps"].get(step, {}).get("status")
        if done in ("ok", "failed") and not args.force:
            print(f"{recipe.name:<15} {step}: {done} earlier, skipped")
            continue
        if args.force:  # the whole program for "all" (its plain runs stay: the same build)
            redo = (*(STAGES[n][0] for n in PIPELINE), "all") if step == "all" else (step,)
            remember_walls(state, redo)
            for name in redo:
                state["steps"].pop(name, None)
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


def join_steps(local: dict[str, Any], incoming: dict[str, Any]) -> dict[str, Any]:
    """``local`` with ``incoming``'s steps over it, less every local pipeline step after the
    first one ``incoming`` redid (another ``at``) that ``incoming`` does not have: an apply
    whose plan a later tune replaced is not that plan's measurement."""
    order = [STAGES[name][0] for name in PIPELINE] + ["all"]
    redone = next((i for i, step in enumerate(order) if step in incoming and step in local
                   and incoming[step].get("at") != local[step].get("at")), None)
    stale = set(order[redone + 1:]) - set(incoming) if redone is not None else set()
    return {**{k: v for k, v in local.items() if k not in stale}, **incoming}


def cmd_import(args: argparse.Namespace) -> int:
    """Take the state files an earlier machine exported: per program, its steps join the
    local ones, an exported step replacing the local step of the same name (it is newer:
    a finished step is never run again, so only an unfinished one is redone).  A program
    redone there from one of its stages on (``--force``) drops the local steps after it that
    the export lacks: they belong to the older recording or plan (:func:`join_steps`)."""
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
        state["steps"] = join_steps(state["steps"], incoming.get("steps", {}))
        write_json(STATE / path.name, state)
        taken += 1
        print(f"{path.stem:<15} " + " ".join(
            f"{k}={v.get('status')}" for k, v in state["steps"].items()))
    print(f"imported {taken} program state(s) from {args.source}")
    return 0 if taken else 2


def cmd_keep(args: argparse.Namespace) -> int:
    """Copy the programs' state files (no recordings, no patches) into the tree, where git
    keeps them: a checkout is new each session and bench/work is ignored, so this is how a
    corpus run that needs two sessions' device time goes on (`import KEPT` next session).
    Only programs whose whole pipeline ended are kept: a half-done one needs its recording,
    which stayed on the machine that made it, and is started again anyway."""
    args.into.mkdir(parents=True, exist_ok=True)
    kept, unfinished = 0, []
    for recipe in selected(args.only):
        path = STATE / f"{recipe.name}.json"
        if not path.is_file():
            continue
        if load_state(recipe.name)["steps"].get("all", {}).get("status") not in ("ok", "failed"):
            unfinished.append(recipe.name)
            continue
        shutil.copy2(path, args.into / path.name)
        kept += 1
    print(f"kept {kept} program state(s) in {args.into}"
          + (f"; not kept, unfinished: {', '.join(unfinished)}" if unfinished else ""))
    return 0 if kept else 2


# -- the command line ----------------------------------------------------------------------
def selected(only: str | None) -> list[Recipe]:
    if not only:
        return list(RECIPES)
    names = [n.strip() for n in only.split(",") if n.strip()]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        raise SystemExit(f"unknown program(s) {unknown}; known: {', '.join(BY_NAME)}")
    return [BY_NAME[n] for n in names]


def cmd_units(args: argparse.Namespace) -> int:
    from corpus_units import check

    recipes = selected(args.only)
    rows = check([CORPUS / r.name for r in recipes], {r.name: load_state(r.name) for r in recipes})
    return 0 if rows else 1


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
    r.add_argument("--strata", type=int, default=0, metavar="N",
                   help="record again with --strata-from the first recording and --strata N "
                   "where its later launches do other work (0: never)")
    r.add_argument("--strata-snapshots", metavar="SIZE",
                   help="r3 record --max-snapshot-bytes for the recording with strata (default: "
                   "the first recording's, from --record-args): each stratum takes a snapshot "
                   "and a check launch's")
    for name in ("record", "tune", "apply"):
        r.add_argument(f"--{name}-args", type=shlex.split, default=[],
                       help=f"more options for r3 {name} (one quoted string)")
    r.add_argument("--export", type=Path, help="copy the state and a report here (e.g. $OUT)")
    r.set_defaults(handler=cmd_run)
    imp = sub.add_parser("import", help="join the state files an earlier machine exported")
    imp.add_argument("source", type=Path,
                     help="the archive (or a folder of state files) `run --export` wrote")
    imp.set_defaults(handler=cmd_import)
    k = sub.add_parser("keep", help="copy the state files into the tree (bench/results)")
    k.add_argument("--only", help="comma-separated program names")
    k.add_argument("--into", type=Path, default=REPO_STATE_KEPT,
                   help="where to copy them (default: bench/results/corpus-state)")
    k.set_defaults(handler=cmd_keep)
    rep = sub.add_parser("report", help="one row per program and the corpus_* figures")
    rep.add_argument("--out", type=Path)
    rep.set_defaults(handler=cmd_report)
    u = sub.add_parser("units", help="on the CPU: whether NVRTC compiles each recorded "
                       "kernel's device unit, and both toolchains' compile times")
    u.add_argument("--only", help="comma-separated program names")
    u.set_defaults(handler=cmd_units)
    c = sub.add_parser("clean", help="remove build outputs, run outputs and large inputs")
    c.add_argument("--only")
    c.set_defaults(handler=cmd_clean)
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    return handler(args)


if __name__ == "__main__":
    raise SystemExit(main())
