"""The index rules' variants of kernels in the older C style replay to the recorded epilogue
on the GPU (the CPU runs of tests/unit/test_remix_older_kernels.py, on the device): a bezier-like
kernel (index assigned after its declaration, a macro type, a pure helper) coarsened and
made a grid-stride loop, and a cfd-like kernel that never bounds its index, coarsened for exact
grids.  Each kernel is recorded fresh from an inputs file written here."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.unit.test_remix_older_kernels import CURVE, UNCHECKED

pytestmark = pytest.mark.gpu

CURVE_INPUTS = '''
import numpy as np
from r3tui.domain import Dim3
from r3tui.record.spec import Buffer, KernelInputs, Scalar


def make_inputs(rng, scale=1.0):
    nc, nu, nv = 8, 1000, 16
    ctrl = rng.uniform(-1.0, 1.0, size=(nc, 3))
    out = np.full((nu * nv, 3), -9.0)
    return KernelInputs(args=[Buffer("ctrl", ctrl), Buffer("out", out), Scalar("nc", nc, "int32"),
                              Scalar("nu", nu, "int32"), Scalar("nv", nv, "int32")],
                        block=Dim3(64), work=Dim3(nu))
'''

UNCHECKED_INPUTS = '''
import numpy as np
from r3tui.domain import Dim3
from r3tui.record.spec import Buffer, KernelInputs, Scalar


def make_inputs(rng, scale=1.0):
    nelr = 128 * 8 * 24  # the host pads the work to the block: every factor divides it
    variables = rng.uniform(0.5, 2.0, size=4 * nelr).astype(np.float32)
    factors = np.full(nelr, -1.0, dtype=np.float32)
    return KernelInputs(args=[Scalar("nelr", nelr, "int32"), Buffer("variables", variables),
                              Buffer("factors", factors)],
                        block=Dim3(128), work=Dim3(nelr))
'''


@pytest.mark.parametrize(("kernel", "source", "inputs", "rules"), [
    ("curve", CURVE, CURVE_INPUTS, ("coarsen", "grid_stride")),
    ("step_factor", UNCHECKED, UNCHECKED_INPUTS, ("coarsen",)),
])
def test_the_variants_replay_to_the_recorded_epilogue(
        kernel: str, source: str, inputs: str, rules: tuple[str, ...], tmp_path: Path) -> None:
    from r3tui.compile.base import CompileRequest, get_toolchain
    from r3tui.domain import MeasurementStatus
    from r3tui.engine.inner_loop import exact_axes
    from r3tui.record.bundle import Bundle
    from r3tui.record.kernel_recorder import RecordKernelRequest, record_kernel
    from r3tui.remix.rules import apply_rule
    from r3tui.replay.candidate import Candidate
    from r3tui.replay.worker import ReplayWorker
    from r3tui.search.source import grid_scaling, parse_tunables

    # C linkage, as the examples have: the recorder and replay name the kernel plainly
    source = source.replace(f"__global__ void {kernel}(", f'extern "C" __global__ void {kernel}(')
    assert 'extern "C"' in source
    (tmp_path / "kernel.cu").write_text(source)
    (tmp_path / "inputs.py").write_text(inputs)
    bundle_path = tmp_path / f"{kernel}.r3b"
    record_kernel(RecordKernelRequest(tmp_path / "kernel.cu", kernel, tmp_path / "inputs.py",
                                      bundle_path, seed=3))
    manifest = Bundle.open(bundle_path).manifest
    block, work = manifest.launch.block, manifest.launch.work
    assert work is not None
    nvrtc = get_toolchain("nvrtc")
    ran = []
    with ReplayWorker(bundle_path, timeout_s=60) as worker:
        worker.start()
        for rule in rules:
            made = apply_rule(rule, source, kernel, random.Random(0))
            assert made.ok and made.source is not None, (rule, made.reason)
            if kernel == "step_factor":
                assert exact_axes(made.source, kernel) == ("x",)
            (tunable,) = [t for t in parse_tunables(made.source) if t.name.startswith("R3_")]
            for value in tunable.values:
                defines = ((tunable.name, str(value)),)
                divisor, multiplier = grid_scaling(made.source, dict(defines))
                if kernel == "step_factor":  # an exact grid only
                    assert work.x % (block.x * divisor[0]) == 0
                compiled = nvrtc.compile(CompileRequest(made.source, kernel, defines=defines))
                assert compiled.ok, (rule, defines, compiled.log[:400])
                measured = worker.evaluate(
                    Candidate.from_compiled(compiled, block=block, work_divisor=divisor,
                                            work_multiplier=multiplier), timed=False)
                assert measured.status is MeasurementStatus.OK, (rule, defines,
                                                                 measured.error_text)
                assert measured.verified is True, (rule, defines)
                ran.append((rule, value))
    assert len(ran) == sum(4 if r == "coarsen" else 5 for r in rules)
