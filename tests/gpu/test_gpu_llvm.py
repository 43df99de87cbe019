"""Kernels built by the llvm toolchain (clang → opt -passes=PIPELINE → llc → ptxas) replay
correctly on the GPU.  The GPU node has no clang, so the cubins are compiled on the CPU
machine by tests/data/llvm/make_cubins.py (every pipeline the search offers) and replayed
here against fresh recordings of the same examples."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data" / "llvm"
INDEX = json.loads((DATA / "index.json").read_text())


@pytest.mark.parametrize("example", sorted({row["example"] for row in INDEX}))
def test_every_llvm_pipeline_replays_to_the_recorded_epilogue(example: str, tmp_path: Path) -> None:
    from r3tui.domain import MeasurementStatus
    from r3tui.record.kernel_recorder import RecordKernelRequest, record_kernel
    from r3tui.replay.candidate import Candidate
    from r3tui.replay.worker import ReplayWorker

    rows = [row for row in INDEX if row["example"] == example]
    ex = REPO / "examples" / example
    bundle = tmp_path / f"{example}.r3b"
    record_kernel(
        RecordKernelRequest(
            ex / "kernel.cu", rows[0]["kernel"], ex / "inputs.py", bundle, seed=2, scale=0.25
        )
    )
    report = os.environ.get("R3_GPU_REPORT")
    with ReplayWorker(bundle, timeout_s=60) as worker:
        worker.start()
        for row in rows:
            candidate = Candidate(
                (DATA / row["file"]).read_bytes(), row["lowered_name"], label=row["pipeline"]
            )
            measured = worker.evaluate(candidate)
            assert measured.status is MeasurementStatus.OK, (row["pipeline"], measured.error_text)
            assert measured.verified is True
            assert measured.time is not None and measured.time.median_s > 0
            if report:
                with Path(report).with_suffix(".llvm.jsonl").open("a") as handle:
                    handle.write(
                        json.dumps(
                            {
                                "name": f"llvm-{example}",
                                "pipeline": row["pipeline"][:40],
                                "median_us": measured.time.median_s * 1e6,
                            }
                        )
                        + "\n"
                    )
