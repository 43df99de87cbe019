"""The vocabulary of R³ as plain typed values.

Everything here is importable without a GPU, a model or the optimizer: no module in this
file imports numpy, pycuda, llama_cpp, skopt or the database.  The database layer maps
these values to rows; the engine passes them between search, remix, compile and replay.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any


class VariantOrigin(StrEnum):
    """Where a kernel source variant came from."""

    SEED = "seed"  # the original kernel as recorded
    LLM = "llm"  # rewritten by a language model
    RULE = "rule"  # rewritten by a deterministic source operator
    CROSSOVER = "crossover"  # combined from two parents
    REPAIR = "repair"  # the model's fix of its own change that did not compile or verify


class VariantStatus(StrEnum):
    """Where a variant stands in the validation funnel apply → compile → verify → tune."""

    PENDING = "pending"
    APPLY_FAILED = "apply_failed"
    COMPILE_FAILED = "compile_failed"
    WRONG_RESULT = "wrong_result"
    CRASHED = "crashed"
    # refused without being run: host code, device-heap state, clock reads (docs/verification.md)
    UNSAFE = "unsafe"
    VERIFIED = "verified"  # correct, not faster than its parent
    IMPROVED = "improved"  # correct and faster than its parent


class MeasurementStatus(StrEnum):
    """Outcome of evaluating one candidate; failures are values, never exceptions."""

    OK = "ok"
    COMPILE_ERROR = "compile_error"
    LAUNCH_ERROR = "launch_error"
    WRONG_RESULT = "wrong_result"
    TIMEOUT = "timeout"
    CRASHED = "crashed"
    # refused before compiling (host code, heap, clocks) or after replay (state that cannot
    # be reset between launches); error_text says why (docs/verification.md)
    UNSAFE = "unsafe"


class CampaignStatus(StrEnum):
    CREATED = "created"
    RUNNING = "running"
    PAUSED = "paused"
    FINISHED = "finished"
    STOPPED = "stopped"  # stopped by the user before its budget ran out
    CRASHED = "crashed"  # the engine died; resumable
    FAILED = "failed"  # the original does not compile or replay: nothing to search


class Norm(StrEnum):
    """How a tolerance compares a replayed buffer with its recorded epilogue."""

    MAX_ABS = "max-abs"  # max |a-b| <= atol + rtol*max|b|
    L2 = "l2"  # ||a-b||_2 <= atol + rtol*||b||_2
    LINF = "linf"  # elementwise |a-b| <= atol + rtol*|b|


@dataclass(frozen=True)
class Dim3:
    x: int = 1
    y: int = 1
    z: int = 1

    def __post_init__(self) -> None:
        for axis, value in (("x", self.x), ("y", self.y), ("z", self.z)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"Dim3.{axis} must be a positive integer, got {value!r}")

    @property
    def volume(self) -> int:
        return self.x * self.y * self.z

    def as_tuple(self) -> tuple[int, int, int]:
        return (self.x, self.y, self.z)

    @classmethod
    def of(cls, value: Dim3 | int | tuple[int, ...] | list[int]) -> Dim3:
        if isinstance(value, Dim3):
            return value
        if isinstance(value, int):
            return cls(value)
        parts = [int(v) for v in value]
        if not 1 <= len(parts) <= 3:
            raise ValueError(f"a launch dimension has 1 to 3 components, got {value!r}")
        return cls(*parts)

    @classmethod
    def parse(cls, text: str) -> Dim3:
        """Parse ``"256"``, ``"32,8"`` or ``"32,8,1"``."""
        try:
            return cls.of([int(p) for p in text.replace("x", ",").split(",") if p.strip()])
        except ValueError as exc:
            raise ValueError(f"bad launch dimension {text!r}: expected X[,Y[,Z]]") from exc

    def grid_for(self, work: Dim3) -> Dim3:
        """The grid that covers ``work`` threads with blocks of this shape."""
        return Dim3(
            math.ceil(work.x / self.x), math.ceil(work.y / self.y), math.ceil(work.z / self.z)
        )


@dataclass(frozen=True)
class Tolerance:
    """A per-buffer verification policy; ``None`` where one is expected means exact bytes."""

    rtol: float = 0.0
    atol: float = 0.0
    norm: Norm = Norm.MAX_ABS

    def __post_init__(self) -> None:
        if self.rtol < 0 or self.atol < 0 or math.isnan(self.rtol) or math.isnan(self.atol):
            raise ValueError("tolerances must be non-negative numbers")


@dataclass(frozen=True)
class KernelLaunch:
    """One (kernel, grid, block, dynamic shared memory) as the application launched it."""

    kernel_name: str
    grid: Dim3
    block: Dim3
    shared_mem_bytes: int = 0
    count: int = 1  # how many times the application launched this configuration
    total_time_s: float | None = None  # device time of all those launches, where measured

    @property
    def key(self) -> tuple[str, tuple[int, int, int], tuple[int, int, int], int]:
        grid, block = self.grid.as_tuple(), self.block.as_tuple()
        return (self.kernel_name, grid, block, self.shared_mem_bytes)


@dataclass(frozen=True)
class Recording:
    """A recording bundle as the experiment database knows it."""

    bundle_path: str
    sha256: str  # of the bundle's manifest, which names every blob by its own hash
    kernel_name: str
    launch: KernelLaunch
    id: int | None = None
    created_at: datetime | None = None


@dataclass(frozen=True)
class ResourceUsage:
    """What the compiler reports for one kernel."""

    registers: int | None = None
    spill_stores_bytes: int | None = None
    spill_loads_bytes: int | None = None
    shared_mem_bytes: int | None = None  # static shared memory
    local_mem_bytes: int | None = None  # stack frame / local memory per thread
    max_threads_per_block: int | None = None

    @property
    def spills_bytes(self) -> int | None:
        if self.spill_stores_bytes is None and self.spill_loads_bytes is None:
            return None
        return (self.spill_stores_bytes or 0) + (self.spill_loads_bytes or 0)


@dataclass(frozen=True)
class TrialConfig:
    """One point of the inner search: how a variant is compiled and launched."""

    toolchain: str = "nvrtc"
    options: tuple[str, ...] = ()  # compiler flags as passed to the toolchain
    block: Dim3 | None = None  # None: the recorded block shape
    tunables: Mapping[str, int | str] = field(default_factory=dict)  # become -D NAME=VALUE
    launch_bounds: tuple[int, int] | None = None  # (max threads, min blocks per SM)
    pipeline: str | None = None  # LLVM pass pipeline for the llvm toolchain
    # Dynamic shared memory bytes at launch (None: the recorded size); set by the search where
    # the kernel declares `// r3: shared EXPR`.
    shared_mem_bytes: int | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "toolchain": self.toolchain,
            "options": list(self.options),
            "block": list(self.block.as_tuple()) if self.block else None,
            "tunables": dict(self.tunables),
            "launch_bounds": list(self.launch_bounds) if self.launch_bounds else None,
            "pipeline": self.pipeline,
        }
        if self.shared_mem_bytes is not None:  # absent = recorded, as in rows written before
            data["shared_mem_bytes"] = self.shared_mem_bytes
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TrialConfig:
        block = data.get("block")
        bounds = data.get("launch_bounds")
        shared = data.get("shared_mem_bytes")
        return cls(
            toolchain=str(data.get("toolchain", "nvrtc")),
            options=tuple(data.get("options", ())),
            block=Dim3.of(block) if block else None,
            tunables=dict(data.get("tunables", {})),
            launch_bounds=(int(bounds[0]), int(bounds[1])) if bounds else None,
            pipeline=data.get("pipeline"),
            shared_mem_bytes=None if shared is None else int(shared),
        )


@dataclass(frozen=True)
class TimeStats:
    """Kernel time over repeated timed launches, in seconds."""

    median_s: float
    min_s: float
    iqr_s: float
    n: int

    @classmethod
    def from_samples(cls, samples: list[float]) -> TimeStats:
        if not samples:
            raise ValueError("no timing samples")
        ordered = sorted(samples)
        n = len(ordered)

        def quantile(q: float) -> float:
            pos = q * (n - 1)
            lo = math.floor(pos)
            hi = min(lo + 1, n - 1)
            return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)

        return cls(quantile(0.5), ordered[0], quantile(0.75) - quantile(0.25), n)


@dataclass(frozen=True)
class LaunchTimes:
    """Launches of one launch configuration inside an application and their device time."""

    count: int
    time_s: float
    timed: int  # how many of them were timed (one whose events failed is only counted)

    @property
    def mean_s(self) -> float | None:
        return self.time_s / self.timed if self.timed else None

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> LaunchTimes | None:
        """``{"count", "time_s", "timed"}`` as ``recording.json`` keeps them (None: none)."""
        if data is None:
            return None
        return cls(int(data["count"]), float(data["time_s"]), int(data["timed"]))


# how far (a fraction) the other launches' mean device time may be from the replayed
# launch's before they are said to do other work (other_launches_differ)
OTHER_WORK_SPREAD = 0.10


def other_launches_differ(count: int, time_s: float,
                          same: LaunchTimes | None) -> tuple[float, float] | None:
    """For a configuration's ``count`` launches taking ``time_s`` in all, of which ``same``
    had the replayed launch's arguments: ``(others' mean, same's mean)`` device time a launch
    where they are more than :data:`OTHER_WORK_SPREAD` apart (the other launches do other
    work: sizes, offsets or steps the arguments set); None where they are not, or where the
    recording cannot say."""
    if same is None or same.mean_s is None or count <= same.count:
        return None
    others = (time_s - same.time_s) / (count - same.count)
    if others <= 0 or abs(others / same.mean_s - 1) <= OTHER_WORK_SPREAD:
        return None
    return others, same.mean_s


@dataclass(frozen=True)
class Measurement:
    """Everything learned by evaluating one candidate (variant x config)."""

    status: MeasurementStatus
    time: TimeStats | None = None
    verified: bool | None = None  # None where verification did not run
    max_error: float | None = None  # worst buffer's error under its policy (0 when exact)
    resources: ResourceUsage = field(default_factory=ResourceUsage)
    compile_time_s: float | None = None
    replay_wall_s: float | None = None  # wall time of restore+time+verify in the worker
    binary_sha256: str | None = None
    error_text: str | None = None
    compile_log: str | None = None
    # what the replay learned of the recording itself (an order-dependent float result and
    # the tolerance it is verified with), for the campaign to say once
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.status is MeasurementStatus.OK


@dataclass(frozen=True)
class LLMCall:
    """One prompt and its response, with everything needed to replay a search without a model."""

    model_path: str
    model_sha256: str
    prompt: str
    response: str
    sampling: Mapping[str, Any]  # temperature, top_p, max_tokens, grammar name, ...
    seed: int | None
    tokens_in: int
    tokens_out: int
    latency_s: float
    backend: str = "llama_cpp"


@dataclass(frozen=True)
class Campaign:
    name: str
    recording_id: int
    seed: int
    settings: Mapping[str, Any] = field(default_factory=dict)
    provenance: Mapping[str, Any] = field(default_factory=dict)  # GPU, driver, toolchains
    status: CampaignStatus = CampaignStatus.CREATED
    id: int | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None


@dataclass(frozen=True)
class Variant:
    campaign_id: int
    source: str
    origin: VariantOrigin
    parent_id: int | None = None
    diff: str | None = None  # unified diff against the parent
    operator: str | None = None  # transformation / recipe that produced it
    status: VariantStatus = VariantStatus.PENDING
    island: int = 0
    features: Mapping[str, Any] = field(default_factory=dict)  # MAP-Elites descriptors
    status_reason: str | None = None
    llm_call_id: int | None = None
    id: int | None = None


@dataclass(frozen=True)
class EliteCell:
    campaign_id: int
    island: int
    cell_key: str  # e.g. "regs=2|smem=1|family=tiling"
    variant_id: int
    fitness_s: float  # best median time of the elite
