"""An order-dependent float result replays under a tolerance sized from the runs themselves.

tests/gpu/apps/atomic_sum_app.cu adds per-block sums into one float with atomicAdd, as
HeCBench jacobi does; on the H200 its replays did not match the recording byte for byte and
tune-app had nothing to search from.  Recorded here, its bundle types the buffers from the
kernel's signature.  The recorded binary then replays as verified: either exactly (the blocks
happened to run in the recorded order) or under the tolerance ResidentBundle derived from
two more runs, which the measurement's notes name.  A kernel that drops one block in 64
still fails.  The CPU side: tests/unit/test_order_dependence.py.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from r3tui.cli import main
from tests.gpu.app_build import build_app

pytestmark = pytest.mark.gpu

APP = Path(__file__).resolve().parent / "apps" / "atomic_sum_app.cu"

_KERNEL = APP.read_text().split("int main()")[0].split("#include <vector>\n")[1]
# the same kernel, leaving out every 64th block's share
DROPS_A_BLOCK = _KERNEL.replace("__global__ void sum_squares(",
                                'extern "C" __global__ void sum_squares_wrong(').replace(
    "if (threadIdx.x == 0) atomicAdd", "if (threadIdx.x == 0 && blockIdx.x % 64 != 7) atomicAdd")


def test_an_atomic_float_sum_replays_verified_and_a_wrong_one_fails(tmp_path: Path) -> None:
    from r3tui.compile.base import CompileRequest, get_toolchain
    from r3tui.domain import MeasurementStatus
    from r3tui.record.bundle import Bundle
    from r3tui.replay import Candidate, ReplayWorker

    assert "sum_squares_wrong" in DROPS_A_BLOCK and "% 64 != 7" in DROPS_A_BLOCK
    exe = build_app(APP, tmp_path / "atomic_sum_app", "static")
    out = tmp_path / "rec"
    with contextlib.redirect_stderr(io.StringIO()):
        code = main(["--db", str(tmp_path / "r3.sqlite"), "record", "--out", str(out),
                     "--timeout", "300", "--", str(exe)])
    assert code == 0
    data = json.loads((out / "recording.json").read_text())
    (kernel,) = data["kernels"]
    config = kernel["configs"][0]
    assert config["replayable"], config
    bundle = Bundle.open(out / config["bundle"], verify=True)
    assert sorted(str(a.dtype) for a in bundle.manifest.allocations) == ["float32", "float32"]
    binary = bundle.binary()
    assert binary is not None
    with ReplayWorker(bundle.path, timeout_s=120) as worker:
        original = worker.evaluate(Candidate(binary, bundle.manifest.kernel.entry_point),
                                   timed=False)
        assert original.status is MeasurementStatus.OK and original.verified, original
        if original.max_error:  # not the recorded bits: the tolerance is the probe's
            assert any("order-dependent floating-point result" in n for n in original.notes)
        print(f"original: max error {original.max_error}, notes {original.notes}")
        wrong = get_toolchain("nvrtc").compile(CompileRequest(
            source=DROPS_A_BLOCK, kernel_name="sum_squares_wrong", arch="sm_90"))
        assert wrong.ok, wrong.log
        result = worker.evaluate(Candidate.from_compiled(wrong), timed=False)
        assert result.status is MeasurementStatus.WRONG_RESULT, result
