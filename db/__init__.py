"""The R³ experiment database: SQLite in WAL mode, migrated by Alembic on open.

``open_database`` (db.session) is the way in; every query is reached through ``db.repository``
(which gathers the per-table modules: recordings, campaigns, variants, trials, ...).
This package imports only ``r3tui.domain`` and ``r3tui.errors`` from R³ and nothing heavy
(no pycuda, llama_cpp, skopt or textual), so the TUI and reports load fast without a GPU.
"""

from db.migrate import SchemaNeedsUpgrade
from db.session import Database, open_database

__all__ = ["Database", "SchemaNeedsUpgrade", "open_database"]
