"""`r3 demo` without a GPU opens a copy of the shipped demo folder: the database with the
recordings stored relative to it, so its campaigns still find their bundles."""

from __future__ import annotations

from pathlib import Path

import pytest

from r3tui.cli import demo


def test_the_demo_folder_is_copied_whole_without_side_files(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shipped = tmp_path / "demo"
    (shipped / "bundles" / "stencil7.r3b").mkdir(parents=True)
    (shipped / "bundles" / "stencil7.r3b" / "manifest.json").write_text("{}")
    (shipped / "r3-demo.sqlite").write_bytes(b"db")
    (shipped / "r3-demo.sqlite-wal").write_bytes(b"left by a reader")
    seen: list[list[str]] = []

    def fake_tui(db: Path) -> int:
        """Stands in for the Textual app (tests/ui drive the real one): what it was given."""
        seen.append(sorted(str(p.relative_to(db.parent)) for p in db.parent.rglob("*")))
        assert db.name == "r3-demo.sqlite" and db.parent != shipped
        return 0

    monkeypatch.setattr("r3tui.cli.tui.run_tui", fake_tui)
    assert demo.open_shipped_demo(shipped / "r3-demo.sqlite") == 0
    assert seen == [["bundles", "bundles/stencil7.r3b", "bundles/stencil7.r3b/manifest.json",
                     "r3-demo.sqlite"]]
    assert (shipped / "r3-demo.sqlite-wal").exists()  # the shipped folder is left as it was
