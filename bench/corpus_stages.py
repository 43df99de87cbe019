"""The device stages of the corpus benchmark (bench/corpus.py `run`): each program's plain
runs and `r3 record`, `r3 tune-app` (the full campaign and the BO-only arm) and `r3 apply`,
each one command run as data (`run_step`) into the program's state, and the time estimates
that let a stage start only when it can finish before the call's deadline.

A stage returns None when it ran (its step, ok or not, is in the state) or why it did not
start ("deadline", or what an earlier stage left undone).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corpus_recipes import BY_NAME, CORPUS, REPO, STATE, Recipe, write_json
from corpus_report import campaign_facts, recording_summary


def r3_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "r3tui", *args]


@functools.cache
def code_version() -> str:
    """The commit the steps run (``+dirty`` with tracked files changed), so that the report
    can say whether every program's figures come from one version of the code.

    ``R3_CODE``, where set, names it instead: the device tool copies the working tree with a
    ``.git`` that may hold another commit (session 28 found one a session old there), so the
    command names the commit its tree is, from the machine that sent it."""
    if os.environ.get("R3_CODE"):
        return os.environ["R3_CODE"]
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
    if ctx.args.strata and steps["record"]["status"] == "ok" and _strata_due(rec, ctx.args.strata):
        # the first recording says later launches do other work: again, with strata
        steps["record_first"] = steps["record"]
        budget = ctx.args.strata_snapshots
        argv = [*argv[:-len(app_argv(recipe)) - 1], "--strata-from", str(rec), "--strata",
                str(ctx.args.strata), *(("--max-snapshot-bytes", budget) if budget else ()),
                "--", *app_argv(recipe)]
        steps["record"] = run_step(argv, root, ctx.left())
    steps["record"]["recording"] = str(rec)
    steps["record"]["summary"] = recording_summary(rec)
    return None


def _strata_due(rec: Path, windows: int) -> bool:
    """Whether the recording in ``rec`` has a configuration whose later launches do other
    work (r3 record --strata-from would record strata of it)."""
    from r3tui.errors import R3Error
    from r3tui.record.strata import read_strata_source

    try:
        return bool(read_strata_source(rec, windows))
    except R3Error:
        return False


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
