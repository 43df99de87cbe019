"""Alembic migrations of the R³ experiment database.

A package (not just a folder) so that an installed R³ finds its revisions through
``migrations.__file__``; see ``db.migrate``.
"""
