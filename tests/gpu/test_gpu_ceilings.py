"""bench/ceilings.py on the GPU: the ceilings bench/campaigns.py puts tuned kernels against
(issue #19), and cuBLAS timed on sgemm's own matrices computing what the kernel computes."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def bench() -> None:
    for path in (BENCH, BENCH.parent / "examples"):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))


def test_copy_and_fma_ceilings_are_those_of_a_datacenter_gpu(bench: None) -> None:
    from ceilings import ceilings

    bandwidth, flops = ceilings()
    # an H100 or H200 copies at a few TB/s and runs fp32 FMAs at tens of TFLOP/s; an error
    # in the byte or FLOP count shows as a factor of 2 or more outside these
    assert 1e12 < bandwidth < 10e12, bandwidth
    assert 10e12 < flops < 200e12, flops


def test_cublas_computes_sgemms_result_on_its_matrices(bench: None) -> None:
    pytest.importorskip("torch")
    import campaigns
    from ceilings import cublas_sgemm, sgemm_operands

    _, inputs = campaigns.example_work(["sgemm"], 0.01)  # 441 x 441 x 441
    seconds, how, result = cublas_sgemm(inputs, runs=5)
    assert seconds is not None and 0 < seconds < 0.01, how
    assert "TF32 off" in how
    a, b, c, alpha, beta = sgemm_operands(inputs)
    expected = alpha * (a.astype(np.float64) @ b.astype(np.float64)) + beta * c
    # the kernel's own tolerance: 2e-5 of the largest |C|; TF32 would be off by ~6e-4
    assert np.max(np.abs(result - expected)) <= 2e-5 * np.max(np.abs(expected))
