"""Issue #22: one campaign on one GPU and on every visible GPU, through each runner.

The same live campaign (``r3 tune BUNDLE --inner-only --budget N --seed S``) runs with
``--gpus 1`` and with ``--gpus 0`` (every visible GPU), through the local runner (one replay
worker per GPU) and the Dask runner (a local cluster: one GPU worker per GPU), one after
another on a quiet machine.  Per runner: candidates evaluated per second on 1 and on all GPUs
(the campaign's own figure: trials over its running time, the search's asks included),
``multi_gpu_scaling_efficiency`` (the rate on N GPUs over N times the rate on one; the issue's
target is 0.85 for a kernel whose replay dominates: nbody at scale 0.25 replays for tens of
milliseconds a candidate, far more than an ask), and whether both runs declared the same
winner (the configuration and its speedup over the recorded launch).  GPUs of one model still
differ by a few percent and the search is told what they measured, so two runs can part ways;
the line says so rather than hiding it.  With one GPU visible the script runs the 1-GPU arms
and says the efficiency is n/a.

    python bench/multi_gpu.py [--example nbody] [--scale 0.25] [--budget 160] [--seed 0]
                              [--runners local,dask] [--out FILE]

Keep NVLink multicast off on a multi-GPU machine (NCCL_NVLS_ENABLE=0 and what its notes name).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]


@dataclass(frozen=True)
class Arm:
    """One campaign: its runner, GPUs, rate and winner."""

    runner: str
    gpus: int
    per_s: float
    trials: int
    seconds: float
    winner: str | None  # the winning configuration, as stored (JSON text), None: no winner
    speedup: float | None


def efficiency(one: Arm, many: Arm) -> float:
    """The rate on ``many.gpus`` GPUs over that many times the rate on one."""
    return many.per_s / (many.gpus * one.per_s) if one.per_s and many.gpus else 0.0


def report(arms: list[Arm], gpus: int) -> list[str]:
    """The ``key: value`` lines of the arms (per runner, 1 GPU then ``gpus``)."""
    lines = [f"{'runner':7} {'gpus':>4} {'trials':>6} {'s':>7} {'cand/s':>8} {'speedup':>8} winner"]
    for a in arms:
        lines.append(f"{a.runner:7} {a.gpus:>4} {a.trials:>6} {a.seconds:>7.1f} {a.per_s:>8.2f} "
                     f"{a.speedup or 0.0:>8.3f} {a.winner or '-'}")
    lines.append("")
    worst = None
    for runner in dict.fromkeys(a.runner for a in arms):
        mine = {a.gpus: a for a in arms if a.runner == runner}
        one = mine.get(1)
        if one is None:
            continue
        lines.append(f"multi_gpu_candidates_per_s[{runner},1]: {one.per_s:.2f}")
        many = mine.get(gpus) if gpus > 1 else None
        if many is None:
            continue
        lines.append(f"multi_gpu_candidates_per_s[{runner},{gpus}]: {many.per_s:.2f}")
        e = efficiency(one, many)
        worst = e if worst is None else min(worst, e)
        lines.append(f"multi_gpu_scaling_efficiency[{runner}]: {e:.3f} ({gpus} GPUs: "
                     f"{many.per_s:.2f} candidates/s against {gpus} x {one.per_s:.2f})")
        same = one.winner is not None and one.winner == many.winner
        lines.append(f"multi_gpu_same_winner[{runner}]: {'yes' if same else 'no'} "
                     f"(1 GPU: {one.speedup or 0:.3f}x, {gpus} GPUs: {many.speedup or 0:.3f}x"
                     + ("" if same else "; the search is told what each GPU measured, and GPUs "
                        "of one model differ by a few percent") + ")")
    if worst is not None:
        lines.append(f"multi_gpu_scaling_efficiency: {worst:.3f} (the worst runner; target 0.85)")
    else:
        lines.append(f"multi_gpu_scaling_efficiency: n/a ({gpus} GPU visible: nothing to scale "
                     "to; the 1-GPU arms above ran)")
    return lines


def run_arm(bundle: Path, runner: str, gpus: int, budget: int, seed: int, workdir: Path) -> Arm:
    """``r3 tune BUNDLE --inner-only`` on ``gpus`` GPUs (0: every visible one) through
    ``runner``, as a user runs it (:func:`eval_cost.campaign_rate`)."""
    from eval_cost import campaign_rate

    from r3tui.cuda.driver import device_count

    run = campaign_rate(bundle, budget, workdir,
                        ["--seed", str(seed), "--runner", runner, "--gpus", str(gpus)])
    winner = run.inner.get("winner")
    return Arm(runner, gpus or device_count(), run.per_s, run.trials, run.seconds,
               json.dumps(winner, sort_keys=True) if winner else None, run.inner.get("speedup"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--example", default="nbody")
    parser.add_argument("--scale", type=float, default=0.25)
    parser.add_argument("--budget", type=int, default=160, help="trials a campaign")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--runners", default="local,dask")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    from eval_cost import gpu_name, record_example

    from r3tui.cuda.driver import device_count
    from r3tui.errors import R3Error

    try:
        gpus = device_count()
    except R3Error as exc:
        print(f"multi_gpu.py: error: {exc}", file=sys.stderr)
        return 2
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    header = [f"# bench/multi_gpu.py, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
              f"{gpus} x {gpu_name()}",
              f"command: python bench/multi_gpu.py {' '.join(argv or sys.argv[1:])}"]
    print("\n".join(header), flush=True)
    arms = []
    with tempfile.TemporaryDirectory(prefix="r3-multi-gpu-") as tmp:
        bundle = record_example(args.example, args.scale, Path(tmp))
        for runner in args.runners.split(","):
            for n in ([1, 0] if gpus > 1 else [1]):
                print(f"== {runner}, {n or gpus} GPU(s)", flush=True)
                arms.append(run_arm(bundle, runner, n, args.budget, args.seed, Path(tmp)))
    text = "\n".join([*header, "", *report(arms, gpus)])
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
