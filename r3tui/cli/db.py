"""``r3 db upgrade``, ``r3 db info`` and ``r3 runs``: the experiment database itself."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from r3tui.cli import Subcommands


def add_commands(subparsers: Subcommands) -> None:
    db_parser = subparsers.add_parser(
        "db", help="create, upgrade and inspect the experiment database"
    )
    db_parser.set_defaults(help_parser=db_parser)
    db_sub = db_parser.add_subparsers(dest="db_command", metavar="ACTION",
                                      parser_class=type(db_parser))
    db_sub.add_parser("upgrade", help="create the database or migrate it to the current schema")
    db_sub.choices["upgrade"].set_defaults(handler=_cmd_db_upgrade)
    db_sub.add_parser("info", help="path, schema revision and row counts")
    db_sub.choices["info"].set_defaults(handler=_cmd_db_info)

    subparsers.add_parser("runs", help="table of campaigns in the database").set_defaults(
        handler=_cmd_runs
    )


def _cmd_db_upgrade(args: argparse.Namespace) -> int:
    from db.session import open_database

    database = open_database(args.db, create=True, upgrade=True)
    try:
        print(f"{database.path}: schema at revision {database.revision()} (head)")
    finally:
        database.close()
    return 0


def _cmd_db_info(args: argparse.Namespace) -> int:
    from db import repository as repo
    from db.migrate import head_revision
    from db.session import open_database

    # an older schema is reported, not refused: this is where users learn they must upgrade
    database = open_database(
        args.db, readonly=True, create=False, upgrade=False, one_shot=True
    )
    try:
        revision = database.revision()
        head = head_revision()
        with database.session_scope() as session:
            counts = repo.table_counts(session)
    finally:
        database.close()
    state = "head" if revision == head else f"behind head {head}: run `r3 db upgrade`"
    print(f"path:      {Path(args.db).resolve()}")
    print(f"size:      {Path(args.db).stat().st_size / 1e6:.2f} MB")
    print(f"revision:  {revision} ({state})")
    for table, count in counts.items():
        print(f"{table + ':':<11}{count}")
    return 0


def _cmd_runs(args: argparse.Namespace) -> int:
    from datetime import UTC, datetime

    from rich.console import Console
    from rich.table import Table

    from db import repository as repo
    from db.figures import duration_text
    from db.session import open_database

    with (
        open_database(args.db, readonly=True, create=False, one_shot=True) as database,
        database.session_scope() as session,
    ):
        summaries = repo.list_campaign_summaries(session)
    console = Console()
    if not summaries:
        console.print(f"no campaigns in {args.db} yet")
        return 0
    now = datetime.now(UTC)
    table = Table(
        "id", "name", "kernel", "gpu", "status", "variants", "best speedup", "took", "started"
    )
    for row in summaries:
        started = row.started_at.strftime("%Y-%m-%d %H:%M") if row.started_at else "-"
        table.add_row(
            str(row.id),
            row.name,
            row.kernel_name or "-",
            row.gpu or "-",
            str(row.status),
            str(row.n_variants),
            row.figures.best_speedup_text,  # as the TUI and r3 report write it (db.figures)
            duration_text(row.figures.duration_s(now)),
            started,
        )
    console.print(table)
    return 0
