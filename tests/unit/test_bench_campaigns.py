"""bench/campaign_summary.py: the campaigns benchmark's summary, from a real SQLite file.

The searches themselves need the GPU (tests/gpu); here the database is written the way they
write it (repository functions, campaign names ``<example>-<kind>-s<seed>``) with known
times, and the summary must come out of it: medians, the worst-example ratios, the yield, the
time per trial, and what was cut short."""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy.orm import Session

from db import repository as repo
from db.models import utcnow
from db.session import open_database
from r3tui.domain import (
    Campaign,
    CampaignStatus,
    Variant,
    VariantOrigin,
    VariantStatus,
)
from tests.db.factories import config, failed, ok, recording

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from campaign_summary import (
    Ceilings,
    Work,
    ceilings_path,
    climb_lines,
    complete_seeds,
    read_results,
    summary_lines,
    yield_lines,
)

BASELINE_S = 1.0e-3
# example -> seed -> kind -> best time (s); None: the search was not finished (cut short)
TIMES: dict[str, dict[int, dict[str, float | None]]] = {
    "stencil7": {
        0: {"r3": 0.50e-3, "bo": 0.80e-3, "remix": 0.90e-3},
        1: {"r3": 0.40e-3, "bo": 0.50e-3, "remix": 1.00e-3},
        2: {"r3": 0.50e-3, "bo": 0.40e-3, "remix": 0.80e-3},
    },
    "sgemm": {
        0: {"r3": 0.25e-3, "bo": 0.20e-3, "remix": 0.50e-3},
        1: {"r3": 0.25e-3, "bo": 0.25e-3, "remix": 0.50e-3},
        2: {"r3": 0.25e-3, "bo": 0.20e-3, "remix": None},  # killed during remix
    },
}
WALL_S = 10.0
TRIALS = 4


def build_db(path: Path) -> None:
    database = open_database(path)
    try:
        with database.session_scope() as s:
            for example, seeds in TIMES.items():
                manifest = {"launch": {"baseline": {"median_s": BASELINE_S, "n": 20}}}
                rid = repo.add_recording(s, recording(example, tag=example), manifest)
                for seed, kinds in seeds.items():
                    for kind, best in kinds.items():
                        add_search(s, rid, f"{example}-{kind}-s{seed}", seed, kind, best)
            # a campaign of another benchmark in the same file is not a search of this one
            repo.create_campaign(s, Campaign("stencil7-rules", rid, seed=0))
    finally:
        database.close()


def add_search(s: Session, rid: int, name: str, seed: int, kind: str, best: float | None) -> None:
    started = utcnow() - timedelta(seconds=WALL_S)
    cid = repo.create_campaign(s, Campaign(name, rid, seed=seed, started_at=started))
    seed = Variant(cid, "seed source", VariantOrigin.SEED, status=VariantStatus.VERIFIED)
    vid = repo.add_variant(s, seed)
    times = [best * 1.5, best * 1.2, best] if best is not None else [2e-3]
    for t in times:
        repo.insert_trial(s, cid, vid, config(), ok(t))
    repo.insert_trial(s, cid, vid, config(block=64), failed())  # failures count as trials
    if kind != "bo":
        for source, origin, status in (
            ("child", VariantOrigin.RULE, VariantStatus.VERIFIED),
            ("x", VariantOrigin.RULE, VariantStatus.APPLY_FAILED),
            ("y", VariantOrigin.LLM, VariantStatus.PENDING),
        ):
            repo.add_variant(s, Variant(cid, source, origin, parent_id=vid, status=status))
    if best is not None:
        repo.set_campaign_status(s, cid, CampaignStatus.FINISHED, finished=True)
    else:
        repo.set_campaign_status(s, cid, CampaignStatus.CRASHED)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "campaigns.sqlite"
    build_db(path)
    return path


def value(lines: list[str], key: str) -> str:
    found = [line.split(": ", 1)[1] for line in lines if line.startswith(f"{key}: ")]
    assert len(found) == 1, (key, lines)
    return found[0]


def test_only_finished_triples_are_compared(db: Path) -> None:
    results = read_results(db)
    assert len(results) == 18  # the "stencil7-rules" campaign is not one of the searches
    complete = complete_seeds(results)
    assert sorted(complete["stencil7"]) == [0, 1, 2]
    assert sorted(complete["sgemm"]) == [0, 1]  # seed 2's remix never finished
    assert complete["stencil7"][1] == pytest.approx({"r3": 2.5, "bo": 2.0, "remix": 1.0})


def test_ratios_are_the_worst_example_of_the_medians(db: Path) -> None:
    lines = summary_lines(read_results(db), ["stencil7", "sgemm", "nbody"], 3, 32)
    # seed by seed: stencil7 r3/bo 1.6, 1.25, 0.8 and r3/remix 1.8, 2.5, 1.6; sgemm (seeds 0,
    # 1) r3/bo 0.8, 1.0 and r3/remix 2, 2: each example's median of its seeds' ratios
    assert float(value(lines, "r3_over_bo_only").split()[0]) == pytest.approx(0.9, abs=1e-3)
    assert value(lines, "r3_over_bo_only") == (
        "0.900 [0.800, 1.000] within noise (2 seeds: a 50.0% interval; 95% needs 6)  "
        "(worst example: sgemm)")
    # with its interval over the seeds: 3 seeds cover the median 75% of the time
    assert value(lines, "r3_over_bo_only[stencil7]") == (
        "1.250 [0.800, 1.600] within noise (3 seeds: a 75.0% interval; 95% needs 6)  "
        "(median of 3 seeds' r3/bo)")
    assert value(lines, "r3_over_bo_only_at_least_1.2") == (
        "1 of 2 examples (stencil7; point estimates)")
    assert float(value(lines, "r3_over_remix_only").split()[0]) == pytest.approx(1.8, abs=1e-3)
    assert "worst example: stencil7" in value(lines, "r3_over_remix_only")
    cut = value(lines, "cut_short")
    assert "sgemm (2 of 3 seeds)" in cut and "nbody (0 of 3 seeds)" in cut
    assert "stencil7" not in cut
    assert any(line.startswith("nbody") and "not run" in line for line in lines)
    # wall time over trials (3 ok + 1 failed per search), r3 searches only for the variant time
    assert float(value(lines, "s_per_trial_r3").split()[0]) == pytest.approx(WALL_S / 4, rel=0.05)
    per_variant = float(value(lines, "s_per_evaluated_variant").split()[0])
    assert per_variant == pytest.approx(WALL_S / 3, rel=0.05)  # seed, verified, failed


def test_nothing_complete_says_so(tmp_path: Path) -> None:
    lines = summary_lines([], ["stencil7"], 3, None)
    assert value(lines, "r3_over_bo_only").startswith("nan")
    assert value(lines, "cut_short") == "stencil7 (0 of 3 seeds)"


def test_yield_per_mutation_source(db: Path) -> None:
    lines = yield_lines(db)
    # each r3/remix search: one verified, one failed rule variant, one pending LLM variant
    n_searches = sum(
        1 for seeds in TIMES.values() for kinds in seeds.values() for k in kinds if k != "bo"
    )
    assert lines == [
        f"valid_variant_yield_rule: 0.500  ({n_searches}/{2 * n_searches} verified, 0 improved)"
    ]


def test_seed_major_order_and_time_limit(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``run_all`` with the GPU parts replaced by named fakes (recording and the three
    searches need the device): every example gets seed 0 before any gets seed 1, and a seed
    that would end past the time limit is not started but named."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    import campaigns

    now = [0.0]
    ran: list[tuple[str, int]] = []
    cost = {"a": 100.0, "b": 30.0}

    def fake_record(name: str, out: Path, scale: float) -> Path:
        return out / f"{name}.r3b"

    def fake_run_seed(
        name: str, bundle: Path, db: Path, seed: int, budgets: object, ablate: bool,
        remix_arm: bool = True,
    ) -> bool:
        assert ablate is True and remix_arm is True
        ran.append((name, seed))
        now[0] += cost[name]
        return True

    monkeypatch.setattr(campaigns, "record", fake_record)
    monkeypatch.setattr(campaigns, "run_seed", fake_run_seed)
    args = campaigns.argparse.Namespace(
        seeds=3,
        time_limit=250.0,
        example_cap=0.0,
        bundles=tmp_path,
        scale=None,
        db=tmp_path,
        ablate_transfer=True,
        no_remix=False,
    )
    notes = campaigns.run_all(args, ["a", "b"], campaigns.Budgets(4, 5, 12), lambda: now[0])
    # a0 (100) b0 (130) a1 (230) b1 (260: started at 230, expected 30 -> 260 > 250: no)
    assert ran == [("a", 0), ("b", 0), ("a", 1)]
    assert "b seed 1 not run: time limit 250.0 s" in notes
    assert "a seed 2 not run: time limit 250.0 s" in notes
    assert notes[-1] == "wall time 230 s"


def test_seeds_the_database_holds_finished_are_not_run_again(
        monkeypatch: pytest.MonkeyPatch, db: Path) -> None:
    """A second device command carrying the database back goes on where the first stopped:
    stencil7 has seeds 0-2 complete, sgemm 0 and 1 (seed 2's remix crashed)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    import campaigns

    ran: list[tuple[str, int]] = []
    monkeypatch.setattr(campaigns, "record", lambda name, out, scale: out / f"{name}.r3b")
    monkeypatch.setattr(campaigns, "run_seed",
                        lambda name, bundle, db, seed, budgets, ablate, remix_arm:
                        ran.append((name, seed, remix_arm)) or True)
    args = campaigns.argparse.Namespace(seeds=4, time_limit=0.0, example_cap=0.0,
                                        bundles=db.parent, scale=None, db=db,
                                        ablate_transfer=False, no_remix=False)
    campaigns.run_all(args, ["stencil7", "sgemm"], campaigns.Budgets(4, 5, 12))
    assert ran == [("sgemm", 2, True), ("stencil7", 3, True), ("sgemm", 3, True)]
    # without the remix arm, sgemm's seed 2 (r3 and BO alone finished) is complete
    ran.clear()
    campaigns.run_all(campaigns.argparse.Namespace(**{**vars(args), "no_remix": True}),
                      ["stencil7", "sgemm"], campaigns.Budgets(4, 5, 12))
    assert ran == [("stencil7", 3, False), ("sgemm", 3, False)]


def test_without_the_remix_arm_the_summary_compares_r3_with_bo_alone(db: Path) -> None:
    """``--no-remix``: a seed counts once r3 and BO alone finished; remix's columns are "-"
    where a seed has none, and r3_over_remix_only is left out when no seed has one."""
    from campaign_summary import COMPARED

    results = read_results(db)
    assert sorted(complete_seeds(results, COMPARED)["sgemm"]) == [0, 1, 2]
    lines = summary_lines(results, ["stencil7", "sgemm"], 3, 4, kinds=COMPARED)
    assert "cut_short: none" in lines
    sgemm = next(line for line in lines if line.startswith("sgemm "))
    # seeds 0 and 1 have a remix search, seed 2 none: the remix median over those two
    assert sgemm.split()[1] == "3" and sgemm.split()[4] != "-"
    assert value(lines, "r3_over_remix_only")
    without = [r for r in results if r.kind != "remix"]
    lines = summary_lines(without, ["stencil7", "sgemm"], 3, 4, kinds=COMPARED)
    assert all(line.split()[4] == "-" for line in lines
               if line.startswith(("stencil7 ", "sgemm ")))
    assert not any(line.startswith("r3_over_remix_only") for line in lines)
    assert value(lines, "r3_over_bo_only")


def test_the_transfer_ablation_is_compared_on_the_seeds_that_have_it(db: Path) -> None:
    database = open_database(db)
    try:
        with database.session_scope() as s:
            rid = next(c.recording_id for c in (repo.get_campaign(s, x.id)
                                                for x in repo.list_campaign_summaries(s))
                       if c is not None and c.name.startswith("stencil7"))
            add_search(s, rid, "stencil7-r3nt-s0", 0, "r3nt", 1.0e-3)
            add_search(s, rid, "stencil7-r3nt-s1", 1, "r3nt", 0.5e-3)
    finally:
        database.close()
    results = read_results(db)
    complete = complete_seeds(results)
    assert complete["stencil7"][0]["r3nt"] == pytest.approx(1.0)
    assert "r3nt" not in complete["stencil7"][2]  # seed 2 has no ablation: still compared
    lines = summary_lines(results, ["stencil7", "sgemm"], 3, 32)
    # stencil7 seeds 0, 1: r3nt 1.0 and 2.0 against bo 1.25 and 2.0, seed by seed 0.8 and 1.0
    ratio = value(lines, "r3nt_over_bo_only")
    assert float(ratio.split()[0]) == pytest.approx(0.9, abs=1e-3)
    assert "worst example: stencil7" in ratio
    assert float(value(lines, "r3_over_bo_only").split()[0]) == pytest.approx(0.9, abs=1e-3)


def test_llm_yield_and_inference_share_per_model(tmp_path: Path) -> None:
    from r3tui.domain import LLMCall

    path = tmp_path / "llm.sqlite"
    database = open_database(path)
    try:
        with database.session_scope() as s:
            rid = repo.add_recording(s, recording("softmax"), {})
            for model, statuses, latency, wall in (
                ("/m/SmolLM2-135M-Instruct.Q4_1.gguf",
                 (VariantStatus.APPLY_FAILED, VariantStatus.COMPILE_FAILED), 30.0, 40.0),
                ("/m/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
                 (VariantStatus.IMPROVED, VariantStatus.WRONG_RESULT), 90.0, 100.0),
            ):
                cid = repo.create_campaign(s, Campaign(f"softmax-{model[3:6]}", rid, seed=0))
                seed = repo.add_variant(s, Variant(cid, "seed", VariantOrigin.SEED))
                for i, status in enumerate(statuses):
                    call = LLMCall(model, "0" * 64, "p", "r", {}, 0, 10, 10, latency / 2)
                    call_id = repo.add_llm_call(s, cid, call)
                    repo.add_variant(s, Variant(cid, f"v{i}", VariantOrigin.LLM, parent_id=seed,
                                                status=status, llm_call_id=call_id))
                repo.add_event(s, cid, "finish", "done", {"wall_s": wall})
    finally:
        database.close()
    lines = yield_lines(path)
    assert value(lines, "valid_variant_yield_smollm2").startswith("0.000  (0/2 verified")
    assert value(lines, "valid_variant_yield_qwen2.5").startswith("0.500  (1/2 verified, 1 impr")
    assert float(value(lines, "inference_share").split()[0]) == pytest.approx(120 / 140, abs=1e-3)
    assert float(value(lines, "inference_share_smollm2").split()[0]) == pytest.approx(0.75)
    assert float(value(lines, "inference_share_qwen2.5").split()[0]) == pytest.approx(0.9)


def test_tuned_kernels_against_the_ceilings_the_run_measured(db: Path) -> None:
    """r3's best time, median over the complete seeds, against the copy bandwidth or the FMA
    rate; sgemm's against cuBLAS per seed, with the interval over its seeds."""
    ceilings = Ceilings(4e12, 50e12, 0.1e-3, "torch addmm (cuBLAS, TF32 off)")
    ceilings.save(ceilings_path(db))  # what bench/campaigns.py keeps beside the database
    assert Ceilings.load(ceilings_path(db)) == ceilings
    assert Ceilings.load(db.with_name("none.json")) is None
    work = {"stencil7": Work("memory", 1e9), "sgemm": Work("compute", 10e9)}
    lines = summary_lines(read_results(db), ["stencil7", "sgemm"], 3, 32, ceilings, work)
    # stencil7: r3 best 0.5, 0.4, 0.5 ms -> 0.5 ms: 1e9 B / 0.5 ms = 2 TB/s of 4; BO alone
    # 0.8, 0.5, 0.4 ms -> 0.5 ms as well
    assert value(lines, "tuned_fraction_of_ceiling[stencil7]") == (
        "0.500 of copy bandwidth  (r3's best, median of 3 seeds; BO alone 0.500)")
    # sgemm: 10 GFLOP in 0.25 ms = 40 TFLOP/s of 50
    assert value(lines, "tuned_fraction_of_ceiling[sgemm]").startswith(
        "0.800 of the fp32 FMA rate  (r3's best, median of 2 seeds")
    # cuBLAS 0.1 ms over r3's 0.25 ms, in each of the 2 complete seeds
    assert value(lines, "sgemm_fraction_of_cublas") == (
        "0.400 [0.400, 0.400]  (cuBLAS 100.0 us over r3's best per seed, 2 seeds; "
        "2 seeds: a 50.0% interval; 95% needs 6)")
    assert value(lines, "ceilings").startswith("copy 4.00 TB/s (read+write), fp32 FMA 50.0")
    # cuBLAS not timed: said so, no figure
    untimed = Ceilings(4e12, 50e12, None, "not timed: torch (for cuBLAS) is not importable")
    lines = summary_lines(read_results(db), ["stencil7", "sgemm"], 3, 32, untimed, work)
    assert value(lines, "sgemm_fraction_of_cublas").startswith("n/a (cuBLAS not timed: torch")


def test_a_wall_time_budget_is_named_as_such() -> None:
    """--seconds: every arm gets the same wall time, and the table's first line says so."""
    import campaigns

    assert campaigns.Budgets(4, 5, 12).describe() == "32 trials per search"
    timed = campaigns.Budgets(4, 5, 12, 30.0)
    assert timed.describe() == "30 s of wall time per search"
    lines = summary_lines([], ["stencil7"], 6, timed.describe())
    assert lines[0].startswith("budget: 30 s of wall time per search; 6 seeds asked")
    assert summary_lines([], ["stencil7"], 3, 32)[0].startswith("budget: 32 trials per search")


def test_climbs_per_example_over_the_r3_searches(db: Path) -> None:
    """A child of stencil7's seed-0 r3 search whose last two of five trials were a climb (its
    inner_done event says so) that took it from 0.6 to 0.45 ms: one child in one of three r3
    searches, two trials, and the gain; bo and remix searches do not count."""
    database = open_database(db)
    try:
        with database.session_scope() as s:
            cid = next(c.id for c in repo.list_campaign_summaries(s) if c.name == "stencil7-r3-s0")
            child = next(v for v in repo.campaign_variants(s, cid) if v.source == "child")
            assert child.id is not None
            for t in (0.7e-3, 0.6e-3, 0.65e-3, 0.5e-3, 0.45e-3):
                repo.insert_trial(s, cid, child.id, config(block=int(t * 1e6)), ok(t))
            repo.add_event(s, cid, "inner_done", "5 trials", {"variant_id": child.id,
                                                                "climbed": 2})
    finally:
        database.close()
    sgemm, stencil7 = climb_lines(db)
    assert stencil7.startswith("climbs[stencil7]: 1 child in 1 of 3 r3 searches, 2 trials")
    assert f"1.333x (variant #{child.id}, 600.0 -> 450.0 us)" in stencil7
    assert sgemm == "climbs[sgemm]: 0 children in 0 of 3 r3 searches, 0 trials (0.0% of theirs)"
