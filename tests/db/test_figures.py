"""The campaign figures of db.figures on a real SQLite file: best speedup and its basis,
duration over resumed runs, evaluations/s."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from db import repository as repo
from db.figures import (
    CampaignTiming,
    SpeedupBasis,
    duration_text,
    figures_of,
    original_time,
)
from db.session import Database
from r3tui.domain import CampaignStatus, TrialConfig, Variant, VariantOrigin, VariantStatus
from tests.db import factories as f

T0 = datetime(2026, 12, 2, 14, 0, tzinfo=UTC)


def test_best_speedup_is_the_retimed_final_else_the_best_trial(database: Database) -> None:
    with database.session_scope() as s:
        _, cid, seed = f.seed_campaign(s)
        child = repo.add_variant(
            s, Variant(campaign_id=cid, source="//", origin=VariantOrigin.RULE, parent_id=seed)
        )
        repo.update_variant(s, child, status=VariantStatus.IMPROVED)
        repo.insert_trial(s, cid, seed, TrialConfig(), f.ok(110e-6))  # the original
        repo.insert_trial(s, cid, seed, f.config(), f.ok(100e-6))  # the seed, tuned
        repo.insert_trial(s, cid, child, f.config(), f.ok(100e-6))
    with database.session_scope() as s:
        figures = figures_of(s, cid)
        assert original_time(s, cid) == pytest.approx(110e-6)
    assert figures is not None and figures.best_speedup is not None
    # not 1.00x (the seed's tuned best over the best): the original is the recorded config
    assert figures.best_speedup.basis is SpeedupBasis.BEST_TRIAL
    assert figures.best_speedup_text == "1.10× best trial"
    with database.session_scope() as s:
        repo.add_event(s, cid, "final", "best variant", {"variant_id": child, "speedup": 1.043,
                                                         "ci": [1.01, 1.07], "rounds": 15})
        figures = figures_of(s, cid)
    assert figures is not None and figures.best_speedup is not None
    assert figures.best_speedup.basis is SpeedupBasis.RETIMED
    assert figures.best_speedup.ci == (1.01, 1.07) and figures.best_speedup.variant_id == child
    assert figures.best_speedup_text == "1.04× re-timed"


def test_duration_sums_the_runs_and_counts_a_running_one_to_now(database: Database) -> None:
    with database.session_scope() as s:
        _, cid, seed = f.seed_campaign(s)
        repo.add_event(s, cid, "start", "started")
        repo.add_event(s, cid, "finish", "budget spent", {"wall_s": 100.0, "llm_s": 20.0})
        repo.add_event(s, cid, "resume", "resumed")
        repo.add_event(s, cid, "stop", "stopped", {"wall_s": 58.0})
        repo.set_campaign_status(s, cid, CampaignStatus.STOPPED, finished=True)
        for _ in range(79):
            repo.insert_trial(s, cid, seed, f.config(), f.ok(1e-4))
    with database.session_scope() as s:
        figures = figures_of(s, cid)
    assert figures is not None
    now = datetime.now(UTC) + timedelta(days=3)  # a finished campaign does not grow
    assert figures.duration_s(now) == pytest.approx(158.0)
    assert duration_text(figures.duration_s(now)) == "2m38s"
    assert figures.evaluations_per_s(now) == pytest.approx(79 / 158.0)
    assert figures.timing.n_runs == 2


def test_duration_without_run_events() -> None:
    finished = CampaignTiming(CampaignStatus.FINISHED, T0, T0 + timedelta(seconds=75))
    assert finished.duration_s(T0 + timedelta(days=1)) == 75.0
    running = CampaignTiming(CampaignStatus.RUNNING, T0, None)
    assert running.duration_s(T0 + timedelta(seconds=30)) == 30.0
    assert CampaignTiming(CampaignStatus.CRASHED, T0, None).duration_s(T0) is None
    # resumed and running: the ended runs plus the time since the last resume
    resumed = CampaignTiming(CampaignStatus.RUNNING, T0, None, (100.0,),
                             T0 + timedelta(hours=1))
    assert resumed.duration_s(T0 + timedelta(hours=1, seconds=20)) == 120.0
    assert duration_text(7384) == "2h03m" and duration_text(None) == "-"
