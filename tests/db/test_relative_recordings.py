"""A recording under the database's folder is stored relative to it, so the folder (the
database with its recordings: the demo that ships with R³) can move or ship as a whole."""

from __future__ import annotations

import dataclasses
import shutil
import sqlite3
from pathlib import Path

from db import repository as repo
from db.session import open_database
from tests.db import factories as f


def test_a_recording_under_the_database_folder_moves_with_it(tmp_path: Path) -> None:
    folder = tmp_path / "demo"
    (folder / "bundles" / "stencil.r3b").mkdir(parents=True)
    inside = dataclasses.replace(f.recording(tag="in"),
                                 bundle_path=str(folder / "bundles" / "stencil.r3b"))
    outside = dataclasses.replace(f.recording(tag="out"), bundle_path=str(tmp_path / "x.r3b"))
    with open_database(folder / "r3.sqlite") as database, database.session_scope() as s:
        ids = [repo.add_recording(s, r, f.manifest()) for r in (inside, outside)]
    with sqlite3.connect(folder / "r3.sqlite") as c:
        stored = dict(c.execute("select id, bundle_path from recordings").fetchall())
    assert stored == {ids[0]: "bundles/stencil.r3b", ids[1]: str(tmp_path / "x.r3b")}

    moved = tmp_path / "elsewhere"
    shutil.move(folder, moved)
    with open_database(moved / "r3.sqlite", readonly=True) as database, \
            database.session_scope() as s:
        first = repo.get_recording(s, ids[0])
        assert first is not None and Path(first.bundle_path) == moved / "bundles/stencil.r3b"
        assert Path(first.bundle_path).is_dir()
        second = repo.get_recording(s, ids[1])
        assert second is not None and second.bundle_path == str(tmp_path / "x.r3b")
        assert [r.bundle_path for r in repo.list_recordings(s)] == [
            str(moved / "bundles/stencil.r3b"), str(tmp_path / "x.r3b")]
