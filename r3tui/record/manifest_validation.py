"""Reading a manifest back from its JSON: every field checked, then the typed values.

:func:`parse_manifest` is what :meth:`~r3tui.record.manifest.Manifest.from_json` runs.  It
raises :class:`~r3tui.errors.ManifestError` with one line naming the dotted path of the first
field that does not validate (``checks[0].allocations[2].epilogue``), so a hand-edited or
damaged bundle says where it went wrong.  Besides each field's type and range it checks what
ties fields together: parameter offsets that do not overlap, pointers into named allocations,
header paths inside the header tree, and a blob table that lists every blob the manifest uses
at the size its allocation needs.
"""

from __future__ import annotations

import re
from typing import Any

from r3tui.domain import Dim3, Norm, TimeStats, Tolerance
from r3tui.errors import ManifestError
from r3tui.record.headers import check_relative
from r3tui.record.manifest import (
    BUFFER_DTYPES,
    FORMAT_VERSION,
    AllocationInfo,
    ArenaInfo,
    BinaryImage,
    CheckLaunch,
    GlobalInfo,
    KernelInfo,
    LaunchInfo,
    Manifest,
    ParamInfo,
    ParamKind,
    SourceFile,
)
from r3tui.record.spec import SCALAR_DTYPES

_SHA = re.compile(r"^[0-9a-f]{64}$")
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


def parse_manifest(data: Any) -> Manifest:
    """The manifest ``data`` (parsed JSON) describes; :class:`ManifestError` if it does not
    validate."""
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
