"""`r3 record --timeout`: an application that does not finish under recording is killed and
reported in one line (exit 1), leaving no half-written recording; a bad timeout is exit 2."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from r3tui.cli import main


def test_an_application_that_runs_too_long_is_killed_with_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sleep = shutil.which("sleep")
    if sleep is None or (shutil.which("cc") is None and shutil.which("gcc") is None):
        pytest.skip("needs sleep and a C compiler for the interposer")
    out = tmp_path / "rec"
    started = time.perf_counter()
    code = main(["--db", str(tmp_path / "r3.sqlite"), "record", "--out", str(out),
                 "--timeout", "1", "--", sleep, "30"])
    assert code == 1 and time.perf_counter() - started < 20
    errors = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("r3: error:")]
    assert len(errors) == 1 and "did not finish within 1 s under recording" in errors[0]
    assert not (out / "raw").exists() and not (out / "recording.json").exists()


@pytest.mark.parametrize("value", ["0", "-5"])
def test_a_timeout_that_is_not_positive_is_bad_input(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str) -> None:
    code = main(["--db", str(tmp_path / "r3.sqlite"), "record", "--out", str(tmp_path / "r"),
                 "--timeout", value, "--", "true"])
    assert code == 2
    assert "--timeout must be a positive number of seconds" in capsys.readouterr().err
