"""kill -9 of a writer mid-batch: the file stays sound and keeps exactly what was committed."""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
from multiprocessing.connection import Connection
from pathlib import Path

import pytest

from db.session import open_database
from tests.db import factories as f
from tests.db import workers

BATCH = 2_000


def _setup(db_path: Path) -> tuple[int, int]:
    with open_database(db_path) as db, db.session_scope() as s:
        _, cid, seed = f.seed_campaign(s)
    return cid, seed


def _after_crash(db_path: Path, committed: list[tuple[int, int]]) -> list[int]:
    """Open like the next `r3 run` would; check integrity; return the trial ids present."""
    with open_database(db_path) as db, db.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA integrity_check").scalar_one() == "ok"
        assert conn.exec_driver_sql("PRAGMA foreign_key_check").fetchall() == []
        ids = [row[0] for row in conn.exec_driver_sql("SELECT id FROM trials ORDER BY id")]
    present = set(ids)
    for first, last in committed:
        assert set(range(first, last + 1)) <= present, f"committed batch {first}..{last} lost"
    assert len(ids) % BATCH == 0, f"a partial batch survived: {len(ids)} trials"
    return ids


def _start(
    db_path: Path, cid: int, seed: int, hang_at: int | None
) -> tuple[multiprocessing.process.BaseProcess, Connection]:
    ctx = multiprocessing.get_context("spawn")
    ours, theirs = ctx.Pipe(duplex=False)
    process = ctx.Process(
        target=workers.crash_writer, args=(str(db_path), cid, seed, BATCH, hang_at, theirs)
    )
    process.start()
    theirs.close()
    return process, ours


def _kill(process: multiprocessing.process.BaseProcess) -> None:
    assert process.pid is not None
    os.kill(process.pid, signal.SIGKILL)
    process.join(10)
    assert process.exitcode == -signal.SIGKILL


@pytest.mark.slow
def test_sigkill_inside_an_open_batch(db_path: Path) -> None:
    cid, seed = _setup(db_path)
    process, report = _start(db_path, cid, seed, hang_at=3)
    committed: list[tuple[int, int]] = []
    try:
        while True:
            assert report.poll(60), "the writer went quiet"
            kind, _k, first, last = report.recv()
            if kind == "in-flight":
                in_flight = (first, last)
                break
            committed.append((first, last))
        _kill(process)
    finally:
        if process.is_alive():
            process.kill()
    ids = _after_crash(db_path, committed)
    assert len(ids) == 3 * BATCH
    assert not set(range(in_flight[0], in_flight[1] + 1)) & set(ids)


@pytest.mark.slow
def test_sigkill_at_random_moments(db_path: Path) -> None:
    cid, seed = _setup(db_path)
    rng = random.Random(3)
    committed: list[tuple[int, int]] = []
    for _round in range(3):
        process, report = _start(db_path, cid, seed, hang_at=None)
        try:
            for _ in range(rng.randint(1, 3)):
                assert report.poll(60), "the writer went quiet"
                committed.append(report.recv()[2:])
            # Somewhere in the next batch, or in the commit, or just after it.
            report.poll(rng.uniform(0.0, 0.05))
            _kill(process)
        finally:
            if process.is_alive():
                process.kill()
        try:
            while report.poll(0):  # commits reported before the kill landed
                committed.append(report.recv()[2:])
        except EOFError:  # the dead writer's end of the pipe is closed
            pass
        ids = _after_crash(db_path, committed)
        # At most one batch committed whose report the kill cut off.
        assert sum(last - first + 1 for first, last in committed) in (len(ids), len(ids) - BATCH)
