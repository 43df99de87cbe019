"""What one candidate costs to evaluate: replay path vs rebuilding and rerunning the application.

For every example this records the naive kernel once, then evaluates the same candidates
(compiler options x block shapes) two ways, in one run on one GPU:

* replay path: NVRTC compile in-process (no cache) + the resident replay worker's restore,
  timed launches and on-device verification against the recorded epilogue;
* application path: write the candidate into a CUDA C++ program that contains the kernel,
  rebuild it with nvcc, run it end to end (its own CUDA-event timing) and check its outputs.

It also reports replay fidelity (kernel time in replay vs inside the application, same
configuration) and throughput (candidates per second with the compile pool feeding the
worker).  Prints a table and the ``key: value`` lines the issue names.

    python bench/eval_cost.py [--examples a,b] [--scale 1.0] [--app-candidates 4]
"""

from __future__ import annotations

import argparse
import itertools
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "examples"))  # the examples' catalog

from app_harness import ApplicationHarness  # noqa: E402

from r3tui.domain import Dim3, TrialConfig  # noqa: E402
from r3tui.engine.inner import KernelSource  # noqa: E402
from r3tui.runners.base import Runner  # noqa: E402

DEFAULT_EXAMPLES = ("stencil7", "spmv_csr", "reduce_sum", "sgemm", "nbody", "softmax")
# Problem size as a fraction of each example's full size: full size for the memory-bound ones
# (working sets of 126-268 MB, past the 60 MB L2); the naive compute-bound ones are cut to a
# few milliseconds a launch so that dozens of candidates fit in one device call.
DEFAULT_SCALES = {"sgemm": 0.25, "nbody": 0.05}
OPTION_SETS: tuple[tuple[str, ...], ...] = (
    (),
    ("--use_fast_math",),
    ("--maxrregcount=64",),
    ("--extra-device-vectorization",),
    ("--fmad=false",),
    ("--ptxas-options=-O2",),
)
# candidates_per_s_small is over the examples whose recorded kernel takes this long or less
SMALL_KERNEL_US = 100.0
# local/Dask rounds per example for dask_overhead_pct (the order alternates round by round)
DASK_ROUNDS = 6
REGISTER_CAPS = (32, 40, 48, 64, 80, 96, 128, 168, 255)
BLOCKS_1D = (Dim3(128), Dim3(256), Dim3(512), Dim3(64), Dim3(1024))
BLOCKS_2D = (Dim3(16, 16), Dim3(32, 8), Dim3(32, 4), Dim3(64, 4), Dim3(8, 8))
BLOCKS_3D = (Dim3(32, 4, 2), Dim3(32, 8, 1), Dim3(64, 4, 1), Dim3(16, 8, 4), Dim3(8, 8, 8))


@dataclass(frozen=True)
class Flow:
    """Candidates through a runner, warm: how many, how long, how busy the GPU was."""

    candidates: int
    ok: int
    wall_s: float
    replay_s: float  # the replay workers' time on these candidates (restore, time, verify)
    tasks: int = 0  # replay tasks the runner sent for them (a runner that batches; else 0)

    @property
    def per_s(self) -> float:
        return self.candidates / self.wall_s

    @property
    def gpu_busy(self) -> float:
        return self.replay_s / self.wall_s


@dataclass
class ExampleResult:
    name: str
    scale: float
    replay_s: list[float]
    app_s: list[float]
    app_build_s: list[float]
    replay_us: float
    app_us: float
    flow: Flow
    # (local, dask) per round of the same candidates, both runners warm (paired_flows)
    dask_pairs: list[tuple[Flow, Flow]]
    wrong_in_app: int

    @property
    def ratio(self) -> float:
        return statistics.median(self.app_s) / statistics.median(self.replay_s)

    @property
    def fidelity_pct(self) -> float:
        return 100.0 * abs(self.replay_us - self.app_us) / self.app_us

    @property
    def per_s(self) -> float:
        return self.flow.per_s


def blocks_for(work: Dim3 | None, recorded: Dim3) -> tuple[Dim3, ...]:
    if work is None or (work.y == 1 and work.z == 1):
        shapes = BLOCKS_1D if recorded.y == 1 and recorded.z == 1 else BLOCKS_2D
    elif work.z == 1:
        shapes = BLOCKS_2D
    else:
        shapes = BLOCKS_3D
    return (recorded, *[b for b in shapes if b != recorded])


def candidates(
    work: Dim3 | None, recorded: Dim3, tunable: bool
) -> list[tuple[tuple[str, ...], Dim3]]:
    blocks = blocks_for(work, recorded) if tunable else (recorded,)
    # the first few candidates change both the options and the block shape
    diagonal = [(OPTION_SETS[i], blocks[i % len(blocks)]) for i in range(len(OPTION_SETS))]
    rest = [p for p in itertools.product(OPTION_SETS, blocks) if p not in diagonal]
    return diagonal + rest


def throughput_configs(work: Dim3 | None, recorded: Dim3, tunable: bool,
                       n: int) -> list[TrialConfig]:
    """``n`` distinct configurations: register caps x fast math x block shapes."""
    blocks = blocks_for(work, recorded) if tunable else (recorded,)
    options = [(*fast, *regs) for fast in ((), ("--use_fast_math",))
               for regs in ((), *((f"--maxrregcount={r}",) for r in REGISTER_CAPS))]
    every = [TrialConfig(options=o, block=None if b == recorded else b)
             for o, b in itertools.product(options, blocks)]
    return every[:n]


def throughput(kind: str, bundle_dir: Path, source: KernelSource,
               configs: list[TrialConfig]) -> Flow:
    """``configs`` through the ``kind`` runner as a campaign submits them (one batch), after a
    warm-up that starts every compile worker."""
    from r3tui.engine.gpu import RunnerSettings, open_runner

    with open_runner(bundle_dir, 120.0, RunnerSettings(runner=kind)) as runner:
        warm_up(runner, source)
        return timed_flow(runner, source, configs)


def warm_up(runner: Runner, source: KernelSource) -> None:
    from r3tui.engine.inner import ReplayEvaluator

    cores = os.cpu_count() or 1
    ReplayEvaluator(source, runner).evaluate(
        [TrialConfig(options=(f"--maxrregcount={255 - i}",)) for i in range(cores)])


def timed_flow(runner: Runner, source: KernelSource, configs: list[TrialConfig]) -> Flow:
    from r3tui.engine.inner import ReplayEvaluator

    tasks = runner.stats().replay_tasks
    started = time.perf_counter()
    measured = ReplayEvaluator(source, runner).evaluate(configs)
    wall = time.perf_counter() - started
    return Flow(len(configs), sum(m.ok for m in measured), wall,
                sum(m.replay_wall_s or 0.0 for m in measured),
                runner.stats().replay_tasks - tasks)


def paired_flows(bundle_dir: Path, source: KernelSource, configs: list[TrialConfig],
                 rounds: int) -> list[tuple[Flow, Flow]]:
    """The same candidates through the local runner and the Dask runner (a local cluster, one
    GPU worker), both open and warm, ``rounds`` times, the order alternating: (local, dask)
    per round.  Each round's source carries an unused ``__device__`` variable of its own, one
    for each runner, so its binaries are new to both runners' workers (a worker serves a binary
    it has replayed from its cache) and each runner compiles every one: both runners share the
    compile cache on disk, and one source for both gave the second of a round the first's
    compiles as cache hits (the rounds alternated between compiling and not)."""
    from dataclasses import replace

    from r3tui.engine.gpu import RunnerSettings, open_runner

    with (open_runner(bundle_dir, 120.0, RunnerSettings(runner="local")) as local,
          open_runner(bundle_dir, 120.0, RunnerSettings(runner="dask")) as dask):
        warm_up(local, source)
        warm_up(dask, source)
        pairs = []
        for r in range(rounds):
            order = (local, dask) if r % 2 == 0 else (dask, local)
            flows = {}
            for runner in order:
                unused = f"\n__device__ int r3_eval_cost_round_{r}_{runner.name};\n"
                fresh = replace(source, text=source.text + unused)
                flows[id(runner)] = timed_flow(runner, fresh, configs)
            pairs.append((flows[id(local)], flows[id(dask)]))
        return pairs


def record_example(name: str, scale: float, workdir: Path) -> Path:
    """The example recorded at ``scale`` (seed 1) into ``workdir/NAME.r3b``."""
    from catalog import load_example  # type: ignore[import-not-found]

    from r3tui.record.kernel_recorder import RecordKernelRequest, record_kernel

    example = load_example(name)
    bundle_dir = workdir / f"{name}.r3b"
    record_kernel(RecordKernelRequest(
        Path(example.path) / "kernel.cu", example.kernel_name, Path(example.path) / "inputs.py",
        bundle_dir, seed=1, scale=scale))
    return bundle_dir


def header(argv: Sequence[str] | None) -> list[str]:
    """The report's first lines: when, on what, and the command."""
    return [
        f"date: {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        f"gpu: {gpu_name()}",
        f"host: {platform.node()} ({os.cpu_count()} cores)",
        "command: python bench/eval_cost.py " + " ".join(sys.argv[1:] if argv is None else argv),
    ]


def run_example(
    name: str, scale: float, app_candidates: int, pool_candidates: int, workdir: Path,
    with_dask: bool = False,
) -> ExampleResult:
    from catalog import load_example

    from r3tui.compile.base import CompileRequest, get_toolchain
    from r3tui.compile.options import canonicalize, render
    from r3tui.record.bundle import Bundle
    from r3tui.record.kernel_recorder import load_inputs
    from r3tui.record.spec import PointerTable
    from r3tui.replay.candidate import Candidate
    from r3tui.replay.verify import compare_host
    from r3tui.replay.worker import ReplayWorker

    example = load_example(name)
    source_path = Path(example.path) / "kernel.cu"
    inputs_path = Path(example.path) / "inputs.py"
    inputs = load_inputs(inputs_path, seed=1, scale=scale)
    bundle_dir = record_example(name, scale, workdir)
    bundle = Bundle.open(bundle_dir)
    manifest = bundle.manifest
    source = source_path.read_text()
    defines = tuple(sorted(inputs.defines.items()))
    nvrtc = get_toolchain("nvrtc")
    harness = ApplicationHarness(workdir / name, inputs, example.kernel_name)
    tables = {a.name for a in inputs.args if isinstance(a, PointerTable)}
    configs = candidates(inputs.work, inputs.block, inputs.block_tunable)[:app_candidates]
    pool_configs = throughput_configs(inputs.work, inputs.block, inputs.block_tunable,
                                      pool_candidates)

    def request(options: tuple[str, ...]) -> CompileRequest:
        return CompileRequest(source, example.kernel_name, options=options, defines=defines)

    replay_s: list[float] = []
    app_s: list[float] = []
    app_build_s: list[float] = []
    wrong_in_app = 0
    with ReplayWorker(bundle_dir, timeout_s=120) as worker:
        worker.start()
        # fidelity: the recorded configuration, in replay and inside the application
        original = nvrtc.compile(request(()))
        measured = worker.evaluate(Candidate.from_compiled(original))
        assert measured.ok and measured.time, measured.error_text
        replay_us = measured.time.median_s * 1e6
        app_us = harness.build_and_run(source, reps=50, tag="original").median_us

        for i, (options, block) in enumerate(configs[:app_candidates]):
            started = time.perf_counter()
            compiled = nvrtc.compile(request(options))  # the toolchain object has no cache
            m = worker.evaluate(Candidate.from_compiled(compiled, block=block))
            replay_s.append(time.perf_counter() - started)
            if not m.ok:
                print(f"  {name} replay candidate {options} {block}: {m.status} {m.error_text}")
            started = time.perf_counter()
            nvcc_options = tuple(render("nvcc", canonicalize("nvrtc", list(options))))
            run = harness.build_and_run(
                source, options=nvcc_options, block=block, reps=20, tag=f"cand{i}"
            )
            for alloc in manifest.allocations:
                if alloc.name in tables:
                    continue  # holds this process's device addresses, not the recording's
                got = run.outputs[alloc.name]
                want = bundle.blob(alloc.epilogue)[: len(got)]
                if not compare_host(got, want, alloc.tolerance, alloc.dtype).passed:
                    wrong_in_app += 1
            app_s.append(time.perf_counter() - started)
            app_build_s.append(run.build_s)

    # throughput: the engine's own path (ReplayEvaluator on a runner), warm, every core
    # compiling while the GPU replays; the replay worker above is closed first so that the
    # runners' own take the GPU
    flow = throughput("local", bundle_dir, KernelSource(source, example.kernel_name,
                                                        defines=defines), pool_configs)
    dask_pairs = (paired_flows(bundle_dir, KernelSource(source, example.kernel_name,
                                                        defines=defines), pool_configs,
                               DASK_ROUNDS) if with_dask else [])
    return ExampleResult(
        name,
        scale,
        replay_s,
        app_s,
        app_build_s,
        replay_us,
        app_us,
        flow,
        dask_pairs,
        wrong_in_app,
    )


def dask_lines(results: Sequence[ExampleResult]) -> list[str]:
    """``dask_overhead_pct`` over every paired round (median, its 95% interval, per example),
    and ``dask_flows``: each runner's GPU busy fraction and the Dask runner's replay tasks a
    flow, where a longer flow under Dask shows whether its GPU waited on tasks.  Empty
    without Dask rounds."""
    ratios = [d.wall_s / loc.wall_s for r in results for loc, d in r.dask_pairs]
    if not ratios:
        return []
    from r3tui.search.winner import order_statistic_median_ci

    low, high = order_statistic_median_ci(ratios, 0.95)
    paired = [r for r in results if r.dask_pairs]
    per_example = ", ".join(
        f"{r.name} "
        f"{100 * (statistics.median(d.wall_s / c.wall_s for c, d in r.dask_pairs) - 1):+.1f}"
        for r in paired)
    flows = "; ".join(
        f"{r.name} GPU busy {statistics.median(c.gpu_busy for c, _ in r.dask_pairs):.2f} "
        f"local / {statistics.median(d.gpu_busy for _, d in r.dask_pairs):.2f} dask, "
        f"{statistics.median(d.tasks for _, d in r.dask_pairs):.0f} replay tasks a flow of "
        f"{r.dask_pairs[0][1].candidates}" for r in paired)
    return [f"dask_overhead_pct: {100 * (statistics.median(ratios) - 1):.1f} "
            f"[{100 * (low - 1):.1f}, {100 * (high - 1):.1f}] (median of {len(ratios)} "
            f"paired rounds, 95% interval of the median; per example: {per_example}; "
            "one GPU worker, the same candidates, both runners warm)",
            f"dask_flows: {flows} (medians over the rounds)"]


@dataclass(frozen=True)
class CampaignRun:
    """One ``r3 tune --inner-only`` run as its database tells it."""

    per_s: float  # evaluations/s as the campaign's figures define it (asks included)
    trials: int
    seconds: float  # the campaign's running time
    command_s: float  # the whole command's wall time (Python, the database, the runner)
    inner: dict[str, Any] = field(default_factory=dict)  # the inner_done event's data

    @property
    def phases(self) -> dict[str, float]:
        """The inner loop's seconds per phase."""
        return dict(self.inner.get("seconds", {}))


def campaign_rate(bundle_dir: Path, budget: int, workdir: Path,
                  extra: Sequence[str] = ()) -> CampaignRun:
    """``r3 tune BUNDLE --inner-only --budget N [EXTRA]`` as a user runs it (a fresh
    database in ``workdir``), its figures read back."""
    import subprocess

    from db.events import events
    from db.figures import figures_of
    from db.session import open_database

    db = workdir / "campaign-rate.sqlite"
    db.unlink(missing_ok=True)
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "r3tui", "tune", str(bundle_dir),
                           "--inner-only", "--budget", str(budget), "--db", str(db), *extra],
                          capture_output=True, text=True, timeout=540)
    command_s = time.perf_counter() - began
    if done.returncode != 0:
        raise RuntimeError(f"r3 tune --inner-only {' '.join(extra)} failed: "
                           f"{done.stderr.strip()[-500:]}")
    with open_database(db, readonly=True) as database, database.session_scope() as s:
        figures = figures_of(s, 1)
        assert figures is not None
        now = datetime.now(UTC)
        rate, took = figures.evaluations_per_s(now), figures.duration_s(now)
        done_events = [e for e in events(s, 1) if e.kind == "inner_done"]
        inner = dict(done_events[-1].data or {}) if done_events else {}
    assert rate is not None and took is not None
    return CampaignRun(rate, figures.n_trials, took, command_s, inner)


def campaign_rates(bundle_dir: Path, budget: int, workdir: Path, runs: int,
                   extra: Sequence[str] = ()) -> list[CampaignRun]:
    """:func:`campaign_rate` ``runs`` times, one after another (a fresh database each)."""
    return [campaign_rate(bundle_dir, budget, workdir, extra) for _ in range(max(1, runs))]


def rate_line(name: str, budget: int, flags: str, rates: Sequence[CampaignRun]) -> list[str]:
    """``campaign_evals_per_s``: the median run's rate, with every run's, and that run's
    seconds per phase.  One run is no figure: the same command varied from 41.7 to 66.3 on
    one H100 (session 35), the search's asks (CPU) taking 2.2 to 4.0 s of 200 trials."""
    run = sorted(rates, key=lambda r: r.per_s)[(len(rates) - 1) // 2]
    every = ", ".join(f"{r.per_s:.1f}" for r in rates)
    command = f"r3 tune --inner-only --budget {budget}" + (f" {flags}" if flags else "")
    which = "the median" if len(rates) % 2 else "the lower middle"
    return [f"campaign_evals_per_s: {run.per_s:.1f} ({which} of {len(rates)} runs: {every}; "
            f"{name}: `{command}`, {run.trials} trials in {run.seconds:.1f} s, the search's "
            f"asks included; the whole command {run.command_s:.1f} s)",
            f"campaign_seconds_by_phase: {phase_text(run.phases)}  (that run)"]


def campaign_only(name: str, scale: float, budget: int, flag_sets: Sequence[str], runs: int,
                  argv: Sequence[str] | None) -> int:
    """``--campaign-only``: one recording, ``runs`` live campaigns per flag set, each set's
    median rate and its run's seconds per phase."""
    import shlex

    print("\n".join(header(argv)), flush=True)
    with tempfile.TemporaryDirectory(prefix="r3-campaign-rate-") as tmp:
        bundle_dir = record_example(name, scale, Path(tmp))
        for flags in flag_sets:
            rates = campaign_rates(bundle_dir, budget, Path(tmp), runs, shlex.split(flags))
            print("\n".join(rate_line(name, budget, flags, rates)), flush=True)
    return 0


def phase_text(phases: dict[str, float]) -> str:
    """The inner loop's seconds per phase, the longest first."""
    return ", ".join(f"{k} {v:.2f}" for k, v in sorted(phases.items(), key=lambda kv: -kv[1]))


def gpu_name() -> str:
    from r3tui.cuda import driver as cu

    ctx = cu.PrimaryContext(0)
    return cu.device_info(ctx.device).name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", default=",".join(DEFAULT_EXAMPLES))
    parser.add_argument(
        "--scale", type=float, help="problem size factor for every example (default: per example)"
    )
    parser.add_argument("--app-candidates", type=int, default=4)
    parser.add_argument("--pool-candidates", type=int, default=120,
                        help="candidates timed through the runner per example (default 120)")
    parser.add_argument("--dask", action="store_true",
                        help="also through the Dask runner (a local cluster: one worker per "
                        "core and one GPU worker): dask_overhead_pct")
    parser.add_argument("--campaign", default="stencil7",
                        help="example whose live inner campaign gives campaign_evals_per_s "
                        "('' : none)")
    parser.add_argument("--campaign-budget", type=int, default=200)
    parser.add_argument("--campaign-runs", type=int, default=3,
                        help="live campaigns timed one after another; the median is reported "
                        "(default 3)")
    parser.add_argument("--campaign-only", action="store_true",
                        help="only record the --campaign example and run its live campaign, "
                        "once per --campaign-flags")
    parser.add_argument("--campaign-flags", action="append", default=[],
                        help="more `r3 tune` flags for one --campaign-only run, as one string "
                        "(repeatable; default: one run with none)")
    parser.add_argument("--out", type=Path, help="also write the report to this file")
    args = parser.parse_args(argv)

    if args.campaign_only:
        return campaign_only(args.campaign, args.scale or DEFAULT_SCALES.get(args.campaign, 1.0),
                             args.campaign_budget, args.campaign_flags or [""],
                             args.campaign_runs, argv)
    results = []
    with tempfile.TemporaryDirectory(prefix="r3-eval-cost-") as tmp:
        rates = []
        if args.campaign:
            # first, while nothing else of this script runs: after the flows below, a
            # closing Dask cluster and compile pools still took the CPU its asks need
            print(f"== r3 tune {args.campaign} --inner-only --budget {args.campaign_budget} "
                  f"(x{args.campaign_runs})", flush=True)
            where = Path(tmp) / "campaign"
            where.mkdir()
            bundle_dir = record_example(
                args.campaign, args.scale or DEFAULT_SCALES.get(args.campaign, 1.0), where)
            rates = campaign_rates(bundle_dir, args.campaign_budget, where, args.campaign_runs)
        for name in args.examples.split(","):
            print(f"== {name}", flush=True)
            results.append(
                run_example(
                    name,
                    args.scale or DEFAULT_SCALES.get(name, 1.0),
                    args.app_candidates,
                    args.pool_candidates,
                    Path(tmp),
                    with_dask=args.dask,
                )
            )

    lines = [
        *header(argv),
        "",
        f"{'example':<11} {'scale':>5} {'replay s/cand':>13} {'app s/cand':>10} {'(nvcc s)':>8} "
        f"{'ratio':>7} {'replay us':>9} {'app us':>9} {'dev %':>6} {'cand/s':>7} {'busy':>5} "
        f"{'ok':>7}",
    ]
    for r in results:
        lines.append(
            f"{r.name:<11} {r.scale:>5.2f} {statistics.median(r.replay_s):>13.3f} "
            f"{statistics.median(r.app_s):>10.3f} {statistics.median(r.app_build_s):>8.2f} "
            f"{r.ratio:>6.1f}x {r.replay_us:>9.1f} {r.app_us:>9.1f} {r.fidelity_pct:>6.2f} "
            f"{r.per_s:>7.2f} {r.flow.gpu_busy:>5.2f} {r.flow.ok:>3}/{r.flow.candidates:<3}"
        )
    worst_ratio = min(results, key=lambda r: r.ratio)
    worst_fidelity = max(results, key=lambda r: r.fidelity_pct)
    slowest = min(results, key=lambda r: r.per_s)
    lines += [
        "",
        f"wrong results in the application path: {sum(r.wrong_in_app for r in results)}",
        f"eval_cost_ratio: {worst_ratio.ratio:.1f} ({worst_ratio.name}, worst example)",
        f"replay_fidelity_max_dev_pct: {worst_fidelity.fidelity_pct:.2f} ({worst_fidelity.name})",
        f"candidates_per_s: {slowest.per_s:.2f} ({slowest.name}, worst example)",
    ]
    small = [r for r in results if r.replay_us <= SMALL_KERNEL_US]
    if small:
        worst = min(small, key=lambda r: r.per_s)
        lines.append(f"candidates_per_s_small: {worst.per_s:.2f} ({worst.name}, worst of "
                     f"{len(small)} examples with kernels of {SMALL_KERNEL_US:.0f} us or less)")
    busiest = max(results, key=lambda r: r.flow.gpu_busy)
    idlest = min(results, key=lambda r: r.flow.gpu_busy)
    lines.append(f"gpu_busy_fraction: {idlest.flow.gpu_busy:.2f} ({idlest.name}) to "
                 f"{busiest.flow.gpu_busy:.2f} ({busiest.name})")
    lines += dask_lines(results)
    if rates:
        lines += rate_line(args.campaign, args.campaign_budget, "", rates)
    report = "\n".join(lines)
    print(report)
    if args.out:
        args.out.write_text(report + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
