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
from concurrent.futures import as_completed
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from app_harness import ApplicationHarness  # noqa: E402

from r3tui.domain import Dim3  # noqa: E402

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
BLOCKS_1D = (Dim3(128), Dim3(256), Dim3(512), Dim3(64), Dim3(1024))
BLOCKS_2D = (Dim3(16, 16), Dim3(32, 8), Dim3(32, 4), Dim3(64, 4), Dim3(8, 8))
BLOCKS_3D = (Dim3(32, 4, 2), Dim3(32, 8, 1), Dim3(64, 4, 1), Dim3(16, 8, 4), Dim3(8, 8, 8))


@dataclass
class ExampleResult:
    name: str
    scale: float
    replay_s: list[float]
    app_s: list[float]
    app_build_s: list[float]
    replay_us: float
    app_us: float
    pool_candidates: int
    pool_wall_s: float
    pool_ok: int
    wrong_in_app: int

    @property
    def ratio(self) -> float:
        return statistics.median(self.app_s) / statistics.median(self.replay_s)

    @property
    def fidelity_pct(self) -> float:
        return 100.0 * abs(self.replay_us - self.app_us) / self.app_us

    @property
    def per_s(self) -> float:
        return self.pool_candidates / self.pool_wall_s


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


def run_example(
    name: str, scale: float, app_candidates: int, pool_candidates: int, workdir: Path
) -> ExampleResult:
    sys.path.insert(0, str(ROOT / "examples"))
    from catalog import load_example  # type: ignore[import-not-found]

    from r3tui.compile.base import CompileRequest, get_toolchain
    from r3tui.compile.cache import CompileCache
    from r3tui.compile.options import canonicalize, render
    from r3tui.compile.pool import CompilePool
    from r3tui.record.bundle import Bundle
    from r3tui.record.kernel_recorder import RecordKernelRequest, load_inputs, record_kernel
    from r3tui.record.spec import PointerTable
    from r3tui.replay.candidate import Candidate
    from r3tui.replay.verify import compare_host
    from r3tui.replay.worker import ReplayWorker

    example = load_example(name)
    source_path = Path(example.path) / "kernel.cu"
    inputs_path = Path(example.path) / "inputs.py"
    inputs = load_inputs(inputs_path, seed=1, scale=scale)
    bundle_dir = workdir / f"{name}.r3b"
    record_kernel(
        RecordKernelRequest(
            source_path, example.kernel_name, inputs_path, bundle_dir, seed=1, scale=scale
        )
    )
    bundle = Bundle.open(bundle_dir)
    manifest = bundle.manifest
    source = source_path.read_text()
    defines = tuple(sorted(inputs.defines.items()))
    nvrtc = get_toolchain("nvrtc")
    harness = ApplicationHarness(workdir / name, inputs, example.kernel_name)
    tables = {a.name for a in inputs.args if isinstance(a, PointerTable)}
    configs = candidates(inputs.work, inputs.block, inputs.block_tunable)[:pool_candidates]

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

        # throughput: every candidate, compiles spread over all cores, one GPU worker
        pool_ok = 0
        with CompilePool(workers=os.cpu_count(), cache=CompileCache(None)) as pool:
            started = time.perf_counter()
            futures = {pool.submit("nvrtc", request(opts)): block for opts, block in configs}
            for future in as_completed(futures):
                result = future.result()
                if result.ok:
                    m = worker.evaluate(Candidate.from_compiled(result, block=futures[future]))
                    pool_ok += m.ok
            pool_wall_s = time.perf_counter() - started
    return ExampleResult(
        name,
        scale,
        replay_s,
        app_s,
        app_build_s,
        replay_us,
        app_us,
        len(configs),
        pool_wall_s,
        pool_ok,
        wrong_in_app,
    )


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
    parser.add_argument("--pool-candidates", type=int, default=24)
    parser.add_argument("--out", type=Path, help="also write the report to this file")
    args = parser.parse_args(argv)

    results = []
    with tempfile.TemporaryDirectory(prefix="r3-eval-cost-") as tmp:
        for name in args.examples.split(","):
            print(f"== {name}", flush=True)
            results.append(
                run_example(
                    name,
                    args.scale or DEFAULT_SCALES.get(name, 1.0),
                    args.app_candidates,
                    args.pool_candidates,
                    Path(tmp),
                )
            )

    lines = [
        f"date: {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        f"gpu: {gpu_name()}",
        f"host: {platform.node()} ({os.cpu_count()} cores)",
        "command: python bench/eval_cost.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "",
        f"{'example':<11} {'scale':>5} {'replay s/cand':>13} {'app s/cand':>10} {'(nvcc s)':>8} "
        f"{'ratio':>7} {'replay us':>9} {'app us':>9} {'dev %':>6} {'cand/s':>7} {'ok':>7}",
    ]
    for r in results:
        lines.append(
            f"{r.name:<11} {r.scale:>5.2f} {statistics.median(r.replay_s):>13.3f} "
            f"{statistics.median(r.app_s):>10.3f} {statistics.median(r.app_build_s):>8.2f} "
            f"{r.ratio:>6.1f}x {r.replay_us:>9.1f} {r.app_us:>9.1f} {r.fidelity_pct:>6.2f} "
            f"{r.per_s:>7.2f} {r.pool_ok:>3}/{r.pool_candidates:<3}"
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
    report = "\n".join(lines)
    print(report)
    if args.out:
        args.out.write_text(report + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
