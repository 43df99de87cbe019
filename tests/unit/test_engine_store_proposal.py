"""``CampaignRun.store_proposal``: a proposal whose code (comments and layout aside) a variant
of the same campaign has is a duplicate, counted and not stored, and so is one whose compiled
code and declared search are a variant's (real NVRTC compiles); in SQLite."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from db import repository as repo
from db.session import open_database
from r3tui.domain import VariantOrigin, VariantStatus
from r3tui.engine.proposals import ProposalRequest
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
        request = ProposalRequest(index=1, island=0, parent=seed, profile=None, inspirations=())
        # x + 0.0 is not x for x = -0.0: the compiler keeps the add, the code differs
        child_source = SOURCE.text.replace("out[idx] = in[idx];", "out[idx] = in[idx] + 0.0;")
        assert child_source != SOURCE.text

        first = run.store_proposal(request, proposal(child_source))
        assert first is not None and first.status is VariantStatus.PENDING

        # the same source again is counted, not stored: it would say nothing new
        assert run.store_proposal(request, proposal(child_source)) is None
        # the parent's own text is a duplicate of the parent, and so is the child with a
        # comment and a blank line more
        assert run.store_proposal(request, proposal(SOURCE.text)) is None
        commented = child_source.replace("long long sy", "// the row stride\n\n"
                                         "    long long sy")
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
            child_source.replace("c0 * in[idx]", "c0 * (in[idx] + 0.0)")))
        assert longer is not None and longer.status is VariantStatus.PENDING
        other = make_run(database, other_cid)
        other_seed = other.seed_variant()
        elsewhere = other.store_proposal(
            ProposalRequest(index=1, island=0, parent=other_seed, profile=None, inspirations=()),
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
        request = ProposalRequest(index=1, island=0, parent=run.seed_variant(), profile=None,
                           inspirations=())
        source = SOURCE.text.replace("out[idx] = in[idx];", "out[idx] = in[idx] + 0.0;")
        detail = "1 of 2 edit(s); skipped edit 2: its SEARCH text is not in the kernel"
        stored = run.store_proposal(request, replace(proposal(source), detail=detail))
        plain = run.store_proposal(request, proposal(
            source.replace("c0 * in[idx]", "c0 * (in[idx] + 0.0)")))
        assert stored is not None and plain is not None
        with database.session_scope() as s:
            assert (repo.get_variant(s, stored.id) or stored).features["applied"] == detail
            assert "applied" not in (repo.get_variant(s, plain.id) or plain).features
    finally:
        database.close()


def test_a_change_that_compiles_to_the_same_code_is_not_stored(tmp_path: Path) -> None:
    """The corpus's model edits that only added `const` compiled to the original's cubin; such
    a proposal would cost an inner loop to measure the same code again."""
    database = open_database(tmp_path / "r3.sqlite")
    try:
        cid = new_campaign(database)
        run = make_run(database, cid)
        seed = run.seed_variant()
        request = ProposalRequest(index=1, island=0, parent=seed, profile=None, inspirations=())
        const_only = SOURCE.text.replace("long long sy = nx;", "const long long sy = nx;")
        renamed = SOURCE.text.replace("sz", "plane")
        assert run.store_proposal(request, proposal(const_only)) is None
        assert run.store_proposal(request, proposal(renamed)) is None
        assert run.skipped == {"same_code": 2}
        # the same code with a search it did not have (a tunable whose default is the
        # original's) is a new candidate
        declared = ("// r3: tune R3_SPARE 1 2\n#ifndef R3_SPARE\n#define R3_SPARE 1\n#endif\n"
                    + const_only)
        stored = run.store_proposal(request, proposal(declared))
        assert stored is not None and stored.status is VariantStatus.PENDING
        # and code that differs is stored, its code kept with it for a resumed campaign
        changed = run.store_proposal(request, proposal(
            SOURCE.text.replace("out[idx] = in[idx];", "out[idx] = in[idx] + 0.0;")))
        assert changed is not None
        with database.session_scope() as s:
            codes = [v.features.get("code") for v in repo.campaign_variants(s, cid)]
        assert len(codes) == 3 and all(isinstance(c, str) for c in codes)
        assert len(set(codes)) == 3  # the seed's, computed once, and the two children's
        # a campaign resumed in another process reads the codes back and still refuses
        again = make_run(database, cid)
        assert again.store_proposal(request, proposal(renamed)) is None
        assert again.skipped == {"same_code": 1}
    finally:
        database.close()
