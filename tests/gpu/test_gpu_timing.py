"""The replay's event timer on the GPU: gated (the stream waits on a word of mapped host
memory until the host has submitted the events and the launch), as the recording interposer
times an application's launches."""

from __future__ import annotations

import statistics

import pytest

pytestmark = pytest.mark.gpu

EMPTY = 'extern "C" __global__ void empty(int* p) { if (p && threadIdx.x == 1024) *p = 1; }'


def test_the_gate_keeps_the_hosts_launch_latency_out_of_a_kernels_time() -> None:
    from r3tui.compile.base import CompileRequest
    from r3tui.compile.nvrtc import NvrtcToolchain
    from r3tui.cuda import driver as cu
    from r3tui.replay.timing import EventTimer

    ctx = cu.PrimaryContext(0)
    try:
        drv = cu.driver()
        arch = cu.device_info(ctx.device).arch
        compiled = NvrtcToolchain().compile(CompileRequest(EMPTY, "empty", arch=arch))
        assert compiled.ok and compiled.binary is not None, compiled.log
        function = cu.get_function(cu.load_module(compiled.binary), compiled.lowered_name)
        stream = cu.check(drv.cuStreamCreate(drv.CUstream_flags.CU_STREAM_NON_BLOCKING),
                          "cuStreamCreate")
        params = cu.KernelParams(bytes(8), cu.param_layout(function))

        def launch() -> None:
            cu.launch(function, (1, 1, 1), (32, 1, 1), 0, stream, params)

        def median_us(timer: EventTimer) -> float:
            for _ in range(20):
                timer.time(launch)
            return statistics.median(timer.time(launch) for _ in range(200)) * 1e6

        gated, plain = EventTimer(stream), EventTimer(stream, gated=False)
        assert gated.gated and not plain.gated
        with_gate, without = median_us(gated), median_us(plain)
        # an empty kernel takes a few microseconds of the GPU; ungated, the host's submission
        # of the launch (through cuda.bindings, several microseconds) counts as well
        assert 0 < with_gate < without, (with_gate, without)
        gated.close()
        plain.close()
        drv.cuStreamDestroy(stream)
    finally:
        ctx.release()
