"""From the interposer's raw dump to recording bundles and ``recording.json``.

The interposer (``interpose/r3rec.c``) writes, per process that used CUDA, ``p<pid>/index.jsonl``
(one event a line: allocations, frees, module images, device globals, the first launch of each
configuration with its argument bytes and snapshot files, and at exit the per-configuration
launch counts and device times, all launches and apart those whose argument bytes equal the
recorded first launch's) and ``p<pid>/data/`` (raw prologue/epilogue bytes and module
images).  :func:`build_recording` writes one standard bundle per replayable configuration, so
the rest of R³ replays them like any other, and returns ``recording.json``: every kernel's
configurations with their launch counts and device times, and the ones that do not replay
with the reason.  The steps live apart: :mod:`~r3tui.record.raw_dump` reads the dump
(:func:`read_dump`), :mod:`~r3tui.record.replayability` says why a configuration does not
replay, :mod:`~r3tui.record.app_bundle` writes one configuration's bundle; this module
assembles ``recording.json`` and the lines ``r3 record`` ends with.

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

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from r3tui.domain import LaunchTimes
from r3tui.record.app_bundle import SourceChoice, launched_threads, short_name, write_bundle
from r3tui.record.raw_dump import RawProcess, error_name, read_dump
from r3tui.record.replayability import (
    budget_text,
    check_problems,
    size_text,
    unreplayable_reasons,
)

# read_dump, RawProcess, SourceChoice, short_name, launched_threads and size_text live in the
# modules this one builds on; the recorder, the command line and the tests import them from
# here, the one entry point of converting a dump.
__all__ = [
    "BUNDLE_DIR",
    "FORMAT_VERSION",
    "RECORDING_NAME",
    "UNSUPPORTED_KINDS",
    "RawProcess",
    "SourceChoice",
    "build_recording",
    "fault_line",
    "fault_summary",
    "graph_line",
    "graph_summary",
    "launched_threads",
    "raw_write_error",
    "read_dump",
    "short_name",
    "size_text",
    "snapshot_summary",
    "write_error_line",
]

FORMAT_VERSION = 1
RECORDING_NAME = "recording.json"
BUNDLE_DIR = "bundles"
UNSUPPORTED_KINDS = ("managed", "stream_ordered")


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
                # a later stratum of the same grid and block (r3 record --strata-from): the
                # launch number it began at among that grid and block's (1: the first), and
                # the one its snapshot is of
                "from_launch": int(cfg.event.get("from") or 1),
                "snapshot_launch": cfg.event.get("at") if cfg.recorded else None,
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
        said.append(f"the snapshot budget ({budget_text(proc)}) was spent: {len(budget)} "
                    "configurations were profiled but not snapshotted")
    return said


def snapshot_summary(procs: Sequence[RawProcess]) -> dict[str, Any]:
    """recording.json's ``snapshots``: the bounds the interposer ran with (the first
    process's), whether it wrote a file's bytes once, the bytes it wrote to the raw dump, and
    how many configurations were
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
            # files whose bytes an earlier file holds were not written again (r3rec.c); None
            # for a dump from before that
            "dedup": bool(start["dedup"]) if "dedup" in start else None,
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
