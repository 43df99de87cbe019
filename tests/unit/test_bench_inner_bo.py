"""bench/inner_bo.py: raw runs written under one set of defaults read back under another."""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from inner_bo import LEGACY_DEFAULTS, join_raw, main, settings_label  # noqa: E402

from r3tui.search import BayesSettings  # noqa: E402

COLD = "acq_func=gp_hedge,transform=power,local_candidates=3"
OLD = "acq_func=EI,transform=log,local_candidates=0"
# rows written before fit_per existed ran skopt's Optimizer: fit_per=point, today's "auto" not
OLD_POINT = OLD + ",fit_per=point"


def row(settings: str, seeds: list[int], best: list[float], **extra: object) -> dict:
    return {"table": "nbody*", "strategy": "bayes", "settings": settings, "budget": 20,
            "optimum_s": 1.0, "best_s": best, "seeds": seeds, **extra}


def test_legacy_rows_are_named_relative_to_the_defaults_they_were_written_under() -> None:
    assert BayesSettings.parse(OLD).changed() == OLD  # today's defaults are not the legacy ones
    assert settings_label(row("defaults", [0], [1.0])) == OLD_POINT
    assert settings_label(row(COLD, [0], [1.0])) == "fit_per=point"
    assert settings_label(row("xi=0.1", [0], [1.0])) == (
        "acq_func=EI,xi=0.1,transform=log,local_candidates=0,fit_per=point")
    new = BayesSettings.parse("defaults")
    assert settings_label(row("defaults", [0], [1.0], bayes=dataclasses.asdict(new))) == "defaults"
    assert LEGACY_DEFAULTS == {"acq_func": "EI", "transform": "log", "local_candidates": 0}
    random_row = {**row("defaults", [0], [2.0]), "strategy": "random"}
    assert settings_label(random_row) == "defaults"


def test_legacy_and_new_rows_of_one_setting_join_by_seed_and_disagreements_raise() -> None:
    old_now = dataclasses.asdict(BayesSettings.parse(OLD_POINT))
    rows = [row("defaults", [0, 1], [1.5, 1.2]),                 # legacy: EI on log time
            row(OLD_POINT, [2], [1.1], bayes=old_now),           # new, same setting
            row("defaults", [2], [1.0], bayes=dataclasses.asdict(BayesSettings()))]
    joined = join_raw(rows, range(3))
    assert joined[("nbody*", "bayes", OLD_POINT, 20)] == ({0: 1.5, 1: 1.2, 2: 1.1}, 1.0)
    assert joined[("nbody*", "bayes", "defaults", 20)] == ({2: 1.0}, 1.0)
    with pytest.raises(ValueError, match="seed 2: two different results"):
        join_raw([*rows, row("defaults", [2], [1.3])], range(3))  # legacy EI, seed 2 again


def test_a_run_writes_full_settings_and_reads_back(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    table = ROOT / "tests" / "data" / "spaces" / "spmv_csr.json"
    if not table.exists():
        pytest.skip("no recorded spmv_csr table")
    data = tmp_path / "spaces"
    data.mkdir()
    shutil.copy(table, data)
    raw = tmp_path / "raw.json"
    args = ["--data", str(data), "--seeds", "2", "--budgets", "20", "--jobs", "1"]
    assert main([*args, "--raw", str(raw), "--sweep", "defaults", OLD]) == 0
    rows = json.loads(raw.read_text())
    assert {r["settings"] for r in rows if r["strategy"] == "bayes"} == {"defaults", OLD}
    assert all(BayesSettings(**r["bayes"]).changed() == r["settings"]
               for r in rows if r["strategy"] == "bayes")
    ran = capsys.readouterr().out
    assert main(["--data", str(data), "--seeds", "2", "--budgets", "20",
                 "--from-raw", str(raw)]) == 0
    report = capsys.readouterr().out
    tail = ran[ran.index("median fraction"):]
    assert report[report.index("median fraction"):].split("cpu s")[0] == tail.split("cpu s")[0]
