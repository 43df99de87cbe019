"""bench/lineage.py: a lineage's quality per root/child setting, on a recorded table."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from lineage import main  # noqa: E402

TABLE = ROOT / "tests" / "data" / "spaces" / "nbody.json"


@pytest.mark.skipif(not TABLE.exists(), reason="no recorded nbody table")
def test_prints_one_row_per_pair_and_prior(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--table", str(TABLE), "--seeds", "1", "defaults",
                 "defaults/prior_acq_func=PI"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()
            if line.startswith("defaults")]
    assert [(r[0], r[1]) for r in rows] == [("defaults", "yes"), ("defaults", "no"),
                                            ("defaults/prior_acq_func=PI", "yes"),
                                            ("defaults/prior_acq_func=PI", "no")]
    assert all(0.0 < float(r[2]) <= 1.0 and float(r[3]) <= float(r[2]) for r in rows)


def test_a_bad_spec_or_table_is_one_error_line(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--table", str(TABLE), "defaults/xi=abc"]) == 2
    assert capsys.readouterr().out.strip() == ("error: bad Bayesian search setting 'xi=abc': "
                                               "xi is float")
    assert main(["--table", str(tmp_path / "none.json"), "defaults"]) == 2
    assert capsys.readouterr().out.startswith("error: cannot read the table")
