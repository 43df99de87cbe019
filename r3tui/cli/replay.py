"""``r3 replay BUNDLE``: compile one candidate and measure it against the recording."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from r3tui.domain import Dim3, Measurement, MeasurementStatus
from r3tui.errors import ConfigError, R3Error

if TYPE_CHECKING:
    from r3tui.cli import Subcommands


def add_commands(subparsers: Subcommands) -> None:
    replay = subparsers.add_parser("replay", help="compile a candidate and replay it on the GPU")
    replay.add_argument("bundle", type=Path, help="recording bundle directory")
    replay.add_argument("--source", type=Path, default=None,
                        help="kernel source of the candidate (default: the recorded source)")
    replay.add_argument("--kernel", default=None,
                        help="entry point in --source (default: the recorded kernel's name)")
    replay.add_argument("--option", action="append", default=None, dest="options",
                        metavar="FLAG", help="compiler flag, repeatable, as --option=-FLAG "
                        "(default: as recorded)")
    replay.add_argument("--define", action="append", default=[], metavar="NAME=VALUE",
                        help="extra -D for the candidate (repeatable)")
    replay.add_argument("--block", default=None, help="block shape X[,Y[,Z]]; the grid follows "
                        "the recorded work size")
    replay.add_argument("--toolchain", choices=("nvrtc", "nvcc"), default="nvrtc")
    replay.add_argument("--device", type=int, default=0)
    replay.add_argument("--timeout", type=float, default=60.0, help="seconds per candidate")
    replay.set_defaults(handler=cmd_replay)


def _defines(recorded: tuple[tuple[str, str], ...], extra: list[str]
             ) -> tuple[tuple[str, str], ...]:
    merged = dict(recorded)
    for item in extra:
        name, sep, value = item.partition("=")
        if not name:
            raise ConfigError(f"bad --define {item!r}: expected NAME=VALUE")
        merged[name] = value if sep else "1"
    return tuple(sorted(merged.items()))


def cmd_replay(args: argparse.Namespace) -> int:
    from rich.console import Console

    from r3tui.compile.base import CompileRequest, get_toolchain
    from r3tui.record.bundle import Bundle
    from r3tui.replay.candidate import Candidate
    from r3tui.replay.worker import ReplayWorker

    console = Console(stderr=True)
    bundle = Bundle.open(args.bundle)
    m = bundle.manifest
    if args.source is not None:
        if not args.source.is_file():
            raise ConfigError(f"candidate source {args.source} does not exist")
        source, source_name = args.source.read_text(encoding="utf-8"), args.source.name
        include_dirs: tuple[str, ...] = (str(args.source.parent.resolve()),)
    else:
        source = bundle.source()
        if source is None:
            raise R3Error(f"{args.bundle} stores no kernel source; pass --source FILE")
        source_name, include_dirs = m.kernel.sources[0].name, bundle.include_dirs()
    original = bundle.source()
    if args.source is not None and original is not None:
        # the static half of docs/verification.md: refused candidates are never compiled
        from r3tui.analysis import check_candidate

        report = check_candidate(original, source)
        if report.refused:
            print_measurement(Measurement(MeasurementStatus.UNSAFE, error_text=report.reason))
            return 1
    recorded_opts = m.kernel.options if m.kernel.toolchain == args.toolchain else ()
    options = tuple(args.options) if args.options is not None else recorded_opts
    block = None
    if args.block:
        try:
            block = Dim3.parse(args.block)
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        if block != m.launch.block and not m.launch.block_tunable:
            raise ConfigError(f"{m.kernel.name} was recorded as not block-tunable; "
                              "it only replays with its recorded block")
    with ReplayWorker(bundle.path, args.device, timeout_s=args.timeout) as worker:
        with console.status("mapping the recording on the GPU"):
            info = worker.start()
        with console.status(f"compiling with {args.toolchain} for {info.arch}"):
            compiled = get_toolchain(args.toolchain).compile(CompileRequest(
                source=source, kernel_name=args.kernel or m.kernel.name, arch=info.arch,
                options=options, defines=_defines(m.kernel.defines, args.define),
                include_dirs=include_dirs, source_name=source_name,
            ))
        if not compiled.ok:
            Console().print(compiled.log, markup=False, highlight=False)
            raise R3Error(f"the candidate does not compile with {args.toolchain}")
        with console.status("replaying"):
            result = worker.evaluate(Candidate.from_compiled(compiled, block=block))
    print_measurement(result, baseline_s=m.launch.baseline.median_s if m.launch.baseline
                      else m.launch.total_time_s, gpu=info.gpu)
    return 0 if result.ok else 1


def print_measurement(m: Measurement, *, baseline_s: float | None = None,
                      gpu: str | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(show_header=False, box=None, padding=(0, 2))
    colour = "green" if m.ok else "red"
    table.add_row("status", f"[{colour}]{m.status.value}[/]")
    if gpu:
        table.add_row("gpu", gpu)
    if m.time is not None:
        t = m.time
        table.add_row("time", f"median {t.median_s * 1e6:.2f} µs, min {t.min_s * 1e6:.2f} µs, "
                      f"IQR {t.iqr_s * 1e6:.2f} µs, n={t.n}")
        if baseline_s:
            table.add_row("speedup", f"{baseline_s / t.median_s:.3f}x vs the recorded original "
                          f"({baseline_s * 1e6:.2f} µs)")
    table.add_row("verified", "-" if m.verified is None else str(m.verified))
    if m.max_error is not None:
        table.add_row("max error", f"{m.max_error:.3g}")
    r = m.resources
    table.add_row("registers", "-" if r.registers is None else str(r.registers))
    table.add_row("spills", "-" if r.spills_bytes is None else f"{r.spills_bytes} B")
    if m.compile_time_s is not None:
        table.add_row("compile", f"{m.compile_time_s * 1e3:.1f} ms")
    if m.replay_wall_s is not None:
        table.add_row("replay wall", f"{m.replay_wall_s * 1e3:.1f} ms")
    if m.binary_sha256:
        table.add_row("binary", m.binary_sha256[:16])
    if m.error_text:
        table.add_row("error", m.error_text)
    Console().print(table)
