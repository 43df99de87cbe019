"""Before any search: the original must compile (the toolchain chosen by trying it) and replay
to its recorded result; proposals that give nothing to evaluate are counted, and a campaign
that keeps getting them stops with the reason.

Compiles are real (NVRTC in process, nvcc as a subprocess); the GPU replay is the named fake
of tests/unit/campaign_fakes.py, and the real path runs in tests/gpu on the device.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from db import repository as repo
from db.session import Database, open_database
from r3tui.domain import Measurement, MeasurementStatus, TrialConfig, VariantStatus
from r3tui.engine import KernelSource
from r3tui.engine.campaign import CampaignRun, CampaignSettings
from r3tui.engine.ledger import STREAK_LIMIT
from r3tui.engine.report import build_report
from r3tui.engine.tune import make_mutator_from
from r3tui.engine.unit_source import OriginalUnusable, preflight
from r3tui.search import DeviceLimits
from tests.unit.campaign_fakes import CompiledCostEvaluator
from tests.unit.test_engine_campaign import LAUNCH, SETTINGS, SOURCE, new_campaign


def test_the_original_is_compiled_with_the_toolchain_asked_for_when_it_can() -> None:
    checked = preflight(SOURCE, "nvrtc", "sm_90")
    assert checked.toolchain == "nvrtc" and checked.note is None


def test_nvcc_takes_over_when_nvrtc_cannot_compile_the_original() -> None:
    # thrust's complex needs <cmath>, which NVRTC does not have; nvcc has the host headers
    source = KernelSource(
        "#include <thrust/complex.h>\n"
        'extern "C" __global__ void k(float* x) {\n'
        "  thrust::complex<float> c(x[0], 2.0f);\n  x[0] = abs(c);\n}\n", "k")
    checked = preflight(source, "nvrtc", "sm_90")
    assert checked.toolchain == "nvcc"
    assert checked.note is not None and checked.note.startswith("nvrtc cannot compile the original")
    assert "cmath" in checked.note and checked.note.endswith("searching with nvcc")


def test_an_original_that_no_toolchain_compiles_ends_the_search_in_one_line() -> None:
    broken = KernelSource('extern "C" __global__ void k(float* x) { x[0] = undefined_name; }\n',
                          "k")
    with pytest.raises(OriginalUnusable) as caught:
        preflight(broken, "nvrtc", "sm_90")
    line = caught.value.one_line()
    assert "\n" not in line and line.startswith("the original kernel does not compile")
    assert "nvrtc:" in line and "nvcc:" in line and "undefined_name" in line


class WrongResults(CompiledCostEvaluator):
    """FAKE replay whose every result differs from the recording (no GPU here)."""

    def evaluate(self, configs: Sequence[TrialConfig]) -> list[Measurement]:
        self.compiles += len(configs)
        return [Measurement(MeasurementStatus.WRONG_RESULT,
                            error_text="out: 4096 of 262144 elements differ") for _ in configs]

    def with_source(self, source: KernelSource) -> WrongResults:
        return WrongResults(source)


def test_an_original_that_does_not_replay_stops_the_campaign_before_any_search(
        tmp_path: Path) -> None:
    database = open_database(tmp_path / "r3.sqlite")
    try:
        cid = new_campaign(database)
        run = CampaignRun(database, cid, SETTINGS, SOURCE, LAUNCH, DeviceLimits(),
                          make_mutator_from(SETTINGS, None), WrongResults)
        with pytest.raises(OriginalUnusable, match=r"does not replay \(wrong_result\): out: 4096"):
            run.run()
        with database.session_scope() as s:
            variants = repo.campaign_variants(s, cid)
            assert len(variants) == 1  # the seed, never searched
            assert repo.finished_trials(s, cid) == []
    finally:
        database.close()


BARE = KernelSource('extern "C" __global__ void nothing_to_rewrite() {}\n',
                    "nothing_to_rewrite")


def dry_run(database: Database, settings: CampaignSettings) -> tuple[int, CampaignRun]:
    """A rules-only campaign on a kernel no rule applies to, run until its streak: its id
    and run."""
    cid = new_campaign(database, settings)
    run = CampaignRun(database, cid, settings, BARE, LAUNCH, DeviceLimits(),
                      make_mutator_from(settings, None), CompiledCostEvaluator)
    assert run.run() == STREAK_LIMIT
    assert run.stop_reason is not None and "in a row" in run.stop_reason
    return cid, run


def test_rules_that_never_apply_are_counted_and_the_campaign_stops_after_a_streak(
        tmp_path: Path) -> None:
    settings = replace(SETTINGS, variants=STREAK_LIMIT * 3)
    database = open_database(tmp_path / "r3.sqlite")
    try:
        cid, _ = dry_run(database, settings)
        with database.session_scope() as s:
            variants = repo.campaign_variants(s, cid)
            events = repo.events(s, cid)
            report = build_report(s, cid)
        assert [v.status for v in variants] == [VariantStatus.VERIFIED]  # the seed alone
        assert [e.kind for e in events if e.kind in ("skipped", "give_up")] == [
            "give_up", "skipped"]
        assert report.skipped == {"declined": STREAK_LIMIT}
        assert sum(report.skipped_by_operator.values()) == STREAK_LIMIT
    finally:
        database.close()


def test_a_campaign_whose_rules_run_dry_spends_the_time_left_on_its_best_variant(
        tmp_path: Path) -> None:
    """Under a wall-time budget, the streak no longer ends the campaign early: the seconds
    left go on with the inner search of the fastest variant (here the original, the only
    one), from the trials it has, so it searches as long as BO alone would."""
    settings = replace(SETTINGS, variants=None, seconds=6.0)
    database = open_database(tmp_path / "r3.sqlite")
    try:
        cid, run = dry_run(database, settings)
        assert run.stop_reason is not None
        assert "went to the inner search of the fastest variant" in run.stop_reason
        with database.session_scope() as s:
            (seed,) = repo.campaign_variants(s, cid)
            trials = repo.trials_of_variant(s, seed.id)
            events = repo.events(s, cid)
        assert seed.status is VariantStatus.VERIFIED
        (mix,) = [e for e in events if e.kind == "mix"]
        assert f"inner search of variant {seed.id}, the fastest" in mix.message
        # its first search took the seed's 6 trials; the rest went on until the time was up
        assert len(trials) > settings.seed_trials
        assert len({repr(sorted(t.config.to_json().items())) for t in trials}) == len(trials)
        assert run.timing.wall_s() >= settings.seconds - 1.0
    finally:
        database.close()


class SlowOriginal(CompiledCostEvaluator):
    """FAKE replay (no GPU here) whose original takes twice its modelled time, so a rule's
    child is the campaign's fastest variant."""

    def time_of(self, config: TrialConfig, registers: int | None) -> float:
        slower = 2.0 if self.source.text == SOURCE.text else 1.0
        return slower * super().time_of(config, registers)

    def with_source(self, source: KernelSource) -> SlowOriginal:
        return SlowOriginal(source)


def test_the_time_left_goes_on_with_the_fastest_variant_where_that_is_a_child(
        tmp_path: Path) -> None:
    """The fastest variant of a stencil7 campaign (rule children, tuned by the inner loop)
    searched again from its own trials: more of them, none repeated, the archive's best as
    fast or faster."""
    settings = replace(SETTINGS, variants=3)
    database = open_database(tmp_path / "r3.sqlite")
    try:
        cid = new_campaign(database, settings)
        run = CampaignRun(database, cid, settings, SOURCE, LAUNCH, DeviceLimits(),
                          make_mutator_from(settings, None), SlowOriginal)
        run.run()
        best = run.state.archive.best()
        assert best is not None
        with database.session_scope() as s:
            variant = repo.get_variant(s, best.variant_id)
            before = len(repo.trials_of_variant(s, best.variant_id))
        assert variant is not None and variant.parent_id is not None  # a child
        run.settings = replace(settings, seconds=run.timing.wall_s() + 4.0)
        run.ledger.stop_reason = "20 proposals in a row gave nothing to evaluate"
        run._spend_rest()
        with database.session_scope() as s:
            trials = repo.trials_of_variant(s, best.variant_id)
            (mix,) = [e for e in repo.events(s, cid) if e.kind == "mix"]
        assert len(trials) > before
        assert len({repr(sorted(t.config.to_json().items())) for t in trials}) == len(trials)
        assert f"variant {best.variant_id}, the fastest" in mix.message
        after = run.state.archive.best()
        assert after is not None and after.fitness_s <= best.fitness_s
        assert run.stop_reason is not None and run.stop_reason.endswith(
            "went to the inner search of the fastest variant")
    finally:
        database.close()
