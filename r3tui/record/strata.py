"""Which launches ``r3 record --strata-from REC`` snapshots as strata (docs/app-recording.md).

A replay reproduces a configuration's first launch.  Where the configuration's other launches
took, on average, more or less device time than the launches with that first launch's
arguments (:func:`~r3tui.domain.other_launches_differ`, read from REC's ``recording.json``), or
most of them had other arguments, they can do other work, and a speedup measured on the first
launch need not hold for them:
Rodinia gaussian's Fan2 runs 4095 launches of one configuration, one elimination step each,
and its winner's 10.9x on the first step was 20.0x over all of them (H100, session 45).

Such a configuration's launches are cut into ``windows`` runs of equal length, each a stratum
that begins at its first launch and is snapshotted at its middle one, so the launch replayed
stands for the run around it (the first run begins at the second launch: the first stays the
configuration's own, alone).  The interposer reads the choice from
``R3_RECORD_STRATA_FILE``: a line a configuration,
``entry gx gy gz bx by bz shm begin snapshot begin snapshot ...``.  The launch numbers are
REC's; an application that launches the same sequence again (as a deterministic program does)
meets them.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

from r3tui.domain import LaunchTimes, other_launches_differ
from r3tui.errors import R3Error

DEFAULT_WINDOWS = 4
STRATA_FILE = "strata.txt"  # beside the recording: what the interposer was given
# A configuration with less of the recorded device time gets no strata: they could move the
# predicted kernel time by less than this share, yet each stratum's snapshot takes as much of
# --max-snapshot-bytes as a large one's (gaussian's Fan1, 0.7%, took three of the six bundles
# 3 GiB held, and two of Fan2's four strata went unsnapshotted; H100, session 48).
MIN_SHARE = 0.05


def windows_of(count: int, windows: int) -> list[tuple[int, int]]:
    """(begin, snapshot) launch numbers of the strata of ``count`` launches cut into
    ``windows`` runs of equal length (within one launch): each run's first launch and its
    middle one.  The first run's stratum begins at the second launch: the first launch stays
    the configuration's own (every recording snapshots it), alone."""
    starts = [1 + round(k * count / windows) for k in range(windows)] + [count + 1]
    return [(max(begin, 2), begin + (end - begin) // 2)
            for begin, end in itertools.pairwise(starts)
            if end > max(begin, 2) and begin + (end - begin) // 2 >= max(begin, 2)]


def does_other_work(config: dict[str, Any]) -> bool:
    """Whether a configuration of ``recording.json`` took, in its launches with other
    arguments than the replayed one, another time a launch (the other launches do other
    work: what ``r3 record`` notes and tune-app calls an uncertain prediction)."""
    same = LaunchTimes.from_json(config.get("same_args"))
    return other_launches_differ(int(config.get("count", 0)),
                                 float(config.get("device_time_s", 0.0)), same) is not None


def wants_strata(config: dict[str, Any], windows: int) -> bool:
    """Whether strata are recorded of a configuration of ``recording.json``: at least two
    launches a window, and its other launches took another time a launch
    (:func:`does_other_work`) or most of its launches had other arguments than the replayed
    one.  The second stands where the original's time is set by its grid and not by the
    work the arguments give it (many blocks that return at once), while a change that
    launches fewer blocks gains with less work."""
    same = LaunchTimes.from_json(config.get("same_args"))
    count = int(config.get("count", 0))
    if count < 2 * windows or same is None:
        return False
    return does_other_work(config) or 2 * same.count < count


def strata_lines(recording: dict[str, Any], windows: int) -> list[str]:
    """The lines of the strata file for the configurations of ``recording`` (a parsed
    ``recording.json``) that want strata (:func:`wants_strata`) and hold at least
    :data:`MIN_SHARE` of its configurations' device time."""
    configs = [c for kernel in recording.get("kernels", []) for c in kernel.get("configs", [])]
    total = sum(float(c.get("device_time_s", 0.0)) for c in configs)
    lines = []
    for kernel in recording.get("kernels", []):
        for c in kernel.get("configs", []):
            if not wants_strata(c, windows) or (
                    float(c.get("device_time_s", 0.0)) < MIN_SHARE * total):
                continue
            count = int(c["count"])
            pairs = windows_of(count, windows)
            geometry = [*c["grid"], *c["block"], int(c.get("shared_mem_bytes", 0))]
            lines.append(" ".join([str(kernel["entry_point"]), *map(str, geometry),
                                   *(f"{b} {s}" for b, s in pairs)]))
    return lines


def read_strata_source(directory: Path, windows: int) -> list[str]:
    """:func:`strata_lines` of the recording in ``directory``; a one-line :class:`R3Error`
    where it is not one, or ``windows`` is below 2."""
    if windows < 2:
        raise R3Error(f"--strata must be 2 or more, not {windows}")
    path = directory / "recording.json"
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise R3Error(f"--strata-from {directory}: not an application recording (no "
                      "recording.json)", hint="record one with `r3 record -- ./app ARGS`") from None
    except (OSError, ValueError) as exc:
        raise R3Error(f"--strata-from: cannot read {path}: {exc}") from None
    if not isinstance(data, dict) or data.get("format_version") != 1:
        raise R3Error(f"--strata-from: {path} is not a format_version 1 application recording")
    try:
        return strata_lines(data, windows)
    except (KeyError, TypeError, ValueError) as exc:
        raise R3Error(f"--strata-from: {path} has a malformed configuration: {exc}") from None
