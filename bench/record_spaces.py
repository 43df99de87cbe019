"""Measure every configuration of a search space per example on the GPU (simulation data).

For each example: record the naive kernel, build its inner space, compile and replay every
configuration once through the same ReplayEvaluator the engine uses, and write
``<out>/<example>.json`` in the recorded-space format of :mod:`r3tui.search.simulation`.  Those
files go to ``tests/data/spaces/`` so that the optimizer is tested in CI against real H200
measurements (Kernel Tuner's simulation mode).

Two kinds of space:

- ``reduced`` (default; ``<out>/<example>.json``): fast math x register cap x block shape,
  10-1470 configurations.  Random search reaches >= 99 % of their optimum within 20 draws.
- ``hard`` (``<out>/hard/<example>.json``, for nbody, spmv_csr and sgemm): ~1500-2000
  configurations each, where the good region is a conjunction of several right choices —
  nbody: the fast-math parts (ftz, prec-div, prec-sqrt, fmad) x register cap x ptxas opt level
  x block; spmv_csr: fast math x opt level x load cache modifier (-dlcm) x __launch_bounds__ x
  block; sgemm: fast math x register cap x opt level x 2-D block shape.

Each file is written as soon as its example is measured (a cut-off run keeps the finished ones),
and a space larger than ``--max-configs`` is refused before anything is compiled.

    python bench/record_spaces.py --out DIR [--space reduced|hard] [--examples a,b]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from r3tui.domain import Measurement, TrialConfig
    from r3tui.search import SearchSpace
    from r3tui.search.space import LaunchInfoLike

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

from eval_cost import DEFAULT_EXAMPLES, DEFAULT_SCALES  # noqa: E402


@dataclass(frozen=True)
class SpaceKind:
    """Which compiler options (nvrtc names) and launch dimensions a recorded space varies."""

    options: tuple[str, ...]
    launch_bounds: bool = False


# the options of the reduced space; the block shapes come from the space's own generator
REDUCED = SpaceKind(("use_fast_math", "maxrregcount"))
HARD: dict[str, SpaceKind] = {
    "nbody": SpaceKind(("use_fast_math", "ftz", "prec-div", "prec-sqrt", "fmad",
                        "maxrregcount", "opt-level")),
    "spmv_csr": SpaceKind(("use_fast_math", "opt-level", "def-load-cache"), launch_bounds=True),
    "sgemm": SpaceKind(("use_fast_math", "maxrregcount", "opt-level")),
}
KINDS = ("reduced", "hard")
SUBDIR = {"reduced": "", "hard": "hard"}
MAX_CONFIGS = 2500  # per example: a hard space measures in well under a minute on an H200


def space_kind(kind: str, example: str) -> SpaceKind:
    if kind == "reduced":
        return REDUCED
    if kind == "hard" and example in HARD:
        return HARD[example]
    raise SystemExit(f"record_spaces: no {kind} space for {example!r} "
                     f"(hard spaces: {', '.join(HARD)})")


def build_space(kind: SpaceKind, launch: LaunchInfoLike) -> SearchSpace:
    from r3tui.compile.options import accepted_options
    from r3tui.search import DeviceLimits, LaunchSpec, SearchSpace, option_dims

    specs = [s for s in accepted_options("nvrtc") if s.name in kind.options]
    missing = set(kind.options) - {s.name for s in specs}
    if missing:
        raise SystemExit(f"record_spaces: nvrtc has no option {sorted(missing)}")
    # the powers-of-two ladder the tables in tests/data/spaces were recorded with, so that a
    # space recorded again is the same space and its size fits one short GPU call
    return SearchSpace.from_parts(option_dims(specs), LaunchSpec.of(launch, ladder="pow2"),
                                  limits=DeviceLimits(), include_launch_bounds=kind.launch_bounds)


def measure(space: SearchSpace, evaluate: Callable[[Sequence[TrialConfig]], list[Measurement]],
            max_configs: int) -> list[tuple[TrialConfig, Measurement]]:
    """Every config of ``space`` with its measurement (refused above ``max_configs``)."""
    configs = list(space.enumerate(limit=max_configs))
    measurements = evaluate(configs)
    if len(measurements) != len(configs):
        raise RuntimeError(f"{len(configs)} configs but {len(measurements)} measurements")
    return list(zip(configs, measurements, strict=True))


def table(example: str, gpu: str, command: str, space: SearchSpace,
          rows: Sequence[tuple[TrialConfig, Measurement]], scale: float,
          kind: str) -> dict[str, Any]:
    from r3tui.search.simulation import space_file

    data = space_file(example, gpu, datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), command,
                      space, rows)
    data["scale"] = scale
    data["space_kind"] = kind
    return data


def write(out: Path, kind: str, example: str, data: dict[str, Any]) -> Path:
    folder = out / SUBDIR[kind]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{example}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=None, separators=(",", ":")))
    tmp.replace(path)  # a file is complete or absent
    return path


def summary(example: str, rows: Sequence[tuple[TrialConfig, Measurement]], seconds: float) -> str:
    times = [m.time.median_s for _, m in rows if m.ok and m.time]
    best = min(times) if times else float("nan")
    return (f"{example:<11} {len(rows):>5} configs  {len(times):>5} ok  best {best * 1e6:9.2f} µs"
            f"  {seconds:6.1f} s")


def record_one(name: str, kind: str, workdir: Path, out: Path, command: str,
               max_configs: int) -> str:
    from catalog import load_example  # type: ignore[import-not-found]

    from r3tui.compile.cache import CompileCache
    from r3tui.compile.pool import CompilePool
    from r3tui.engine import KernelSource, ReplayEvaluator
    from r3tui.record.bundle import Bundle
    from r3tui.record.kernel_recorder import RecordKernelRequest, record_kernel
    from r3tui.replay.worker import ReplayWorker
    from r3tui.runners import GpuReplayer, LocalRunner

    example = load_example(name)
    scale = DEFAULT_SCALES.get(name, 1.0)
    bundle_dir = workdir / f"{name}.r3b"
    record_kernel(RecordKernelRequest(Path(example.path) / "kernel.cu", example.kernel_name,
                                      Path(example.path) / "inputs.py", bundle_dir, seed=1,
                                      scale=scale))
    manifest = Bundle.open(bundle_dir).manifest
    source = KernelSource((Path(example.path) / "kernel.cu").read_text(), example.kernel_name,
                          defines=manifest.kernel.defines)
    space = build_space(space_kind(kind, name), manifest.launch)
    started = time.perf_counter()
    runner = LocalRunner([GpuReplayer(ReplayWorker(bundle_dir, timeout_s=60))],
                         CompilePool(cache=CompileCache(None)))
    with runner:
        info = runner.info
        evaluator = ReplayEvaluator(source, runner)
        rows = measure(space, evaluator.evaluate, max_configs)
    seconds = time.perf_counter() - started
    gpu = f"{info.gpu} ({info.arch}), driver {info.driver_version}"
    write(out, kind, name, table(name, gpu, command, space, rows, scale, kind))
    return summary(name, rows, seconds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--space", choices=KINDS, default="reduced")
    parser.add_argument("--examples", default=None,
                        help="comma-separated (default: every example of the space kind)")
    parser.add_argument("--max-configs", type=int, default=MAX_CONFIGS)
    args = parser.parse_args(argv)
    names = (args.examples.split(",") if args.examples
             else list(DEFAULT_EXAMPLES if args.space == "reduced" else HARD))
    for name in names:
        space_kind(args.space, name)  # an unknown example fails before any GPU work
    args.out.mkdir(parents=True, exist_ok=True)
    command = "python bench/record_spaces.py " + " ".join(sys.argv[1:] if argv is None else argv)
    lines = []
    with tempfile.TemporaryDirectory(prefix="r3-spaces-") as tmp:
        for name in names:
            print(f"== {name} ({args.space})", flush=True)
            lines.append(record_one(name, args.space, Path(tmp), args.out, command,
                                    args.max_configs))
            print(lines[-1], flush=True)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
