"""The recording bundle's manifest: typed values, JSON form and validation.

The manifest names every blob by the sha256 of its uncompressed content, so the sha256 of
the canonical manifest JSON identifies the whole bundle.  ``docs/bundle-format.md``
documents each field; :meth:`Manifest.from_json` raises :class:`ManifestError` with one line
naming the first field that does not validate.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from r3tui.domain import Dim3, KernelLaunch, Norm, TimeStats, Tolerance
from r3tui.errors import ManifestError
from r3tui.record.headers import check_relative
from r3tui.record.spec import SCALAR_DTYPES

FORMAT_VERSION = 1
# Element types a buffer may declare for its verification; exact comparison ignores them.
BUFFER_DTYPES = frozenset({*SCALAR_DTYPES, "float16"})
_SHA = re.compile(r"^[0-9a-f]{64}$")


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
        return _parse_manifest(data)


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


# -- validation ------------------------------------------------------------------------------

_MISSING = object()


class _Reader:
    """Typed field access that reports the dotted path of a bad field."""

    def __init__(self, data: Any, path: str) -> None:
        if not isinstance(data, dict):
            raise ManifestError(f"manifest field {path or '<root>'!r}: expected an object")
        self.data = data
        self.path = path

    def _name(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def get(self, key: str, types: type | tuple[type, ...], *, optional: bool = False) -> Any:
        value = self.data.get(key, _MISSING)
        if value is _MISSING or (optional and value is None):
            if optional:
                return None
            raise ManifestError(f"manifest field {self._name(key)!r} is missing")
        # bool is an int to Python; a count or size given as true/false is still wrong.
        bad_bool = isinstance(value, bool) and bool not in _as_tuple(types)
        if bad_bool or not isinstance(value, types):
            want = " or ".join(t.__name__ for t in _as_tuple(types))
            raise ManifestError(
                f"manifest field {self._name(key)!r}: expected {want}, got {type(value).__name__}"
            )
        return value

    def integer(self, key: str, *, minimum: int = 0, optional: bool = False) -> Any:
        value = self.get(key, int, optional=optional)
        if value is not None and value < minimum:
            raise ManifestError(f"manifest field {self._name(key)!r}: must be >= {minimum}")
        return value

    def number(self, key: str, *, optional: bool = False) -> float | None:
        value = self.get(key, (int, float), optional=optional)
        return None if value is None else float(value)

    def text(self, key: str, *, optional: bool = False) -> Any:
        return self.get(key, str, optional=optional)

    def sha(self, key: str) -> str:
        value = self.text(key)
        if not _SHA.match(value):
            raise ManifestError(f"manifest field {self._name(key)!r}: not a sha256 hex digest")
        return str(value)

    def array(self, key: str, *, optional: bool = False) -> list[Any]:
        value = self.get(key, list, optional=optional)
        return [] if value is None else value

    def obj(self, key: str, *, optional: bool = False) -> _Reader | None:
        value = self.get(key, dict, optional=optional)
        return None if value is None else _Reader(value, self._name(key))

    def req_obj(self, key: str) -> _Reader:
        value = self.obj(key)
        assert value is not None
        return value

    def dim3(self, key: str, *, optional: bool = False) -> Dim3 | None:
        value = self.get(key, list, optional=optional)
        if value is None:
            return None
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise ManifestError(f"manifest field {self._name(key)!r}: expected integers")
        try:
            return Dim3.of(value)
        except (TypeError, ValueError) as exc:
            raise ManifestError(f"manifest field {self._name(key)!r}: {exc}") from exc


def _as_tuple(types: type | tuple[type, ...]) -> tuple[type, ...]:
    return types if isinstance(types, tuple) else (types,)


def _items(r: _Reader, key: str, *, optional: bool = False) -> list[_Reader]:
    return [_Reader(item, f"{r._name(key)}[{i}]")
            for i, item in enumerate(r.array(key, optional=optional))]


def _parse_manifest(data: Any) -> Manifest:
    root = _Reader(data, "")
    version = root.get("format_version", int)
    if version != FORMAT_VERSION:
        raise ManifestError(
            f"manifest field 'format_version': unsupported version {version} "
            f"(this R³ reads {FORMAT_VERSION})"
        )
    kernel = _parse_kernel(root.req_obj("kernel"))
    launch = _parse_launch(root.req_obj("launch"))
    arena_r = root.req_obj("arena")
    arena = ArenaInfo(base=arena_r.integer("base", minimum=1),
                      size=arena_r.integer("size", minimum=1),
                      guard=arena_r.integer("guard", optional=True) or 0)
    allocations, params, globals_ = _parse_state(root, arena)
    checks = []
    for c in _items(root, "checks", optional=True):
        c_allocations, c_params, c_globals = _parse_state(c, arena)
        checks.append(CheckLaunch(c.text("label"), _parse_launch(c.req_obj("launch")),
                                  c_params, c_allocations, c_globals))
    blobs_r = root.req_obj("blobs")
    blobs: dict[str, int] = {}
    for sha in blobs_r.data:
        if not _SHA.match(sha):
            raise ManifestError(f"manifest field 'blobs.{sha}': not a sha256 hex digest")
        blobs[sha] = blobs_r.integer(sha)
    manifest = Manifest(
        kernel=kernel,
        launch=launch,
        params=params,
        allocations=allocations,
        arena=arena,
        recorded_at=root.text("recorded_at"),
        globals=globals_,
        blobs=blobs,
        provenance=dict(root.get("provenance", dict)),
        format_version=version,
        checks=tuple(checks),
    )
    _check_blob_table(manifest)
    return manifest


def _parse_state(
    r: _Reader, arena: ArenaInfo
) -> tuple[tuple[AllocationInfo, ...], tuple[ParamInfo, ...], tuple[GlobalInfo, ...]]:
    """One launch's allocations, parameters and device globals."""
    allocations = tuple(_parse_alloc(a, arena) for a in _items(r, "allocations"))
    names = [a.name for a in allocations]
    if len(set(names)) != len(names):
        raise ManifestError(f"manifest field {r._name('allocations')!r}: allocation names "
                            "must be unique")
    params = tuple(_parse_param(p, i, set(names)) for i, p in enumerate(_items(r, "params")))
    _check_param_offsets(params, r._name("params"))
    globals_ = tuple(
        GlobalInfo(g.text("name"), g.integer("size", minimum=1), g.sha("prologue"),
                   g.sha("epilogue"))
        for g in _items(r, "globals")
    )
    return allocations, params, globals_


def _parse_kernel(r: _Reader) -> KernelInfo:
    sources = tuple(SourceFile(s.text("name"), s.sha("sha256")) for s in _items(r, "sources"))
    options = r.array("options")
    if not all(isinstance(o, str) for o in options):
        raise ManifestError(f"manifest field {r._name('options')!r}: expected strings")
    defines = []
    for i, d in enumerate(r.array("defines")):
        if not (isinstance(d, list) and len(d) == 2 and all(isinstance(x, str) for x in d)):
            raise ManifestError(
                f"manifest field '{r._name('defines')}[{i}]': expected [name, value]"
            )
        defines.append((d[0], d[1]))
    binary = None
    b = r.obj("binary", optional=True)
    if b is not None:
        binary = BinaryImage(b.sha("sha256"), b.text("kind"), b.text("arch", optional=True))
    headers = tuple(SourceFile(h.text("name"), h.sha("sha256"))
                    for h in _items(r, "headers", optional=True))
    for i, h in enumerate(headers):
        why = check_relative(h.name, allow_root=False)
        if why is not None:
            raise ManifestError(f"manifest field '{r._name('headers')}[{i}].name': {why}")
    if len({h.name for h in headers}) != len(headers):
        raise ManifestError(f"manifest field {r._name('headers')!r}: a header is listed twice")
    include_dirs = r.array("include_dirs", optional=True)
    for i, d in enumerate(include_dirs):
        why = "expected a string" if not isinstance(d, str) else check_relative(d, allow_root=True)
        if why is not None:
            raise ManifestError(f"manifest field '{r._name('include_dirs')}[{i}]': {why}")
    forced = r.array("forced_includes", optional=True)
    names = {h.name for h in headers}
    for i, f in enumerate(forced):
        why = ("expected a string" if not isinstance(f, str)
               else "not one of the bundle's headers" if f not in names else None)
        if why is not None:
            raise ManifestError(f"manifest field '{r._name('forced_includes')}[{i}]': {why}")
    return KernelInfo(
        name=r.text("name"),
        entry_point=r.text("entry_point"),
        sources=sources,
        toolchain=r.text("toolchain", optional=True),
        toolchain_version=r.text("toolchain_version", optional=True),
        options=tuple(options),
        defines=tuple(defines),
        binary=binary,
        headers=headers,
        include_dirs=tuple(include_dirs),
        forced_includes=tuple(forced),
    )


def _parse_launch(r: _Reader) -> LaunchInfo:
    baseline = None
    b = r.obj("baseline", optional=True)
    if b is not None:
        median, low, iqr = b.number("median_s"), b.number("min_s"), b.number("iqr_s")
        assert median is not None and low is not None and iqr is not None
        baseline = TimeStats(median, low, iqr, b.integer("n", minimum=1))
    grid, block = r.dim3("grid"), r.dim3("block")
    assert grid is not None and block is not None
    return LaunchInfo(
        grid=grid,
        block=block,
        shared_mem_bytes=r.integer("shared_mem_bytes"),
        work=r.dim3("work", optional=True),
        block_tunable=r.get("block_tunable", bool),
        count=r.integer("count", minimum=1),
        total_time_s=r.number("total_time_s", optional=True),
        baseline=baseline,
        cache_config=_in_range(r, "cache_config", 0, 3),
        carveout=_in_range(r, "carveout", -1, 100),
        cooperative=bool(r.get("cooperative", bool, optional=True)),
    )


def _in_range(r: _Reader, key: str, low: int, high: int) -> int | None:
    """An optional integer field within [low, high]."""
    value = r.get(key, int, optional=True)
    if value is not None and not low <= value <= high:
        raise ManifestError(f"manifest field {r._name(key)!r}: must be {low} to {high}")
    return value


def _parse_alloc(r: _Reader, arena: ArenaInfo) -> AllocationInfo:
    address, size = r.integer("address", minimum=1), r.integer("size")
    if address < arena.base or address + size > arena.base + arena.size:
        raise ManifestError(f"manifest field {r._name('address')!r}: allocation outside the arena")
    v = r.req_obj("verify")
    policy = v.text("policy")
    tolerance: Tolerance | None
    if policy == "exact":
        tolerance = None
    elif policy == "tolerance":
        try:
            tolerance = Tolerance(
                rtol=v.number("rtol") or 0.0,
                atol=v.number("atol") or 0.0,
                norm=Norm(v.text("norm")),
            )
        except ValueError as exc:
            raise ManifestError(f"manifest field {v._name('norm')!r} or tolerances: {exc}") from exc
    else:
        raise ManifestError(
            f"manifest field {v._name('policy')!r}: expected 'exact' or 'tolerance', got {policy!r}"
        )
    dtype = r.text("dtype", optional=True)
    if dtype is not None and dtype not in BUFFER_DTYPES:
        raise ManifestError(f"manifest field {r._name('dtype')!r}: unknown dtype {dtype!r}")
    if tolerance is not None and dtype is None:
        raise ManifestError(f"manifest field {r._name('dtype')!r}: a tolerance needs a dtype")
    shape_list = r.get("shape", list, optional=True)
    if shape_list is not None and not all(isinstance(n, int) for n in shape_list):
        raise ManifestError(f"manifest field {r._name('shape')!r}: expected integers")
    shape = tuple(shape_list) if shape_list is not None else None
    return AllocationInfo(
        name=r.text("name"),
        address=address,
        size=size,
        prologue=r.sha("prologue"),
        epilogue=r.sha("epilogue"),
        tolerance=tolerance,
        dtype=dtype,
        shape=shape,
    )


def _parse_param(r: _Reader, position: int, allocations: set[str]) -> ParamInfo:
    index = r.integer("index")
    if index != position:
        raise ManifestError(f"manifest field {r._name('index')!r}: expected {position}")
    size = r.integer("size", minimum=1)
    try:
        raw = bytes.fromhex(r.text("raw"))
    except ValueError as exc:
        raise ManifestError(f"manifest field {r._name('raw')!r}: not hex") from exc
    if len(raw) != size:
        raise ManifestError(f"manifest field {r._name('raw')!r}: {len(raw)} bytes, size is {size}")
    try:
        kind = ParamKind(r.text("kind"))
    except ValueError as exc:
        raise ManifestError(f"manifest field {r._name('kind')!r}: {exc}") from exc
    dtype = value = allocation = alloc_offset = None
    if kind is ParamKind.SCALAR:
        dtype = r.text("dtype")
        if dtype not in SCALAR_DTYPES:
            raise ManifestError(f"manifest field {r._name('dtype')!r}: unknown dtype {dtype!r}")
        value = r.get("value", (int, float))
    elif kind is ParamKind.POINTER:
        allocation = r.text("allocation")
        if allocation not in allocations:
            raise ManifestError(
                f"manifest field {r._name('allocation')!r}: no allocation named {allocation!r}"
            )
        alloc_offset = r.integer("alloc_offset")
    return ParamInfo(
        index=index,
        offset=r.integer("offset"),
        size=size,
        kind=kind,
        raw=raw,
        name=r.text("name", optional=True),
        dtype=dtype,
        value=value,
        allocation=allocation,
        alloc_offset=alloc_offset,
    )


def _check_param_offsets(params: tuple[ParamInfo, ...], where: str = "params") -> None:
    end = 0
    for p in sorted(params, key=lambda p: p.offset):
        if p.offset < end:
            raise ManifestError(f"manifest field '{where}[{p.index}].offset': overlaps a "
                                "parameter")
        end = p.offset + p.size


def _check_blob_table(m: Manifest) -> None:
    used: list[tuple[str, str]] = [(f"kernel.sources[{i}]", s.sha256)
                                   for i, s in enumerate(m.kernel.sources)]
    used += [(f"kernel.headers[{i}]", h.sha256) for i, h in enumerate(m.kernel.headers)]
    if m.kernel.binary is not None:
        used.append(("kernel.binary", m.kernel.binary.sha256))
    states = [("", m.allocations, m.globals)] + [
        (f"checks[{k}].", c.allocations, c.globals) for k, c in enumerate(m.checks)]
    for prefix, allocations, globals_ in states:
        for i, a in enumerate(allocations):
            used += [(f"{prefix}allocations[{i}].prologue", a.prologue),
                     (f"{prefix}allocations[{i}].epilogue", a.epilogue)]
        for i, g in enumerate(globals_):
            used += [(f"{prefix}globals[{i}].prologue", g.prologue),
                     (f"{prefix}globals[{i}].epilogue", g.epilogue)]
    for where, sha in used:
        if sha not in m.blobs:
            raise ManifestError(f"manifest field {where!r}: blob {sha[:12]} is not in 'blobs'")
    for prefix, allocations, _globals in states:
        for i, a in enumerate(allocations):
            for which, sha in (("prologue", a.prologue), ("epilogue", a.epilogue)):
                if m.blobs[sha] != a.size:
                    raise ManifestError(
                        f"manifest field '{prefix}allocations[{i}].{which}': blob is "
                        f"{m.blobs[sha]} bytes, allocation is {a.size}"
                    )


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
