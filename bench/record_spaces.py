"""Measure every configuration of a small search space per example on the GPU (simulation data).

For each example: record the naive kernel, build a reduced inner space (fast math x register
cap x block shape), compile and replay every configuration once through the same
ReplayEvaluator the engine uses, and write ``<out>/<example>.json`` in the recorded-space
format of :mod:`r3tui.search.simulation`.  Those files go to ``tests/data/spaces/`` so that
the optimizer is tested in CI against real H200 measurements (Kernel Tuner's simulation mode).

    python bench/record_spaces.py --out DIR [--examples a,b]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from r3tui.record.manifest import LaunchInfo
    from r3tui.search import SearchSpace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

from eval_cost import DEFAULT_EXAMPLES, DEFAULT_SCALES  # noqa: E402

# the options of the reduced space; the block shapes come from the space's own generator
OPTIONS = ("use_fast_math", "maxrregcount")


def reduced_space(launch: LaunchInfo) -> SearchSpace:
    from r3tui.compile.options import accepted_options
    from r3tui.search import DeviceLimits, LaunchSpec, SearchSpace, option_dims

    specs = [s for s in accepted_options("nvrtc") if s.name in OPTIONS]
    return SearchSpace.from_parts(option_dims(specs), LaunchSpec.of(launch), limits=DeviceLimits())


def record_one(name: str, workdir: Path, out: Path, command: str) -> str:
    from catalog import load_example  # type: ignore[import-not-found]

    from r3tui.compile.cache import CompileCache
    from r3tui.compile.pool import CompilePool
    from r3tui.engine import KernelSource, ReplayEvaluator
    from r3tui.record.bundle import Bundle
    from r3tui.record.kernel_recorder import RecordKernelRequest, record_kernel
    from r3tui.replay.worker import ReplayWorker
    from r3tui.search.simulation import space_file

    example = load_example(name)
    scale = DEFAULT_SCALES.get(name, 1.0)
    bundle_dir = workdir / f"{name}.r3b"
    record_kernel(
        RecordKernelRequest(
            Path(example.path) / "kernel.cu",
            example.kernel_name,
            Path(example.path) / "inputs.py",
            bundle_dir,
            seed=1,
            scale=scale,
        )
    )
    manifest = Bundle.open(bundle_dir).manifest
    source = KernelSource(
        (Path(example.path) / "kernel.cu").read_text(),
        example.kernel_name,
        defines=manifest.kernel.defines,
    )
    space = reduced_space(manifest.launch)
    configs = list(space.enumerate())
    started = time.perf_counter()
    with (
        ReplayWorker(bundle_dir, timeout_s=60) as worker,
        CompilePool(cache=CompileCache(None)) as pool,
    ):
        info = worker.start()
        evaluator = ReplayEvaluator(source, worker, pool, arch=info.arch)
        measurements = evaluator.evaluate(configs)
    seconds = time.perf_counter() - started
    data = space_file(
        name,
        f"{info.gpu} ({info.arch}), driver {info.driver_version}",
        datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        command,
        space,
        zip(configs, measurements, strict=True),
    )
    data["scale"] = scale
    (out / f"{name}.json").write_text(json.dumps(data, indent=None, separators=(",", ":")))
    ok = [m for m in measurements if m.ok and m.time]
    best = min(m.time.median_s for m in ok if m.time) if ok else float("nan")
    return (
        f"{name:<11} {len(configs):>5} configs  {len(ok):>5} ok  best {best * 1e6:9.2f} µs"
        f"  {seconds:6.1f} s"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--examples", default=",".join(DEFAULT_EXAMPLES))
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    command = "python bench/record_spaces.py " + " ".join(sys.argv[1:] if argv is None else argv)
    lines = []
    with tempfile.TemporaryDirectory(prefix="r3-spaces-") as tmp:
        for name in args.examples.split(","):
            print(f"== {name}", flush=True)
            lines.append(record_one(name, Path(tmp), args.out, command))
            print(lines[-1], flush=True)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
