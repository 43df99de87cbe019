"""`r3 tune --bo` as a user types it: a bad spec is one line and touches nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.test_bundle import write_bundle
from tests.unit.test_bundle_commands import r3


@pytest.mark.parametrize("mode", [["--inner-only"], []])
@pytest.mark.parametrize(("spec", "message"), [
    ("xi=abc", "bad Bayesian search setting 'xi=abc': xi is float"),
    ("colour=red", "want NAME=VALUE (NAME is one of estimator, "),
    ("transform=sqrt", "transform 'sqrt' is not one of"),
])
def test_a_bad_bo_spec_is_one_line_before_any_work(
    tmp_path: Path, mode: list[str], spec: str, message: str
) -> None:
    bundle = write_bundle(tmp_path / "b")
    db = tmp_path / "r3.sqlite"
    result = r3("tune", str(bundle.path), *mode, "--budget", "4", "--bo", spec,
                "--db", str(db), cwd=tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert not db.exists()
