"""A kernel's resource usage, from the ptxas report in the compile log and from the cubin.

Both toolchains run ptxas with ``-v``; its report is the only place spill traffic appears (the
cubin records the stack frame, not how much of it is spills).  Registers, stack and static
shared memory come from the ptxas report when it is there and from the cubin otherwise (a log
can be missing or truncated); the unit tests check that the two agree.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from r3tui.compile.cubin import Cubin, CubinError
from r3tui.domain import ResourceUsage

# Hardware limits shared by every architecture CUDA 13 targets (sm_75 .. sm_121): 64 Ki
# registers per block, registers allocated per warp in units of 256, at most 1024 threads.
REGISTERS_PER_BLOCK = 65536
REGISTER_ALLOCATION_UNIT = 256
MAX_THREADS_PER_BLOCK = 1024
WARP_SIZE = 32

_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_PROPERTIES = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_CUMULATIVE = re.compile(r"(\d+) bytes cumulative stack size")
_SMEM = re.compile(r"(\d+) bytes smem")


@dataclass
class PtxasReport:
    """What ``ptxas -v`` printed about one function."""

    name: str
    registers: int | None = None
    stack_frame_bytes: int | None = None
    spill_stores_bytes: int | None = None
    spill_loads_bytes: int | None = None
    cumulative_stack_bytes: int | None = None
    shared_bytes: int | None = None
    lines: list[str] = field(default_factory=list)


def parse_ptxas_log(log: str) -> dict[str, PtxasReport]:
    """Per-function reports from a compile log (NVRTC prefixes the lines with ``ptxas``, nvcc
    indents them; both print the same text)."""
    reports: dict[str, PtxasReport] = {}
    current: PtxasReport | None = None
    for line in log.splitlines():
        match = _ENTRY.search(line) or _PROPERTIES.search(line)
        if match:
            name = match.group(1)
            current = reports.setdefault(name, PtxasReport(name))
            continue
        if current is None:
            continue
        frame = _FRAME.search(line)
        if frame:
            current.stack_frame_bytes = int(frame.group(1))
            current.spill_stores_bytes = int(frame.group(2))
            current.spill_loads_bytes = int(frame.group(3))
            current.lines.append(line.strip())
            continue
        used = _USED.search(line)
        if used:
            current.registers = int(used.group(1))
            cumulative = _CUMULATIVE.search(line)
            smem = _SMEM.search(line)
            # ptxas leaves out the stack and smem clauses when they are zero.
            current.cumulative_stack_bytes = int(cumulative.group(1)) if cumulative else 0
            current.shared_bytes = int(smem.group(1)) if smem else 0
            current.lines.append(line.strip())
    return reports


def max_threads_per_block(registers: int | None, launch_bound: int | None = None) -> int | None:
    """The largest block that can launch with ``registers`` per thread (and under
    ``__launch_bounds__``), as the driver computes it: whole warps, each warp's registers
    rounded up to the allocation unit, within the per-block register file."""
    if registers is None:
        return launch_bound
    per_warp = -(-max(registers, 1) * WARP_SIZE // REGISTER_ALLOCATION_UNIT)
    per_warp *= REGISTER_ALLOCATION_UNIT
    limit = min(MAX_THREADS_PER_BLOCK, REGISTERS_PER_BLOCK // per_warp * WARP_SIZE)
    if launch_bound is not None:
        limit = min(limit, launch_bound)
    return limit


def kernel_resources(cubin: bytes | None, lowered_name: str | None, log: str) -> ResourceUsage:
    """Resource usage of ``lowered_name`` from the ptxas report in ``log`` and the cubin."""
    if lowered_name is None:
        return ResourceUsage()
    report = parse_ptxas_log(log).get(lowered_name, PtxasReport(lowered_name))
    registers = report.registers
    frame = report.stack_frame_bytes
    stack = report.cumulative_stack_bytes
    shared = report.shared_bytes
    launch_bound: int | None = None
    if cubin is not None:
        try:
            attrs = Cubin.parse(cubin).kernel(lowered_name)
        except (CubinError, KeyError):
            attrs = None
        if attrs is not None:
            registers = registers if registers is not None else attrs.registers
            frame = frame if frame is not None else attrs.frame_bytes
            stack = stack if stack is not None else attrs.min_stack_bytes
            shared = shared if shared is not None else attrs.shared_bytes
            bounds = [b for b in (attrs.max_threads, attrs.required_threads) if b]
            if bounds:
                launch_bound = min(x * y * z for x, y, z in bounds)
    # The stack a launch needs: the kernel's own frame plus what its non-inlined callees use.
    known = [v for v in (frame, stack) if v is not None]
    return ResourceUsage(
        registers=registers,
        spill_stores_bytes=report.spill_stores_bytes,
        spill_loads_bytes=report.spill_loads_bytes,
        shared_mem_bytes=shared,
        local_mem_bytes=max(known) if known else None,
        max_threads_per_block=max_threads_per_block(registers, launch_bound),
    )
