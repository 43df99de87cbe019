"""Application-level benchmark (issue #7): record, tune and patch the example CG application.

Measures, on the machine it runs on (an H200 for the recorded figures):

- record overhead: the application's wall time under `r3 record --` (interposer, snapshots,
  bundle writing, all of it) over its plain wall time, medians of several runs each;
- recording size: bytes under the recording directory;
- replay fidelity: each recorded configuration replayed alone (the original source compiled
  by nvcc from the whole translation unit) vs the device time per launch the interposer
  measured inside the application, over the launches with the recorded arguments (what the
  replay reproduces) where the recording has them, else over every launch;
- `r3 tune-app` with a small budget, then `r3 apply` (rebuild, interleaved pairs until the 95%
  intervals are narrow or a bound): predicted vs measured kernel-time speedup (all kernels'
  device time under the interposer) and application speedup (its time key), with intervals.

Prints `record_overhead_x:`, `kernel_time_speedup_predicted:`, `kernel_time_speedup_measured:`,
`app_wall_speedup_predicted:` and `app_speedup_measured:` lines and a table; with --out FILE
it also writes exactly what it printed.  Nothing is written that this run did not measure.
About 4-6 minutes on an H200 with the defaults (more when r3 apply needs more pairs).

    python bench/app_tune.py [--n 128] [--runs 5] [--budget 16] [--top 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
CG = REPO / "examples" / "apps" / "cg"

from r3tui.engine.app_run import parse_output  # noqa: E402

LINES: list[str] = []


def say(line: str = "") -> None:
    print(line, flush=True)
    LINES.append(line)


def r3(*args: str, cwd: Path, timeout: float = 600,
       extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("R3_")}
    env.update(extra_env or {})
    # prepend: on the GPU node the dependencies come from PYTHONPATH (.device/setup.sh)
    path = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.update({"NO_COLOR": "1", "COLUMNS": "200", "PYTHONPATH": path})
    run = subprocess.run(
        [sys.executable, "-m", "r3tui", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if run.returncode != 0:
        sys.stderr.write(run.stdout + run.stderr)
        raise SystemExit(f"r3 {' '.join(args[:2])} failed with {run.returncode}")
    return run


def timed(command: list[str], cwd: Path) -> tuple[float, dict[str, float]]:
    started = time.perf_counter()
    run = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - started
    if run.returncode != 0:
        sys.stderr.write(run.stdout + run.stderr)
        raise SystemExit(f"{' '.join(command)} exited with {run.returncode}")
    return wall, parse_output(run.stdout)


def line_text(stdout: str, key: str) -> str | None:
    """The last ``key: ...`` line (r3 apply prints its predictions again after measuring)."""
    found = [line for line in stdout.splitlines() if line.startswith(key + ":")]
    return found[-1] if found else None


def fidelity(rec: Path) -> list[tuple[str, float, str, float | None, float | None, str]]:
    """(kernel, in-app device time per launch, which launches that mean is over ("same args"
    or "all"), replayed median with L2 flushed, replayed median with the restored data left in
    L2, status) per configuration."""
    from r3tui.compile.base import CompileRequest
    from r3tui.compile.nvcc import NvccToolchain
    from r3tui.engine.application import load_recording
    from r3tui.record.bundle import Bundle
    from r3tui.replay.candidate import Candidate
    from r3tui.replay.timing import TimingPolicy
    from r3tui.replay.worker import ReplayWorker

    rows: list[tuple[str, float, str, float | None, float | None, str]] = []
    nvcc = NvccToolchain()
    for kernel in load_recording(rec).kernels:
        for config in kernel.configs:
            per_launch, basis = config.in_app_time()
            if config.bundle is None or not config.replayable:
                rows.append((kernel.name, per_launch, basis, None, None, "not replayable"))
                continue
            bundle = Bundle.open(config.bundle)
            m = bundle.manifest
            times: list[float | None] = []
            status = "ok"
            for policy in (TimingPolicy(), TimingPolicy(l2_flush=False)):
                with ReplayWorker(bundle.path, timeout_s=60, policy=policy) as worker:
                    info = worker.start()
                    compiled = nvcc.compile(
                        CompileRequest(
                            source=bundle.source() or "",
                            kernel_name=m.kernel.name,
                            arch=info.arch,
                            options=m.kernel.options if m.kernel.toolchain == "nvcc" else (),
                            defines=m.kernel.defines,
                            source_name=m.kernel.sources[0].name if m.kernel.sources else "app.cu",
                            include_dirs=bundle.include_dirs(),
                        )
                    )
                    if not compiled.ok:
                        status = "compile error"
                        times.append(None)
                        continue
                    measured = worker.evaluate(Candidate.from_compiled(compiled))
                times.append(measured.time.median_s if measured.ok and measured.time else None)
                if not measured.ok:
                    status = measured.status.value
            rows.append((kernel.name, per_launch, basis, times[0], times[1], status))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=128, help="grid points per dimension")
    parser.add_argument("--runs", type=int, default=5, help="plain runs, and apply's runs")
    parser.add_argument("--record-runs", type=int, default=2)
    parser.add_argument("--budget", default="16", help="tune-app budget per kernel")
    parser.add_argument("--top", type=int, default=3)
    parser.add_argument("--reachable", action="store_true",
                        help="record with --reachable (snapshot only what the arguments reach)")
    parser.add_argument("--no-gate", action="store_true",
                        help="record without the interposer's launch gate (R3_REC_NO_GATE=1)")
    parser.add_argument("--work", type=Path, help="work directory (default: a temporary one)")
    parser.add_argument("--out", type=Path, help="also write the printed report here")
    args = parser.parse_args()

    work = args.work or Path(tempfile.mkdtemp(prefix="r3-app-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    app = work / "app"
    if app.exists():
        shutil.rmtree(app)
    shutil.copytree(CG, app, ignore=shutil.ignore_patterns("cg", "cg-shared", "*.o", "*.json"))
    subprocess.run(["make"], cwd=app, check=True, capture_output=True, timeout=300)
    db = work / "r3.sqlite"
    command = ["./cg", "--n", str(args.n)]
    started = time.perf_counter()
    say(f"# bench/app_tune.py on {platform.node()}, {time.strftime('%Y-%m-%d %H:%M:%S')}")
    gpu = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    say(f"# GPU: {gpu or '?'}; app: examples/apps/cg {' '.join(command)} (static runtime)"
        + ("; recorded with --reachable" if args.reachable else "")
        + ("; launch gate off (R3_REC_NO_GATE=1)" if args.no_gate else ""))

    # -- record overhead ---------------------------------------------------------------------
    plain = [timed(command, app) for _ in range(args.runs)]
    plain_wall = statistics.median(w for w, _ in plain)
    recorded_walls = []
    rec = work / "rec"
    for i in range(args.record_runs):
        out = rec if i == args.record_runs - 1 else work / f"rec-{i}"
        if out.exists():
            shutil.rmtree(out)
        t0 = time.perf_counter()
        r3(
            "record",
            "--out",
            str(out),
            "--source",
            str(app),
            "--db",
            str(db),
            *(["--reachable"] if args.reachable else []),
            "--",
            *command,
            cwd=app,
            extra_env={"R3_REC_NO_GATE": "1"} if args.no_gate else None,
        )
        recorded_walls.append(time.perf_counter() - t0)
        if out != rec:
            shutil.rmtree(out)
    record_wall = statistics.median(recorded_walls)
    size = sum(p.stat().st_size for p in rec.rglob("*") if p.is_file())
    data = json.loads((rec / "recording.json").read_text())
    say(
        f"plain wall: median {plain_wall:.3f} s over {args.runs} runs "
        f"({', '.join(f'{w:.3f}' for w, _ in plain)})"
    )
    say(
        f"recorded wall: median {record_wall:.3f} s over {args.record_runs} runs "
        f"({', '.join(f'{w:.3f}' for w in recorded_walls)}), whole `r3 record` process"
    )
    say(f"record_overhead_x: {record_wall / plain_wall:.2f}")
    say(f"recording_size_mb: {size / 1e6:.1f} ({len(list(rec.glob('bundles/*')))} bundles)")

    # -- replay fidelity ---------------------------------------------------------------------
    say("")
    say("replayed: median of the recorded launch replayed alone, L2 flushed after the prologue")
    say("is restored (cold) or left holding what the restore wrote (warm); ratio = replayed /")
    say("in-app; in-app is the mean over the launches of that configuration whose arguments")
    say("equal the recorded launch's (over: same args), or over every launch where the")
    say("recording does not have them (over: all)")
    say(f"{'kernel':<40} {'in-app µs':>10} {'over':>9} {'cold µs':>9} {'ratio':>6} "
        f"{'warm µs':>9} {'ratio':>6}  status")
    worst_cold = worst_best = 0.0
    for name, in_app, basis, cold, warm, status in fidelity(rec):
        cells = []
        for t in (cold, warm):
            cells.append(f"{t * 1e6:9.2f} {t / in_app:6.3f}" if t and in_app > 0
                         else f"{'-':>9} {'-':>6}")
        say(f"{name[:40]:<40} {in_app * 1e6:10.2f} {basis:>9} {cells[0]} {cells[1]}  {status}")
        errors = [abs(t / in_app - 1) for t in (cold, warm) if t and in_app > 0]
        if cold and in_app > 0:
            worst_cold = max(worst_cold, abs(cold / in_app - 1))
        if errors:
            worst_best = max(worst_best, min(errors))
    say(f"replay_fidelity_worst_cold: {worst_cold:.3f} (largest |cold/in-app - 1|)")
    say(f"replay_fidelity_worst: {worst_best:.3f} (largest over kernels of the nearer of cold and "
        "warm)")

    # -- tune-app and apply ------------------------------------------------------------------
    say("")
    tuned = r3(
        "tune-app",
        str(rec),
        "--top",
        str(args.top),
        "--budget",
        args.budget,
        "--db",
        str(db),
        cwd=work,
    )
    for line in tuned.stdout.splitlines():
        say(f"tune-app | {line}")
    plan = json.loads((rec / "tune-app.json").read_text())
    campaigns = [str(k["campaign_id"]) for k in plan["kernels"] if k["campaign_id"] is not None]
    if not campaigns:
        say("no campaign to apply")
        return 1
    patched = work / "patched"
    for stale in (patched, work / "patched.original"):
        if stale.exists():
            shutil.rmtree(stale)
    applied = r3(
        "apply",
        *campaigns,
        "--into",
        str(patched),
        "--source-tree",
        str(app),
        "--runs",
        str(args.runs),
        "--run",
        " ".join(command),
        "--time-key",
        "solve_time_s",  # what the cg example prints (r3 apply's default is the wall time)
        "--db",
        str(db),
        cwd=work,
    )
    for line in applied.stdout.splitlines():
        say(f"apply | {line}")
    say("")
    say(f"record_overhead_x: {record_wall / plain_wall:.3f}")
    for key in ("kernel_time_speedup_predicted", "kernel_time_speedup_measured",
                "app_wall_speedup_predicted", "app_speedup_measured"):
        say(line_text(applied.stdout, key) or f"{key}: -")
    say(
        f"kernel_time_share_tuned: {sum(k['share'] for k in plan['kernels']):.3f} "
        f"of {sum(k['device_time_s'] for k in data['kernels']) * 1e3:.2f} ms kernel time; "
        f"app wall {data['wall_s']:.3f} s under record"
    )
    say(f"# bench wall {time.perf_counter() - started:.0f} s; work dir {work}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(LINES) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
