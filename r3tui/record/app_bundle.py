"""One configuration of an application recording, written as a standard bundle.

:func:`write_bundle` turns a replayable configuration's snapshotted first launch -- and its
check launch, where that one replays too -- into a manifest and blobs with the existing
:class:`~r3tui.record.bundle.BundleWriter`, so the rest of R³ replays it like any other
bundle.  :class:`SourceChoice` is what source association found for its kernel; the bundle
carries that source only when the unit is complete, and replays the recorded image otherwise.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from r3tui import __version__
from r3tui.cuda.arena import ARENA_BASE
from r3tui.domain import Dim3
from r3tui.record.bundle import BundleWriter
from r3tui.record.layout import allocation_dtypes, layout_from_buffer, params_from_bytes
from r3tui.record.manifest import (
    AllocationInfo,
    ArenaInfo,
    BinaryImage,
    CheckLaunch,
    GlobalInfo,
    KernelInfo,
    LaunchInfo,
    Manifest,
    ParamInfo,
    SourceFile,
)
from r3tui.record.raw_dump import RawConfig, RawProcess
from r3tui.record.replayability import check_problems

# the arena's mapping granularity where the dump's arena event names none
_DEFAULT_GRANULARITY = 2 << 20


@dataclass(frozen=True)
class SourceChoice:
    """What the bundle's ``kernel`` section says about source (from source association)."""

    path: str
    file_name: str
    text: str
    kernel: str
    options: tuple[str, ...]
    defines: tuple[tuple[str, str], ...]
    # the application headers the unit reaches (r3tui/record/headers.py): paths in the
    # bundle's header tree with their content, include directories in that tree, and where
    # each header was read
    headers: tuple[tuple[str, bytes], ...] = ()
    include_dirs: tuple[str, ...] = ()
    header_origins: tuple[str, ...] = ()
    unresolved: tuple[str, ...] = ()
    problem: str | None = None  # why the unit cannot go into a bundle (a header is missing)
    forced_includes: tuple[str, ...] = ()  # tree paths of the -include FILEs, in order

    @property
    def usable(self) -> bool:
        return self.problem is None

    def summary(self) -> dict[str, Any]:
        """The kernel's ``source`` entry in recording.json."""
        return {"path": self.path, "kernel": self.kernel, "headers": list(self.header_origins),
                "include_dirs": list(self.include_dirs),
                "unresolved_includes": list(self.unresolved), "error": self.problem}


def _image_kind(image: bytes) -> str:
    if image[:4] == b"\x7fELF":
        return "cubin"
    if image[:4] in (b"\x50\xed\x55\xba", b"\xb1\x43\x62\x46"):
        return "fatbin"
    return "ptx"


def launched_threads(grid: Dim3, block: Dim3) -> Dim3:
    """An application launch's work size as the recording knows it: the threads it ran along
    each axis.  The program's own bound may be smaller: a kernel that checks it then covers it
    with any block; one that does not stays exact with blocks that divide it, which the
    search's ladders offer first.  Whether the kernel lets its block change at all is for its
    source to say (:func:`r3tui.search.block_source.block_facts`)."""
    return Dim3(grid.x * block.x, grid.y * block.y, grid.z * block.z)


def write_bundle(proc: RawProcess, cfg: RawConfig, dest: Path, *, entry_point: str,
                 name: str, source: SourceChoice | None, provenance: dict[str, Any]) -> str:
    """Write the configuration's bundle at ``dest``; returns the bundle's sha256."""
    ev = cfg.event
    arena = proc.arena or {}
    granularity = int(arena.get("granularity", _DEFAULT_GRANULARITY))
    guard = int(arena.get("guard", 0))  # dumps before guards: none
    with BundleWriter(dest, overwrite=True) as w:
        allocations, globals_, params = _snapshot_state(proc, ev, w, name)
        checks: tuple[CheckLaunch, ...] = ()
        if cfg.check is not None and not check_problems(proc, cfg):
            c_allocations, c_globals, c_params = _snapshot_state(proc, cfg.check, w, name)
            checks = (CheckLaunch(
                "the application's second launch of this configuration",
                LaunchInfo(grid=cfg.grid, block=cfg.block, shared_mem_bytes=cfg.shared,
                           work=launched_threads(cfg.grid, cfg.block), block_tunable=True),
                c_params, tuple(c_allocations), tuple(c_globals)),)
        image_file = proc.images.get(int(ev.get("image", -1)))
        binary = None
        if image_file is not None:
            image = proc.data(image_file)
            binary = BinaryImage(w.add_blob(image), _image_kind(image), arena.get("arch"))
        if source is not None and not source.usable:
            source = None  # an incomplete unit does not compile: the bundle replays its image
        sources: tuple[SourceFile, ...] = ()
        headers: tuple[SourceFile, ...] = ()
        if source is not None:
            sources = (SourceFile(source.file_name, w.add_blob(source.text.encode())),)
            headers = tuple(SourceFile(rel, w.add_blob(content))
                            for rel, content in source.headers)
        every = [*allocations, *(a for c in checks for a in c.allocations)]
        extent = max((a.address + a.size for a in every), default=ARENA_BASE) - ARENA_BASE \
            + guard
        manifest = Manifest(
            kernel=KernelInfo(
                name=source.kernel if source else name, entry_point=entry_point,
                sources=sources, toolchain="nvcc" if source else None,
                options=source.options if source else (),
                defines=source.defines if source else (), binary=binary, headers=headers,
                include_dirs=source.include_dirs if source and headers else (),
                forced_includes=source.forced_includes if source and headers else ()),
            launch=LaunchInfo(grid=cfg.grid, block=cfg.block, shared_mem_bytes=cfg.shared,
                              work=launched_threads(cfg.grid, cfg.block), block_tunable=True,
                              count=max(cfg.count, 1), total_time_s=cfg.time_s,
                              cache_config=cfg.setting("cache"),
                              carveout=cfg.setting("carveout"),
                              cooperative=cfg.setting("coop") == 1),
            params=params,
            allocations=tuple(allocations),
            globals=tuple(globals_),
            arena=ArenaInfo(ARENA_BASE, max(granularity, -(-extent // granularity) * granularity),
                            guard),
            recorded_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            blobs=dict(w.blobs),
            provenance={"recorder": "app interposer", "r3_version": __version__,
                        "pid": proc.pid, "device": arena.get("device"), **provenance},
            checks=checks,
        )
        return w.commit(manifest).sha256


def _snapshot_state(
    proc: RawProcess, ev: dict[str, Any], w: BundleWriter, signature: str
) -> tuple[list[AllocationInfo], list[GlobalInfo], tuple[ParamInfo, ...]]:
    """One snapshotted launch's allocations, device globals and parameters; an allocation's
    dtype is what the kernel's pointer parameters into it point to (``signature``, the
    demangled name), for the errors a replay reports and the tolerance an order-dependent
    float result is verified with (docs/verification.md)."""
    allocations = [
        AllocationInfo(name=f"alloc{aid}", address=int(addr), size=int(size),
                       prologue=w.add_blob(proc.data(pro)), epilogue=w.add_blob(proc.data(epi)))
        for aid, addr, size, pro, epi in ev.get("allocs", [])
    ]
    globals_ = [GlobalInfo(str(gname), int(size), w.add_blob(proc.data(pro)),
                           w.add_blob(proc.data(epi)))
                for gname, _addr, size, pro, epi in ev.get("globals", [])]
    spans = sorted((a.address, a.address + a.size, a.name) for a in allocations)

    def locate(address: int) -> tuple[str, int] | None:
        for start, end, label in spans:
            if start <= address < max(end, start + 1):
                return label, address - start
        return None

    args = bytes.fromhex(ev.get("args", ""))
    layout: list[tuple[int, int]] = layout_from_buffer(args)
    if ev.get("layout") is not None:
        layout = [(int(o), int(n)) for o, n in ev["layout"]]
    params = params_from_bytes(args, layout, locate)
    dtypes = allocation_dtypes(params, signature)
    allocations = [replace(a, dtype=dtypes.get(a.name)) for a in allocations]
    return allocations, globals_, params


def short_name(demangled: str) -> str:
    """A file-system-safe short form of a kernel name for its bundle directory."""
    base = demangled.split("(")[0].split("<")[0].split("::")[-1] or "kernel"
    return re.sub(r"[^A-Za-z0-9_.-]", "_", base)[:40]
