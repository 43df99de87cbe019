"""Every rule's variants of the examples replay to the recorded epilogue on the GPU.

Each example is recorded fresh; each rule that applies to it (tests/unit/test_remix_rules.py
checks the same variants compile on the CPU) is compiled with NVRTC and evaluated against that
recording, at the recorded block, and for a tunable the rule declares, at each of its values
(an unroll factor of 1 and of 16 both replay; a grid-stride loop at 1 and at 16 elements a
thread, with a grid 16 times smaller).  Issue #19: "each transformation's variants of
the examples replay to the recorded epilogue".
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = ("reduce_sum", "softmax", "sgemm", "stencil7", "spmv_csr", "nbody")


@pytest.mark.parametrize("example", EXAMPLES)
def test_every_rule_variant_replays_to_the_recorded_epilogue(example: str,
                                                             tmp_path: Path) -> None:
    from r3tui.compile.base import CompileRequest, get_toolchain
    from r3tui.domain import MeasurementStatus
    from r3tui.record.bundle import Bundle
    from r3tui.record.kernel_recorder import RecordKernelRequest, record_kernel
    from r3tui.remix.rules import RULES, apply_rule
    from r3tui.replay.candidate import Candidate
    from r3tui.replay.worker import ReplayWorker
    from r3tui.search.source import (
        grid_scaling,
        parse_tunables,
        requirements_hold,
        shared_bytes_at,
    )

    ex = REPO / "examples" / example
    source = (ex / "kernel.cu").read_text()
    bundle_path = tmp_path / f"{example}.r3b"
    record_kernel(RecordKernelRequest(ex / "kernel.cu", example, ex / "inputs.py", bundle_path,
                                      seed=2, scale=0.25))
    block = Bundle.open(bundle_path).manifest.launch.block
    nvrtc = get_toolchain("nvrtc")
    ran = []
    tiled: list[tuple[tuple[tuple[str, str], ...], int | None]] = []
    with ReplayWorker(bundle_path, timeout_s=60) as worker:
        worker.start()
        for rule in sorted(RULES):
            made = apply_rule(rule, source, example, random.Random(0))
            if not made.ok or made.source is None:
                continue
            tunables = [t for t in parse_tunables(made.source) if t.name.startswith("R3_")]
            settings: list[tuple[tuple[str, str], ...]] = [()]
            for t in tunables:  # the smallest value and the largest the recorded block takes
                # (a split's threads of an element must divide the block's x extent)
                fit = [v for v in t.values if requirements_hold(
                    made.source, block, {t.name: v} if isinstance(v, int) else {})]
                settings += [((t.name, str(v)),) for v in (fit[0], fit[-1])]
            if len(tunables) > 1:  # a coarsened tile: every axis divided at once, by 2 (8 x 8
                # at stencil7's recorded 8x8x8 block asks 210 registers a thread: too many to
                # launch, which the search meets as a launch error like any other)
                settings.append(tuple((t.name, str(t.values[1])) for t in tunables))
            for defines in settings:
                compiled = nvrtc.compile(CompileRequest(made.source, example, defines=defines))
                assert compiled.ok, (rule, defines, compiled.log[:400])
                # a grid-stride or coarsened variant launches a grid divided by its
                # elements per thread (along each axis it declares), a split one a grid
                # multiplied by the threads that share an element
                divisor, multiplier = scaling = grid_scaling(made.source, dict(defines))
                # a tiled variant launches with the dynamic shared memory it declares
                shared_bytes = shared_bytes_at(made.source, block,
                                               {name: int(value) for name, value in defines})
                measured = worker.evaluate(
                    Candidate.from_compiled(compiled, block=block, work_divisor=divisor,
                                            work_multiplier=multiplier,
                                            shared_mem_bytes=shared_bytes), timed=False)
                assert measured.status is MeasurementStatus.OK, (rule, defines,
                                                                 measured.error_text)
                assert measured.verified is True
                ran.append((rule, defines, scaling))
                if rule == "tile_shared":
                    tiled.append((defines, shared_bytes))
        if example in ("sgemm", "nbody"):  # register blocking with tiles: coarsened, tiled
            axes = ("R3_CF_X", "R3_CF_Y") if example == "sgemm" else ("R3_CF_X",)
            coarse = next(m.source for seed in range(40)
                          if (m := apply_rule("coarsen", source, example,
                                              random.Random(seed))).source
                          and all(a in m.source for a in axes))
            both = apply_rule("tile_shared", coarse, example, random.Random(0))
            assert both.ok and both.source is not None, both.reason
            # one tile in flight, then two (cp.async into a second buffer), then two with
            # each thread's outputs along x neighbours (where a tile lies along x)
            layouts = [(), (("R3_STAGES", "2"),)]
            if "R3_X_CONTIGUOUS" in both.source:
                layouts.append((("R3_STAGES", "2"), ("R3_X_CONTIGUOUS", "1")))
            for (factor, tile), more in [(p, m) for p in ((2, 16), (4, 32)) for m in layouts]:
                defines = (*((a, str(factor)) for a in axes), ("R3_TILE", str(tile)), *more)
                compiled = nvrtc.compile(CompileRequest(both.source, example, defines=defines))
                assert compiled.ok, (defines, compiled.log[:400])
                divisor, multiplier = scaling = grid_scaling(both.source, dict(defines))
                shared_bytes = shared_bytes_at(both.source, block,
                                               {name: int(value) for name, value in defines})
                assert shared_bytes
                measured = worker.evaluate(
                    Candidate.from_compiled(compiled, block=block, work_divisor=divisor,
                                            work_multiplier=multiplier,
                                            shared_mem_bytes=shared_bytes), timed=False)
                assert measured.status is MeasurementStatus.OK, (defines, measured.error_text)
                assert measured.verified is True
                ran.append(("coarsen+tile_shared", defines, scaling))
        if example == "softmax":  # all three of its loops vectorized, one after the other
            text = source
            for step in range(3):
                vectorized = apply_rule("vector_access", text, example, random.Random(step))
                assert vectorized.source is not None, vectorized
                text = vectorized.source
            assert text.count("reinterpret_cast<const float4*>(xr)") == 3
            compiled = nvrtc.compile(CompileRequest(text, example))
            measured = worker.evaluate(Candidate.from_compiled(compiled, block=block),
                                       timed=False)
            assert measured.status is MeasurementStatus.OK, measured.error_text
            ran.append(("vector_access x3", (), ((1, 1, 1), (1, 1, 1))))
    print(f"{example}: {len(ran)} variants replayed: {ran}")
    assert ran  # every example has at least one rule that applies
    if example in ("spmv_csr", "nbody"):  # a grid 16 times smaller covers every element
        assert any(rule == "grid_stride" and scaled[0] == (16, 1, 1)
                   for rule, _d, scaled in ran)
    if example in ("sgemm", "stencil7", "spmv_csr", "nbody"):  # 8 elements a thread, jammed
        assert any(rule == "coarsen" and 8 in scaled[0] for rule, _d, scaled in ran)
    if example == "stencil7":  # 16 points a thread along one axis, the column in registers
        assert any(rule == "stream_axis" and 16 in scaled[0] for rule, _d, scaled in ran)
    if example == "reduce_sum":  # 256 elements summed a thread, the same total
        assert any(rule == "strided_accumulate" and scaled[0] == (256, 1, 1)
                   for rule, _d, scaled in ran)
    if example in ("sgemm", "spmv_csr", "nbody"):  # threads an element, shuffled together:
        # 32 (16 for sgemm's recorded 16x16 block)
        most = 16 if example == "sgemm" else 32
        assert any(rule == "split_loop" and scaled[1] == (most, 1, 1)
                   for rule, _d, scaled in ran)
    if example in ("sgemm", "nbody"):  # their loops' shared reads staged, 256 iterations a
        # tile (sgemm's 16x16 block: 32 KiB of tiles)
        assert any(d == (("R3_TILE", "256"),) and b for d, b in tiled), tiled
