"""Alembic environment of the R³ experiment database.

R³ itself runs migrations in code (``db.migrate.upgrade``) and hands its connection over in
``config.attributes["connection"]``, already inside ``schema_transaction``.  Without one
(the ``alembic`` CLI from a checkout) this opens the file named by ``-x db=PATH`` the same way
R³ does, so the same pragmas, lock and foreign-key handling apply.
"""

from __future__ import annotations

import logging.config
from typing import Any

import sqlalchemy as sa
from alembic import context
from alembic.autogenerate.api import AutogenContext
from sqlalchemy import Connection

from db.models import Base, UTCDateTime

config = context.config
target_metadata = Base.metadata


def render_item(type_: str, obj: Any, autogen_context: AutogenContext) -> str | bool:
    """Render our column types as plain SQLAlchemy types in generated revisions.

    A revision must not import the models (they change; the revision must not), and the
    stored types are just DATETIME and VARCHAR(32).
    """
    if type_ == "type" and isinstance(obj, UTCDateTime):
        return "sa.DateTime()"
    if type_ == "type" and isinstance(obj, sa.Enum):
        return f"sa.String(length={obj.length})"
    return False


def _configure(**kwargs: Any) -> None:
    context.configure(
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things: batch mode rebuilds the table instead.
        render_as_batch=True,
        compare_type=True,
        # DDL is transactional in SQLite once pysqlite stops managing transactions
        # (db.session does that), so a failed revision leaves nothing half done.
        transactional_ddl=True,
        render_item=render_item,
        **kwargs,
    )


def _run_on(connection: Connection) -> None:
    _configure(connection=connection)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_offline() -> None:
    _configure(url="sqlite://", literal_binds=True, dialect_opts={"paramstyle": "named"})
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run_on(connection)
        return

    if config.config_file_name is not None:
        # Only the CLI gets the ini's logging; R³ keeps its own.
        logging.config.fileConfig(config.config_file_name, disable_existing_loggers=False)

    from db.migrate import schema_transaction
    from db.session import sqlite_engine

    path = context.get_x_argument(as_dictionary=True).get("db")
    if not path:
        raise SystemExit("alembic: pass the database file with -x db=PATH")
    engine = sqlite_engine(path, create=True)
    try:
        with engine.connect() as conn, schema_transaction(conn):
            _run_on(conn)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
