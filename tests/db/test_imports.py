"""Import hygiene and packaging: the database layer loads light and works when installed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ["pycuda", "llama_cpp", "skopt", "textual", "cuda"]

PROBE = """
import json, sys
import db, db.models, db.session, db.repository, db.migrate, r3tui.domain
from db.session import open_database
from db import repository as repo
with open_database(sys.argv[1]) as database, database.session_scope() as s:
    repo.list_campaign_summaries(s)
heavy = sorted({m.split(".")[0] for m in sys.modules} & set(json.loads(sys.argv[2])))
print(json.dumps({"heavy": heavy, "migrations": db.migrate.MIGRATIONS_DIR.as_posix()}))
"""


def _probe(cwd: Path, pythonpath: Path, db_path: Path) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONPATH"] = str(pythonpath)
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(db_path), json.dumps(HEAVY)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_db_and_domain_import_nothing_heavy(tmp_path: Path) -> None:
    """Importing and using the DB layer loads no GPU, model, optimizer or UI module."""
    result = _probe(ROOT, ROOT, tmp_path / "r3.sqlite")
    assert result["heavy"] == []


def test_works_installed_without_a_checkout(tmp_path: Path) -> None:
    """Laid out like site-packages (no alembic.ini, another cwd), migrations still run."""
    site = tmp_path / "site-packages"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for package in ("db", "migrations"):
        shutil.copytree(ROOT / package, site / package, ignore=ignore)
    (site / "r3tui").mkdir()
    for module in ("__init__.py", "domain.py", "errors.py"):  # all that db needs of r3tui
        shutil.copy(ROOT / "r3tui" / module, site / "r3tui" / module)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    db_path = elsewhere / "r3.sqlite"
    result = _probe(elsewhere, site, db_path)
    assert result["migrations"] == (site / "migrations").as_posix()
    assert not (site / "alembic.ini").exists()

    from db.session import open_database

    with open_database(db_path, readonly=True) as db:
        assert db.revision() == db.head_revision()


def test_setuptools_ships_the_revisions() -> None:
    """pyproject's find() must see migrations.versions as a package, or wheels lose it."""
    from setuptools import find_packages

    found = find_packages(where=str(ROOT), include=["r3tui*", "db*", "migrations*"])
    assert {"db", "migrations", "migrations.versions"} <= set(found)
    assert (ROOT / "migrations" / "script.py.mako").is_file()
