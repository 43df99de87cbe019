"""One writer process and two reader processes on one file, as the engine and the TUI."""

from __future__ import annotations

import multiprocessing
import queue
from pathlib import Path
from typing import Any

import pytest

from db import repository as repo
from db.session import open_database
from tests.db import factories as f
from tests.db import workers

N_TRIALS = 20_000
BATCH = 250


@pytest.mark.slow
def test_writer_and_two_readers(db_path: Path) -> None:
    with open_database(db_path) as db, db.session_scope() as s:
        _, cid, seed = f.seed_campaign(s)

    ctx = multiprocessing.get_context("spawn")
    results: Any = ctx.Queue()
    go, stop = ctx.Event(), ctx.Event()
    ready = [ctx.Event(), ctx.Event()]
    readers = [
        ctx.Process(target=workers.tree_reader, args=(str(db_path), cid, BATCH, r, stop, results))
        for r in ready
    ]
    writer = ctx.Process(
        target=workers.trial_writer, args=(str(db_path), cid, seed, N_TRIALS, BATCH, go, results)
    )
    processes = [*readers, writer]
    for p in processes:
        p.start()
    try:
        for r in ready:
            assert r.wait(60), "a reader did not start"
        go.set()
        writer_result = results.get(timeout=120)
        stop.set()
        reader_results = [results.get(timeout=60) for _ in readers]
    except queue.Empty:
        pytest.fail("a worker process did not report back")
    finally:
        stop.set()
        for p in processes:
            p.join(30)
            if p.is_alive():
                p.kill()

    assert writer_result[:2] == ("writer", "done"), writer_result
    print(
        f"writer: {N_TRIALS} trials in {writer_result[2]:.2f} s;",
        "reader snapshots:",
        [len(r[1]) for r in reader_results],
    )
    for _, counts, problems, error in reader_results:
        assert error is None, error  # e.g. "database is locked"
        assert problems == []
        assert counts == sorted(counts)
        assert counts[-1] == N_TRIALS
        # The reader really ran while the writer wrote, not just before and after.
        assert any(0 < n < N_TRIALS for n in counts), counts

    with open_database(db_path, readonly=True) as db, db.session_scope() as s:
        assert repo.trial_count(s, cid) == N_TRIALS
        assert len(repo.best_so_far_series(s, cid)) == workers.expected_ok(N_TRIALS // BATCH, BATCH)
