"""replay layer of R³: the GPU worker process, timing and verification.

``from r3tui.replay import ReplayWorker, Candidate`` loads no CUDA library; the worker
process does.
"""

from r3tui.replay.candidate import Candidate
from r3tui.replay.worker import ReplayWorker, WorkerInfo

__all__ = ["Candidate", "ReplayWorker", "WorkerInfo"]
