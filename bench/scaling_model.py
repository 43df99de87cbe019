"""How many candidates a second a campaign can evaluate on 1, 8, 64 and 512 GPUs, and what
limits it: a model from measured per-candidate costs (docs/scaling.md explains it).

Each stage of a candidate is a resource that serves it at some rate:

- the search's ask and tell (CPU, in the campaign's process: one core per independent search),
- the compile (CPU, one core a compile, ``cores_per_gpu`` cores a GPU),
- the replay (GPU: restore the recorded state, time, verify),
- the scheduler of a Dask cluster (per task, two tasks a candidate: compile and replay),
- the model's proposals (source-level search only: one proposal feeds ``trials_per_proposal``
  trials of the inner search).

With every stage pipelined (runner layer, two batches in flight), the campaign goes as fast as
its slowest stage; the model prints each stage's rate and names the bottleneck.  The one cost
measured here is the Dask scheduler's per-task overhead (``--measure-dask``: a LocalCluster
of worker processes on this machine running no-op tasks); the others are flags whose
defaults are the figures measured so far, with where they come from in ``--help``.

    python bench/scaling_model.py [--measure-dask] [--ask-ms 10] [--compile-ms 30] ...
"""

from __future__ import annotations

import argparse
import math
import os
import time
from dataclasses import dataclass

GPUS = (1, 8, 64, 512)


@dataclass(frozen=True)
class Costs:
    ask_ms: float  # the search's CPU per evaluation (ask + tell), one core
    compile_ms: float  # one compile, one core
    replay_ms: float  # one replay on one GPU (restore, timed launches, verification)
    task_ms: float  # the Dask scheduler's overhead per task (0: the local runner)
    cores_per_gpu: int
    searches: int  # independent searches (variants or islands searched at once)
    llm_s: float  # one model proposal (0: no source-level proposals)
    trials_per_proposal: int
    llm_servers_per_gpu: float


def stage_rates(c: Costs, gpus: int) -> dict[str, float]:
    """Candidates per second each stage could serve on ``gpus`` GPUs."""
    rates = {
        "search": 1000.0 / c.ask_ms * c.searches,
        "compile": 1000.0 / c.compile_ms * c.cores_per_gpu * gpus,
        "replay": 1000.0 / c.replay_ms * gpus,
    }
    if c.task_ms > 0:
        rates["scheduler"] = 1000.0 / (2 * c.task_ms)  # one scheduler, two tasks a candidate
    if c.llm_s > 0:
        rates["proposals"] = c.trials_per_proposal * c.llm_servers_per_gpu * gpus / c.llm_s
    return rates


def measure_dask_task_ms(n: int = 2000, workers: int = 2) -> float:
    """Wall time per no-op task, submitted and gathered through a LocalCluster of processes."""
    from distributed import Client, LocalCluster

    with (LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                       dashboard_address=None, silence_logs=40) as cluster,
          Client(cluster) as client):
        client.gather(client.map(_noop, range(200)))  # warm
        started = time.perf_counter()
        client.gather([client.submit(_noop, i, pure=False) for i in range(n)])
        return (time.perf_counter() - started) / n * 1000.0


def _noop(x: int) -> int:
    return x


def table(c: Costs) -> list[str]:
    names = list(stage_rates(c, 1))
    lines = [f"{'GPUs':>5} " + " ".join(f"{n:>10}" for n in names)
             + f" {'cand/s':>9} {'bottleneck':>10}"]
    for gpus in GPUS:
        rates = stage_rates(c, gpus)
        slowest = min(rates, key=lambda k: rates[k])
        lines.append(f"{gpus:>5} " + " ".join(f"{rates[n]:>10.0f}" for n in names)
                     + f" {rates[slowest]:>9.0f} {slowest:>10}")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ask-ms", type=float, default=150.0,
                   help="search CPU per evaluation (default 150: 110-250 ms measured in "
                   "simulation, 100-evaluation runs, 2-core CPU machine, issue #21)")
    p.add_argument("--compile-ms", type=float, default=30.0,
                   help="one NVRTC compile on one core (default 30: 11-50 ms on the H200 "
                   "host, bench/results/*eval-cost*)")
    p.add_argument("--replay-ms", type=float, default=2.0,
                   help="one replay of a 100 us kernel (default 2: issue #21 on the H200)")
    p.add_argument("--task-ms", type=float, default=None,
                   help="Dask scheduler overhead per task (default: --measure-dask's figure, "
                   "else 0, the local runner)")
    p.add_argument("--measure-dask", action="store_true",
                   help="measure the per-task overhead on this machine first")
    p.add_argument("--cores-per-gpu", type=int, default=16,
                   help="compile cores per GPU (default 16: the H200 machine)")
    p.add_argument("--searches", type=int, default=1, help="independent searches at once")
    p.add_argument("--llm-s", type=float, default=0.0,
                   help="seconds per model proposal (0: no source proposals; ~88 s measured "
                   "for SmolLM2 on CPU cores, bench/results/2026-12-02-llm-campaigns-h200.txt)")
    p.add_argument("--trials-per-proposal", type=int, default=8)
    p.add_argument("--llm-servers-per-gpu", type=float, default=1.0)
    args = p.parse_args(argv)

    task_ms = args.task_ms
    if args.measure_dask:
        measured = measure_dask_task_ms()
        print(f"dask_task_overhead_ms: {measured:.2f} (no-op tasks, LocalCluster of 2 "
              f"processes, {os.cpu_count()} cores)")
        task_ms = measured if task_ms is None else task_ms
    costs = Costs(args.ask_ms, args.compile_ms, args.replay_ms, task_ms or 0.0,
                  args.cores_per_gpu, args.searches, args.llm_s, args.trials_per_proposal,
                  args.llm_servers_per_gpu)
    print(f"costs: {costs}")
    print("\n".join(table(costs)))
    one = stage_rates(costs, 1)
    print(f"candidates_per_s_1gpu_model: {min(one.values()):.0f} "
          f"(bottleneck: {min(one, key=lambda k: one[k])})")
    return 0 if all(math.isfinite(v) for v in one.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
