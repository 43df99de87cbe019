"""``r3 tui``: browse an experiment database (and watch the campaigns writing it)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from r3tui.errors import DatabaseMissing, R3Error

if TYPE_CHECKING:
    from r3tui.cli import Subcommands


def add_commands(subparsers: Subcommands) -> None:
    tui = subparsers.add_parser(
        "tui",
        help="terminal UI: campaigns, the evolutionary tree, trials, plots, live",
        description="Browse the experiment database read-only; campaigns that an engine is "
        "writing update within a second. Press ? inside for every key.",
    )
    tui.add_argument("--campaign", type=int, metavar="ID", help="open this campaign directly")
    tui.add_argument(
        "--export-dir",
        type=Path,
        default=Path("r3-export"),
        help="where `e` writes exported variants (default ./r3-export)",
    )
    tui.set_defaults(handler=cmd_tui)


def run_tui(db: Path, **options: object) -> int:
    """Run the app; a database that could not be shown ends as one R³ error line."""
    from r3tui.ui.app import R3App

    app = R3App(db, **options)  # type: ignore[arg-type]
    code = app.run()
    if app.failure is not None:
        raise R3Error(app.failure)
    return int(code or 0)


def cmd_tui(args: argparse.Namespace) -> int:
    db = Path(args.db)
    if not db.exists():
        # before the screen switches to the app: a typo should read like any other command's
        raise DatabaseMissing(
            f"no experiment database at {db.resolve()}",
            hint="pass --db PATH, or run `r3 demo` to see the shipped demo campaign",
        )
    return run_tui(db, campaign_id=args.campaign, export_dir=args.export_dir)
