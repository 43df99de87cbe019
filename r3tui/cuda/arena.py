"""The recording arena: device memory at a fixed virtual address (CUDA VMM).

Every recorded allocation lives inside one virtual range reserved at :data:`ARENA_BASE`, so
a replay in another process can map the same addresses again and every pointer the kernel
finds -- in its arguments, in structs, in linked data -- stays valid (Mneme's method).

Physical memory is mapped on demand in granularity-sized chunks behind a bump allocator, so
reserving a large range costs nothing until it is used.  Mappings belong to the process and
the device, not to a context: kernels launched from pycuda's context (autoinit's or the
primary one) see them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from r3tui.cuda import driver as cu
from r3tui.errors import ArenaUnavailable

ARENA_BASE = 0x153940000000
DEFAULT_RESERVE = 64 << 30  # virtual only; physical memory follows use
ALIGNMENT = 256
_MIN_CHUNK = 64 << 20  # map at least this much at a time: fewer, larger cuMemCreate calls
# Mapped, zero-filled bytes the recording interposer leaves free before and after each
# allocation (its R3_DEFAULT_GUARD; `r3 record --guard-bytes`): a read a few elements out of
# bounds, harmless where the driver's allocator has memory mapped around a buffer, must not
# fault in the arena.  Not a multiple of the VMM granularity (2 MiB on the H200): the arena is
# one contiguous mapping, a guard is only a gap in it, so 64 KiB (8192 doubles either side)
# costs 128 KiB per allocation where a granule would cost 4 MiB.
GUARD_BYTES = 64 << 10


def _round_up(value: int, multiple: int) -> int:
    return (value + multiple - 1) // multiple * multiple


@dataclass
class ArenaBlock:
    """One allocation inside the arena."""

    name: str
    address: int
    size: int
    live: bool = True
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def end(self) -> int:
        return self.address + self.size


# Reservations made by this process, base -> size; a base is used by one Arena at a time.
_RESERVED: dict[int, int] = {}
_IN_USE: set[int] = set()


def _reserve(base: int, size: int, granularity: int) -> int:
    """Reserve ``size`` bytes at exactly ``base`` (once per process); returns the size held."""
    if base in _IN_USE:
        raise ArenaUnavailable(
            f"the recording arena at {base:#x} is already in use in this process",
            hint="close the other recording or replay first",
        )
    held = _RESERVED.get(base)
    if held is not None and held >= size:
        _IN_USE.add(base)
        return held
    if held is not None:  # a freed range is not handed back at the same base (Arena.close)
        raise ArenaUnavailable(
            f"the recording arena at {base:#x} holds {held >> 20} MiB in this process; "
            f"{size >> 20} MiB are needed",
            hint="record or replay this bundle in a fresh process",
        )
    drv = cu.driver()
    result = drv.cuMemAddressReserve(size, granularity, base, 0)
    if result[0] != drv.CUresult.CUDA_SUCCESS:
        raise ArenaUnavailable(
            f"cannot reserve {size >> 20} MiB of device address space at {base:#x}: "
            f"{cu.error_from(result[0], 'cuMemAddressReserve')}"
        )
    got = int(result[1])
    if got != base:
        drv.cuMemAddressFree(result[1], size)
        raise ArenaUnavailable(
            f"the driver placed the recording arena at {got:#x}, not {base:#x}: another "
            "allocation holds that range in this process",
            hint="record and replay in a fresh process",
        )
    _RESERVED[base] = size
    _IN_USE.add(base)
    return size


class Arena:
    """A fixed-address VMM range with a bump allocator.

    ``device`` is the CUDA device ordinal.  A context must be current (the caller's, or
    :class:`~r3tui.cuda.driver.PrimaryContext`).
    """

    def __init__(self, reserve: int = DEFAULT_RESERVE, *, base: int = ARENA_BASE,
                 device: int = 0, alignment: int = ALIGNMENT) -> None:
        """``reserve`` bytes of address space at ``base``, at least :data:`DEFAULT_RESERVE`
        (a recording does not know how much it will need, and on the H200 the driver placed
        a reservation of a few MiB away from the base every time, where 64 GiB held)."""
        drv = cu.driver()
        self.device = cu.init_device(device)
        self.alignment = alignment
        prop = drv.CUmemAllocationProp()
        prop.type = drv.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = drv.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = int(device)
        self._prop = prop
        gran_flag = drv.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED
        self.granularity = int(cu.check(
            drv.cuMemGetAllocationGranularity(prop, gran_flag), "cuMemGetAllocationGranularity"
        ))
        want = _round_up(max(reserve, DEFAULT_RESERVE), self.granularity)
        self.reserved = _reserve(base, want, self.granularity)
        self.base = base
        self._chunks: list[tuple[int, int, Any]] = []  # (address, size, handle)
        self.mapped = 0  # bytes mapped from base
        self.top = 0  # bump offset from base
        self.blocks: list[ArenaBlock] = []
        self._closed = False

    # -- mapping -------------------------------------------------------------------------
    def _map_until(self, end_offset: int) -> None:
        if end_offset <= self.mapped:
            return
        if end_offset > self.reserved:
            raise ArenaUnavailable(
                f"the recording arena is full: {end_offset >> 20} MiB needed, "
                f"{self.reserved >> 20} MiB reserved"
            )
        drv = cu.driver()
        want = max(end_offset - self.mapped, min(_MIN_CHUNK, self.reserved - self.mapped))
        size = min(_round_up(want, self.granularity), self.reserved - self.mapped)
        address = self.base + self.mapped
        handle = cu.check(drv.cuMemCreate(size, self._prop, 0), "cuMemCreate")
        try:
            cu.check(drv.cuMemMap(address, size, 0, handle, 0), "cuMemMap")
        except cu.CudaError:
            drv.cuMemRelease(handle)
            raise
        access = drv.CUmemAccessDesc()
        access.location.type = drv.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        access.location.id = self._prop.location.id
        access.flags = drv.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        cu.check(drv.cuMemSetAccess(address, size, [access], 1), "cuMemSetAccess")
        self._chunks.append((address, size, handle))
        self.mapped += size

    def map_extent(self, size: int) -> None:
        """Map physical memory for ``[base, base+size)`` (replay maps the recorded extent)."""
        self._map_until(size)

    # -- allocation ----------------------------------------------------------------------
    def allocate(self, size: int, name: str | None = None, *, alignment: int | None = None
                 ) -> ArenaBlock:
        align = alignment or self.alignment
        offset = _round_up(self.top, align)
        self._map_until(offset + max(size, 1))
        block = ArenaBlock(name or f"alloc{len(self.blocks)}", self.base + offset, size)
        self.top = offset + max(size, 1)
        self.blocks.append(block)
        return block

    def place(self, name: str, address: int, size: int) -> ArenaBlock:
        """Claim a recorded allocation at its recorded address (replay)."""
        if address < self.base or address + size > self.base + self.reserved:
            raise ArenaUnavailable(f"allocation {name} at {address:#x} lies outside the arena")
        self._map_until(address + size - self.base)
        block = ArenaBlock(name, address, size)
        self.top = max(self.top, address + size - self.base)
        self.blocks.append(block)
        return block

    def free(self, block: ArenaBlock) -> None:
        """Mark a block dead; a bump allocator never reuses its memory within a recording."""
        block.live = False

    def live_blocks(self) -> list[ArenaBlock]:
        return [b for b in self.blocks if b.live]

    def contains(self, address: int) -> bool:
        return self.base <= address < self.base + self.top

    def block_at(self, address: int) -> ArenaBlock | None:
        """The live block holding ``address`` (the newest one if a dead block overlapped)."""
        for b in reversed(self.blocks):
            if b.live and b.address <= address < b.end:
                return b
        return None

    @property
    def used(self) -> int:
        """Bytes from ``base`` to the end of the last allocation, rounded to the granularity."""
        return _round_up(max(self.top, 1), self.granularity)

    def close(self) -> None:
        """Unmap and release the physical memory; the caller makes sure no kernel uses it.

        The virtual range stays reserved for the life of the process: once freed, the
        driver was seen not to hand the same address back to a later reservation in the
        same process (H200, driver 580), so a second recording would lose its base.
        """
        if self._closed:
            return
        self._closed = True
        drv = cu.driver()
        for address, size, handle in reversed(self._chunks):
            drv.cuMemUnmap(address, size)
            drv.cuMemRelease(handle)
        self._chunks.clear()
        _IN_USE.discard(self.base)

    def __enter__(self) -> Arena:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
