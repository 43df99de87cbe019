"""``r3 record kernel``, ``r3 record pycuda``, ``r3 record verify``, ``r3 record -- ./app``
and ``r3 recordings``."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from r3tui.errors import ConfigError, GpuUnavailable, R3Error, RecordingError

if TYPE_CHECKING:
    from rich.status import Status

    from r3tui.domain import Recording
    from r3tui.record.bundle import Bundle


def add_commands(subparsers: argparse._SubParsersAction) -> None:
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

    from r3tui.record.app_commands import add_app_command

    add_app_command(record, sub)

    recordings = subparsers.add_parser("recordings", help="table of the recordings in the DB")
    recordings.set_defaults(handler=cmd_recordings)


@contextmanager
def _status(text: str) -> Iterator[Status]:
    from rich.console import Console

    console = Console(stderr=True)
    with console.status(text) as status:
        yield status


def register(db_path: Path, bundle: Bundle) -> int:
    """Add the bundle to the experiment database (idempotent on its sha256)."""
    from db import repository as repo
    from db.session import open_database

    database = open_database(db_path, create=True, upgrade=True)
    try:
        with database.session_scope() as session:
            return repo.add_recording(session, recording_of(bundle), bundle.manifest.to_json())
    finally:
        database.close()


def recording_of(bundle: Bundle) -> Recording:
    from r3tui.domain import Recording

    m = bundle.manifest
    return Recording(bundle_path=str(bundle.path.resolve()), sha256=bundle.sha256,
                     kernel_name=m.kernel.name, launch=m.to_launch())


def cmd_record_kernel(args: argparse.Namespace) -> int:
    from r3tui.record.kernel_recorder import RecordKernelRequest, record_kernel

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
    from r3tui.record.pycuda_capture import main as capture_main

    if not args.script.is_file():
        raise R3Error(f"no script at {args.script}")
    argv = ["--out", str(args.out)]
    for name in args.only or []:
        argv += ["--kernel", name]
    code = capture_main([*argv, str(args.script), *args.args])
    from r3tui.record.bundle import Bundle
    from r3tui.record.pycuda_capture import INDEX_NAME

    index = args.out / INDEX_NAME
    if index.is_file():
        import json

        for entry in json.loads(index.read_text())["bundles"]:
            register(args.db, Bundle.open(args.out / entry["path"]))
    return code


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
