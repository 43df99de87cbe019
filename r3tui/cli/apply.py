"""``r3 apply CAMPAIGN... --into DIR``: write tuned kernels back into a copy of an
application's tree, then build and measure both (:mod:`r3tui.engine.apply` writes the tree,
:mod:`r3tui.engine.app_run` measures it)."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from r3tui.errors import R3Error

if TYPE_CHECKING:
    from r3tui.cli import Subcommands


def _cmd_apply(args: argparse.Namespace) -> int:
    from db.session import open_database
    from r3tui.engine.app_run import MeasureOptions
    from r3tui.engine.application import recording_context
    from r3tui.engine.apply import PATCH_FILE, check_into, load_bests, outcome_lines, write_tree

    options = MeasureOptions(args.time_key, args.runs, args.max_runs, args.ci_width)
    options.check()
    if not args.campaigns:
        raise R3Error("give at least one campaign id")
    with (
        open_database(args.db, readonly=True, create=False, one_shot=True) as database,
        database.session_scope() as s,
    ):
        context = recording_context(s, args.campaigns)
        given = args.source_tree or context.cwd
        if given is None:
            raise R3Error(
                "no source tree: the campaigns' recording does not name one",
                hint="give --source-tree SRC",
            )
        # absolute from here on: builds and runs change directory into the trees
        source_tree = Path(given).expanduser().resolve()
        args.into = args.into.expanduser().resolve()
        check_into(source_tree, args.into)
        bests = load_bests(s, args.campaigns, args.into)
    result = write_tree(bests, source_tree, args.into, context, args.include_noise)
    for line in outcome_lines(result):
        print(line)
    print(f"patch: {args.into / PATCH_FILE} ({len(result.patch.splitlines())} lines)")
    if result.predicted_kernel_speedup is not None:
        from r3tui.engine.application import prediction_lines

        for line in prediction_lines(result.predicted_kernel_speedup,
                                     result.predicted_wall_speedup, context.kernel_time_s,
                                     context.wall_s, result.prediction_other_work):
            print(line)
    if args.no_run:
        print("not measured (--no-run): every applied change is in the patch, unmeasured")
        return 0
    if not result.patch:
        # two identical builds would only measure the noise, and a figure of it reads as one
        print("not measured: the patch is empty, the tree is the original")
        return 0
    app_command = tuple(shlex.split(args.run)) if args.run else context.command
    if not app_command:
        raise R3Error("no application command recorded", hint='give --run "./app ARGS"')
    from r3tui.engine.app_run import measure_and_ship

    measure_and_ship(bests, source_tree, args.into, app_command, result, context,
                     args.build, options, args.include_noise)
    return 0


def add_commands(sub: Subcommands) -> None:
    parser = sub.add_parser(
        "apply", help="write campaigns' best variants into a copy of the application's tree"
    )
    parser.add_argument("campaigns", type=int, nargs="*", metavar="CAMPAIGN")
    parser.add_argument("--into", type=Path, required=True, help="new directory for the copy")
    parser.add_argument(
        "--source-tree", type=Path, help="the application's tree (default: its recorded cwd)"
    )
    parser.add_argument("--no-run", action="store_true", help="write the patch only")
    parser.add_argument(
        "--include-noise",
        action="store_true",
        help="also apply winners whose speedup interval includes 1 (default: keep the original)",
    )
    parser.add_argument("--build", default="make", help="build command run in both trees")
    parser.add_argument("--run", help="application command (default: the recorded one)")
    parser.add_argument(
        "--runs", type=int, default=5,
        help="interleaved pairs of runs before the intervals are first looked at (default 5)")
    parser.add_argument(
        "--max-runs", type=int, default=30,
        help="interleaved pairs at most, of plain runs and of timed runs each (default 30)")
    parser.add_argument(
        "--ci-width", type=float, default=0.02,
        help="enough pairs once each 95%% interval is at most this wide, relative to its "
             "ratio (default 0.02)")
    parser.add_argument(
        "--time-key",
        default=None,
        metavar="KEY",
        help="time the application by the `KEY: seconds` line it prints (e.g. solve_time_s); "
        "default, and where a run does not print it: the process's wall time (wall_s)",
    )
    parser.set_defaults(handler=_cmd_apply)
