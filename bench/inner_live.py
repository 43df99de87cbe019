"""`r3 tune --inner-only` live on the GPU for every example: gain over the recorded launch.

For each example: record the naive kernel, run the inner loop (Bayesian optimization over
compiler options, block shape and launch bounds, every trial compiled and replayed) for a
trial budget, declare the winner by interleaved re-timing against the recorded configuration,
and report the speedup and the tuned kernel's achieved bandwidth (memory-bound examples) or
FLOP/s (compute-bound) as a fraction of ceilings measured in the same run: a device-to-device
copy for bandwidth, an FMA-chain kernel for fp32 FLOP/s.  All campaigns go into one
experiment database (``--db``).

    python bench/inner_live.py --db OUT/inner-live.sqlite [--budget 40] [--examples a,b]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

from ceilings import ceilings  # noqa: E402
from eval_cost import DEFAULT_EXAMPLES, DEFAULT_SCALES  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    from catalog import load_example  # type: ignore[import-not-found]

    from r3tui.engine import InnerCampaign, InnerSettings, run_inner_campaign
    from r3tui.record.kernel_recorder import RecordKernelRequest, load_inputs, record_kernel

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", type=Path, required=True)
    parser.add_argument("--budget", type=int, default=40)
    parser.add_argument("--examples", default=",".join(DEFAULT_EXAMPLES))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    bandwidth, flops = ceilings()
    rows = []
    with tempfile.TemporaryDirectory(prefix="r3-inner-live-") as tmp:
        for name in args.examples.split(","):
            print(f"== {name}", flush=True)
            example = load_example(name)
            scale = DEFAULT_SCALES.get(name, 1.0)
            inputs_path = Path(example.path) / "inputs.py"
            bundle = Path(tmp) / f"{name}.r3b"
            record_kernel(
                RecordKernelRequest(
                    Path(example.path) / "kernel.cu",
                    example.kernel_name,
                    inputs_path,
                    bundle,
                    seed=1,
                    scale=scale,
                )
            )
            result = run_inner_campaign(
                InnerCampaign(
                    bundle,
                    args.db,
                    budget_trials=args.budget,
                    name=f"{name}-inner-live",
                    settings=InnerSettings(seed=args.seed),
                )
            )
            inputs = load_inputs(inputs_path, seed=1, scale=scale)
            w = result.winner
            if w is None:
                rows.append(f"{name:<11} no configuration succeeded")
                continue
            tuned_s = w.best.median_s
            if example.bound == "memory":
                fraction = example.bytes_moved(inputs) / tuned_s / bandwidth
                what = "of copy bandwidth"
            else:
                fraction = example.flops(inputs) / tuned_s / flops
                what = "of fp32 FMA rate"
            failed = sum(result.failures.values())
            rows.append(
                f"{name:<11} {scale:>5.2f} {result.trials:>6} {failed:>6} "
                f"{w.baseline_median_s * 1e6:>10.2f} {tuned_s * 1e6:>10.2f} "
                f"{w.speedup:>7.3f} [{w.best.low:.3f},{w.best.high:.3f}] "
                f"{fraction:>6.3f} {what}   tuned_fraction_of_ceiling[{name}]: {fraction:.3f}"
            )
            print(rows[-1], flush=True)
    print(f"date: {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}")
    print("command: python bench/inner_live.py " + " ".join(sys.argv[1:] if argv is None else argv))
    print(
        f"ceilings measured: copy {bandwidth / 1e12:.2f} TB/s (read+write), "
        f"fp32 FMA {flops / 1e12:.1f} TFLOP/s"
    )
    print(
        f"{'example':<11} {'scale':>5} {'trials':>6} {'failed':>6} {'recorded us':>10} "
        f"{'tuned us':>10} {'speedup':>7} [95% CI]       fraction"
    )
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
