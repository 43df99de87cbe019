"""Campaign and search settings declared once: each field of ``CampaignSettings`` and
``InnerSettings`` that a user may set carries its command-line flag and help in its
metadata (:func:`option`); the flags of ``r3 tune`` and ``r3 tune-app``, their defaults and
the ``[campaign]`` and ``[search]`` sections of ``r3.toml`` all come from there.

Precedence, highest first: the flag, the project's then the user's ``r3.toml``
(``r3tui.config``), the dataclass default.
"""

from __future__ import annotations

import argparse
from dataclasses import MISSING, Field, dataclass, field, fields
from pathlib import Path
from typing import Any

from r3tui.errors import ConfigError


@dataclass(frozen=True)
class Option:
    flag: str
    help: str
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    negate: bool = False  # a bool the flag turns off (--no-repair sets repair False)


def option(default: Any, flag: str, help: str, *, choices: tuple[str, ...] | None = None,
           metavar: str | None = None, negate: bool = False) -> Any:
    """A settings field a user may set: its default, flag and help, declared together."""
    return field(default=default, metadata={
        "option": Option(flag, help, choices, metavar, negate)})


def user_fields(cls: type) -> list[tuple[Field[Any], Option]]:
    """The fields of the settings dataclass ``cls`` that have a flag, in declaration order."""
    return [(f, f.metadata["option"]) for f in fields(cls) if "option" in f.metadata]


def _kind(f: Field[Any]) -> type:
    default = f.default
    if default is MISSING or default is None:
        raise TypeError(f"settings field {f.name} needs a default of a plain type")
    return type(default)


def add_options(parser: argparse.ArgumentParser, cls: type) -> None:
    """One flag for each user field of ``cls``; unset flags stay None, so that ``r3.toml``
    and then the dataclass default decide (:func:`resolve`)."""
    for f, opt in user_fields(cls):
        kind = _kind(f)
        shown = f"{opt.help} (default: {f.default})"
        if kind is bool:
            parser.add_argument(opt.flag, dest=f.name, action="store_const",
                                const=not opt.negate, default=None,
                                help=opt.help)
        else:
            parser.add_argument(opt.flag, dest=f.name, type=kind, default=None,
                                choices=opt.choices, metavar=opt.metavar, help=shown)


def resolve(cls: type, args: argparse.Namespace, table: dict[str, Any] | None = None
            ) -> dict[str, Any]:
    """The user fields' values: the flag's, else the ``r3.toml`` table's, else the default."""
    values: dict[str, Any] = {}
    for f, _opt in user_fields(cls):
        given = getattr(args, f.name, None)
        values[f.name] = given if given is not None else (table or {}).get(f.name, f.default)
    return values


def check_table(cls: type, section: str, table: dict[str, Any], origin: Path | None) -> None:
    """Refuse an ``r3.toml`` section with an unknown key or a value of the wrong type, in one
    line naming the file."""
    where = f"{origin}: " if origin else ""
    known = {f.name: f for f, _ in user_fields(cls)}
    for key, value in table.items():
        if key not in known:
            raise ConfigError(f"{where}unknown key {section}.{key} "
                              f"(known: {', '.join(sorted(known))})")
        kind = _kind(known[key])
        ok = isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            ok = True
        if not ok:
            raise ConfigError(f"{where}{section}.{key} must be {kind.__name__}, not "
                              f"{type(value).__name__}")
        opt = known[key].metadata["option"]
        if opt.choices and value not in opt.choices:
            raise ConfigError(f"{where}{section}.{key} must be one of {', '.join(opt.choices)}")
