"""From the interposer's raw dump to recording bundles and ``recording.json``.

The interposer (``interpose/r3rec.c``) writes, per process that used CUDA, ``p<pid>/index.jsonl``
(one event a line: allocations, frees, module images, device globals, the first launch of each
configuration with its argument bytes and snapshot files, and at exit the per-configuration
launch counts and device times, all launches and apart those whose argument bytes equal the
recorded first launch's) and ``p<pid>/data/`` (raw prologue/epilogue bytes and module
images).  This module reads that dump -- tolerating a last line cut short by a crash -- and
writes one standard bundle per replayable configuration with the existing
:class:`~r3tui.record.bundle.BundleWriter`, so the rest of R³ replays them like any other.

A configuration is *not replayable*, with the reason, when its arguments or the buffers it can
reach hold a pointer into memory the arena does not hold (managed memory, a stream-ordered
pool, or an allocation the arena could not serve), when its launch failed or faulted, or when
no module image of it was captured.

A kernel that faults (an illegal address, a trap, ...) leaves a sticky error: the interposer
writes one ``fault`` event naming the launch and lets every later launch pass through
unrecorded.  What it recorded before the fault is converted as usual; :func:`fault_line` is
the one line ``r3 record`` ends with.

Snapshots are bounded (``r3 record --max-configs``, ``--max-snapshot-bytes``): a configuration
the interposer did not snapshot is counted and timed like the others and its ``config`` event
says why; it stays in ``recording.json`` as not replayable with that reason.  A file that
could not be written -- by the interposer (its ``write_error`` event) or here, while writing
bundles -- is recording.json's ``write_error`` and :func:`write_error_line`.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from r3tui import __version__
from r3tui.cuda.arena import ARENA_BASE
from r3tui.domain import Dim3, LaunchTimes
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

FORMAT_VERSION = 1
RECORDING_NAME = "recording.json"
BUNDLE_DIR = "bundles"
UNSUPPORTED_KINDS = ("managed", "stream_ordered")
_DEFAULT_GRANULARITY = 2 << 20
# The sticky errors the interposer reports as faults (its is_fault()), for a dump whose
# driver could not name them.
FAULT_ERRORS = {
    214: "CUDA_ERROR_ECC_UNCORRECTABLE", 700: "CUDA_ERROR_ILLEGAL_ADDRESS",
    702: "CUDA_ERROR_LAUNCH_TIMEOUT", 710: "CUDA_ERROR_ASSERT",
    714: "CUDA_ERROR_HARDWARE_STACK_ERROR", 715: "CUDA_ERROR_ILLEGAL_INSTRUCTION",
    716: "CUDA_ERROR_MISALIGNED_ADDRESS", 717: "CUDA_ERROR_INVALID_ADDRESS_SPACE",
    718: "CUDA_ERROR_INVALID_PC", 719: "CUDA_ERROR_LAUNCH_FAILED",
    721: "CUDA_ERROR_TENSOR_MEMORY_LEAK",
}


def error_name(code: int, name: str = "") -> str:
    return name or FAULT_ERRORS.get(code) or f"CUresult {code}"


@dataclass
class OutsideAllocation:
    """Device memory the arena does not hold: managed, stream-ordered, or passed through."""

    kind: str
    address: int
    size: int
    api: str
    live: bool = True

    def contains(self, value: int) -> bool:
        return self.address <= value < self.address + max(self.size, 1)


@dataclass
class RawConfig:
    """One (function, grid, block, shared memory) the process launched."""

    id: int
    name: str
    grid: Dim3
    block: Dim3
    shared: int
    recorded: bool
    event: dict[str, Any] = field(default_factory=dict)
    outside: list[OutsideAllocation] = field(default_factory=list)  # live at its first launch
    count: int = 1
    time_s: float = 0.0
    # the launches whose argument bytes equal the recorded first launch's (the ones a replay
    # reproduces); None where the interposer kept no reference or the dump predates them
    same_args: LaunchTimes | None = None
    # the snapshot of its second launch (a check launch), and what lay outside the arena then
    check: dict[str, Any] | None = None
    check_outside: list[OutsideAllocation] = field(default_factory=list)
    # why the interposer took no check launch though the configuration ran again
    # ("budget", "write_error"), and the bytes it would have written when it was the one
    # that did not fit
    check_skipped: dict[str, Any] | None = None

    def setting(self, key: str) -> int | None:
        """The L1/shared split the application asked for at this launch (``cache`` or
        ``carveout`` in the interposer's event), None where it set none (-1, or a dump
        before the interposer reported them)."""
        value = self.event.get(key)
        return int(value) if isinstance(value, int) and value >= 0 else None

    @property
    def why_not(self) -> str | None:
        """Why its launch was not snapshotted: "kernel" (--kernel), "max_configs", "budget",
        "write_error"; None when it was."""
        if self.recorded:
            return None
        return str(self.event.get("why") or "kernel")  # dumps before the bounds: --kernel


@dataclass
class RawGraph:
    """One executable CUDA graph: launched as a whole, its kernels are not recorded."""

    id: int
    kernel_nodes: int  # at instantiation; -1 when the interposer did not see it instantiated
    kernels: list[str] = field(default_factory=list)  # entry points of its kernel nodes
    launches: int = 0
    time_s: float = 0.0


@dataclass
class RawProcess:
    path: Path
    pid: int
    configs: list[RawConfig] = field(default_factory=list)
    graphs: list[RawGraph] = field(default_factory=list)
    outside: list[OutsideAllocation] = field(default_factory=list)
    images: dict[int, str] = field(default_factory=dict)
    arena: dict[str, Any] | None = None
    end: dict[str, Any] | None = None
    fault: dict[str, Any] | None = None  # the interposer's "fault" event, if a kernel faulted
    start: dict[str, Any] | None = None  # the "start" event: the snapshot bounds it ran with
    # the first file the interposer could not write (a full disk), with the bytes before it
    write_error: dict[str, Any] | None = None
    profiled: bool = False
    warnings: list[str] = field(default_factory=list)

    def data(self, name: str) -> bytes:
        return (self.path / "data" / name).read_bytes()

    def count(self, key: str) -> int:
        """A counter of the ``end`` event (0 when the process did not end normally)."""
        return int((self.end or {}).get(key, 0))


def read_process(path: Path) -> RawProcess:
    """Parse one ``p<pid>/index.jsonl``."""
    proc = RawProcess(path, int(path.name[1:]) if path.name[1:].isdigit() else 0)
    live: dict[int, OutsideAllocation] = {}
    lines = (path / "index.jsonl").read_text(errors="replace").splitlines()
    configs: dict[int, RawConfig] = {}
    for number, line in enumerate(lines, 1):
        try:
            ev = json.loads(line)
        except json.JSONDecodeError:
            proc.warnings.append(f"{path.name}/index.jsonl line {number} is cut short "
                                 "(the application crashed while recording?)")
            continue
        kind = ev.get("ev")
        if kind == "alloc" and ev["kind"] != "arena":
            a = OutsideAllocation(ev["kind"], int(ev["addr"]), int(ev["size"]), ev.get("api", ""))
            live[a.address] = a
            proc.outside.append(a)
        elif kind == "free" and ev.get("id", -1) < 0:
            gone = live.pop(int(ev["addr"]), None)
            if gone is not None:
                gone.live = False
        elif kind == "image":
            proc.images[int(ev["id"])] = str(ev["file"])
        elif kind == "arena":
            proc.arena = ev
            if not ev.get("ok"):
                proc.warnings.append(f"the arena could not be reserved: {ev.get('error')}; "
                                     "allocations went to the driver and cannot be replayed")
        elif kind == "config":
            cfg = RawConfig(int(ev["id"]), str(ev["name"]), Dim3.of(ev["grid"]),
                            Dim3.of(ev["block"]), int(ev["shm"]), bool(ev["recorded"]), ev,
                            [a for a in live.values()], time_s=float(ev.get("time_s", 0.0)))
            configs[cfg.id] = cfg
            proc.configs.append(cfg)
        elif kind == "check" and int(ev["id"]) in configs:
            configs[int(ev["id"])].check = ev
            configs[int(ev["id"])].check_outside = list(live.values())
        elif kind == "check_skipped" and int(ev["id"]) in configs:
            configs[int(ev["id"])].check_skipped = ev
        elif kind == "start":
            proc.start = ev
        elif kind == "write_error":
            proc.write_error = ev
        elif kind == "graph":
            proc.graphs.append(RawGraph(int(ev["id"]), int(ev["kernel_nodes"]),
                                        [str(k) for k in ev.get("kernels", [])]))
        elif kind == "profile":
            proc.profiled = True
            # [id, count, time_s, timed] and, where the interposer kept the first launch's
            # arguments, [..., same_count, same_time_s, same_timed] (older dumps: never)
            for cid, count, time_s, *rest in ev["configs"]:
                if cid in configs:
                    configs[cid].count, configs[cid].time_s = int(count), float(time_s)
                    if len(rest) >= 4:
                        configs[cid].same_args = LaunchTimes(int(rest[1]), float(rest[2]),
                                                             int(rest[3]))
            graphs = {g.id: g for g in proc.graphs}
            for gid, launches, time_s, _timed in ev.get("graphs", []):
                if gid in graphs:
                    graphs[gid].launches, graphs[gid].time_s = int(launches), float(time_s)
        elif kind == "fault":
            proc.fault = ev
        elif kind == "end":
            proc.end = ev
    if proc.configs and not proc.profiled:
        proc.warnings.append(f"process {proc.pid} did not exit normally: launch counts and "
                             "device times are those of the first launches only")
    elif proc.end is not None and not proc.end.get("harvested"):
        proc.warnings.append(f"process {proc.pid} exited without the interposer's exit "
                             "handler: device times of later launches may be missing")
    return proc


def read_dump(raw: Path) -> list[RawProcess]:
    return [read_process(p) for p in sorted(raw.glob("p*"))
            if p.is_dir() and (p / "index.jsonl").is_file()]


# -- replayability ---------------------------------------------------------------------------

def _words(data: bytes) -> np.ndarray:
    n = len(data) // 8 * 8
    return np.frombuffer(data[:n], dtype="<u8")


def _hits(words: np.ndarray, region: OutsideAllocation) -> bool:
    lo, hi = region.address, region.address + max(region.size, 1)
    return bool(np.any((words >= lo) & (words < hi)))


def size_text(n: int) -> str:
    """Bytes as a person reads them: ``8.0 GiB``, ``64.0 MiB``, ``512 bytes``."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} bytes"


def _budget_text(proc: RawProcess) -> str:
    limit = (proc.start or {}).get("max_bytes")
    return f"{size_text(int(limit))}, --max-snapshot-bytes" if limit is not None \
        else "--max-snapshot-bytes"


def _not_snapshotted(proc: RawProcess, why: str, need: int, reserve: int = 0) -> str:
    """The reason a launch was not snapshotted, as recording.json and ``r3 tune-app`` say it;
    for the byte budget, ``need`` is its snapshot's size and ``reserve`` the room the
    interposer kept for another kernel's first configuration (0 for a first one)."""
    if why == "max_configs":
        limit = (proc.start or {}).get("max_configs")
        return f"not snapshotted: --max-configs {'' if limit is None else f'{limit} '}reached"
    if why == "budget":
        if need:
            kept = (f" with {size_text(reserve)} kept for another kernel's first configuration"
                    if reserve else "")
            return (f"not snapshotted: its snapshot ({size_text(need)}) would pass the "
                    f"snapshot budget ({_budget_text(proc)}){kept}")
        return f"not snapshotted: snapshot budget spent ({_budget_text(proc)})"
    if why == "write_error":
        err = proc.write_error or {}
        return ("not snapshotted: the raw dump could not be written "
                f"({err.get('text') or 'write error'})")
    return "not snapshotted: excluded by --kernel"


def unreplayable_reasons(proc: RawProcess, cfg: RawConfig) -> list[str]:
    """Why this configuration's bundle would replay wrongly (empty: it replays)."""
    why = cfg.why_not
    if why is not None:
        return [_not_snapshotted(proc, why, int(cfg.event.get("need", 0)),
                                 int(cfg.event.get("reserve", 0)))]
    reasons = _snapshot_problems(proc, cfg.event, cfg.outside)
    if cfg.event.get("write_error"):
        err = proc.write_error or {}
        reasons.append("its snapshot could not be written completely "
                       f"({err.get('text') or 'write error'})")
    return reasons


def check_problems(proc: RawProcess, cfg: RawConfig) -> list[str]:
    """Why the configuration's check launch cannot go into its bundle (empty: it can)."""
    if cfg.check is None:
        if cfg.check_skipped is not None:
            return [_not_snapshotted(proc, str(cfg.check_skipped.get("why", "budget")),
                                     int(cfg.check_skipped.get("need", 0)),
                                     int(cfg.check_skipped.get("reserve", 0)))]
        return ["the application launched this configuration once"]
    problems = _snapshot_problems(proc, cfg.check, cfg.check_outside)
    if cfg.check.get("write_error"):
        problems.append("its snapshot could not be written completely")
    return problems


def _snapshot_problems(proc: RawProcess, ev: dict[str, Any],
                       regions: list[OutsideAllocation]) -> list[str]:
    reasons: list[str] = []
    if ev.get("rc", 0) != 0:
        reasons.append(f"the launch failed in the application (CUresult {ev['rc']})")
    elif int(ev.get("sync_rc", 0)) in FAULT_ERRORS:
        reasons.append("the launch faulted in the application "
                       f"({error_name(int(ev['sync_rc']))})")
    if ev.get("image", -1) not in proc.images:
        reasons.append("no module image of this kernel was captured")
    args = bytes.fromhex(ev.get("args", ""))
    if ev.get("layout") is None and not args:
        reasons.append("its parameter layout is unknown (cuFuncGetParamInfo unavailable)")
    if regions:
        arg_words = _words(args)
        for region in regions:
            what = f"{region.kind.replace('_', '-')} memory ({region.size} bytes at " \
                   f"{region.address:#x}, {region.api})"
            if _hits(arg_words, region):
                reasons.append(f"an argument points into {what}, which the arena does not hold")
                continue
            for alloc_id, _addr, _size, pro, _epi in ev.get("allocs", []):
                if _hits(_words(proc.data(pro)), region):
                    reasons.append(f"allocation alloc{alloc_id} holds a pointer into {what}, "
                                   "which the arena does not hold")
                    break
    return reasons


# -- bundles ---------------------------------------------------------------------------------

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


# -- recording.json --------------------------------------------------------------------------

def _times(t: LaunchTimes | None) -> dict[str, Any] | None:
    return None if t is None else {"count": t.count, "time_s": t.time_s, "timed": t.timed}


def build_recording(
    procs: Sequence[RawProcess], out: Path, *, command: Sequence[str], cwd: str, runtime: str,
    wall_s: float, exit_code: int, reachable: bool, recorded_at: str,
    demangle: Callable[[str], str], source_of: Callable[[str], SourceChoice | None],
    progress: Callable[[str], None] = lambda _msg: None,
) -> dict[str, Any]:
    """Write the bundles under ``out/bundles`` and return the recording.json object."""
    kernels: dict[str, dict[str, Any]] = {}
    warnings: list[str] = []
    unsupported: list[dict[str, Any]] = []
    index = 0
    failed: dict[str, Any] | None = None  # the bundle that could not be written
    for proc in procs:
        warnings += proc.warnings
        unsupported += [{"kind": a.kind, "size": a.size, "address": a.address}
                        for a in proc.outside if a.kind in UNSUPPORTED_KINDS]
        for cfg in proc.configs:
            entry = kernels.get(cfg.name)
            if entry is None:
                pretty = demangle(cfg.name)
                choice = source_of(cfg.name)
                entry = kernels[cfg.name] = {
                    "entry_point": cfg.name, "name": pretty, "launches": 0,
                    "device_time_s": 0.0,
                    "source": None if choice is None else choice.summary(),
                    "configs": [], "_source": choice}
                if choice is not None and not choice.usable:
                    warnings.append(f"{pretty}: {choice.problem}; its bundles carry no source "
                                    "(they replay from the recorded image but cannot be "
                                    "recompiled for tuning)")
            reasons = unreplayable_reasons(proc, cfg)
            bundle_rel = None
            if not reasons and failed is not None:
                reasons = [f"its bundle was not written: {failed['error']}"]
            elif not reasons:
                short = short_name(entry["name"])
                bundle_rel = f"{BUNDLE_DIR}/{index:03d}-{short}"
                progress(f"writing bundle {bundle_rel}")
                try:
                    write_bundle(proc, cfg, out / bundle_rel, entry_point=cfg.name,
                                 name=entry["name"], source=entry["_source"],
                                 provenance={"command": list(command), "runtime": runtime})
                except OSError as exc:  # a full disk: keep what was written, write no more
                    failed = _bundle_write_error(exc, out, out / bundle_rel, index)
                    reasons = [f"its bundle was not written: {failed['error']}"]
                    bundle_rel = None
                else:
                    index += 1
            entry["launches"] += cfg.count
            entry["device_time_s"] += cfg.time_s
            entry["configs"].append({
                "grid": list(cfg.grid.as_tuple()), "block": list(cfg.block.as_tuple()),
                "shared_mem_bytes": cfg.shared, "count": cfg.count, "device_time_s": cfg.time_s,
                "same_args": _times(cfg.same_args),
                "bundle": bundle_rel, "replayable": not reasons, "reasons": reasons,
                "snapshotted": cfg.recorded,
                # whether its bundle holds a check launch (docs/verification.md), else why not
                "check_launch": not reasons and not check_problems(proc, cfg),
                "check_reasons": check_problems(proc, cfg) if cfg.recorded else []})
    ordered = sorted(kernels.values(), key=lambda k: -k["device_time_s"])
    for k in ordered:
        del k["_source"]
    warnings += _bound_warnings(procs, ordered)
    skipped = sum(p.count("capture_skipped") for p in procs)
    if skipped:
        warnings.append(f"{skipped} kernel launches made while a stream was capturing a CUDA "
                        "graph were passed through unrecorded (they are not in the profile)")
    unknown = sum(p.count("capture_unknown") for p in procs)
    if unknown:
        codes = sorted({p.count("capture_error") for p in procs if p.count("capture_unknown")})
        warnings.append(f"{unknown} kernel launches were passed through unrecorded: "
                        "cuStreamIsCapturing failed on their stream (CUresult "
                        f"{', '.join(map(str, codes))})")
    gated = sum(p.count("gated") for p in procs)
    if any(p.end is not None and p.end.get("gate") == -1 for p in procs):
        warnings.append("the launch gate (cuStreamWaitValue32 on mapped host memory) was not "
                        "available: device times of launches onto an idle stream include the "
                        "host's launch latency")
    return {"format_version": FORMAT_VERSION, "command": list(command), "cwd": cwd,
            "runtime": runtime, "recorded_at": recorded_at, "wall_s": wall_s,
            "exit_code": exit_code, "reachable": reachable, "kernels": ordered,
            "graphs": graph_summary(procs, demangle), "gated_launches": gated,
            "guard_bytes": next((int(p.arena.get("guard", 0)) for p in procs
                                 if p.arena and p.arena.get("ok")), None),
            "fault": fault_summary(procs, demangle),
            "snapshots": snapshot_summary(procs),
            "write_error": failed or raw_write_error(procs),
            "unsupported_allocations": unsupported, "warnings": warnings}


def _bound_warnings(procs: Sequence[RawProcess], kernels: list[dict[str, Any]]) -> list[str]:
    """One line per snapshot bound that left configurations profiled but not snapshotted."""
    said: list[str] = []
    capped: list[tuple[str, int]] = []
    for k in kernels:
        n = sum(any(r.startswith("not snapshotted: --max-configs") for r in c["reasons"])
                for c in k["configs"])
        if n:
            capped.append((str(k["name"]).split("(")[0], n))
    if capped:
        limit = next((p.start.get("max_configs") for p in procs if p.start), "N")
        shown = ", ".join(f"{name} {n}" for name, n in capped[:4])
        more = f" and {len(capped) - 4} more kernels" if len(capped) > 4 else ""
        said.append(f"{sum(n for _, n in capped)} configurations beyond --max-configs {limit} "
                    f"per kernel were profiled but not snapshotted ({shown}{more})")
    budget = [c for p in procs for c in p.configs if c.why_not == "budget"]
    if budget:
        proc = next(p for p in procs if any(c.why_not == "budget" for c in p.configs))
        said.append(f"the snapshot budget ({_budget_text(proc)}) was spent: {len(budget)} "
                    "configurations were profiled but not snapshotted")
    return said


def snapshot_summary(procs: Sequence[RawProcess]) -> dict[str, Any]:
    """recording.json's ``snapshots``: the bounds the interposer ran with (the first
    process's), the bytes it wrote to the raw dump, and how many configurations were
    snapshotted and, by reason, not."""
    start = next((p.start for p in procs if p.start), None) or {}
    skipped: dict[str, int] = {}
    for cfg in (c for p in procs for c in p.configs):
        if cfg.why_not is not None:
            skipped[cfg.why_not] = skipped.get(cfg.why_not, 0) + 1
    written = sum(int((p.end or {}).get("snap_bytes", 0)) or
                  sum(int(c.event.get("bytes", 0)) + int((c.check or {}).get("bytes", 0))
                      for c in p.configs) for p in procs)
    return {"max_configs": start.get("max_configs"), "max_bytes": start.get("max_bytes"),
            "bytes": written,
            "snapshotted": sum(c.recorded for p in procs for c in p.configs),
            "not_snapshotted": skipped,
            "budget_spent": any(p.count("budget_spent") for p in procs) or "budget" in skipped}


def raw_write_error(procs: Sequence[RawProcess]) -> dict[str, Any] | None:
    """The interposer's first ``write_error`` (a full disk while dumping), as recording.json's
    ``write_error``."""
    for proc in procs:
        ev = proc.write_error
        if ev is not None:
            return {"stage": "raw dump", "path": str(ev.get("file", "")),
                    "error": str(ev.get("text") or f"errno {ev.get('errno')}"),
                    "errno": int(ev.get("errno", 0)), "written_bytes": int(ev.get("bytes", 0)),
                    "bundles_written": None}
    return None


def _bundle_write_error(exc: OSError, out: Path, dest: Path, written: int) -> dict[str, Any]:
    size = sum(f.stat().st_size for f in (out / BUNDLE_DIR).rglob("*") if f.is_file()) \
        if (out / BUNDLE_DIR).is_dir() else 0
    return {"stage": "bundles", "bundle": str(dest),
            "path": str(exc.filename) if exc.filename else str(dest),
            "error": exc.strerror or str(exc), "errno": exc.errno or 0,
            "written_bytes": size, "bundles_written": written}


def write_error_line(data: dict[str, Any]) -> str | None:
    """The one line ``r3 record`` ends with when a file could not be written, e.g.
    ``writing bundle rec/bundles/004-lud_internal failed: rec/bundles/.004-lud_internal.tmp-7-
    ab12/blobs/9f3e...: No space left on device (after 4 bundles, 1.2 GiB)``."""
    err = data.get("write_error")
    if not err:
        return None
    what = {"bundles": f"writing bundle {err.get('bundle')}",
            "raw dump": "dumping snapshots",
            "recording.json": "writing recording.json"}.get(str(err.get("stage")), "writing")
    written = size_text(int(err.get("written_bytes", 0)))
    n = err.get("bundles_written")
    after = f"{written} of snapshots" if n is None else \
        f"{n} bundle{'s' if n != 1 else ''}, {written}"
    return f"{what} failed: {err['path']}: {err['error']} (after {after})"


def fault_summary(procs: Sequence[RawProcess], demangle: Callable[[str], str]
                  ) -> dict[str, Any] | None:
    """recording.json's ``fault``: the first process's fault, None when nothing faulted.

    ``kernel`` is None when the launch is a graph's (``graph``) or none was pending;
    ``exact`` says the named launch is the one that faulted (it ran alone and was
    synchronized), else it is the oldest launch not known to have finished: it or a later
    one faulted.  ``after_fault`` counts the launches passed through after it."""
    faulted = [p for p in procs if p.fault is not None]
    if not faulted:
        return None
    proc = faulted[0]
    ev = proc.fault or {}
    name = ev.get("name")
    graph = int(ev.get("graph", -1))
    return {
        "pid": proc.pid, "error": error_name(int(ev.get("code", 0)), str(ev.get("error") or "")),
        "code": int(ev.get("code", 0)), "text": str(ev.get("text") or ""),
        "entry_point": name, "kernel": demangle(name) if name else None,
        "graph": graph if graph >= 0 else None, "launch": int(ev.get("nth", 0)) or None,
        "process_launch": int(ev.get("launch", 0)) or None, "exact": bool(ev.get("exact")),
        "where": str(ev.get("where", "")),
        "after_fault": sum(p.count("after_fault") for p in faulted),
        "processes": len(faulted),
    }


def fault_line(data: dict[str, Any]) -> str | None:
    """The one line ``r3 record`` ends with when a kernel faulted, e.g.
    ``kernel step launch 1 faulted: CUDA_ERROR_ILLEGAL_ADDRESS (an illegal memory access was
    encountered); 1999 later launches were not recorded``."""
    fault = data.get("fault")
    if not fault:
        return None
    what = f"{fault['error']}" + (f" ({fault['text']})" if fault.get("text") else "")
    if fault.get("kernel"):
        launch = f"kernel {str(fault['kernel']).split('(')[0]} launch {fault['launch']}"
    elif fault.get("graph") is not None:
        launch = f"CUDA graph {fault['graph']} launch {fault['launch']}"
    else:
        launch = None
    if launch is None:
        line = (f"the application faulted: {what}, seen by {fault['where']} with no recorded "
                "launch pending")
    elif fault.get("exact"):
        line = f"{launch} faulted: {what}"
    else:
        line = (f"{launch} or a launch after it faulted: {what} (launches run asynchronously; "
                "record with CUDA_LAUNCH_BLOCKING=1 to name the launch)")
    after = int(fault.get("after_fault", 0))
    if after:
        line += f"; {after} later launch{'es were' if after != 1 else ' was'} not recorded"
    if data.get("guard_bytes") == 0 and fault.get("code") == 700:
        line += " (recorded with --guard-bytes 0: a read just outside an allocation faults)"
    return line


def graph_summary(procs: Sequence[RawProcess], demangle: Callable[[str], str]
                  ) -> dict[str, Any]:
    """recording.json's ``graphs``: what ran through CUDA graphs, which R³ does not record.

    ``kernel_node_launches`` is the kernel nodes each graph held when instantiated times its
    launches, None when a launched graph was instantiated where the interposer did not see
    it; ``captured_kernel_launches`` counts the launches made into capturing streams."""
    graphs = [g for p in procs for g in p.graphs]
    launched = [g for g in graphs if g.launches]
    unknown = any(g.kernel_nodes < 0 for g in launched)
    names = dict.fromkeys(k for g in launched for k in g.kernels)
    return {
        "launches": sum(g.launches for g in graphs),
        "device_time_s": sum(g.time_s for g in graphs),
        "instantiated": sum(g.kernel_nodes >= 0 for g in graphs),
        "kernel_node_launches": None if unknown else sum(g.launches * g.kernel_nodes
                                                         for g in launched),
        "captured_kernel_launches": sum(p.count("captured_launches") for p in procs),
        "kernels": [demangle(n) for n in names],
    }


def graph_line(data: dict[str, Any]) -> str | None:
    """The one line ``r3 record`` prints when kernels ran through CUDA graphs."""
    graphs = data.get("graphs") or {}
    launches = int(graphs.get("launches", 0))
    if not launches:
        return None
    names = [n.split("(")[0] for n in graphs.get("kernels", [])]
    shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    nodes = graphs.get("kernel_node_launches")
    what = f"{nodes} kernel runs" if nodes is not None else "their kernel runs"
    return (f"{launches} CUDA graph launch{'es' if launches != 1 else ''} were not recorded: "
            f"{what}{f' ({shown})' if shown else ''} are not in the profile "
            f"({graphs.get('device_time_s', 0.0) * 1e3:.3f} ms of device time in graphs)")
