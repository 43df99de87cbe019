"""The ``r3`` command line: every command, one module of this package per group of commands
(``db``, ``doctor``, ``record``, ``replay``, ``tune``, ``tune_app``, ``apply``, ``report``,
``tui``, ``demo``), each adding its commands with ``add_commands``.  The work a command does is
in the layers below, and no module below imports this package (pyproject.toml's layers
contract says so).

Errors a user can cause are :class:`r3tui.errors.R3Error`; they end in one line on stderr and
exit code 2.  ``--db PATH`` is accepted anywhere on the line, so ``r3 runs --db x.sqlite``
and ``r3 --db x.sqlite runs`` mean the same.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TypeAlias

from r3tui import __version__
from r3tui.config import load_settings, resolve_db_path
from r3tui.errors import R3Error


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


# what each command module's ``add_commands`` adds its commands to
Subcommands: TypeAlias = "argparse._SubParsersAction[_Parser]"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="r3",
        description="R³ — record GPU kernel launches, remix their source, replay candidates.",
        epilog="--db PATH (any position) selects the experiment database; default ./r3.sqlite, "
        "or R3_DB, or [db] path in r3.toml / ~/.config/r3/config.toml.",
    )
    parser.add_argument("--version", action="version", version=f"r3 {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    # imported when the parser is built: importing r3tui.cli, or one of its modules, loads
    # no other command's module
    from r3tui.cli import apply, db, demo, doctor, record, replay, report, tui, tune, tune_app

    # in the order `r3 --help` lists them
    db.add_commands(sub)
    doctor.add_commands(sub)
    record.add_commands(sub)
    replay.add_commands(sub)
    tune.add_commands(sub)
    tune_app.add_commands(sub)
    apply.add_commands(sub)
    report.add_commands(sub)
    tui.add_commands(sub)
    demo.add_commands(sub)
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
