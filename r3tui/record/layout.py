"""From a :class:`~r3tui.record.spec.KernelInputs` to arena allocations and argument bytes.

Pure and GPU-free: the recorder asks the arena for addresses, the driver for the kernel's
parameter layout (``cuFuncGetParamInfo``), and this module for everything in between, so
the packing is unit-tested on the CPU.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from r3tui.analysis.text import split_top_level
from r3tui.domain import Tolerance
from r3tui.errors import RecordingError
from r3tui.record.manifest import BUFFER_DTYPES, ParamInfo, ParamKind
from r3tui.record.spec import SCALAR_DTYPES, Buffer, KernelInputs, PointerTable, Scalar

POINTER_SIZE = 8


@dataclass(frozen=True)
class PlannedAllocation:
    """One buffer or pointer table to place in the arena, with its initial contents."""

    name: str
    size: int
    tolerance: Tolerance | None
    dtype: str | None
    shape: tuple[int, ...] | None
    buffer: Buffer | None = None
    table: PointerTable | None = None

    def contents(self, addresses: Mapping[str, int]) -> bytes:
        """The bytes copied into the arena before the launch."""
        if self.table is not None:
            return struct.pack(f"<{len(self.table.targets)}Q",
                               *(addresses[t] for t in self.table.targets))
        assert self.buffer is not None
        data = np.ascontiguousarray(self.buffer.data).tobytes()
        return data + bytes(self.buffer.pad_bytes)


def plan_allocations(inputs: KernelInputs) -> list[PlannedAllocation]:
    plans: list[PlannedAllocation] = []
    for arg in inputs.args:
        if isinstance(arg, Buffer):
            data = np.asarray(arg.data)
            dtype = data.dtype.name if data.dtype.name in BUFFER_DTYPES else None
            if arg.tolerance is not None and dtype is None:
                raise RecordingError(
                    f"buffer {arg.name!r} declares a tolerance but its dtype {data.dtype} "
                    f"is not one of {sorted(BUFFER_DTYPES)}"
                )
            if arg.pad_bytes < 0:
                raise RecordingError(f"buffer {arg.name!r}: pad_bytes must be >= 0")
            plans.append(PlannedAllocation(
                arg.name, data.nbytes + arg.pad_bytes, arg.tolerance, dtype,
                tuple(int(s) for s in data.shape), buffer=arg,
            ))
        elif isinstance(arg, PointerTable):
            plans.append(PlannedAllocation(
                arg.name, POINTER_SIZE * len(arg.targets), None, "uint64",
                (len(arg.targets),), table=arg,
            ))
    return plans


def check_signature(inputs: KernelInputs, layout: Sequence[tuple[int, int]], kernel: str) -> None:
    """The spec's arguments must match the kernel's parameters in count and sizes."""
    if len(layout) != len(inputs.args):
        raise RecordingError(
            f"kernel {kernel!r} takes {len(layout)} parameters but the inputs file gives "
            f"{len(inputs.args)} arguments ({', '.join(a.name for a in inputs.args)})"
        )
    for i, (arg, (_, size)) in enumerate(zip(inputs.args, layout, strict=True)):
        want = _arg_size(arg)
        if size != want:
            kind = "a pointer" if want == POINTER_SIZE and not isinstance(arg, Scalar) \
                else f"a {want}-byte {getattr(arg, 'dtype', 'value')}"
            raise RecordingError(
                f"kernel {kernel!r} parameter {i} is {size} bytes but argument "
                f"{arg.name!r} is {kind}"
            )


def _arg_size(arg: Buffer | Scalar | PointerTable) -> int:
    if isinstance(arg, Scalar):
        return np.dtype(SCALAR_DTYPES[arg.dtype]).itemsize
    return POINTER_SIZE


def pack_params(inputs: KernelInputs, layout: Sequence[tuple[int, int]],
                addresses: Mapping[str, int]) -> tuple[ParamInfo, ...]:
    """Each parameter's raw bytes and meaning; call :func:`check_signature` first."""
    params: list[ParamInfo] = []
    for i, (arg, (offset, size)) in enumerate(zip(inputs.args, layout, strict=True)):
        if isinstance(arg, Scalar):
            dtype = np.dtype(SCALAR_DTYPES[arg.dtype])
            value = np.array(arg.value, dtype=dtype)
            if value.item() != arg.value and not (isinstance(arg.value, float)
                                                  and dtype.kind == "f"):
                raise RecordingError(
                    f"scalar {arg.name!r}: {arg.value!r} does not fit {arg.dtype}"
                )
            params.append(ParamInfo(
                index=i, offset=offset, size=size, kind=ParamKind.SCALAR,
                raw=value.astype(dtype.newbyteorder("<")).tobytes(), name=arg.name,
                dtype=arg.dtype, value=value.item(),
            ))
        else:
            address = addresses[arg.name]
            params.append(ParamInfo(
                index=i, offset=offset, size=size, kind=ParamKind.POINTER,
                raw=struct.pack("<Q", address), name=arg.name,
                allocation=arg.name, alloc_offset=0,
            ))
    return tuple(params)


def params_from_bytes(arg_bytes: bytes, layout: Sequence[tuple[int, int]],
                      locate: Callable[[int], tuple[str, int] | None]
                      ) -> tuple[ParamInfo, ...]:
    """Interpret captured argument bytes: 8-byte values inside an allocation are pointers.

    ``locate(address) -> (allocation name, offset) | None`` tells arena addresses apart from
    numbers (a number that happens to equal an arena address would be mislabelled, which
    only changes the manifest's description, never the replayed bytes).
    """
    params: list[ParamInfo] = []
    for i, (offset, size) in enumerate(layout):
        raw = arg_bytes[offset : offset + size]
        if len(raw) != size:
            raise RecordingError(
                f"captured argument buffer is {len(arg_bytes)} bytes; parameter {i} needs "
                f"{offset + size}"
            )
        hit = locate(struct.unpack("<Q", raw)[0]) if size == POINTER_SIZE else None
        if hit is not None:
            name, alloc_offset = hit
            params.append(ParamInfo(i, offset, size, ParamKind.POINTER, raw,
                                    allocation=name, alloc_offset=alloc_offset))
        else:
            params.append(ParamInfo(i, offset, size, ParamKind.BYTES, raw))
    return tuple(params)


def layout_from_buffer(arg_bytes: bytes) -> list[tuple[int, int]]:
    """A fallback layout when the kernel's own is unknown: 8-byte slots."""
    n = (len(arg_bytes) + 7) // 8
    return [(8 * i, min(8, len(arg_bytes) - 8 * i)) for i in range(n)]


# ``__device__`` / ``__constant__`` variables: a declaration ending in ';' with no '('
# before it (functions have parameter lists).  Candidates are confirmed by looking the name
# up in the loaded module, so a false match costs nothing.
_GLOBAL_DECL = re.compile(
    r"(?:__device__|__constant__)(?:\s+(?:__device__|__constant__|__managed__|static|"
    r"volatile|const))*\s+[A-Za-z_][\w:<>,\s\*]*?\b([A-Za-z_]\w*)\s*(?:\[[^\];]*\]\s*)*"
    r"(?:=[^;(]*)?;"
)


def device_global_names(source: str) -> list[str]:
    """Names that may be module-scope device variables in ``source`` (to confirm in the module)."""
    text = re.sub(r"//[^\n]*|/\*.*?\*/", " ", source, flags=re.S)
    names: list[str] = []
    for match in _GLOBAL_DECL.finditer(text):
        decl = match.group(0)
        if "(" in decl.split("=")[0] or "__managed__" in decl:
            continue
        name = match.group(1)
        if name not in names:
            names.append(name)
    return names


# Element types of a pointer parameter as a demangler spells them (c++filt: "float const*",
# cu++filt the same), as numpy names them.  Only these become an allocation's dtype.
_POINTEE_DTYPES = {
    "float": "float32", "double": "float64", "__half": "float16", "half": "float16",
    "char": "int8", "signed char": "int8", "unsigned char": "uint8",
    "short": "int16", "unsigned short": "uint16", "int": "int32", "unsigned int": "uint32",
    "unsigned": "uint32", "long": "int64", "unsigned long": "uint64",
    "long long": "int64", "unsigned long long": "uint64",
}
_QUALIFIERS = re.compile(r"\b(?:const|volatile|__restrict__|__restrict|restrict)\b")


def pointee_dtypes(signature: str) -> list[str | None]:
    """Per parameter of a demangled kernel signature (``jacobi_step(float*, float const*,
    float*)``), the numpy dtype its pointer points to; None for anything else (a scalar, a
    struct, a pointer to a pointer, a type not in the table)."""
    end = signature.rfind(")")
    start, depth = -1, 0
    for i in range(end, -1, -1):  # the parenthesis that opens the last group
        depth += {")": 1, "(": -1}.get(signature[i], 0)
        if depth == 0:
            start = i
            break
    if end < 0 or start < 0:
        return []
    inner = signature[start + 1:end].strip()
    if not inner or inner == "void":
        return []
    out: list[str | None] = []
    for part in (p.strip() for p in split_top_level(inner, "()[]<>")):
        base = " ".join(_QUALIFIERS.sub(" ", part).split())
        if base.count("*") != 1 or not base.endswith("*"):
            out.append(None)
            continue
        out.append(_POINTEE_DTYPES.get(base[:-1].strip()))
    return out


def allocation_dtypes(params: Sequence[ParamInfo], signature: str) -> dict[str, str]:
    """The element type of each allocation that pointer parameters of one type point into at
    an offset of whole elements (none where two parameters disagree)."""
    types = pointee_dtypes(signature)
    if len(types) != len(params):
        return {}
    seen: dict[str, set[str | None]] = {}
    for param, dtype in zip(params, types, strict=True):
        if param.kind is not ParamKind.POINTER or param.allocation is None:
            continue
        aligned = dtype is not None and (param.alloc_offset or 0) % np.dtype(dtype).itemsize == 0
        seen.setdefault(param.allocation, set()).add(dtype if aligned else None)
    out: dict[str, str] = {}
    for name, kinds in seen.items():
        (only, *more) = kinds
        if only is not None and not more:
            out[name] = only
    return out
