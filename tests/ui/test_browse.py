"""The read-only queries of db/browse.py against generated databases."""

from __future__ import annotations

import dataclasses
import itertools
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from db import browse, series
from db.session import Database, open_database
from r3tui.domain import CampaignStatus, VariantStatus
from tests.ui.factories import CampaignSpec, add_live_variant, build_database


@pytest.fixture
def db(standard_db: Path) -> Iterator[Database]:
    database = open_database(standard_db, readonly=True)
    yield database
    database.close()


def _sql(path: Path, query: str, *args: object) -> list[tuple[Any, ...]]:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as c:
        return c.execute(query, args).fetchall()


def test_pages_cover_every_child_once(db: Database, standard_db: Path) -> None:
    parent = _sql(
        standard_db,
        "select parent_id from variants where campaign_id=1 and parent_id is not "
        "null group by parent_id order by count(*) desc limit 1",
    )[0][0]
    expected = [
        r[0]
        for r in _sql(standard_db, "select id from variants where parent_id=? order by id", parent)
    ]
    seen: list[int] = []
    after = 0
    with db.session_scope() as s:
        while True:
            page = browse.child_page(s, 1, parent, after_id=after, limit=2)
            seen += [n.id for n in page.nodes]
            assert page.remaining == len(expected) - len(seen)
            if not page.remaining:
                break
            after = page.nodes[-1].id
    assert seen == expected


def test_node_stats_match_the_trials(db: Database, standard_db: Path) -> None:
    with db.session_scope() as s:
        page = browse.child_page(s, 1, 1)
    for node in page.nodes:
        n, best = _sql(
            standard_db,
            "select count(*), min(case when status='ok' then "
            "median_s end) from trials where variant_id=?",
            node.id,
        )[0]
        kids = _sql(standard_db, "select count(*) from variants where parent_id=?", node.id)[0][0]
        assert (node.n_trials, node.best_time_s, node.n_children) == (n, best, kids)


def test_through_id_extends_the_page_to_reach_a_child(db: Database, standard_db: Path) -> None:
    kids = [
        r[0] for r in _sql(standard_db, "select id from variants where parent_id=1 order by id")
    ]
    with db.session_scope() as s:
        page = browse.child_page(s, 1, 1, limit=1, through_id=kids[-1])
    assert kids[-1] in [n.id for n in page.nodes]


def test_ancestry_and_best(db: Database, standard_db: Path) -> None:
    best = _sql(
        standard_db,
        "select variant_id from trials where campaign_id=1 "
        "and status='ok' order by median_s limit 1",
    )[0][0]
    with db.session_scope() as s:
        assert browse.best_variant(s, 1) == best
        path = browse.ancestry(s, best)
    assert path[-1] == best and path[0] == 1
    parents = dict(_sql(standard_db, "select id, parent_id from variants"))
    assert all(parents[child] == parent for parent, child in itertools.pairwise(path))


def test_filter_keeps_ancestors_of_matches(db: Database, standard_db: Path) -> None:
    flt = browse.VariantFilter(statuses=frozenset({VariantStatus.CRASHED}))
    crashed = {
        r[0]
        for r in _sql(
            standard_db, "select id from variants where campaign_id=1 and status='crashed'"
        )
    }
    with db.session_scope() as s:
        roots = browse.child_page(s, 1, None, flt=flt)
        assert [n.id for n in roots.nodes] == ([1] if crashed else [])
        shown: set[int] = set()
        frontier = [1] if crashed else []
        while frontier:
            page = browse.child_page(s, 1, frontier.pop(), flt=flt)
            shown |= {n.id for n in page.nodes}
            frontier += [n.id for n in page.nodes if n.n_children]
    assert crashed <= shown
    parents = dict(_sql(standard_db, "select id, parent_id from variants"))
    for vid in shown - crashed:  # every other line leads to a crashed variant
        assert any(_is_ancestor(parents, c, vid) for c in crashed)


def _is_ancestor(parents: dict[int, int | None], vid: int, candidate: int) -> bool:
    current: int | None = parents[vid]
    while current is not None:
        if current == candidate:
            return True
        current = parents[current]
    return False


def test_trial_page_sorts_in_sql(db: Database, standard_db: Path) -> None:
    vid = _sql(
        standard_db,
        "select variant_id from trials where campaign_id=1 group "
        "by variant_id order by count(*) desc limit 1",
    )[0][0]
    with db.session_scope() as s:
        page = series.trial_page(s, vid, sort=series.TrialSort.TIME, descending=True)
    times = [t.measurement.time.median_s for t in page.rows if t.measurement.time]
    assert times == sorted(times, reverse=True) and page.total == len(page.rows)


def test_incremental_series_and_totals_equal_a_full_recount(tmp_path: Path) -> None:
    path = build_database(
        tmp_path / "r3.sqlite",
        (CampaignSpec(n_variants=20, n_trials=150, status=CampaignStatus.RUNNING),),
    )
    writer = open_database(path)
    reader = open_database(path, readonly=True)
    try:
        with reader.session_scope() as s:
            curve = series.convergence(s, 1)
            stats = series.campaign_stats(s, 1)
            header = browse.campaign_header(s, 1)
        assert header is not None
        new = [add_live_variant(writer, 1, 1, k, time_s=40e-6 - k * 1e-6) for k in range(3)]
        with reader.session_scope() as s:
            curve = series.convergence(s, 1, since=curve)
            stats = series.campaign_stats(s, 1, since=stats)
            changes = browse.tree_changes(
                s, 1, after_variant_id=header.last_variant_id, after_trial_id=header.last_trial_id
            )
            full_series = series.convergence(s, 1)
            full_stats = series.campaign_stats(s, 1)
        assert curve == full_series
        assert dataclasses.asdict(stats) == pytest.approx(dataclasses.asdict(full_stats))
        assert [n.id for n in changes.new_nodes] == new
        assert curve.best_s == pytest.approx(38e-6)
        bests = [p.best_s for p in curve.points]
        assert bests == sorted(bests, reverse=True)
        total = _sql(path, "select count(*) from trials where campaign_id=1")[0][0]
        assert curve.n_evaluations == total == stats.n_trials
    finally:
        writer.close()
        reader.close()
