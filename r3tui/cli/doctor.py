"""``r3 doctor``: the probes of :mod:`r3tui.doctor`, one line each, OK or missing."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from r3tui.cli import Subcommands


def add_commands(subparsers: Subcommands) -> None:
    subparsers.add_parser(
        "doctor", help="check GPU, compilers, model and database"
    ).set_defaults(handler=_cmd_doctor)


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
