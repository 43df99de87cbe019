"""Process entry points for the concurrency and crash tests (importable for spawn)."""

from __future__ import annotations

import itertools
import random
import time
import traceback
from multiprocessing.connection import Connection
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from typing import Any

from sqlalchemy import text

from db import repository as repo
from db.session import open_database
from r3tui.domain import Variant, VariantOrigin
from tests.db import factories as f

FAIL_EVERY = 5  # trial j of each batch fails when j % FAIL_EVERY == 0
NEW_VARIANT_EVERY = 10  # batches


def expected_variants(n_batches: int) -> int:
    """The seed plus one variant added with batch 0, 10, 20, ..."""
    return 1 + (n_batches + NEW_VARIANT_EVERY - 1) // NEW_VARIANT_EVERY


def expected_ok(n_batches: int, batch: int) -> int:
    return n_batches * (batch - (batch + FAIL_EVERY - 1) // FAIL_EVERY)


def trial_writer(
    path: str,
    campaign_id: int,
    seed_id: int,
    n_trials: int,
    batch: int,
    go: Event,
    results: Queue[Any],
) -> None:
    """Insert ``n_trials`` trials, ``batch`` per transaction, plus a variant now and then."""
    try:
        go.wait(60)
        db = open_database(path)
        rng = random.Random(1)
        variants = [seed_id]
        start = time.monotonic()
        for k in range(n_trials // batch):
            with db.session_scope() as s:
                if k % NEW_VARIANT_EVERY == 0:
                    variants.append(
                        repo.add_variant(
                            s,
                            Variant(
                                campaign_id=campaign_id,
                                source=f"// v{k}",
                                origin=VariantOrigin.RULE,
                                parent_id=rng.choice(variants),
                                operator="unroll",
                            ),
                        )
                    )
                rows = [
                    repo.NewTrial(
                        campaign_id,
                        rng.choice(variants),
                        f.config(block=32 * (1 + j % 8)),
                        f.failed() if j % FAIL_EVERY == 0 else f.ok(rng.uniform(50e-6, 150e-6)),
                    )
                    for j in range(batch)
                ]
                repo.insert_trials(s, rows)
            time.sleep(0.002)  # leave the readers room to interleave
        db.close()
        results.put(("writer", "done", time.monotonic() - start))
    except BaseException:  # reported to the parent
        results.put(("writer", "error", traceback.format_exc()))


def tree_reader(
    path: str,
    campaign_id: int,
    batch: int,
    ready: Event,
    stop: Event,
    results: Queue[Any],
) -> None:
    """Poll the tree and the best-so-far series; check every snapshot is a whole prefix."""
    problems: list[str] = []
    counts: list[int] = []
    try:
        db = open_database(path, readonly=True)
        ready.set()
        while True:
            finished = stop.is_set()  # read before the snapshot: the last one sees it all
            with db.session_scope() as s:
                tree = repo.campaign_tree(s, campaign_id)
                series = repo.best_so_far_series(s, campaign_id)
            n = sum(node.n_trials for node in tree)
            n_batches = n // batch
            if n % batch:
                problems.append(f"partial batch visible: {n} trials")
            if counts and n < counts[-1]:
                problems.append(f"trial count went back from {counts[-1]} to {n}")
            if len(series) != expected_ok(n_batches, batch):
                problems.append(f"{len(series)} ok trials in the series for {n} trials")
            if len(tree) != (expected_variants(n_batches) if n else 1):
                problems.append(f"{len(tree)} variants for {n} trials")
            bests = [best for _, best, _ in series]
            if any(b > a for a, b in itertools.pairwise(bests)):
                problems.append("best-so-far series went up")
            ids = [tid for tid, _, _ in series]
            if ids != sorted(ids):
                problems.append("series not in trial order")
            counts.append(n)
            if finished:
                break
            time.sleep(0.1)  # a TUI polls a few times a second; it does not spin
        db.close()
        results.put(("reader", counts, problems[:10], None))
    except BaseException:  # reported to the parent
        results.put(("reader", counts, problems[:10], traceback.format_exc()))


def crash_writer(
    path: str,
    campaign_id: int,
    variant_id: int,
    batch: int,
    hang_at: int | None,
    report: Connection,
) -> None:
    """Commit batches and report each commit; at batch ``hang_at`` stop before committing.

    A tiny page cache makes SQLite spill the open transaction's pages into the WAL before
    it commits, so the kill leaves uncommitted frames behind for recovery to discard.
    """
    db = open_database(path)
    k = 0
    while True:
        with db.session_scope() as s:
            s.execute(text("PRAGMA cache_size = 20"))
            ids = repo.insert_trials(
                s, [repo.NewTrial(campaign_id, variant_id, f.config(), f.ok(1e-4))] * batch
            )
            if k == hang_at:
                report.send(("in-flight", k, ids[0], ids[-1]))
                time.sleep(120)  # killed here, inside the open transaction
        # Sent only after commit returned: every id reported here must survive the kill.
        report.send(("committed", k, ids[0], ids[-1]))
        k += 1
