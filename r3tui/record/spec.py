"""What a standalone kernel needs to be recorded: its arguments and launch configuration.

An inputs file (``r3 record kernel SOURCE.cu --kernel NAME --inputs gen.py``) defines::

    def make_inputs(rng: numpy.random.Generator) -> KernelInputs: ...

Buffers are host arrays copied into the recording arena before the original kernel runs
once; the kernel's writes become the epilogue.  Argument order is the kernel's parameter
order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from r3tui.domain import Dim3, Tolerance

if TYPE_CHECKING:
    import numpy as np

# The scalar kinds a kernel parameter can have, with their numpy dtype names.
SCALAR_DTYPES: dict[str, str] = {
    "int8": "int8",
    "uint8": "uint8",
    "int16": "int16",
    "uint16": "uint16",
    "int32": "int32",
    "uint32": "uint32",
    "int64": "int64",
    "uint64": "uint64",
    "float32": "float32",
    "float64": "float64",
}


@dataclass
class Buffer:
    """A device allocation, passed to the kernel as a pointer to its first element."""

    name: str
    data: np.ndarray  # initial contents (host); never all zeros for inputs
    tolerance: Tolerance | None = None  # None: the epilogue must match byte for byte
    # Extra bytes allocated past ``data`` (zero-filled): room a kernel may write into.
    pad_bytes: int = 0


@dataclass
class Scalar:
    """A parameter passed by value."""

    name: str
    value: int | float
    dtype: str  # a key of SCALAR_DTYPES

    def __post_init__(self) -> None:
        if self.dtype not in SCALAR_DTYPES:
            raise ValueError(f"scalar {self.name!r}: unknown dtype {self.dtype!r}")


@dataclass
class PointerTable:
    """A device buffer holding the device addresses of other buffers (a struct of pointers).

    Passed to the kernel as a pointer, so the kernel follows pointers stored in memory; this
    is what the fixed-address arena keeps valid on replay.
    """

    name: str
    targets: list[str]  # names of Buffers, in order; each becomes one 8-byte address


Argument = Buffer | Scalar | PointerTable


@dataclass
class KernelInputs:
    """Arguments and launch configuration for one recorded launch."""

    args: list[Argument]
    block: Dim3
    grid: Dim3 | None = None  # None: derived from ``work`` and ``block``
    work: Dim3 | None = None  # threads of work; the grid that covers it follows the block
    shared_mem_bytes: int = 0  # dynamic shared memory
    # Whether a different block shape keeps the kernel correct when the grid is re-derived
    # from ``work`` (false for kernels that hard-code their block size).
    block_tunable: bool = True
    defines: dict[str, str] = field(default_factory=dict)  # -D NAME=VALUE for the original

    def __post_init__(self) -> None:
        if self.grid is None and self.work is None:
            raise ValueError("KernelInputs needs a grid or a work size")
        names = [a.name for a in self.args]
        if len(set(names)) != len(names):
            raise ValueError(f"argument names must be unique: {names}")
        buffers = {a.name for a in self.args if isinstance(a, Buffer)}
        for arg in self.args:
            if isinstance(arg, PointerTable):
                missing = [t for t in arg.targets if t not in buffers]
                if missing:
                    raise ValueError(f"pointer table {arg.name!r} names unknown buffers {missing}")

    def launch_grid(self, block: Dim3 | None = None) -> Dim3:
        """The grid for ``block`` (default: the recorded block)."""
        shape = block or self.block
        if self.work is not None:
            return shape.grid_for(self.work)
        assert self.grid is not None
        return self.grid
