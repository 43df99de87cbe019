"""The "full application" baseline: a CUDA C++ program that contains the kernel.

This is what evaluating a candidate costs without record/replay (an OpenEvolve-style loop):
write the candidate into the application's source, rebuild it with nvcc, run it end to end —
process start, context creation, reading the inputs, host→device copies, the timed kernel
launches (CUDA events inside the program), the device→host copy of the results — and check
the results.  The generated program is plain CUDA C++; it reads its inputs from one binary
file so that every run does the I/O a real application does.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from r3tui.domain import Dim3
from r3tui.record.spec import Buffer, KernelInputs, PointerTable, Scalar

_CTYPES = {
    "int8": "signed char",
    "uint8": "unsigned char",
    "int16": "short",
    "uint16": "unsigned short",
    "int32": "int",
    "uint32": "unsigned int",
    "int64": "long long",
    "uint64": "unsigned long long",
    "float32": "float",
    "float64": "double",
}

L2_FLUSH_BYTES = 2 * 60 * 1024 * 1024  # twice the H200's L2, as the replay worker flushes

_TEMPLATE = r"""
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>

#include "{kernel_path}"

#define CHECK(call) do {{ cudaError_t e_ = (call); if (e_ != cudaSuccess) {{ \
    std::fprintf(stderr, "CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
    return 3; }} }} while (0)

int main(int argc, char** argv) {{
    if (argc < 4) {{ std::fprintf(stderr, "usage: app INPUTS OUTPUTS REPS\n"); return 2; }}
    const int reps = std::atoi(argv[3]);
    const int nbuf = {nbuf};
    const size_t data_bytes[] = {{ {data_bytes} }};
    const size_t alloc_bytes[] = {{ {alloc_bytes} }};
    std::vector<void*> dev(nbuf, nullptr);
    std::FILE* in = std::fopen(argv[1], "rb");
    if (!in) {{ std::perror(argv[1]); return 2; }}
    for (int i = 0; i < nbuf; ++i) {{
        std::vector<char> host(data_bytes[i]);
        if (data_bytes[i] && std::fread(host.data(), 1, data_bytes[i], in) != data_bytes[i]) {{
            std::fprintf(stderr, "short read\n"); return 2; }}
        CHECK(cudaMalloc(&dev[i], alloc_bytes[i] ? alloc_bytes[i] : 1));
        CHECK(cudaMemset(dev[i], 0, alloc_bytes[i]));
        CHECK(cudaMemcpy(dev[i], host.data(), data_bytes[i], cudaMemcpyHostToDevice));
    }}
    std::fclose(in);
{pointer_tables}
{scalars}
    void* args[] = {{ {arg_addresses} }};
    void* flush = nullptr;
    CHECK(cudaMalloc(&flush, {flush_bytes}ull));
    // the inputs the kernel overwrites are restored before each launch, as in replay
    std::vector<void*> pristine(nbuf, nullptr);
    for (int i = 0; i < nbuf; ++i) {{
        CHECK(cudaMalloc(&pristine[i], alloc_bytes[i] ? alloc_bytes[i] : 1));
        CHECK(cudaMemcpy(pristine[i], dev[i], alloc_bytes[i], cudaMemcpyDeviceToDevice));
    }}
    cudaEvent_t start, stop;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));
    dim3 grid({grid}), block({block});
    std::vector<float> times;
    for (int r = 0; r < reps + 3; ++r) {{
        for (int i = 0; i < nbuf; ++i)
            CHECK(cudaMemcpyAsync(dev[i], pristine[i], alloc_bytes[i], cudaMemcpyDeviceToDevice));
        CHECK(cudaMemsetAsync(flush, r & 0xff, {flush_bytes}ull));
        CHECK(cudaEventRecord(start));
        CHECK(cudaLaunchKernel((const void*){entry}, grid, block, args, {shared}, 0));
        CHECK(cudaEventRecord(stop));
        CHECK(cudaEventSynchronize(stop));
        CHECK(cudaGetLastError());
        float ms = 0.f;
        CHECK(cudaEventElapsedTime(&ms, start, stop));
        if (r >= 3) times.push_back(ms);
    }}
    // final state: restore once more and run once, so the outputs are one launch's result
    for (int i = 0; i < nbuf; ++i)
        CHECK(cudaMemcpy(dev[i], pristine[i], alloc_bytes[i], cudaMemcpyDeviceToDevice));
    CHECK(cudaLaunchKernel((const void*){entry}, grid, block, args, {shared}, 0));
    CHECK(cudaDeviceSynchronize());
    std::FILE* out = std::fopen(argv[2], "wb");
    if (!out) {{ std::perror(argv[2]); return 2; }}
    for (int i = 0; i < nbuf; ++i) {{
        std::vector<char> host(data_bytes[i]);
        CHECK(cudaMemcpy(host.data(), dev[i], data_bytes[i], cudaMemcpyDeviceToHost));
        std::fwrite(host.data(), 1, data_bytes[i], out);
    }}
    std::fclose(out);
    std::sort(times.begin(), times.end());
    std::printf("median_us %.3f\n", 1000.0 * times[times.size() / 2]);
    std::printf("min_us %.3f\n", 1000.0 * times.front());
    return 0;
}}
"""


@dataclass(frozen=True)
class AppRun:
    build_s: float
    run_s: float
    median_us: float
    min_us: float
    outputs: dict[str, bytes]


class ApplicationHarness:
    """Writes, builds and runs the baseline program for one example's inputs."""

    def __init__(self, workdir: Path, inputs: KernelInputs, entry: str) -> None:
        self.workdir = workdir
        self.inputs = inputs
        self.entry = entry
        workdir.mkdir(parents=True, exist_ok=True)
        self.buffers: list[Buffer | PointerTable] = [
            a for a in inputs.args if isinstance(a, Buffer | PointerTable)
        ]
        self._write_inputs()

    def _data(self, arg: Buffer | PointerTable) -> bytes:
        if isinstance(arg, Buffer):
            return np.ascontiguousarray(arg.data).tobytes()
        return bytes(8 * len(arg.targets))  # filled with device addresses by the program

    def _write_inputs(self) -> None:
        with (self.workdir / "inputs.bin").open("wb") as handle:
            for arg in self.buffers:
                handle.write(self._data(arg))

    def source(self, kernel_path: Path, block: Dim3 | None = None) -> str:
        index = {arg.name: i for i, arg in enumerate(self.buffers)}
        data_bytes = [len(self._data(a)) for a in self.buffers]
        alloc = [
            n + (a.pad_bytes if isinstance(a, Buffer) else 0)
            for n, a in zip(data_bytes, self.buffers, strict=True)
        ]
        tables, scalars, addresses = [], [], []
        for arg in self.inputs.args:
            if isinstance(arg, Scalar):
                ctype = _CTYPES[arg.dtype]
                scalars.append(f"    {ctype} s_{arg.name} = ({ctype})({arg.value!r});")
                addresses.append(f"&s_{arg.name}")
            else:
                addresses.append(f"&dev[{index[arg.name]}]")
            if isinstance(arg, PointerTable):
                targets = ", ".join(f"dev[{index[t]}]" for t in arg.targets)
                dst = f"dev[{index[arg.name]}]"
                copy = f"cudaMemcpy({dst}, table, sizeof(table), cudaMemcpyHostToDevice)"
                tables.append(f"    {{ void* table[] = {{ {targets} }}; CHECK({copy}); }}")
        shape = block or self.inputs.block
        grid = self.inputs.launch_grid(shape)
        return _TEMPLATE.format(
            kernel_path=kernel_path.resolve(),
            nbuf=len(self.buffers),
            data_bytes=", ".join(f"{n}ull" for n in data_bytes) or "0",
            alloc_bytes=", ".join(f"{n}ull" for n in alloc) or "0",
            pointer_tables="\n".join(tables),
            scalars="\n".join(scalars),
            arg_addresses=", ".join(addresses),
            flush_bytes=L2_FLUSH_BYTES,
            grid=", ".join(map(str, grid.as_tuple())),
            block=", ".join(map(str, shape.as_tuple())),
            shared=self.inputs.shared_mem_bytes,
            entry=self.entry,
        )

    def build_and_run(
        self,
        kernel_source: str,
        *,
        options: tuple[str, ...] = (),
        block: Dim3 | None = None,
        reps: int = 20,
        tag: str = "app",
    ) -> AppRun:
        """One candidate the slow way: rebuild the program, run it, read its outputs."""
        kernel_path = self.workdir / f"{tag}_kernel.cu"
        kernel_path.write_text(kernel_source)
        main_path = self.workdir / f"{tag}_main.cu"
        main_path.write_text(self.source(kernel_path, block))
        binary = self.workdir / tag
        defines = [f"-D{k}={v}" for k, v in self.inputs.defines.items()]
        started = time.perf_counter()
        subprocess.run(
            ["nvcc", "-O3", "-arch=sm_90", *defines, *options, "-o", str(binary), str(main_path)],
            check=True,
            capture_output=True,
            text=True,
        )
        built = time.perf_counter()
        outputs_path = self.workdir / f"{tag}_outputs.bin"
        result = subprocess.run(
            [str(binary), str(self.workdir / "inputs.bin"), str(outputs_path), str(reps)],
            check=True,
            capture_output=True,
            text=True,
        )
        raw = outputs_path.read_bytes()
        outputs: dict[str, bytes] = {}
        offset = 0
        for arg in self.buffers:
            size = len(self._data(arg))
            outputs[arg.name] = raw[offset : offset + size]
            offset += size
        finished = time.perf_counter()
        values = dict(line.split() for line in result.stdout.splitlines() if " " in line)
        return AppRun(
            build_s=built - started,
            run_s=finished - built,
            median_us=float(values["median_us"]),
            min_us=float(values["min_us"]),
            outputs=outputs,
        )
