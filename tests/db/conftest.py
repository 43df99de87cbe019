from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from db.session import Database, open_database


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "r3.sqlite"


@pytest.fixture
def database(db_path: Path) -> Iterator[Database]:
    db = open_database(db_path)
    try:
        yield db
    finally:
        db.close()
