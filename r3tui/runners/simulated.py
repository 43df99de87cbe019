"""A stand-in for a GPU where none runs: replays are answered from a table of real measurements.

This is a fake, named as one.  It exists so that a runner's whole path (compiles on real
toolchains, jobs sent to workers, results coming back as futures complete, workers lost and
jobs resubmitted) can run end to end on a machine without a GPU, CI included; the measurements
it returns are those an H200 gave for the same configurations (Kernel Tuner's simulation mode:
``tests/data/spaces/*.json``, :mod:`r3tui.search.simulation`).  The real path, the same runner
with :class:`~r3tui.runners.local.GpuReplayer`, is tested on the GPU.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from r3tui.domain import Measurement, MeasurementStatus

if TYPE_CHECKING:
    from r3tui.replay.worker import WorkerInfo
    from r3tui.runners.base import ReplayJob
    from r3tui.search.simulation import RecordedResult


@dataclass
class SimulatedReplayer:
    """Answers each job with the recorded result of its configuration's key; a key the table
    lacks is a crash (the table is the whole space, so a search never asks outside it).

    ``replay_s`` is slept per replay, so that a worker is busy for a while as a GPU would be."""

    table: Mapping[str, RecordedResult]
    gpu: str = "simulated GPU"
    arch: str = "sm_90"
    replay_s: float = 0.0
    replayed: list[str] = field(default_factory=list)  # keys, in order (for tests)

    def start(self) -> WorkerInfo:
        from r3tui.replay.worker import WorkerInfo

        return WorkerInfo(pid=0, gpu=self.gpu, arch=self.arch, driver_version=0,
                          startup_s=0.0, l2_flush=True)

    def evaluate(self, job: ReplayJob) -> Measurement:
        if self.replay_s:
            time.sleep(self.replay_s)
        self.replayed.append(job.key)
        found = self.table.get(job.key)
        if found is None:
            return Measurement(MeasurementStatus.CRASHED, binary_sha256=job.candidate.binary_sha256,
                               error_text=f"simulated replay: no recorded result for {job.key}")
        return replace(found.measurement(), binary_sha256=job.candidate.binary_sha256,
                       resources=job.candidate.resources)

    def interleaved(self, jobs: list[ReplayJob], rounds: int) -> list[list[float]]:
        out = []
        for job in jobs:
            found = self.table.get(job.key)
            if found is None or found.median_s is None:
                from r3tui.errors import GpuUnavailable

                raise GpuUnavailable(f"simulated re-timing: no recorded time for {job.key}")
            out.append([found.median_s] * rounds)
        return out

    def close(self) -> None:
        return None
