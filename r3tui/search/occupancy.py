"""Theoretical occupancy of a launch: resident warps per SM over the SM's maximum.

Used to describe variants for the MAP-Elites archive and in the profile a mutation prompt shows
the model.  The limits are those of sm_90 (H100/H200); the allocation granularities follow the
CUDA occupancy rules (registers per warp in units of 256, shared memory in 128-byte units plus
the 1 KiB each block reserves).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SMLimits:
    max_warps: int = 64
    max_blocks: int = 32
    registers: int = 65536
    register_unit: int = 256  # registers are allocated per warp in this many
    max_registers_per_thread: int = 255
    shared_bytes: int = 228 * 1024
    shared_unit: int = 128
    reserved_shared_per_block: int = 1024
    warp_size: int = 32


SM90 = SMLimits()


def _round_up(value: int, unit: int) -> int:
    return -(-value // unit) * unit


def occupancy(
    threads_per_block: int,
    registers_per_thread: int | None,
    shared_bytes_per_block: int = 0,
    limits: SMLimits = SM90,
) -> float | None:
    """Fraction of the SM's warp slots a kernel can fill, or None when it cannot run at all
    (or the register count is unknown)."""
    if registers_per_thread is None or threads_per_block <= 0:
        return None
    if registers_per_thread > limits.max_registers_per_thread:
        return None
    warps = -(-threads_per_block // limits.warp_size)
    by_warps = limits.max_warps // warps
    regs_per_warp = _round_up(max(registers_per_thread, 1) * limits.warp_size, limits.register_unit)
    by_registers = limits.registers // (regs_per_warp * warps)
    shared = (
        _round_up(shared_bytes_per_block, limits.shared_unit) + limits.reserved_shared_per_block
    )
    by_shared = limits.shared_bytes // shared
    blocks = min(limits.max_blocks, by_warps, by_registers, by_shared)
    if blocks <= 0:
        return None
    return min(1.0, blocks * warps / limits.max_warps)
