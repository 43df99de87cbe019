"""The runner's load reaches the TUI's status line through the database: the engine samples
it while a run goes on (r3tui.engine.gpu.report_load) into ``campaigns.workers``, the status
line reads it from the campaign's header, and the end of the run clears it.  A real SQLite
file, the real local runner and compile pool; the simulated replayer (a named fake) stands in
for the GPU."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path

from db import repository as repo
from db.browse import campaign_header
from db.session import open_database
from r3tui.compile.pool import CompilePool
from r3tui.domain import CampaignStatus
from r3tui.engine.gpu import report_load
from r3tui.replay.candidate import Candidate
from r3tui.runners import LocalRunner, ReplayJob
from r3tui.runners.simulated import SimulatedReplayer
from r3tui.search.simulation import parse_space_file
from r3tui.ui.widgets.status_bar import status_line
from tests.db import factories as f

REPO = Path(__file__).resolve().parents[2]


def test_the_status_line_shows_the_runners_load_while_the_run_goes_on(tmp_path: Path) -> None:
    from db.series import campaign_stats

    table = parse_space_file(json.loads(
        (REPO / "tests" / "data" / "spaces" / "stencil7.json").read_text())).table
    database = open_database(tmp_path / "r3.sqlite", create=True, upgrade=True)
    with database.session_scope() as s:
        _, cid, _ = f.seed_campaign(s)
        repo.set_campaign_status(s, cid, CampaignStatus.RUNNING)
    runner = LocalRunner([SimulatedReplayer(table, replay_s=0.3)], CompilePool(workers=1))
    job = ReplayJob(Candidate(b"cubin", "k"), next(iter(table)))
    seen = None
    with runner, report_load(database, cid, runner, every_s=0.05):
        futures = [runner.replay(job) for _ in range(4)]
        deadline = time.monotonic() + 10
        while seen is None and time.monotonic() < deadline:
            time.sleep(0.05)
            with database.session_scope() as s:
                header = campaign_header(s, cid)
                assert header is not None
                if header.workers and header.workers["queued"]["gpu"]:
                    seen = status_line(header, campaign_stats(s, cid),
                                       datetime.now(UTC)).plain
        for future in futures:
            assert future.result().ok
    assert seen is not None and "local: gpu 1/1 busy, " in seen and " queued · cpu 0/1 busy" in seen
    with database.session_scope() as s:
        header = campaign_header(s, cid)
        assert header is not None and header.workers is None  # the run is over
        (event,) = [e for e in repo.events(s, cid) if e.kind == "runner"]
        assert event.message == "local runner: 0 compiles, 4 replays"
    database.close()
