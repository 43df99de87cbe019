"""The interposer's raw dump, read back into processes, configurations and graphs.

The interposer (``interpose/r3rec.c``) writes, per process that used CUDA, ``p<pid>/index.jsonl``
(one event a line: allocations, frees, module images, device globals, the first launch of each
configuration with its argument bytes and snapshot files, and at exit the per-configuration
launch counts and device times, all launches and apart those whose argument bytes equal the
recorded first launch's) and ``p<pid>/data/`` (raw prologue/epilogue bytes and module
images).  :func:`read_dump` parses every process's index -- tolerating a last line cut short
by a crash, which becomes a warning -- and keeps, for each configuration's first and check
launch, the memory outside the arena that was live then: what decides whether it replays
(:mod:`r3tui.record.replayability`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from r3tui.domain import Dim3, LaunchTimes

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
