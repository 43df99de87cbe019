"""What the GPU reaches in the same run as a benchmark, to put tuned kernels against: a
device-to-device copy (bytes/s, read and write counted), a chain of fp32 FMAs (FLOP/s), and
cuBLAS SGEMM on sgemm's own matrices (through torch: ``C = alpha*A@B + beta*C``, fp32 with
TF32 off, as the kernel computes it).  Every timing is CUDA events around the work alone,
median of its runs; before each cuBLAS run L2 is overwritten, as the replay does before each
timed launch (METHOD.md: cold, repeatable timing).  Used by bench/inner_live.py and
bench/campaigns.py; needs a GPU (tests/gpu/test_gpu_ceilings.py)."""

from __future__ import annotations

import statistics
import struct
from typing import Any

from campaign_summary import Ceilings

FMA_KERNEL = r"""
extern "C" __global__ void fma_peak(float* out, float seed, int iters) {
    float a = seed + threadIdx.x, b = a * 0.5f, c = a * 0.25f, d = a * 0.125f;
    float e = a + 1.f, f = b + 1.f, g = c + 1.f, h = d + 1.f;
    for (int i = 0; i < iters; ++i) {
        a = fmaf(a, 0.9999f, 0.0001f); b = fmaf(b, 0.9999f, 0.0001f);
        c = fmaf(c, 0.9999f, 0.0001f); d = fmaf(d, 0.9999f, 0.0001f);
        e = fmaf(e, 0.9999f, 0.0001f); f = fmaf(f, 0.9999f, 0.0001f);
        g = fmaf(g, 0.9999f, 0.0001f); h = fmaf(h, 0.9999f, 0.0001f);
    }
    out[blockIdx.x * blockDim.x + threadIdx.x] = a + b + c + d + e + f + g + h;
}
"""


def ceilings() -> tuple[float, float]:
    """(copy bytes/s counting read+write, fp32 FLOP/s) measured with CUDA events."""
    from r3tui.compile.base import CompileRequest, get_toolchain
    from r3tui.cuda import driver as cu
    from r3tui.replay.timing import EventTimer

    ctx = cu.PrimaryContext(0)
    info = cu.device_info(ctx.device)
    drv = cu.driver()
    stream = cu.check(
        drv.cuStreamCreate(drv.CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate"
    )
    timer = EventTimer(stream)
    size = 2 << 30
    src = int(cu.check(drv.cuMemAlloc(size), "cuMemAlloc"))
    dst = int(cu.check(drv.cuMemAlloc(size), "cuMemAlloc"))
    try:
        cu.check(drv.cuMemsetD8(src, 7, size), "cuMemsetD8")

        def copy() -> None:
            cu.check(drv.cuMemcpyDtoDAsync(dst, src, size, stream), "cuMemcpyDtoDAsync")

        copy_s = statistics.median(timer.time(copy) for _ in range(10))
        compiled = get_toolchain("nvrtc").compile(
            CompileRequest(FMA_KERNEL, "fma_peak", arch=info.arch)
        )
        assert compiled.ok and compiled.binary and compiled.lowered_name, compiled.log
        function = cu.get_function(cu.load_module(compiled.binary), compiled.lowered_name)
        blocks, threads, iters = info.sm_count * 8, 256, 20000
        args = struct.pack("<Qfi", dst, 1.0, iters)
        params = cu.KernelParams(args, cu.param_layout(function))

        def fma() -> None:
            cu.launch(function, (blocks, 1, 1), (threads, 1, 1), 0, stream, params)

        fma_s = statistics.median(timer.time(fma) for _ in range(10))
    finally:
        drv.cuMemFree(src)
        drv.cuMemFree(dst)
    return 2 * size / copy_s, blocks * threads * iters * 8 * 2 / fma_s


def sgemm_operands(inputs: Any) -> tuple[Any, Any, Any, float, float]:
    """(A, B, C, alpha, beta) of sgemm's recorded inputs (a KernelInputs), as numpy."""
    from r3tui.record.spec import Buffer, Scalar

    buffers = {a.name: a.data for a in inputs.args if isinstance(a, Buffer)}
    scalars = {a.name: a.value for a in inputs.args if isinstance(a, Scalar)}
    return (buffers["A"], buffers["B"], buffers["C"], float(scalars["alpha"]),
            float(scalars["beta"]))


def cublas_sgemm(inputs: Any, runs: int = 20) -> tuple[float | None, str, Any]:
    """cuBLAS SGEMM on ``inputs``' matrices: (median seconds or None, one line how or why
    not, the result of one run as numpy or None)."""
    try:
        import torch  # type: ignore[import-not-found]
    except ImportError:
        return None, "not timed: torch (for cuBLAS) is not importable here", None
    if not torch.cuda.is_available():
        return None, "not timed: torch sees no CUDA device", None
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 arithmetic, as the kernel's
    a, b, c, alpha, beta = sgemm_operands(inputs)
    dev = torch.device("cuda")
    ta, tb, tc = (torch.from_numpy(x).to(dev) for x in (a, b, c))
    out = torch.empty_like(tc)
    l2 = torch.cuda.get_device_properties(dev).L2_cache_size
    scratch = torch.empty(max(2 * l2, 1 << 20), dtype=torch.uint8, device=dev)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for run in range(runs + 3):  # the first 3 warm up (handle, kernel choice, clocks)
        scratch.fill_(run & 0xFF)
        start.record()
        torch.addmm(tc, ta, tb, beta=beta, alpha=alpha, out=out)
        end.record()
        end.synchronize()
        if run >= 3:
            times.append(start.elapsed_time(end) / 1e3)
    how = (f"torch {torch.__version__} addmm (cuBLAS, TF32 off), {runs} runs, L2 overwritten "
           "before each")
    return statistics.median(times), how, out.cpu().numpy()


def measure(sgemm_inputs: Any | None) -> Ceilings:
    """The ceilings of this GPU, cuBLAS on ``sgemm_inputs`` where given."""
    bandwidth, flops = ceilings()
    cublas_s, how = None, "not timed: sgemm is not among the examples"
    if sgemm_inputs is not None:
        cublas_s, how, _ = cublas_sgemm(sgemm_inputs)
    return Ceilings(bandwidth, flops, cublas_s, how)
