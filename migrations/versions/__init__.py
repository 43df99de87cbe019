# A package so that setuptools' find() ships the revisions; Alembic skips __init__.py.
