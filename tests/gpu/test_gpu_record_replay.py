"""Record every example with ``r3 record kernel``'s recorder, then replay it in a worker.

The recorded epilogue must match the example's numpy reference (within the buffer's declared
tolerance), and the original binary, the recorded source recompiled with NVRTC, and (where
the kernel is block-tunable) another block shape must all replay to the epilogue.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from r3tui.domain import Dim3, MeasurementStatus
from r3tui.replay.verify import compare_host

pytestmark = pytest.mark.gpu

EXAMPLES = ["stencil7", "spmv_csr", "reduce_sum", "sgemm", "nbody", "softmax", "ptr_struct"]
# Big enough to fill the GPU for a few microseconds, small enough for numpy references.
SCALE = {"nbody": 0.01, "sgemm": 0.05}
DEFAULT_SCALE = 0.1


def _us(m: object) -> float | None:
    t = getattr(m, "time", None)
    return None if t is None else t.median_s * 1e6


def _report(**row: object) -> None:
    """Append a row to $R3_GPU_REPORT (JSON lines) for bench/gpu_session.sh's table."""
    import json
    import os

    target = os.environ.get("R3_GPU_REPORT")
    if target:
        with open(target, "a") as f:
            f.write(json.dumps(row) + "\n")


def _record(catalog: ModuleType, recordings: dict[str, Path], tmp: Path, name: str) -> Path:
    from r3tui.record.kernel_recorder import RecordKernelRequest, record_kernel

    if name not in recordings:
        example = catalog.load_example(name)
        out = tmp / name
        record_kernel(RecordKernelRequest(
            source_path=example.kernel_path, kernel_name=example.kernel_name,
            inputs_path=example.inputs_path, out=out, seed=0,
            scale=SCALE.get(name, DEFAULT_SCALE),
        ))
        recordings[name] = out
    return recordings[name]


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_records_reference_and_replays(
    name: str, catalog: ModuleType, recordings: dict[str, Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    from r3tui.compile.base import CompileRequest, get_toolchain
    from r3tui.record.bundle import Bundle
    from r3tui.record.kernel_recorder import load_inputs
    from r3tui.replay import Candidate, ReplayWorker

    if name not in catalog.list_examples():
        pytest.skip(f"example {name} is not in this checkout")
    example = catalog.load_example(name)
    path = _record(catalog, recordings, tmp_path_factory.mktemp("rec"), name)
    bundle = Bundle.open(path, verify=True)
    m = bundle.manifest
    assert m.launch.baseline is not None and m.launch.baseline.median_s > 0

    # The recorded epilogue is what the reference computes from the same inputs.
    inputs = load_inputs(example.inputs_path, 0, SCALE.get(name, DEFAULT_SCALE))
    for buffer, expected in example.reference(inputs).items():
        alloc = m.allocation(buffer)
        expected = np.ascontiguousarray(expected, dtype=alloc.dtype)
        epilogue = bundle.blob(alloc.epilogue)[: expected.nbytes]
        result = compare_host(epilogue, expected.tobytes(), alloc.tolerance, alloc.dtype,
                              buffer=buffer)
        assert result.passed, f"{name}: recorded epilogue vs reference: {result.describe()}"

    with ReplayWorker(path, timeout_s=120) as worker:
        info = worker.start()
        original = worker.evaluate(Candidate(bundle.binary() or b"", m.kernel.entry_point))
        assert original.status is MeasurementStatus.OK, original.error_text
        assert original.verified and original.time is not None and original.time.n >= 5

        compiled = get_toolchain("nvrtc").compile(CompileRequest(
            source=bundle.source() or "", kernel_name=m.kernel.name, arch=info.arch,
            defines=m.kernel.defines,
        ))
        assert compiled.ok, compiled.log
        recompiled = worker.evaluate(Candidate.from_compiled(compiled))
        assert recompiled.status is MeasurementStatus.OK, recompiled.error_text
        assert recompiled.resources.registers is not None
        # the same binary at the same launch again: the stored result, at no GPU cost (a busy
        # fraction that sums the trials' replay walls counts it once)
        again = worker.evaluate(Candidate.from_compiled(compiled))
        assert again.time == recompiled.time and again.verified == recompiled.verified
        assert again.replay_wall_s is not None and recompiled.replay_wall_s is not None
        assert again.replay_wall_s < 0.1 * recompiled.replay_wall_s

        if m.launch.block_tunable and m.launch.work is not None:
            work, block = m.launch.work, m.launch.block
            if work.z > 1:
                other = Dim3(32, 4, 2) if block != Dim3(32, 4, 2) else Dim3(16, 8, 4)
            elif work.y > 1:
                other = Dim3(32, 8) if block != Dim3(32, 8) else Dim3(16, 16)
            else:
                other = Dim3(128) if block.x != 128 else Dim3(64)
            reshaped = worker.evaluate(Candidate.from_compiled(compiled, block=other))
            assert reshaped.status is MeasurementStatus.OK, (other, reshaped.error_text)
            _report(name=name, block=list(other.as_tuple()), median_us=_us(reshaped))
        _report(name=name, block=list(m.launch.block.as_tuple()),
                baseline_us=m.launch.baseline.median_s * 1e6, original_us=_us(original),
                recompiled_us=_us(recompiled), replay_wall_ms=(original.replay_wall_s or 0) * 1e3,
                samples=original.time.n, worker_start_s=info.startup_s,
                working_set_mb=m.working_set_bytes / 1e6, l2_flush=info.l2_flush)
    assert worker.restarts == 0


def test_ptr_struct_pointers_survive_replay_in_another_process(
    catalog: ModuleType, recordings: dict[str, Path], tmp_path_factory: pytest.TempPathFactory,
) -> None:
    import os
    import struct

    from r3tui.cuda.arena import ARENA_BASE
    from r3tui.record.bundle import Bundle
    from r3tui.replay import Candidate, ReplayWorker

    if "ptr_struct" not in catalog.list_examples():
        pytest.skip("example ptr_struct is not in this checkout")
    path = _record(catalog, recordings, tmp_path_factory.mktemp("rec"), "ptr_struct")
    bundle = Bundle.open(path)
    m = bundle.manifest
    table = bundle.blob(m.allocation("pairs").prologue)
    addresses = struct.unpack(f"<{len(table) // 8}Q", table)
    by_name = {a.name: a.address for a in m.allocations}
    assert all(ARENA_BASE <= a < ARENA_BASE + m.arena.size for a in addresses)
    assert addresses[0] == by_name["x2"] and addresses[1] == by_name["y2"]
    with ReplayWorker(path) as worker:
        result = worker.evaluate(Candidate(bundle.binary() or b"", m.kernel.entry_point))
        assert worker.stats()["pid"] != os.getpid()
    assert result.status is MeasurementStatus.OK and result.verified, result.error_text
    assert result.max_error == 0.0
