"""bench/corpus.py's apply stage asks r3 apply for what r3 apply accepts: no more --runs than
--max-runs (R3_CORPUS_MAX_RUNS=4 once made every apply on the H200 fail with "--max-runs (4)
is below --runs (5)")."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import corpus
import corpus_stages
from corpus_recipes import RECIPES


@pytest.mark.parametrize(("runs", "max_runs", "asked"), [(5, 4, "4"), (5, 10, "5"), (3, 3, "3")])
def test_apply_never_asks_more_runs_than_its_max(monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path, runs: int, max_runs: int,
                                                 asked: str) -> None:
    seen: list[list[str]] = []
    # the stage clears its patched trees there
    monkeypatch.setattr(corpus_stages, "STATE", tmp_path)

    def step(argv: list[str], cwd: Path, timeout_s: float) -> dict[str, Any]:
        seen.append(list(argv))
        return {"status": "ok"}

    monkeypatch.setattr(corpus_stages, "run_step", step)
    args = argparse.Namespace(runs=runs, max_runs=max_runs, jobs=2, apply_args=[])
    state = {"steps": {"tune": {"status": "ok", "plan": {"kernels": [{"campaign_id": 3}]}}}}
    context = corpus.StageContext(args, time.perf_counter() + 3600)
    assert corpus.stage_apply(RECIPES[0], state, context) is None
    (argv,) = seen
    assert argv[argv.index("--runs") + 1] == asked
    assert argv[argv.index("--max-runs") + 1] == str(max_runs)
    assert int(asked) <= max_runs


def test_a_run_with_too_few_apply_pairs_stops_before_any_step(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """R3_CORPUS_MAX_RUNS=4 once ran a whole device call; r3 apply now refuses fewer than the
    6 pairs of a 95% interval, so the harness says so at once, with exit 2."""
    monkeypatch.setattr(corpus, "STATE", tmp_path)
    monkeypatch.setattr(corpus_stages, "STATE", tmp_path)
    monkeypatch.setattr(corpus_stages, "run_step", lambda *a, **k: pytest.fail("a step ran"))
    assert corpus.main(["run", "--stage", "all", "--max-runs", "4"]) == 2
    err = capsys.readouterr().err
    assert err == ("corpus.py: error: --max-runs (4) is below the 6 pairs r3 apply's 95% "
                   "interval needs\n")


def test_each_step_keeps_the_commit_it_ran_and_the_report_counts_them(tmp_path: Path) -> None:
    import re

    from corpus_report import code_versions

    step = corpus.run_step([sys.executable, "-c", "print('x: 1')"], tmp_path, 60)
    assert step["status"] == "ok"
    assert re.fullmatch(r"[0-9a-f]{7,}(\+dirty)?", step["code"]), step["code"]
    states = {
        "one": {"steps": {"record": {"code": "abc1234"}, "tune": {"code": "abc1234"}}},
        "two": {"steps": {"record": {"code": "abc1234"}, "apply": {"code": "abc1234"}}},
        "mixed": {"steps": {"record": {"code": "abc1234"}, "tune": {"code": "def5678"}}},
        "old": {"steps": {"record": {"status": "ok"}}},  # stored before steps kept a commit
        "never": {"steps": {}},
    }
    assert code_versions(states) == "abc1234 2, mixed 1, unknown 1"


def test_kept_states_import_into_a_new_checkout(monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path) -> None:
    """`keep` copies the state files into the tree and a later session's `import` of that
    folder gives the report the same steps: a corpus run can span two sessions' checkouts."""
    import json

    first, kept, second = tmp_path / "first", tmp_path / "kept", tmp_path / "second"
    first.mkdir()
    name = RECIPES[0].name
    steps = {"record": {"status": "ok", "code": "abc1234"}, "apply": {"status": "failed"},
             "all": {"status": "ok"}}
    (first / f"{name}.json").write_text(json.dumps({"steps": steps}))
    # a program whose pipeline did not end needs its recording, gone with its machine
    (first / f"{RECIPES[1].name}.json").write_text(json.dumps(
        {"steps": {"plain": {"status": "ok"}, "record": {"status": "ok"}}}))
    import corpus_recipes
    monkeypatch.setattr(corpus, "STATE", first)
    monkeypatch.setattr(corpus_recipes, "STATE", first)
    assert corpus.main(["keep", "--into", str(kept)]) == 0
    assert [p.name for p in kept.iterdir()] == [f"{name}.json"]

    monkeypatch.setattr(corpus, "STATE", second)
    monkeypatch.setattr(corpus_recipes, "STATE", second)
    assert corpus.main(["import", str(kept)]) == 0
    assert json.loads((second / f"{name}.json").read_text())["steps"] == steps
    # nothing to keep is an error, not a silent success
    monkeypatch.setattr(corpus, "STATE", tmp_path / "empty")
    monkeypatch.setattr(corpus_recipes, "STATE", tmp_path / "empty")
    assert corpus.main(["keep", "--into", str(tmp_path / "none")]) == 2


def test_the_report_counts_the_programs_each_arm_ships_more_for() -> None:
    from corpus_report import arm_counts

    ratios = [1.0] * 6 + [1.02, 1.3, 0.99, 1.0, 0.97]
    assert arm_counts(ratios) == "2 ahead, 7 tied, 2 behind (the median passes 1 with 6 ahead)"


def test_a_difference_between_the_arms_counts_only_beyond_both_intervals() -> None:
    """hotspot3D (session 44): the full campaign's 1.092 [1.068, 1.100] against BO alone's
    1.127 [1.046, 1.135] is behind by point estimate and tied by interval."""
    from corpus_report import _shipped_interval, beyond_noise

    def plan(*kernels: tuple[float, float, float]) -> dict[str, object]:
        return {"kernels": [{"speedup": v, "ci": [lo, hi]} for v, lo, hi in kernels]}

    assert beyond_noise(_shipped_interval(plan((1.092, 1.068, 1.100))),
                        _shipped_interval(plan((1.127, 1.046, 1.135)))) == "tied"
    # a kernel whose interval reaches 1 ships nothing: the arm counts as (1, 1, 1)
    nothing = _shipped_interval(plan((1.003, 0.998, 1.010)))
    assert nothing == (1.0, 1.0, 1.0)
    assert beyond_noise(_shipped_interval(plan((1.07, 1.04, 1.09))), nothing) == "ahead"
    assert beyond_noise(nothing, _shipped_interval(plan((1.07, 1.04, 1.09)))) == "behind"
    assert beyond_noise(_shipped_interval({}), nothing) is None


def test_the_prediction_error_names_its_program_and_what_its_prediction_said() -> None:
    """The worst shipped program is named; where its prediction said it was uncertain (its
    replayed launch did other work than its other launches: gaussian's Fan2, 10.2x predicted
    and 17.8x measured), the worst of the other programs is given beside it."""
    from corpus_report import prediction_error_lines

    hot = {"name": "hotspot3D", "kernel_pred": 1.18, "kernel_meas": 1.116}
    gauss = {"name": "gaussian", "kernel_pred": 10.205, "kernel_meas": 17.756,
             "other_work": ["Fan2: the replayed launch's arguments recur in 1 of 4095"]}
    unmeasured = {"name": "lud", "kernel_pred": 1.04, "kernel_meas": "n/a"}
    lines = prediction_error_lines([hot, gauss, unmeasured])
    assert lines[0].startswith("corpus_prediction_error_pct: 74.0  (gaussian: predicted 10.205, "
                               "measured 17.756; its prediction said it was uncertain: Fan2")
    assert lines[1].startswith("corpus_prediction_error_pct_without_uncertain: 5.4  (hotspot3D;")
    assert prediction_error_lines([hot]) == [
        "corpus_prediction_error_pct: 5.4  (hotspot3D: predicted 1.180, measured 1.116)"]
    assert prediction_error_lines([unmeasured])[0].endswith("has a measured kernel time)")
    assert prediction_error_lines([])[0].endswith("(nothing shipped yet)")


def test_a_recording_whose_later_launches_do_other_work_is_made_again_with_strata(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """With --strata N the record step records a second time, --strata-from the first, where
    the first says a configuration's later launches do other work (gaussian's Fan2), and
    once where they do not (double-buffered pointers)."""
    import json

    recipe = RECIPES[0]
    root = tmp_path / "corpus" / recipe.name
    (root / recipe.binary).parent.mkdir(parents=True, exist_ok=True)
    (root / recipe.binary).write_text("")
    for spec in recipe.inputs:
        (root / spec.path).parent.mkdir(parents=True, exist_ok=True)
        (root / spec.path).write_text("")
    monkeypatch.setattr(corpus_stages, "CORPUS", tmp_path / "corpus")
    monkeypatch.setattr(corpus_stages, "STATE", tmp_path / "state")
    seen: list[list[str]] = []
    same = {"count": 1, "time_s": 0.004, "timed": 1}

    def step(argv: list[str], cwd: Path, timeout_s: float) -> dict[str, Any]:
        seen.append(list(argv))
        rec = Path(argv[argv.index("--out") + 1])
        rec.mkdir(parents=True, exist_ok=True)
        config = {"grid": [8, 8, 1], "block": [4, 4, 1], "count": 100, "device_time_s": 0.1,
                  "same_args": same}
        (rec / "recording.json").write_text(json.dumps({"format_version": 1, "kernels": [
            {"entry_point": "_Z4Fan2Pf", "configs": [config]}]}))
        return {"status": "ok", "stdout_tail": []}

    monkeypatch.setattr(corpus_stages, "run_step", step)
    args = argparse.Namespace(stage="record", record_args=["--max-configs", "6"], strata=4,
                              plain_runs=1, strata_snapshots="6G")
    state = {"program": recipe.name, "steps": {"plain": {"status": "ok", "median_wall_s": 1.0}}}
    context = corpus.StageContext(args, time.perf_counter() + 3600)
    assert corpus_stages.stage_record(recipe, state, context) is None
    first, second = seen
    assert "--strata-from" not in first
    at = second.index("--strata-from")
    assert second[at + 1] == first[first.index("--out") + 1]
    assert second[at + 2:at + 4] == ["--strata", "4"]
    # its own snapshot budget, after --record-args' (the last one counts)
    assert second[at + 4:at + 6] == ["--max-snapshot-bytes", "6G"]
    assert second[second.index("--") + 1:] == first[first.index("--") + 1:]
    assert state["steps"]["record_first"]["status"] == "ok"
    # half the launches with the first's arguments, every launch as long: recorded once
    seen.clear()
    same = {"count": 50, "time_s": 0.05, "timed": 50}
    assert corpus_stages.stage_record(recipe, state, context) is None
    assert len(seen) == 1


def test_an_import_of_a_program_redone_there_drops_the_local_steps_of_its_older_plan(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A program redone on the device from its recording on (`--force`) whose apply did not
    fit there: the local apply measured the older plan, so it must not join the new one."""
    import json

    import corpus_recipes
    name = RECIPES[0].name
    local, exported = tmp_path / "local", tmp_path / "exported"
    local.mkdir(), exported.mkdir()
    old = {step: {"status": "ok", "at": "12:00"} for step in ("record", "tune", "tune_bo", "apply")}
    (local / f"{name}.json").write_text(json.dumps(
        {"steps": {"plain": {"status": "ok"}, **old, "all": {"status": "ok"}}}))
    new = {step: {"status": "ok", "at": "13:00"} for step in ("record", "tune", "tune_bo")}
    (exported / f"{name}.json").write_text(json.dumps(
        {"steps": {"plain": {"status": "ok"}, **new}}))
    monkeypatch.setattr(corpus, "STATE", local)
    monkeypatch.setattr(corpus_recipes, "STATE", local)
    assert corpus.main(["import", str(exported)]) == 0
    steps = json.loads((local / f"{name}.json").read_text())["steps"]
    assert steps == {"plain": {"status": "ok"}, **new}

    # an export that only adds the steps after the local ones keeps them all
    later = {"apply": {"status": "ok", "at": "14:00"}, "all": {"status": "ok"}}
    (exported / f"{name}.json").write_text(json.dumps({"steps": {**new, **later}}))
    assert corpus.main(["import", str(exported)]) == 0
    steps = json.loads((local / f"{name}.json").read_text())["steps"]
    assert steps == {"plain": {"status": "ok"}, **new, **later}
