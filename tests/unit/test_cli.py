"""The `r3` command as a user runs it: real subprocesses, real SQLite files."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest


def r3(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("R3_")}
    # a user config file on this machine must not leak into the test
    full_env.update({"NO_COLOR": "1", "COLUMNS": "160", "XDG_CONFIG_HOME": str(cwd / ".config")})
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "r3tui", *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=180,
    )


def assert_one_line_error(result: subprocess.CompletedProcess[str], fragment: str) -> None:
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("r3: error: ")
    assert fragment in lines[0], lines[0]


def test_version_and_help(tmp_path: Path) -> None:
    result = r3("--version", cwd=tmp_path)
    assert result.returncode == 0 and result.stdout.startswith("r3 ")
    result = r3(cwd=tmp_path)
    assert result.returncode == 0
    for command in ("db", "runs", "doctor", "record", "replay", "recordings"):
        assert command in result.stdout


def test_unknown_command_is_one_line(tmp_path: Path) -> None:
    assert_one_line_error(r3("frobnicate", cwd=tmp_path), "invalid choice")


def test_doctor_reports_each_component(tmp_path: Path) -> None:
    result = r3("doctor", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    names = (
        "python",
        "database",
        "nvrtc",
        "nvcc",
        "llvm",
        "gpu (pycuda)",
        "gpu (driver)",
        "llama_cpp",
        "model",
    )
    for name in names:
        matching = [line for line in lines if f" {name} " in f"{line} "]
        assert matching, f"no doctor line for {name}: {result.stdout}"
        assert matching[0].startswith(("OK", "MISSING"))
    nvrtc = next(line for line in lines if " nvrtc " in line)
    assert nvrtc.startswith("OK") and "13.0" in nvrtc
    # a missing part says how to fix it
    for line in lines:
        if line.startswith("MISSING"):
            assert "→" in line, line
    assert "not created yet" in result.stdout
    assert not (tmp_path / "r3.sqlite").exists(), "doctor must not create the database"


def test_db_upgrade_info_and_runs_on_a_new_database(tmp_path: Path) -> None:
    db = tmp_path / "exp.sqlite"
    result = r3("db", "upgrade", "--db", str(db), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert db.exists() and "(head)" in result.stdout
    info = r3("--db", str(db), "db", "info", cwd=tmp_path)
    assert info.returncode == 0, info.stderr
    assert "revision:" in info.stdout and "(head)" in info.stdout
    assert "campaigns:" in info.stdout
    runs = r3("runs", "--db", str(db), cwd=tmp_path)
    assert runs.returncode == 0 and "no campaigns" in runs.stdout


def test_default_path_and_env_override(tmp_path: Path) -> None:
    assert r3("db", "upgrade", cwd=tmp_path).returncode == 0
    assert (tmp_path / "r3.sqlite").exists()
    env_db = tmp_path / "env.sqlite"
    assert r3("db", "upgrade", cwd=tmp_path, env={"R3_DB": str(env_db)}).returncode == 0
    assert env_db.exists()


def test_runs_lists_campaigns(tmp_path: Path) -> None:
    from db import repository as repo
    from db.session import open_database
    from r3tui.domain import Campaign, Dim3, KernelLaunch, Recording

    db = tmp_path / "exp.sqlite"
    database = open_database(db)
    with database.session_scope() as s:
        launch = KernelLaunch("stencil7", Dim3(8, 32, 256), Dim3(32, 8, 1))
        rid = repo.add_recording(s, Recording("b", "ab" * 32, "stencil7", launch), {})
        repo.create_campaign(
            s, Campaign("first-try", rid, seed=7, provenance={"gpu": "NVIDIA H200"})
        )
    database.close()
    result = r3("runs", "--db", str(db), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "first-try" in result.stdout and "stencil7" in result.stdout
    assert "NVIDIA H200" in result.stdout


def test_read_commands_refuse_a_missing_database(tmp_path: Path) -> None:
    for args in (("runs",), ("db", "info"), ("recordings",)):
        result = r3(*args, "--db", str(tmp_path / "nope.sqlite"), cwd=tmp_path)
        assert_one_line_error(result, "nope.sqlite")
    assert not (tmp_path / "nope.sqlite").exists()


def test_corrupt_database_file(tmp_path: Path) -> None:
    db = tmp_path / "broken.sqlite"
    db.write_bytes(os.urandom(8192))
    for args in (("runs",), ("db", "upgrade")):
        assert_one_line_error(r3(*args, "--db", str(db), cwd=tmp_path), "broken.sqlite")


def test_database_from_a_newer_schema_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "future.sqlite"
    assert r3("db", "upgrade", "--db", str(db), cwd=tmp_path).returncode == 0
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE alembic_version SET version_num = 'f00dfeedbeef'")
    before = db.read_bytes()
    for args in (("runs",), ("db", "upgrade"), ("db", "info")):
        assert_one_line_error(r3(*args, "--db", str(db), cwd=tmp_path), "f00dfeedbeef")
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT version_num FROM alembic_version").fetchone() == (
            "f00dfeedbeef",
        )
    assert len(db.read_bytes()) == len(before)


def test_unwritable_location(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    # a path under a regular file cannot be created, even by root
    result = r3("db", "upgrade", "--db", str(blocker / "exp.sqlite"), cwd=tmp_path)
    assert_one_line_error(result, "exp.sqlite")


def test_read_only_directory(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    immutable = False
    if os.geteuid() == 0:
        # root ignores permission bits; the immutable attribute stops root too
        immutable = (
            subprocess.run(["chattr", "+i", str(locked)], capture_output=True).returncode == 0
        )
        if not immutable:
            pytest.skip("running as root on a file system without chattr +i")
    try:
        result = r3("db", "upgrade", "--db", str(locked / "exp.sqlite"), cwd=tmp_path)
        assert_one_line_error(result, "exp.sqlite")
        assert list(locked.iterdir()) == []
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(locked)], check=True)
