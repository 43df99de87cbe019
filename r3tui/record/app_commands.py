"""``r3 record [OPTIONS] -- ./app ARGS...`` (also spelled ``r3 record app ...``)."""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path
from typing import Any

from r3tui.errors import ApplicationFaulted, R3Error, RecordingWriteFailed

_ACTIONS = ("kernel", "pycuda", "verify", "app")


def add_app_command(record: argparse.ArgumentParser, sub: Any) -> None:
    """Add ``app`` under ``r3 record`` and route ``r3 record [opts] -- CMD`` to it."""
    app = sub.add_parser("app", help="run an unmodified CUDA application and record its "
                         "kernels: r3 record [OPTIONS] -- ./app ARGS...")
    app.add_argument("--out", type=Path, default=None,
                     help="recording directory (default: recordings/<app name>)")
    app.add_argument("--source", action="append", type=Path, default=[], dest="sources",
                     metavar="FILE", help="a source file or directory of the application "
                     "(repeatable), for kernel source association")
    app.add_argument("--compile-db", type=Path, default=None, metavar="JSON",
                     help="compile_commands.json of the application's build")
    app.add_argument("--include", action="append", type=Path, default=[], dest="include_dirs",
                     metavar="DIR", help="an include directory of the application (repeatable), "
                     "searched after a unit's own -I: the headers it holds that a recorded "
                     "unit includes are copied into the bundle")
    app.add_argument("--reachable", action="store_true",
                     help="snapshot only the allocations the arguments reach (default: all live)")
    app.add_argument("--no-checks", action="store_true",
                     help="do not snapshot each configuration's second launch as a check "
                     "launch (docs/verification.md); halves the snapshots")
    app.add_argument("--kernel", action="append", default=[], dest="kernels", metavar="NAME",
                     help="snapshot only this kernel (repeatable; all are still profiled)")
    app.add_argument("--guard-bytes", type=int, default=None, metavar="N",
                     help="mapped, zero-filled bytes left free before and after each "
                     "allocation, so that a kernel reading a little out of bounds does not "
                     "fault under recording or replay (default 65536; 0: none)")
    app.add_argument("--max-configs", type=int, default=None, metavar="N",
                     help="snapshot at most N launch configurations of each kernel, the first "
                     "N it launches (default 4; every launch is still counted and timed)")
    app.add_argument("--max-snapshot-bytes", type=parse_size, default=None, metavar="SIZE",
                     help="stop snapshotting once the snapshots would pass SIZE bytes (8G, "
                     "512M, ...; default: 8 GiB or a quarter of the space free under --out, "
                     "whichever is smaller)")
    app.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                     help="kill the application if it runs longer than this under recording "
                     "(default: no limit)")
    app.add_argument("--force", action="store_true", help="replace an existing recording")
    app.add_argument("--keep-raw", action="store_true",
                     help="keep the interposer's raw dump (DIR/raw) for debugging")
    app.add_argument("app_command", nargs="*", metavar="-- CMD", help="the application and "
                     "its arguments, after --")
    app.set_defaults(handler=cmd_record_app)

    base = type(record)

    class RecordParser(base):  # type: ignore[valid-type, misc]
        """Inserts the ``app`` action when the line reads ``r3 record [opts] -- CMD``."""

        def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
            items = list(args) if args is not None else []
            if items and items[0] not in _ACTIONS and items[0] not in ("-h", "--help") \
                    and "--" in items:
                items = ["app", *items]
            return super().parse_known_args(items, namespace)

        def format_help(self) -> str:
            # `r3 record --help` is where a user looks for how to record an application
            return super().format_help() + "\n" + app_options_help(app)

    record.usage = "%(prog)s [-h] ACTION ...\n       %(prog)s [OPTIONS] -- ./app ARGS..."
    record.__class__ = RecordParser


def app_options_help(app: argparse.ArgumentParser) -> str:
    """The options of ``r3 record [OPTIONS] -- ./app ARGS...`` as a help section."""
    formatter = app._get_formatter()
    formatter.start_section("options of r3 record [OPTIONS] -- ./app ARGS... "
                            "(also spelled `r3 record app`)")
    formatter.add_arguments([a for a in app._actions
                             if a.option_strings and not isinstance(a, argparse._HelpAction)])
    formatter.end_section()
    return formatter.format_help()


_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?", re.IGNORECASE)


def parse_size(text: str) -> int:
    """``8G``, ``512MiB``, ``1.5g`` or a count of bytes."""
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (write e.g. 8G, 512M, 100000)")
    shift = 10 * "kmgt".find(match.group(2).lower()) + 10 if match.group(2) else 0
    return int(float(match.group(1)) * (1 << shift))


def cmd_record_app(args: argparse.Namespace) -> int:
    from rich.console import Console

    from r3tui.cuda.arena import GUARD_BYTES
    from r3tui.record.app_recorder import (
        MAX_CONFIGS,
        AppRecordRequest,
        record_app,
        resolve_executable,
    )
    from r3tui.record.commands import register

    command = tuple(args.app_command)
    exe = resolve_executable(command)
    for path in args.sources:
        if not path.exists():
            raise R3Error(f"no source file or directory {path}")
    if args.compile_db is not None and not args.compile_db.is_file():
        raise R3Error(f"no compile database {args.compile_db}")
    for path in args.include_dirs:
        if not path.is_dir():
            raise R3Error(f"no include directory {path}")
    if args.include_dirs and not args.sources and args.compile_db is None:
        raise R3Error("--include needs --source or --compile-db (it is where their units' "
                      "headers are searched)")
    guard = GUARD_BYTES if args.guard_bytes is None else args.guard_bytes
    if guard < 0:
        raise R3Error(f"--guard-bytes must be 0 or more, not {guard}")
    max_configs = MAX_CONFIGS if args.max_configs is None else args.max_configs
    if max_configs < 0:
        raise R3Error(f"--max-configs must be 0 or more, not {max_configs}")
    out = args.out or Path("recordings") / exe.name
    if args.timeout is not None and not args.timeout > 0:
        raise R3Error(f"--timeout must be a positive number of seconds, not {args.timeout:g}")
    req = AppRecordRequest(command=command, out=out, sources=tuple(args.sources),
                           compile_db=args.compile_db,
                           include_dirs=tuple(args.include_dirs), reachable=args.reachable,
                           checks=not args.no_checks,
                           kernels=tuple(args.kernels), overwrite=args.force,
                           keep_raw=args.keep_raw, guard_bytes=guard,
                           max_configs=max_configs, max_snapshot_bytes=args.max_snapshot_bytes,
                           timeout_s=args.timeout)
    console = Console(stderr=True)
    console.print(f"[bold]recording[/] {' '.join(command)} -> {out}")
    # No spinner while the application runs: its own output goes to the terminal.
    recording = record_app(req, progress=lambda msg: console.print(f"[dim]{msg}[/]"))
    from r3tui.record.bundle import Bundle

    registered = 0
    for kernel in recording.data["kernels"]:
        for config in kernel["configs"]:
            if config["bundle"]:
                register(args.db, Bundle.open(recording.out / config["bundle"]))
                registered += 1
    from r3tui.record.app_dump import fault_line, graph_line, write_error_line

    saved = recording.out / "recording.json" if recording.saved else None
    fault = fault_line(recording.data)
    if fault is not None:  # one line, exit 1; what was recorded before the fault is kept
        raise ApplicationFaulted(f"{fault}; what was recorded before it ({registered} "
                                 f"replayable bundles) is in "
                                 f"{saved or 'bundles/ (recording.json could not be written)'}")
    unwritten = write_error_line(recording.data)
    if unwritten is not None:  # a full disk: one line, exit 1; the bundles written are kept
        where = f"{saved} says what was recorded" if saved else \
            "recording.json could not be written"
        raise RecordingWriteFailed(f"{unwritten}; the {registered} replayable bundles written "
                                   f"before it are registered in {args.db}; {where}")
    print_profile(recording.data)
    line = graph_line(recording.data)
    if line is not None:
        console.print(f"[yellow]{line}[/]", markup=True, highlight=False)
    for warning in recording.data["warnings"]:
        console.print(f"[yellow]warning:[/] {warning}")
    print(f"{recording.out / 'recording.json'}: {registered} replayable bundles "
          f"(registered in {args.db})")
    return 0


def print_profile(data: dict[str, Any]) -> None:
    """The recording as a profile: kernels by device time, with their share and replayability."""
    from rich.console import Console
    from rich.table import Table

    graphs = data.get("graphs") or {}
    graph_time = float(graphs.get("device_time_s", 0.0))
    total = sum(k["device_time_s"] for k in data["kernels"]) + graph_time or 1.0
    table = Table("kernel", "launches", "device time", "share", "configs", "replayable",
                  title=f"{' '.join(data['command'])}: runtime {data['runtime']}, "
                  f"wall {data['wall_s']:.2f} s, exit {data['exit_code']}")
    for k in data["kernels"]:
        ok = sum(c["replayable"] for c in k["configs"])
        n = len(k["configs"])
        # the reason most of its other configurations share
        reasons = Counter(r for c in k["configs"] for r in c["reasons"]).most_common(1)
        verdict = f"{ok}/{n}" + (f" [red]({reasons[0][0]})[/]" if reasons else "")
        table.add_row(k["name"], str(k["launches"]), f"{k['device_time_s'] * 1e3:.3f} ms",
                      f"{k['device_time_s'] / total:.1%}", str(n), verdict)
    if graphs.get("launches"):
        table.add_row("(CUDA graphs)", str(graphs["launches"]),
                      f"{graph_time * 1e3:.3f} ms", f"{graph_time / total:.1%}", "-",
                      "[red]not recorded[/]")
    Console().print(table)
