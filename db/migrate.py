"""Schema migrations, run in code.

The Alembic environment lives in the ``migrations`` package and is found through that
package's ``__file__``, not through ``alembic.ini``: an installed R³ (a wheel, no checkout,
any working directory) migrates its databases the same way a checkout does.  ``alembic.ini``
at the repository root is only for developers running the ``alembic`` CLI.

Every schema change runs on one connection inside ``schema_transaction``: foreign keys off
(SQLite batch migrations rebuild tables by copy-and-drop, and with foreign keys on a
``DROP TABLE`` deletes the rows that reference it through ``ON DELETE CASCADE``), one
``BEGIN IMMEDIATE`` transaction around all revisions (a second process opening the same
file waits instead of migrating twice), and ``PRAGMA foreign_key_check`` before commit.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, inspect

import migrations
from r3tui.errors import DatabaseError, SchemaNeedsUpgrade, SchemaTooNew

MIGRATIONS_DIR = Path(migrations.__file__).resolve().parent

# Tables SQLite or Alembic create themselves; their presence does not make a file ours.
_BOOKKEEPING_TABLES = frozenset({"alembic_version", "sqlite_sequence", "sqlite_stat1"})


class SchemaState(StrEnum):
    EMPTY = "empty"  # no tables at all: a new file
    CURRENT = "current"  # at our single head
    BEHIND = "behind"  # at a revision we know, older than head
    TOO_NEW = "too_new"  # at a revision we do not know: a newer R³ wrote it
    FOREIGN = "foreign"  # an SQLite database with tables but no R³ revision


@dataclass(frozen=True)
class SchemaInfo:
    """What ``r3 db info`` shows about a database's schema."""

    path: str
    revision: str | None
    head: str
    state: SchemaState
    journal_mode: str
    size_bytes: int
    row_counts: dict[str, int]

    @property
    def needs_upgrade(self) -> bool:
        return self.state in (SchemaState.EMPTY, SchemaState.BEHIND)


def alembic_config(connection: Connection | None = None) -> Config:
    """An Alembic ``Config`` built in code, pointing at the packaged migrations."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("path_separator", "os")
    # ConfigParser interpolation: %% is a literal %.
    config.set_main_option("file_template", "%%(year)d_%%(month).2d_%%(day).2d_%%(rev)s_%%(slug)s")
    if connection is not None:
        config.attributes["connection"] = connection
    return config


@functools.cache
def script_directory() -> ScriptDirectory:
    return ScriptDirectory.from_config(alembic_config())


def head_revision() -> str:
    """The one head of our revision graph; two heads mean an unmerged branch: a bug."""
    heads = script_directory().get_heads()
    if len(heads) != 1:
        raise DatabaseError(
            f"the migrations in {MIGRATIONS_DIR} have {len(heads)} heads "
            f"({', '.join(sorted(heads)) or 'none'}); expected exactly one",
            hint="merge them with `alembic merge heads`",
        )
    return heads[0]


def known_revisions() -> frozenset[str]:
    return frozenset(s.revision for s in script_directory().walk_revisions())


def database_file(connection: Connection) -> str:
    """The file behind a connection, for messages."""
    for _seq, name, file in connection.exec_driver_sql("PRAGMA database_list"):
        if name == "main":
            return str(file) or ":memory:"
    return "?"


def current_heads(connection: Connection) -> tuple[str, ...]:
    return MigrationContext.configure(connection).get_current_heads()


def current_revision(connection: Connection) -> str | None:
    """The database's revision, or None where it has none (a new or foreign file)."""
    heads = current_heads(connection)
    if not heads:
        return None
    return ",".join(sorted(heads))


def schema_state(connection: Connection) -> SchemaState:
    heads = current_heads(connection)
    if not heads:
        tables = set(inspect(connection).get_table_names()) - _BOOKKEEPING_TABLES
        return SchemaState.FOREIGN if tables else SchemaState.EMPTY
    if any(h not in known_revisions() for h in heads):
        return SchemaState.TOO_NEW
    return SchemaState.CURRENT if heads == (head_revision(),) else SchemaState.BEHIND


def check_schema(connection: Connection, *, allow_behind: bool) -> SchemaState:
    """Raise for a schema this R³ must not touch; return the state otherwise."""
    state = schema_state(connection)
    path = database_file(connection)
    if state is SchemaState.TOO_NEW:
        raise SchemaTooNew(
            f"database {path} is at schema revision {current_revision(connection)}, which "
            f"this R³ does not know (newest known: {head_revision()})",
            hint="open it with the newer R³ that wrote it",
        )
    if state is SchemaState.FOREIGN:
        raise DatabaseError(
            f"{path} is an SQLite database but not an R³ experiment database "
            "(it has tables and no schema revision)",
            hint="choose another path",
        )
    if state in (SchemaState.EMPTY, SchemaState.BEHIND) and not allow_behind:
        where = (
            "has no R³ schema yet"
            if state is SchemaState.EMPTY
            else f"is at schema revision {current_revision(connection)}, older than "
            f"{head_revision()}"
        )
        raise SchemaNeedsUpgrade(
            f"database {path} {where}", hint=f"run `r3 db upgrade {path}` first"
        )
    return state


@contextmanager
def schema_transaction(connection: Connection) -> Iterator[Connection]:
    """One locked transaction for schema changes, with foreign keys off (see module doc)."""
    if connection.in_transaction():
        raise RuntimeError(
            "schema changes need a connection outside a transaction: PRAGMA foreign_keys "
            "cannot be turned off inside one"
        )
    # The DBAPI connection runs in autocommit mode (see db.session), so these pragmas
    # apply at once instead of being swallowed by an implicit BEGIN.
    raw = connection.connection.driver_connection
    assert raw is not None
    raw.execute("PRAGMA foreign_keys = OFF")
    try:
        with connection.begin():
            yield connection
            problems = connection.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
            if problems:
                raise DatabaseError(
                    f"a migration of {database_file(connection)} left "
                    f"{len(problems)} broken foreign keys (first: {problems[0]}); rolled back",
                    hint="report this as a bug",
                )
    finally:
        raw.execute("PRAGMA foreign_keys = ON")


def _run(connection: Connection, action: str, revision: str) -> None:
    config = alembic_config(connection)
    if action == "upgrade":
        command.upgrade(config, revision)
    else:
        command.downgrade(config, revision)


def upgrade(engine_or_connection: Engine | Connection, revision: str = "head") -> None:
    """Migrate to ``revision`` (default: head), refusing files we must not touch.

    A connection must not be in a transaction (``schema_transaction`` opens its own).
    """
    if isinstance(engine_or_connection, Engine):
        with engine_or_connection.connect() as connection:
            upgrade(connection, revision)
        return
    connection = engine_or_connection
    head_revision()  # refuse a broken revision graph before touching the file
    with schema_transaction(connection):
        # Checked inside the lock: another process may have migrated meanwhile.
        check_schema(connection, allow_behind=True)
        _run(connection, "upgrade", revision)


def downgrade(connection: Connection, revision: str) -> None:
    """Migrate down to ``revision`` (``"base"`` drops every table); for tests and repairs."""
    with schema_transaction(connection):
        check_schema(connection, allow_behind=True)
        _run(connection, "downgrade", revision)


def schema_info(connection: Connection) -> SchemaInfo:
    """Revision, state, journal mode, size and row counts, for ``r3 db info``."""
    state = schema_state(connection)
    counts: dict[str, int] = {}
    if state is SchemaState.CURRENT:
        from db.models import Base  # the models only describe a current schema

        for table in Base.metadata.sorted_tables:
            counts[table.name] = int(
                connection.exec_driver_sql(f'SELECT count(*) FROM "{table.name}"').scalar_one()
            )
    page_size = int(connection.exec_driver_sql("PRAGMA page_size").scalar_one())
    page_count = int(connection.exec_driver_sql("PRAGMA page_count").scalar_one())
    return SchemaInfo(
        path=database_file(connection),
        revision=current_revision(connection),
        head=head_revision(),
        state=state,
        journal_mode=str(connection.exec_driver_sql("PRAGMA journal_mode").scalar_one()),
        size_bytes=page_size * page_count,
        row_counts=counts,
    )
