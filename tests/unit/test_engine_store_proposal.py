"""``CampaignRun.store_proposal``: a proposal whose code (comments and layout aside) a variant
of the same campaign has is a duplicate, counted and not stored; in SQLite."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from db import repository as repo
from db.session import open_database
from r3tui.domain import VariantOrigin, VariantStatus
from r3tui.engine.campaign import _Request
from r3tui.remix.catalogue import transformation
from r3tui.remix.mutation import Proposal
from tests.unit.test_engine_campaign import SOURCE, make_run, new_campaign

RESTRICT = transformation("restrict_const")


def proposal(source: str | None, *, ok: bool = True) -> Proposal:
    return Proposal(
        source=source,
        origin=VariantOrigin.RULE,
        operator=RESTRICT.name,
        transformation=RESTRICT,
        llm_call=None,
        ok=ok,
        reason=None if ok else "no match",
        diff="--- a\n+++ b\n" if ok else None,
    )


def test_a_source_already_in_the_campaign_is_a_duplicate_and_only_in_that_campaign(
    tmp_path: Path,
) -> None:
    database = open_database(tmp_path / "r3.sqlite")
    try:
        cid = new_campaign(database)
        other_cid = new_campaign(database)
        run = make_run(database, cid)
        seed = run.seed_variant()
        request = _Request(index=1, island=0, parent=seed, profile=None, inspirations=())
        child_source = SOURCE.text.replace("long long sy = nx;", "const long long sy = nx;")
        assert child_source != SOURCE.text

        first = run.store_proposal(request, proposal(child_source))
        assert first is not None and first.status is VariantStatus.PENDING

        # the same source again is counted, not stored: it would say nothing new
        assert run.store_proposal(request, proposal(child_source)) is None
        # the parent's own text is a duplicate of the parent, and so is the child with a
        # comment and a blank line more
        assert run.store_proposal(request, proposal(SOURCE.text)) is None
        commented = child_source.replace("const long long sy", "// the row stride\n\n"
                                         "    const long long sy")
        assert run.store_proposal(request, proposal(commented)) is None
        assert run.skipped == {"duplicate": 3}

        # a rule that does not apply is counted as declined, never a node of the tree
        assert run.store_proposal(request, proposal(None, ok=False)) is None
        assert run.skipped == {"duplicate": 3, "declined": 1}
        run.record_skipped()
        with database.session_scope() as s:
            (event,) = [e for e in repo.events(s, cid) if e.kind == "skipped"]
            assert event.data is not None and event.data["counts"] == {
                "duplicate": 3, "declined": 1}
            assert len(repo.campaign_variants(s, cid)) == 2  # the seed and the first child
        assert run.skipped == {}

        # another change of the code is a different source; another campaign's rows do not
        # count
        longer = run.store_proposal(request, proposal(
            child_source.replace("long long sz", "const long long sz")))
        assert longer is not None and longer.status is VariantStatus.PENDING
        other = make_run(database, other_cid)
        other_seed = other.seed_variant()
        elsewhere = other.store_proposal(
            _Request(index=1, island=0, parent=other_seed, profile=None, inspirations=()),
            proposal(child_source),
        )
        assert elsewhere is not None and elsewhere.status is VariantStatus.PENDING

        with database.session_scope() as s:
            assert repo.variant_sources_after(s, cid, seed.id or 0) == [
                (first.id, child_source), (longer.id, longer.source)]
            assert repo.variant_sources_after(s, cid, longer.id or 0) == []
            assert (elsewhere.id, child_source) in repo.variant_sources_after(s, other_cid, 0)
    finally:
        database.close()


def test_how_a_proposal_was_made_is_stored_with_the_variant(tmp_path: Path) -> None:
    database = open_database(tmp_path / "r3.sqlite")
    try:
        run = make_run(database, new_campaign(database))
        request = _Request(index=1, island=0, parent=run.seed_variant(), profile=None,
                           inspirations=())
        source = SOURCE.text.replace("long long sy = nx;", "const long long sy = nx;")
        detail = "1 of 2 edit(s); skipped edit 2: its SEARCH text is not in the kernel"
        stored = run.store_proposal(request, replace(proposal(source), detail=detail))
        plain = run.store_proposal(request, proposal(
            source.replace("long long sz", "const long long sz")))
        assert stored is not None and plain is not None
        with database.session_scope() as s:
            assert (repo.get_variant(s, stored.id) or stored).features["applied"] == detail
            assert "applied" not in (repo.get_variant(s, plain.id) or plain).features
    finally:
        database.close()
