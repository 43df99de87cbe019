"""Where a campaign's candidates are evaluated: compile jobs on CPUs, replay jobs on GPUs.

The engine submits jobs to a :class:`Runner` and gets futures back; the runner decides where
they run.  :class:`LocalRunner` (the default) uses this machine: the compile pool on its cores
and one replay worker per GPU.  :class:`~r3tui.runners.dask_runner.DaskRunner` spreads them
over a ``dask.distributed`` cluster, GPU workers holding the recording resident.  The simulated
replayer (:mod:`r3tui.runners.simulated`) stands in for a GPU where none runs.

Imports point down: ``engine → runners → replay, record → compile``.
"""

from r3tui.runners.base import (
    Replayer,
    ReplayJob,
    Runner,
    RunnerLoad,
    RunnerStats,
    WorkerLoad,
)
from r3tui.runners.local import GpuReplayer, LocalRunner

__all__ = [
    "GpuReplayer",
    "LocalRunner",
    "ReplayJob",
    "Replayer",
    "Runner",
    "RunnerLoad",
    "RunnerStats",
    "WorkerLoad",
]
