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
import functools
import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corpus_recipes import (  # bench/ is on sys.path: this script's own directory
    BY_NAME,
    CORPUS,
    DEPS,
    HECBENCH,
    NVCC_BASE,
    RECIPES,
    REPO,
    RODINIA,
    STATE,
    Recipe,
    Suite,
    Unit,
    load_state,
    write_json,
)
from corpus_report import campaign_facts, cmd_report, recording_summary, report_lines


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
def r3_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "r3tui", *args]


@functools.cache
def code_version() -> str:
    """The commit the steps run (``+dirty`` with tracked files changed), so that the report
    can say whether every program's figures come from one version of the code."""
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=30, check=True)
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain",
                                "--untracked-files=no"],
                               capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


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
            "at": time.strftime("%Y-%m-%d %H:%M:%S"), "code": code_version(),
            "tail": output.splitlines()[-25:],
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
    estimate = record_estimate(state)
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
        if ctx.left() < tune_estimate(recipe, ctx.args, state, step):
            return "deadline"
        argv = r3_argv("tune-app", str(rec), "--budget", tune_budget(recipe, ctx.args.budget),
                       "--top",
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
    if ctx.left() < apply_estimate(state, ctx.args):
        return "deadline"
    into = STATE / recipe.name / "patched"
    for stale in (into, into.with_name("patched.original")):
        if stale.exists():
            shutil.rmtree(stale)
    argv = r3_argv("apply", *campaigns, "--into", str(into), "--source-tree",
                   str(CORPUS / recipe.name), "--build", f"make -j{ctx.args.jobs}",
                   "--run", shlex.join(app_argv(recipe)),
                   # r3 apply refuses fewer --max-runs than --runs
                   "--runs", str(min(ctx.args.runs, ctx.args.max_runs)),
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
    # the full campaign checks its winner on up to 5 other configurations (rmsnorm has 6);
    # the BO-only arm's plan feeds only corpus_r3_over_bo_only (tuned configurations), so it
    # checks none and spends nothing on them
    "tune": ("tune", _tune("tune", ("--check-configs", "5"))),
    "tune-bo": ("tune_bo", _tune("tune_bo", ("--inner-only", "--check-configs", "0"))),
    "apply": ("apply", stage_apply),
}
PIPELINE = ("record", "tune", "tune-bo", "apply")


def tune_budget(recipe: Recipe, budget: str) -> str:
    """``budget``, raised to the recipe's floor (the same for the full and the BO-only arm)."""
    if recipe.min_budget_s and budget_seconds(budget) < recipe.min_budget_s:
        return f"{recipe.min_budget_s:g}s"
    return budget


# Seconds each stage needs at most, from the H200 (2026-12-04): record 2-52 s whatever the
# program's wall time (7-10 s for programs of 1.4-3.2 s), tune 8-29 s at --budget 8s --top 1,
# apply 26 s (lud, 0.46 s a run) to 94 s (bfs, 2.1 s) at 10 pairs, at most six walls a pair
# (a timed run costs about twice a plain one, both trees); each with a margin.  The program's
# estimate is the sum of its stages', so a program started is one whose every stage fits.

def _wall(state: dict[str, Any]) -> float:
    return float(state["steps"].get("plain", {}).get("median_wall_s") or 3)


# A stage this program ran before (on this machine or an earlier one) is expected to take
# its last time with this margin (its times varied by about 10% between H200 runs),
# instead of the bound from the program's wall time (which, for r3 apply's --max-runs pairs,
# was up to 3x what it took on the H200).
CHECK_S = 10.0
_SEEN_MARGIN = 1.1
_SEEN_SLACK_S = 3.0


def _seen(state: dict[str, Any], step: str, bound: float) -> float:
    last = (state.get("last_walls") or {}).get(step)
    return bound if last is None else _SEEN_SLACK_S + _SEEN_MARGIN * float(last)


def record_estimate(state: dict[str, Any]) -> float:
    return _seen(state, "record", 45 + 3 * _wall(state))


def tune_estimate(recipe: Recipe, args: argparse.Namespace,
                  state: dict[str, Any] | None = None, step: str = "tune") -> float:
    bound = 20 + budget_seconds(tune_budget(recipe, args.budget)) * args.top * 1.5
    # the full campaign's checks of its winner on other configurations and kernels (a replay
    # worker each, about 5 s on the H200, for the programs that have several); times
    # measured before they existed lack them
    checks = CHECK_S if step == "tune" else 0.0
    return bound + checks if state is None else _seen(state, step, bound) + checks


def apply_estimate(state: dict[str, Any], args: argparse.Namespace) -> float:
    # r3 apply runs plain and timed (interposer) pairs of both trees until the intervals are
    # narrow or --max-runs pairs of each; a time seen at another --max-runs scales with it
    bound = 20 + 2 * (1 + 2) * args.max_runs * _wall(state)
    seen = (state.get("last_walls") or {}).get("apply_max_runs")
    scale = min(1.0, args.max_runs / seen) if seen else 1.0
    return min(bound, _seen(state, "apply", bound) * scale + _SEEN_SLACK_S)


def program_estimate(state: dict[str, Any], args: argparse.Namespace) -> float:
    """Seconds one program's whole pipeline needs at most (its stages' estimates)."""
    recipe = BY_NAME[state["program"]]
    return (record_estimate(state) + tune_estimate(recipe, args, state, "tune")
            + tune_estimate(recipe, args, state, "tune_bo") + apply_estimate(state, args))


def remember_walls(state: dict[str, Any], steps: Sequence[str]) -> None:
    """Keep the wall time of each step about to be redone, for the estimates above."""
    seen = state.setdefault("last_walls", {})
    for step in steps:
        wall = state["steps"].get(step, {}).get("wall_s")
        if wall is not None and state["steps"][step].get("status") == "ok":
            seen[step] = float(wall)
            runs = re.search(r"--max-runs (\d+)", str(state["steps"][step].get("command", "")))
            if step == "apply" and runs:
                seen["apply_max_runs"] = int(runs.group(1))


def stage_all(recipe: Recipe, state: dict[str, Any], ctx: StageContext) -> str | None:
    """Every stage of one program back to back, so that a program finished on one machine
    needs nothing of that machine again: its state file holds every figure of the report.
    A program left half-done by an earlier machine starts again from its recording, which
    (with the database its campaigns are in) did not survive that machine."""
    steps = state["steps"]
    rec = Path(steps.get("record", {}).get("recording", "/nonexistent"))
    if steps.get("record", {}).get("status") == "ok" and not (rec / "recording.json").is_file():
        remember_walls(state, ("record", "tune", "tune_bo", "apply"))
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
