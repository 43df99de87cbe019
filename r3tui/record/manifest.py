"""The recording bundle's manifest: typed values and their JSON form.

The manifest names every blob by the sha256 of its uncompressed content, so the sha256 of
the canonical manifest JSON identifies the whole bundle.  ``docs/bundle-format.md``
documents each field; :meth:`Manifest.from_json` reads one back through
:mod:`r3tui.record.manifest_validation`, which raises :class:`~r3tui.errors.ManifestError`
with one line naming the first field that does not validate.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from r3tui.domain import Dim3, KernelLaunch, TimeStats, Tolerance
from r3tui.record.spec import SCALAR_DTYPES

FORMAT_VERSION = 1
# Element types a buffer may declare for its verification; exact comparison ignores them.
BUFFER_DTYPES = frozenset({*SCALAR_DTYPES, "float16"})


class ParamKind(StrEnum):
    SCALAR = "scalar"  # a number passed by value; ``dtype`` and ``value`` say which
    POINTER = "pointer"  # a device address inside one recorded allocation
    BYTES = "bytes"  # anything else passed by value (a struct, an unknown)


@dataclass(frozen=True)
class SourceFile:
    name: str
    sha256: str


@dataclass(frozen=True)
class BinaryImage:
    """The original's compiled module, so the recording replays without a compiler."""

    sha256: str
    kind: str = "cubin"  # cubin | ptx | fatbin
    arch: str | None = None


@dataclass(frozen=True)
class KernelInfo:
    name: str
    entry_point: str  # the lowered (mangled) name to look up in the module
    sources: tuple[SourceFile, ...] = ()
    toolchain: str | None = None
    toolchain_version: str | None = None
    options: tuple[str, ...] = ()
    defines: tuple[tuple[str, str], ...] = ()
    binary: BinaryImage | None = None
    # The application headers the source includes, by their path in a header tree, and the
    # include directories inside that tree (``r3tui/record/headers.py``); empty in bundles
    # whose source needs no headers of its own, and absent from their JSON.
    headers: tuple[SourceFile, ...] = ()
    include_dirs: tuple[str, ...] = ()
    # headers the build forces in before the unit's first line (nvcc -include FILE), by their
    # path in the header tree, in order; absent from the JSON of bundles without them
    forced_includes: tuple[str, ...] = ()


@dataclass(frozen=True)
class LaunchInfo:
    grid: Dim3
    block: Dim3
    shared_mem_bytes: int = 0
    work: Dim3 | None = None
    block_tunable: bool = False
    count: int = 1  # launches of this configuration the recorder saw
    total_time_s: float | None = None  # device time of those launches
    baseline: TimeStats | None = None  # the original's time, timed the way replay times
    # the L1/shared-memory split the application asked for (cuFuncSetCacheConfig's CUfunc_cache
    # value; CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT), set alike in every replay;
    # None: never set (the driver's default)
    cache_config: int | None = None
    carveout: int | None = None
    # launched cooperatively (cuLaunchCooperativeKernel or the cooperative launch attribute):
    # its blocks may synchronize over the grid, so every replay launches it that way
    cooperative: bool = False


@dataclass(frozen=True)
class ParamInfo:
    index: int
    offset: int
    size: int
    kind: ParamKind
    raw: bytes
    name: str | None = None
    dtype: str | None = None  # scalar parameters
    value: int | float | None = None  # scalar parameters
    allocation: str | None = None  # pointer parameters
    alloc_offset: int | None = None  # pointer parameters


@dataclass(frozen=True)
class AllocationInfo:
    name: str
    address: int
    size: int
    prologue: str  # blob sha256 of the contents before the launch
    epilogue: str  # blob sha256 of the contents after it
    tolerance: Tolerance | None = None  # None: the replay must match byte for byte
    dtype: str | None = None  # element type for tolerance comparison and display
    shape: tuple[int, ...] | None = None


@dataclass(frozen=True)
class GlobalInfo:
    """A ``__device__`` / ``__constant__`` variable of the kernel's module."""

    name: str
    size: int
    prologue: str
    epilogue: str


@dataclass(frozen=True)
class CheckLaunch:
    """Another launch of the same kernel on other inputs, verified and never timed.

    A candidate that fits the recording instead of the program (hard-coded sizes, scalar
    arguments or data) passes the recorded launch and fails this one.  Its allocations lie in
    the same arena: apart from the recorded launch's (``r3 record kernel``), or the same
    buffers with the contents the application had by then (an application's second launch).
    """

    label: str  # how the inputs differ, e.g. "seed 1, scale 0.125"
    launch: LaunchInfo
    params: tuple[ParamInfo, ...]
    allocations: tuple[AllocationInfo, ...]
    globals: tuple[GlobalInfo, ...] = ()

    def arg_bytes(self) -> bytes:
        return assemble_arg_bytes(self.params)


@dataclass(frozen=True)
class ArenaInfo:
    base: int
    size: int  # bytes reserved and mapped at ``base`` on replay
    # mapped, zero-filled bytes the recording left free before and after each allocation
    # (``r3 record --guard-bytes``): replay maps and zeroes as much after the last one
    guard: int = 0


@dataclass(frozen=True)
class Manifest:
    kernel: KernelInfo
    launch: LaunchInfo
    params: tuple[ParamInfo, ...]
    allocations: tuple[AllocationInfo, ...]
    arena: ArenaInfo
    recorded_at: str
    globals: tuple[GlobalInfo, ...] = ()
    blobs: Mapping[str, int] = field(default_factory=dict)  # sha256 -> uncompressed size
    provenance: Mapping[str, Any] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION
    checks: tuple[CheckLaunch, ...] = ()

    # -- derived -------------------------------------------------------------------------
    def arg_bytes(self) -> bytes:
        """The packed parameter buffer the original was launched with."""
        return assemble_arg_bytes(self.params)

    def to_launch(self) -> KernelLaunch:
        return KernelLaunch(
            kernel_name=self.kernel.name,
            grid=self.launch.grid,
            block=self.launch.block,
            shared_mem_bytes=self.launch.shared_mem_bytes,
            count=self.launch.count,
            total_time_s=self.launch.total_time_s,
        )

    def allocation(self, name: str) -> AllocationInfo:
        for a in self.allocations:
            if a.name == name:
                return a
        raise KeyError(name)

    @property
    def working_set_bytes(self) -> int:
        return sum(a.size for a in self.allocations)

    @property
    def all_allocations(self) -> tuple[AllocationInfo, ...]:
        """The recorded launch's allocations, then every check launch's."""
        return self.allocations + tuple(a for c in self.checks for a in c.allocations)

    def canonical_bytes(self) -> bytes:
        return canonical_json(self.to_json())

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.canonical_bytes()).hexdigest()

    # -- JSON ----------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        k = self.kernel
        kernel: dict[str, Any] = {
            "name": k.name,
            "entry_point": k.entry_point,
            "sources": [{"name": s.name, "sha256": s.sha256} for s in k.sources],
            "toolchain": k.toolchain,
            "toolchain_version": k.toolchain_version,
            "options": list(k.options),
            "defines": [[n, v] for n, v in k.defines],
            "binary": None
            if k.binary is None
            else {"sha256": k.binary.sha256, "kind": k.binary.kind, "arch": k.binary.arch},
        }
        # Written only when present, so a bundle without them keeps its identity (sha256).
        if k.headers:
            kernel["headers"] = [{"name": s.name, "sha256": s.sha256} for s in k.headers]
        if k.include_dirs:
            kernel["include_dirs"] = list(k.include_dirs)
        if k.forced_includes:
            kernel["forced_includes"] = list(k.forced_includes)
        out = {
            "format_version": self.format_version,
            "kernel": kernel,
            "launch": _launch_json(self.launch),
            "params": [_param_json(p) for p in self.params],
            "allocations": [_alloc_json(a) for a in self.allocations],
            "globals": [_global_json(g) for g in self.globals],
            "arena": _arena_json(self.arena),
            "blobs": dict(sorted(self.blobs.items())),
            "provenance": dict(self.provenance),
            "recorded_at": self.recorded_at,
        }
        if self.checks:  # only when present, so older bundles keep their identity
            out["checks"] = [
                {"label": c.label, "launch": _launch_json(c.launch),
                 "params": [_param_json(p) for p in c.params],
                 "allocations": [_alloc_json(a) for a in c.allocations],
                 "globals": [_global_json(g) for g in c.globals]}
                for c in self.checks
            ]
        return out

    @classmethod
    def from_json(cls, data: Any) -> Manifest:
        # The parser builds these types, so it imports this module: import it on first use.
        from r3tui.record.manifest_validation import parse_manifest

        return parse_manifest(data)


def _arena_json(arena: ArenaInfo) -> dict[str, Any]:
    out = {"base": arena.base, "size": arena.size}
    if arena.guard:  # only when present, so bundles without guards keep their identity
        out["guard"] = arena.guard
    return out


def assemble_arg_bytes(params: tuple[ParamInfo, ...]) -> bytes:
    """Each parameter's raw bytes at its offset; gaps (alignment padding) are zero."""
    end = max((p.offset + p.size for p in params), default=0)
    buf = bytearray(end)
    for p in params:
        buf[p.offset : p.offset + p.size] = p.raw
    return bytes(buf)


def canonical_json(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _launch_json(ln: LaunchInfo) -> dict[str, Any]:
    return {
        "grid": list(ln.grid.as_tuple()),
        "block": list(ln.block.as_tuple()),
        "shared_mem_bytes": ln.shared_mem_bytes,
        "work": list(ln.work.as_tuple()) if ln.work else None,
        "block_tunable": ln.block_tunable,
        "count": ln.count,
        "total_time_s": ln.total_time_s,
        "baseline": None
        if ln.baseline is None
        else {
            "median_s": ln.baseline.median_s,
            "min_s": ln.baseline.min_s,
            "iqr_s": ln.baseline.iqr_s,
            "n": ln.baseline.n,
        },
        # written only where set: a bundle without them reads as before
        **({"cache_config": ln.cache_config} if ln.cache_config is not None else {}),
        **({"carveout": ln.carveout} if ln.carveout is not None else {}),
        **({"cooperative": True} if ln.cooperative else {}),
    }


def _global_json(g: GlobalInfo) -> dict[str, Any]:
    return {"name": g.name, "size": g.size, "prologue": g.prologue, "epilogue": g.epilogue}


def _param_json(p: ParamInfo) -> dict[str, Any]:
    out: dict[str, Any] = {
        "index": p.index,
        "name": p.name,
        "offset": p.offset,
        "size": p.size,
        "kind": p.kind.value,
        "raw": p.raw.hex(),
    }
    if p.kind is ParamKind.SCALAR:
        out["dtype"] = p.dtype
        out["value"] = p.value
    elif p.kind is ParamKind.POINTER:
        out["allocation"] = p.allocation
        out["alloc_offset"] = p.alloc_offset
    return out


def _alloc_json(a: AllocationInfo) -> dict[str, Any]:
    verify: dict[str, Any]
    if a.tolerance is None:
        verify = {"policy": "exact"}
    else:
        verify = {
            "policy": "tolerance",
            "rtol": a.tolerance.rtol,
            "atol": a.tolerance.atol,
            "norm": a.tolerance.norm.value,
        }
    return {
        "name": a.name,
        "address": a.address,
        "size": a.size,
        "prologue": a.prologue,
        "epilogue": a.epilogue,
        "verify": verify,
        "dtype": a.dtype,
        "shape": list(a.shape) if a.shape is not None else None,
    }


def blob_users(m: Manifest) -> dict[str, str]:
    """For each blob sha, a human name of (one of) the fields that uses it."""
    users: dict[str, str] = {}
    for s in m.kernel.sources:
        users.setdefault(s.sha256, f"source {s.name}")
    for h in m.kernel.headers:
        users.setdefault(h.sha256, f"header {h.name}")
    if m.kernel.binary is not None:
        users.setdefault(m.kernel.binary.sha256, "kernel binary")
    for a in m.allocations:
        users.setdefault(a.prologue, f"prologue of {a.name}")
        users.setdefault(a.epilogue, f"epilogue of {a.name}")
    for c in m.checks:
        for a in c.allocations:
            users.setdefault(a.prologue, f"prologue of {a.name} ({c.label})")
            users.setdefault(a.epilogue, f"epilogue of {a.name} ({c.label})")
    for g in m.globals:
        users.setdefault(g.prologue, f"prologue of global {g.name}")
        users.setdefault(g.epilogue, f"epilogue of global {g.name}")
    return users
