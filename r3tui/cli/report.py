"""``r3 report CAMPAIGN`` and ``r3 export CAMPAIGN``: what a campaign found, and a variant's
files (:mod:`r3tui.engine.report` reads and writes them)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from r3tui.cli import Subcommands


def _cmd_report(args: argparse.Namespace) -> int:
    from db.session import open_database
    from r3tui.engine.report import build_report, render

    with (
        open_database(args.db, readonly=True, create=False, one_shot=True) as database,
        database.session_scope() as s,
    ):
        report = build_report(s, args.campaign)
    for line in render(report):
        print(line)
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from db.session import open_database
    from r3tui.engine.report import export_variant, prepare_export_dir

    out = args.out or Path(f"r3-export-{args.campaign}")
    if out.exists() and not out.is_dir():  # before the database: bad input costs nothing
        prepare_export_dir(out)
    with (
        open_database(args.db, readonly=True, create=False, one_shot=True) as database,
        database.session_scope() as s,
    ):
        for path in export_variant(s, args.campaign, args.variant, out):
            print(path)
    return 0


def add_commands(sub: Subcommands) -> None:
    report = sub.add_parser("report", help="what a campaign found and where its time went")
    report.add_argument("campaign", type=int)
    report.set_defaults(handler=_cmd_report)
    export = sub.add_parser("export", help="write a variant's source, options, launch and patch")
    export.add_argument("campaign", type=int)
    export.add_argument("--variant", type=int, help="variant id (default: the campaign's best)")
    export.add_argument("--out", type=Path, help="directory (default: r3-export-CAMPAIGN)")
    export.set_defaults(handler=_cmd_export)
