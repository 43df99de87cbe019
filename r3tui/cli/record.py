"""``r3 record kernel``, ``r3 record pycuda``, ``r3 record verify``, ``r3 record -- ./app``
(also spelled ``r3 record app ...``) and ``r3 recordings``."""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from r3tui.errors import (
    ApplicationFaulted,
    ConfigError,
    GpuUnavailable,
    R3Error,
    RecordingError,
    RecordingWriteFailed,
)

if TYPE_CHECKING:
    from rich.status import Status

    from r3tui.cli import Subcommands


def add_commands(subparsers: Subcommands) -> None:
    record = subparsers.add_parser("record", help="record a kernel launch into a bundle")
    record.set_defaults(help_parser=record)
    sub = record.add_subparsers(dest="record_command", metavar="ACTION",
                                parser_class=type(record))

    kernel = sub.add_parser("kernel", help="record one launch of a standalone kernel")
    kernel.add_argument("source", type=Path, help="the kernel's .cu file")
    kernel.add_argument("--kernel", required=True, help="entry point (extern \"C\" name)")
    kernel.add_argument("--inputs", required=True, type=Path,
                        help="Python file defining make_inputs(rng) -> KernelInputs")
    kernel.add_argument("--out", type=Path, default=None,
                        help="bundle directory (default: recordings/<kernel>-<seed>)")
    kernel.add_argument("--seed", type=int, default=0, help="seed of the input generator")
    kernel.add_argument("--scale", type=float, default=1.0,
                        help="problem scale passed to make_inputs (default 1.0)")
    kernel.add_argument("--checks", type=int, default=1, metavar="N",
                        help="check launches to record besides the timed one: the generator "
                        "with seed+k at scale*CHECK_SCALE**k; candidates must pass them too "
                        "(default 1; 0 records none)")
    kernel.add_argument("--check-scale", type=float, default=0.125,
                        help="scale factor of each check launch's inputs (default 0.125)")
    kernel.add_argument("--option", action="append", default=[], dest="options",
                        metavar="FLAG", help="compiler flag for the original, repeatable; "
                        "write --option=-FLAG for flags that start with a dash")
    kernel.add_argument("--toolchain", choices=("nvrtc", "nvcc"), default="nvrtc")
    kernel.add_argument("--device", type=int, default=0)
    kernel.add_argument("--force", action="store_true", help="replace an existing bundle")
    kernel.set_defaults(handler=cmd_record_kernel)

    py = sub.add_parser("pycuda", help="run a PyCUDA program and record its launches")
    py.add_argument("script", type=Path)
    py.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    py.add_argument("--out", required=True, type=Path, help="directory for the bundles")
    py.add_argument("--only", action="append", default=None, metavar="KERNEL",
                    help="record only this kernel (repeatable)")
    py.set_defaults(handler=cmd_record_pycuda)

    verify = sub.add_parser("verify", help="check a bundle's checksums and, on a GPU, its replay")
    verify.add_argument("bundle", type=Path)
    verify.add_argument("--device", type=int, default=0)
    verify.add_argument("--no-gpu", action="store_true", help="checksums only")
    verify.set_defaults(handler=cmd_record_verify)

    _add_app_command(record, sub)

    recordings = subparsers.add_parser("recordings", help="table of the recordings in the DB")
    recordings.set_defaults(handler=cmd_recordings)


@contextmanager
def _status(text: str) -> Iterator[Status]:
    from rich.console import Console

    console = Console(stderr=True)
    with console.status(text) as status:
        yield status


def cmd_record_kernel(args: argparse.Namespace) -> int:
    from r3tui.record.kernel_recorder import RecordKernelRequest, record_kernel
    from r3tui.record.registration import register

    out = args.out or Path("recordings") / f"{args.kernel}-{args.seed}"
    if args.checks < 0 or not 0 < args.check_scale <= 1:
        raise ConfigError("--checks must be >= 0 and --check-scale in (0, 1]")
    req = RecordKernelRequest(
        source_path=args.source, kernel_name=args.kernel, inputs_path=args.inputs, out=out,
        seed=args.seed, scale=args.scale, options=tuple(args.options),
        toolchain=args.toolchain, device=args.device, overwrite=args.force,
        checks=args.checks, check_scale=args.check_scale,
    )
    with _status("recording") as status:
        bundle = record_kernel(req, progress=lambda msg: status.update(msg))
    rec_id = register(args.db, bundle)
    m = bundle.manifest
    base = m.launch.baseline
    timing = f", original {base.median_s * 1e6:.1f} µs median of {base.n}" if base else ""
    print(f"recorded {m.kernel.name} grid {m.launch.grid.as_tuple()} block "
          f"{m.launch.block.as_tuple()}: {len(m.allocations)} allocations, "
          f"{m.working_set_bytes / 1e6:.1f} MB{timing}")
    for c in m.checks:
        print(f"check launch ({c.label}): grid {c.launch.grid.as_tuple()}, "
              f"{sum(a.size for a in c.allocations) / 1e6:.1f} MB")
    print(f"bundle {bundle.path} sha256 {bundle.sha256[:16]} (recording #{rec_id} in {args.db})")
    return 0


def cmd_record_pycuda(args: argparse.Namespace) -> int:
    from r3tui.record.pycuda_capture import record_script

    if not args.script.is_file():
        raise R3Error(f"no script at {args.script}")
    session = record_script(args.out, args.script, args.args, args.only)
    for bundle in session.bundles:
        print(f"recorded {bundle.manifest.kernel.name} -> {bundle.path} ({bundle.sha256[:12]})")
    for warning in session.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    from r3tui.record.bundle import Bundle
    from r3tui.record.pycuda_capture import INDEX_NAME
    from r3tui.record.registration import register

    index = args.out / INDEX_NAME
    if index.is_file():
        import json

        for entry in json.loads(index.read_text())["bundles"]:
            register(args.db, Bundle.open(args.out / entry["path"]))
    return 0


def cmd_record_verify(args: argparse.Namespace) -> int:
    from r3tui.record.bundle import Bundle

    with _status(f"hashing {args.bundle}"):
        bundle = Bundle.open(args.bundle)
        n = bundle.verify_checksums()
    m = bundle.manifest
    print(f"{bundle.path}: manifest valid (format {m.format_version}), {n} blobs match their "
          f"sha256; bundle sha256 {bundle.sha256[:16]}")
    if args.no_gpu:
        return 0
    binary = bundle.binary()
    if binary is None:
        print("replay: skipped (the bundle stores no binary of the original)")
        return 0
    from r3tui.replay.candidate import Candidate
    from r3tui.replay.worker import ReplayWorker

    try:
        with _status("replaying the original on the GPU"), \
                ReplayWorker(bundle.path, args.device) as worker:
            result = worker.evaluate(Candidate(binary, m.kernel.entry_point, label="original"),
                                     timed=False)
    except GpuUnavailable as exc:
        print(f"replay: skipped ({exc.one_line()})")
        return 0
    if not result.ok:
        raise RecordingError(f"the original does not replay to its epilogue: {result.status}: "
                             f"{result.error_text}")
    print(f"replay: the original reproduces the epilogue (max error {result.max_error or 0:.3g})")
    return 0


def cmd_recordings(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from db import repository as repo
    from db.session import open_database

    with (
        open_database(args.db, readonly=True, create=False, one_shot=True) as database,
        database.session_scope() as session,
    ):
        rows = repo.list_recordings(session)
    console = Console()
    if not rows:
        console.print(f"no recordings in {args.db} yet")
        return 0
    table = Table("id", "kernel", "grid", "block", "smem", "launches", "time", "sha256",
                  "bundle", "recorded")
    for r in rows:
        ln = r.launch
        time_text = f"{ln.total_time_s * 1e6:.1f} µs" if ln.total_time_s else "-"
        present = Path(r.bundle_path).is_dir()
        table.add_row(
            str(r.id), r.kernel_name, "x".join(map(str, ln.grid.as_tuple())),
            "x".join(map(str, ln.block.as_tuple())), str(ln.shared_mem_bytes), str(ln.count),
            time_text, r.sha256[:12],
            r.bundle_path if present else f"[red]{r.bundle_path} (missing)[/]",
            r.created_at.strftime("%Y-%m-%d %H:%M") if r.created_at else "-",
        )
    console.print(table)
    return 0


# -- r3 record [OPTIONS] -- ./app ARGS... -----------------------------------------------
_ACTIONS = ("kernel", "pycuda", "verify", "app")


def _add_app_command(record: argparse.ArgumentParser, sub: Any) -> None:
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
    app.add_argument("--strata-from", type=Path, default=None, metavar="REC",
                     help="an earlier recording of the same run: each configuration whose "
                     "later launches do other work than its first (other sizes, steps) is "
                     "cut into --strata runs, each snapshotted at its middle launch, so "
                     "predictions cover them")
    from r3tui.record.strata import DEFAULT_WINDOWS

    app.add_argument("--strata", type=int, default=DEFAULT_WINDOWS, metavar="N",
                     help=f"runs a --strata-from configuration is cut into (default "
                     f"{DEFAULT_WINDOWS})")
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
    from r3tui.record.registration import register

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
    if args.strata < 2:
        raise R3Error(f"--strata must be 2 or more, not {args.strata}")
    out = args.out or Path("recordings") / exe.name
    if args.timeout is not None and not args.timeout > 0:
        raise R3Error(f"--timeout must be a positive number of seconds, not {args.timeout:g}")
    req = AppRecordRequest(command=command, out=out, sources=tuple(args.sources),
                           compile_db=args.compile_db,
                           include_dirs=tuple(args.include_dirs), reachable=args.reachable,
                           checks=not args.no_checks,
                           kernels=tuple(args.kernels), overwrite=args.force,
                           keep_raw=args.keep_raw, guard_bytes=guard,
                           max_configs=max_configs, strata_from=args.strata_from,
                           strata=args.strata,
                           max_snapshot_bytes=args.max_snapshot_bytes,
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
    names = _other_work_names(recording.data)
    if args.strata_from is None and names:
        # where a replay of the first launch stands for little of a configuration's time
        console.print(f"[yellow]note:[/] later launches of {names} "
                      "do other work than the one replayed (other arguments, other times); "
                      f"`r3 record --strata-from {recording.out} --force ...` records strata "
                      "of them, so that tune-app's prediction counts their gains")
    print(f"{recording.out / 'recording.json'}: {registered} replayable bundles "
          f"(registered in {args.db})")
    return 0


def _other_work_names(data: dict[str, Any]) -> str:
    """The kernels of ``data`` with a configuration whose launches with other arguments than
    the replayed one took another time a launch (names, joined)."""
    from r3tui.record.strata import does_other_work

    return ", ".join(str(k.get("name") or k["entry_point"]) for k in data["kernels"]
                     if any(does_other_work(c) for c in k["configs"]))


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
        strata = sum(int(c.get("from_launch") or 1) > 1 for c in k["configs"])
        table.add_row(k["name"], str(k["launches"]), f"{k['device_time_s'] * 1e3:.3f} ms",
                      f"{k['device_time_s'] / total:.1%}",
                      f"{n} ({strata} strata)" if strata else str(n), verdict)
    if graphs.get("launches"):
        table.add_row("(CUDA graphs)", str(graphs["launches"]),
                      f"{graph_time * 1e3:.3f} ms", f"{graph_time / total:.1%}", "-",
                      "[red]not recorded[/]")
    Console().print(table)
