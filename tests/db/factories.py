"""Domain values for database tests (real values, nothing faked: the DB stores them as is)."""

from __future__ import annotations

import hashlib

from sqlalchemy.orm import Session

from db import repository as repo
from r3tui.domain import (
    Campaign,
    Dim3,
    KernelLaunch,
    Measurement,
    MeasurementStatus,
    Recording,
    ResourceUsage,
    TimeStats,
    TrialConfig,
    Variant,
    VariantOrigin,
)

SEED_SOURCE = """extern "C" __global__ void stencil(const double* in, double* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i > 0 && i < n - 1) out[i] = (in[i - 1] + in[i] + in[i + 1]) / 3.0;
}
"""


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def recording(name: str = "stencil", tag: str = "a") -> Recording:
    launch = KernelLaunch(
        kernel_name=name,
        grid=Dim3(8, 256, 256),
        block=Dim3(32, 1, 1),
        shared_mem_bytes=128,
        count=3,
        total_time_s=3.1e-4,
    )
    return Recording(
        bundle_path=f"/data/recordings/{name}-{tag}",
        sha256=sha(name + tag),
        kernel_name=name,
        launch=launch,
    )


def manifest(name: str = "stencil") -> dict[str, object]:
    return {"format": 1, "kernel": name, "blobs": {"prologue/0": sha("p"), "epilogue/0": sha("e")}}


def ok(median_s: float, *, n: int = 20) -> Measurement:
    return Measurement(
        status=MeasurementStatus.OK,
        time=TimeStats(median_s, median_s * 0.98, median_s * 0.01, n),
        verified=True,
        max_error=0.0,
        resources=ResourceUsage(
            registers=32,
            spill_stores_bytes=0,
            spill_loads_bytes=4,
            shared_mem_bytes=0,
            local_mem_bytes=0,
            max_threads_per_block=1024,
        ),
        compile_time_s=0.011,
        replay_wall_s=0.02,
        binary_sha256=sha(f"cubin{median_s}"),
    )


def failed(status: MeasurementStatus = MeasurementStatus.COMPILE_ERROR) -> Measurement:
    return Measurement(
        status=status,
        compile_time_s=0.01,
        error_text='error: identifier "tile" is undefined',
        compile_log='kernel.cu(3): error: identifier "tile" is undefined\n1 error detected',
    )


def config(block: int = 128, unroll: int = 4) -> TrialConfig:
    return TrialConfig(
        toolchain="nvrtc",
        options=("-O3", "--use_fast_math"),
        block=Dim3(block, 1, 1),
        tunables={"UNROLL": unroll},
        launch_bounds=(block, 2),
    )


def seed_campaign(s: Session, *, name: str = "c1", tag: str = "a") -> tuple[int, int, int]:
    """A recording, a campaign and its seed variant; returns their ids."""
    rid = repo.add_recording(s, recording(tag=tag), manifest())
    cid = repo.create_campaign(
        s,
        Campaign(
            name=name,
            recording_id=rid,
            seed=7,
            settings={"budget": 100},
            provenance={"gpu": {"name": "NVIDIA H200", "sm": 90}, "driver": "580.65"},
        ),
    )
    seed = Variant(campaign_id=cid, source=SEED_SOURCE, origin=VariantOrigin.SEED)
    vid = repo.add_variant(s, seed)
    return rid, cid, vid
