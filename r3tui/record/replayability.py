"""Whether a configuration the interposer recorded replays, and in words why not.

A configuration is *not replayable*, with the reason, when its arguments or the buffers it can
reach hold a pointer into memory the arena does not hold (managed memory, a stream-ordered
pool, or an allocation the arena could not serve), when its launch failed or faulted, when
no module image of it was captured, or when the interposer did not snapshot it (``--kernel``,
``--max-configs``, ``--max-snapshot-bytes``, a file it could not write).  Its check launch
(its second launch, ``docs/verification.md``) goes into its bundle only under the same
conditions.  The reasons are the sentences ``recording.json`` and ``r3 tune-app`` show.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from r3tui.record.raw_dump import (
    FAULT_ERRORS,
    OutsideAllocation,
    RawConfig,
    RawProcess,
    error_name,
)


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


def budget_text(proc: RawProcess) -> str:
    """The snapshot byte budget the process ran with, as a reason names it."""
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
                    f"snapshot budget ({budget_text(proc)}){kept}")
        return f"not snapshotted: snapshot budget spent ({budget_text(proc)})"
    if why == "stratum":
        return ("not snapshotted: this stratum's launch to snapshot did not come (the run "
                "launched fewer times than the recording its strata were chosen from)")
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
