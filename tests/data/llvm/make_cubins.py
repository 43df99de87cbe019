"""Compile example kernels with the llvm toolchain (clang → opt -passes → llc → ptxas) here,
for tests/gpu/test_gpu_llvm.py to replay on a GPU node that has no clang.

    python tests/data/llvm/make_cubins.py      # writes <example>-<n>.cubin and index.json
"""

from __future__ import annotations

import json
from pathlib import Path

from r3tui.compile.base import get_toolchain
from r3tui.compile.llvm import PIPELINES
from r3tui.domain import TrialConfig
from r3tui.engine import KernelSource, compile_request

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
EXAMPLES = {"stencil7": "stencil7", "reduce_sum": "reduce_sum", "softmax": "softmax"}


def main() -> int:
    toolchain = get_toolchain("llvm")
    index = []
    for example, kernel in EXAMPLES.items():
        source = KernelSource((REPO / "examples" / example / "kernel.cu").read_text(), kernel)
        for n, pipeline in enumerate(PIPELINES):
            config = TrialConfig(toolchain="llvm", pipeline=pipeline)
            compiled = toolchain.compile(compile_request(source, config, "sm_90"))
            if not compiled.ok or compiled.binary is None:
                raise SystemExit(f"{example} {pipeline}: {compiled.log[-2000:]}")
            name = f"{example}-{n}.cubin"
            (HERE / name).write_bytes(compiled.binary)
            index.append(
                {
                    "example": example,
                    "kernel": kernel,
                    "pipeline": pipeline,
                    "file": name,
                    "lowered_name": compiled.lowered_name,
                    "registers": compiled.resources.registers,
                    "toolchain_version": compiled.toolchain_version,
                }
            )
            print(f"{name}: {compiled.resources.registers} registers, {pipeline}")
    (HERE / "index.json").write_text(json.dumps(index, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
