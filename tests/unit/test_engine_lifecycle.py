"""One campaign status lifecycle for every kind of run (engine/lifecycle.py), on a real
SQLite database."""

from __future__ import annotations

from pathlib import Path

import pytest

from db import repository as repo
from db.session import open_database
from r3tui.domain import CampaignStatus
from r3tui.engine.lifecycle import campaign_run, finish
from r3tui.engine.unit_source import OriginalUnusable
from tests.db import factories as f


def _campaign(tmp_path: Path):  # type: ignore[no-untyped-def]
    database = open_database(tmp_path / "r3.sqlite")
    with database.session_scope() as s:
        _, cid, _ = f.seed_campaign(s)
        repo.set_campaign_status(s, cid, CampaignStatus.RUNNING)
    return database, cid


def _state(database, cid):  # type: ignore[no-untyped-def]
    with database.session_scope() as s:
        campaign = repo.get_campaign(s, cid)
        return campaign.status, [(e.kind, e.message) for e in repo.events(s, cid)]


def test_a_run_that_raises_leaves_its_campaign_crashed_with_the_reason(tmp_path: Path) -> None:
    database, cid = _campaign(tmp_path)
    with pytest.raises(KeyboardInterrupt), campaign_run(database, cid):
        raise KeyboardInterrupt()
    status, events = _state(database, cid)
    assert status is CampaignStatus.CRASHED and ("crash", "KeyboardInterrupt: ") in events


def test_an_original_that_cannot_be_searched_fails_the_campaign(tmp_path: Path) -> None:
    database, cid = _campaign(tmp_path)
    with pytest.raises(OriginalUnusable), campaign_run(database, cid):
        raise OriginalUnusable("the original does not compile: kernel.cu(3): error")
    status, events = _state(database, cid)
    assert status is CampaignStatus.FAILED
    assert ("abort", "the original does not compile: kernel.cu(3): error") in events


@pytest.mark.parametrize("status,kind,finished", [
    (CampaignStatus.FINISHED, "finish", True), (CampaignStatus.STOPPED, "stop", True),
    (CampaignStatus.PAUSED, "finish", False)])
def test_a_run_ends_with_its_status_and_one_event_with_its_timing(
        tmp_path: Path, status: CampaignStatus, kind: str, finished: bool) -> None:
    database, cid = _campaign(tmp_path)
    with campaign_run(database, cid):
        pass  # nothing raised: the status is the run's to set
    assert _state(database, cid)[0] is CampaignStatus.RUNNING
    finish(database, cid, status, "3 variant(s) done", {"wall_s": 1.5})
    with database.session_scope() as s:
        campaign = repo.get_campaign(s, cid)
        (event,) = [e for e in repo.events(s, cid) if e.kind in ("finish", "stop")]
    assert campaign.status is status and (campaign.finished_at is not None) is finished
    assert event.kind == kind and event.data == {"wall_s": 1.5}
