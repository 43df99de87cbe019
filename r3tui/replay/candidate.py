"""What the replay worker evaluates: a compiled binary and how to launch it."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from r3tui.domain import Dim3, ResourceUsage

if TYPE_CHECKING:
    from r3tui.compile.base import CompiledKernel
    from r3tui.record.manifest import CheckLaunch, Manifest


@dataclass(frozen=True)
class Candidate:
    """One kernel binary and launch configuration to replay against a recording.

    ``None`` launch fields mean "as recorded"; ``arg_bytes`` None means the recorded
    argument bytes (the usual case: variants keep the kernel's signature).
    """

    binary: bytes
    lowered_name: str
    grid: Dim3 | None = None
    block: Dim3 | None = None
    shared_mem_bytes: int | None = None
    arg_bytes: bytes | None = None
    resources: ResourceUsage = field(default_factory=ResourceUsage)
    compile_time_s: float | None = None
    compile_log: str | None = None
    label: str | None = None  # for logs only
    # elements each thread covers along x, y and z (`// r3: work_per_thread`): the grid derived
    # from the work size has each extent divided by it (1: one element a thread, as recorded;
    # a single number is along x)
    work_divisor: int | tuple[int, int, int] = 1
    # threads that share each element along x, y and z (`// r3: threads_per_item`): the grid
    # derived from the work size has each extent multiplied by it
    work_multiplier: tuple[int, int, int] = (1, 1, 1)
    # The compiler's code hash (r3tui.compile ignores ptxas's command-line note), so binaries
    # that differ only in how they were asked for are measured once.
    code_sha256: str | None = None

    @property
    def binary_sha256(self) -> str:
        return self.code_sha256 or hashlib.sha256(self.binary).hexdigest()

    def launch_key(self, manifest: Manifest) -> tuple[object, ...]:
        """Identical binaries launched identically are measured once."""
        grid, block, shm, args = self.resolve(manifest)
        return (self.binary_sha256, self.lowered_name, grid.as_tuple(), block.as_tuple(), shm,
                hashlib.sha256(args).hexdigest())

    def resolve(self, manifest: Manifest) -> tuple[Dim3, Dim3, int, bytes]:
        """Grid, block, dynamic shared memory and argument bytes with the recording's defaults.

        A new block shape re-derives the grid from the recorded work size, when there is one.
        """
        rec = manifest.launch
        block = self.block or rec.block
        if self.grid is not None:
            grid = self.grid
        elif (self.block is not None or self.rescales) and rec.work is not None:
            grid = block.grid_for(self._covered(rec.work))
        else:
            grid = rec.grid
        shm = rec.shared_mem_bytes if self.shared_mem_bytes is None else self.shared_mem_bytes
        args = manifest.arg_bytes() if self.arg_bytes is None else self.arg_bytes
        return grid, block, shm, args

    def resolve_check(self, check: CheckLaunch) -> tuple[Dim3, Dim3, int, bytes] | None:
        """The same for a check launch: its own work size, scalars and buffers.

        None where the candidate fixes what a check launch cannot follow: its own argument
        bytes, or an explicit grid without a work size to derive another from.
        """
        rec = check.launch
        if self.arg_bytes is not None or (self.grid is not None and rec.work is None):
            return None
        block = self.block or rec.block
        grid = (block.grid_for(self._covered(rec.work))
                if (self.block or self.grid or self.rescales) and rec.work else rec.grid)
        shm = rec.shared_mem_bytes if self.shared_mem_bytes is None else self.shared_mem_bytes
        return grid, block, shm, check.arg_bytes()

    @property
    def divisors(self) -> tuple[int, int, int]:
        """:attr:`work_divisor` along x, y and z."""
        if isinstance(self.work_divisor, int):
            return (self.work_divisor, 1, 1)
        return self.work_divisor

    @property
    def rescales(self) -> bool:
        """Whether the grid is not one thread an element of the recorded work."""
        return any(d > 1 for d in (*self.divisors, *self.work_multiplier))

    def _covered(self, work: Dim3) -> Dim3:
        """The threads ``work`` needs when each covers ``work_divisor`` elements and
        ``work_multiplier`` threads share each element."""
        if not self.rescales:
            return work
        (x, y, z), (mx, my, mz) = self.divisors, self.work_multiplier
        return Dim3(-(-work.x * mx // x), -(-work.y * my // y), -(-work.z * mz // z))

    @classmethod
    def from_compiled(cls, compiled: CompiledKernel, *, block: Dim3 | None = None,
                      grid: Dim3 | None = None, shared_mem_bytes: int | None = None,
                      label: str | None = None,
                      work_divisor: int | tuple[int, int, int] = 1,
                      work_multiplier: tuple[int, int, int] = (1, 1, 1)) -> Candidate:
        if not compiled.ok or compiled.binary is None or compiled.lowered_name is None:
            raise ValueError("a candidate needs a kernel that compiled")
        return cls(
            binary=compiled.binary,
            lowered_name=compiled.lowered_name,
            grid=grid,
            block=block,
            shared_mem_bytes=shared_mem_bytes,
            resources=compiled.resources,
            compile_time_s=compiled.seconds,
            compile_log=compiled.log or None,
            label=label,
            code_sha256=compiled.binary_sha256,
            work_divisor=work_divisor,
            work_multiplier=work_multiplier,
        )
