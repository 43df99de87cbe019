"""The ``r3`` command line.

Errors a user can cause are :class:`r3tui.errors.R3Error`; they end in one line on stderr and
exit code 2.  ``--db PATH`` is accepted anywhere on the line, so ``r3 runs --db x.sqlite``
and ``r3 --db x.sqlite runs`` mean the same.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from pathlib import Path

from r3tui import __version__
from r3tui.config import load_settings, resolve_db_path
from r3tui.errors import R3Error

# Subcommand groups that other layers contribute; each module exposes add_commands().
COMMAND_MODULES = (
    "r3tui.record.commands",
    "r3tui.replay.commands",
    "r3tui.engine.commands",
    "r3tui.engine.application",
    "r3tui.engine.apply",
    "r3tui.report",
    "r3tui.ui.commands",
    "r3tui.demo",
)


def _split_db_flag(argv: list[str]) -> tuple[list[str], str | None]:
    """Take ``--db PATH`` / ``--db=PATH`` out of argv wherever it stands."""
    rest: list[str] = []
    db: str | None = None
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            rest.extend(argv[i:])
            break
        if arg == "--db":
            if i + 1 >= len(argv):
                raise R3Error("--db needs a path")
            db = argv[i + 1]
            i += 2
            continue
        if arg.startswith("--db="):
            db = arg.split("=", 1)[1]
        else:
            rest.append(arg)
        i += 1
    return rest, db


class _Parser(argparse.ArgumentParser):
    """argparse that reports bad usage in one line with exit code 2, like every other error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"r3: error: {message} (see `{self.prog} --help`)\n")
        raise SystemExit(2)


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


def _cmd_doctor(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.markup import escape

    from r3tui.doctor import run_checks

    console = Console(highlight=False)
    checks = run_checks(args.settings, args.db)
    width = max(len(c.name) for c in checks)
    for check in checks:
        mark = "[green]OK     [/]" if check.ok else "[red]MISSING[/]"
        line = f"{mark} {check.name:<{width}}  {escape(check.detail)}"
        if not check.ok and check.fix:
            line += f"  [dim]→ {escape(check.fix)}[/]"
        console.print(line, soft_wrap=True)
    return 1 if any(c.required and not c.ok for c in checks) else 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="r3",
        description="R³ — record GPU kernel launches, remix their source, replay candidates.",
        epilog="--db PATH (any position) selects the experiment database; default ./r3.sqlite, "
        "or R3_DB, or [db] path in r3.toml / ~/.config/r3/config.toml.",
    )
    parser.add_argument("--version", action="version", version=f"r3 {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    db_parser = sub.add_parser("db", help="create, upgrade and inspect the experiment database")
    db_parser.set_defaults(help_parser=db_parser)
    db_sub = db_parser.add_subparsers(dest="db_command", metavar="ACTION", parser_class=_Parser)
    db_sub.add_parser("upgrade", help="create the database or migrate it to the current schema")
    db_sub.choices["upgrade"].set_defaults(handler=_cmd_db_upgrade)
    db_sub.add_parser("info", help="path, schema revision and row counts")
    db_sub.choices["info"].set_defaults(handler=_cmd_db_info)

    sub.add_parser("runs", help="table of campaigns in the database").set_defaults(
        handler=_cmd_runs
    )
    sub.add_parser("doctor", help="check GPU, compilers, model and database").set_defaults(
        handler=_cmd_doctor
    )
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).add_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        rest, db_flag = _split_db_flag(list(sys.argv[1:] if argv is None else argv))
        parser = build_parser()
        args = parser.parse_args(rest)
        handler = getattr(args, "handler", None)
        if handler is None:
            # `r3` or `r3 db` alone: show what there is to do
            getattr(args, "help_parser", parser).print_help()
            return 2 if args.command else 0
        args.settings = load_settings()
        args.db = resolve_db_path(db_flag, args.settings)
        return int(handler(args))
    except R3Error as exc:
        sys.stderr.write(f"r3: error: {exc.one_line()}\n")
        return exc.exit_code
    except KeyboardInterrupt:
        sys.stderr.write("r3: interrupted\n")
        return 130
    except BrokenPipeError:
        return 0
