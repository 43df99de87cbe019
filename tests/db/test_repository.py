"""Round trips through every repository function on a real, migrated SQLite file."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import exc

from db import repository as repo
from db.figures import SpeedupBasis
from db.session import Database
from r3tui.domain import (
    Campaign,
    CampaignStatus,
    EliteCell,
    LLMCall,
    MeasurementStatus,
    TrialConfig,
    Variant,
    VariantOrigin,
    VariantStatus,
)
from tests.db import factories as f


def test_recordings_round_trip_and_dedupe(database: Database) -> None:
    rec = f.recording()
    with database.session_scope() as s:
        rid = repo.add_recording(s, rec, f.manifest())
        again = repo.add_recording(s, rec, {"other": True})
        other = repo.add_recording(s, f.recording(tag="b"), f.manifest())
    assert again == rid
    assert other != rid
    with database.session_scope() as s:
        got = repo.get_recording(s, rid)
        assert got is not None
        assert got.id == rid
        assert got.sha256 == rec.sha256
        assert got.bundle_path == rec.bundle_path
        assert got.launch == rec.launch
        assert got.created_at is not None and got.created_at.tzinfo is UTC
        assert repo.get_recording_manifest(s, rid) == f.manifest()  # the first one wins
        assert repo.find_recording_by_sha(s, rec.sha256) == got
        assert repo.find_recording_by_sha(s, "0" * 64) is None
        assert repo.get_recording(s, 999) is None
        assert [r.id for r in repo.list_recordings(s)] == [rid, other]


def test_campaign_round_trip_and_status(database: Database) -> None:
    with database.session_scope() as s:
        rid = repo.add_recording(s, f.recording(), f.manifest())
        cid = repo.create_campaign(
            s,
            Campaign(
                name="stencil-h200",
                recording_id=rid,
                seed=42,
                settings={"budget": {"trials": 50}},
                provenance={"gpu": "NVIDIA H200"},
            ),
        )
    with database.session_scope() as s:
        c = repo.get_campaign(s, cid)
        assert c is not None
        assert (c.id, c.name, c.recording_id, c.seed) == (cid, "stencil-h200", rid, 42)
        assert c.settings == {"budget": {"trials": 50}}
        assert c.provenance == {"gpu": "NVIDIA H200"}
        assert c.status is CampaignStatus.CREATED
        assert c.started_at is not None and c.finished_at is None
        assert datetime.now(UTC) - c.started_at < timedelta(minutes=1)
        repo.set_campaign_status(s, cid, CampaignStatus.RUNNING)
    with database.session_scope() as s:
        c = repo.get_campaign(s, cid)
        assert c is not None and c.status is CampaignStatus.RUNNING and c.finished_at is None
        repo.set_campaign_status(s, cid, CampaignStatus.FINISHED, finished=True)
    with database.session_scope() as s:
        c = repo.get_campaign(s, cid)
        assert c is not None and c.status is CampaignStatus.FINISHED
        assert c.finished_at is not None and c.finished_at >= c.started_at
        assert repo.get_campaign(s, 999) is None
        with pytest.raises(KeyError):
            repo.set_campaign_status(s, 999, CampaignStatus.RUNNING)


def test_enum_values_are_stored_as_their_strings(database: Database) -> None:
    with database.session_scope() as s:
        _, cid, vid = f.seed_campaign(s)
        repo.insert_trial(s, cid, vid, f.config(), f.failed(MeasurementStatus.WRONG_RESULT))
    with database.engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT status FROM campaigns").scalar_one() == "created"
        assert conn.exec_driver_sql("SELECT origin, status FROM variants").one() == (
            "seed",
            "pending",
        )
        assert conn.exec_driver_sql("SELECT status FROM trials").scalar_one() == "wrong_result"


def test_variants_tree_children_and_updates(database: Database) -> None:
    with database.session_scope() as s:
        _, cid, seed = f.seed_campaign(s)
        call_id = repo.add_llm_call(s, cid, _llm_call())
        a = repo.add_variant(
            s,
            Variant(
                campaign_id=cid,
                source="// a",
                origin=VariantOrigin.LLM,
                parent_id=seed,
                diff="--- a\n+++ b\n",
                operator="tile-2d",
                island=1,
                features={"regs": 2},
                llm_call_id=call_id,
            ),
        )
        b = repo.add_variant(
            s, Variant(campaign_id=cid, source="// b", origin=VariantOrigin.RULE, parent_id=seed)
        )
        c = repo.add_variant(
            s, Variant(campaign_id=cid, source="// c", origin=VariantOrigin.CROSSOVER, parent_id=a)
        )
        t_seed = repo.insert_trial(s, cid, seed, f.config(), f.ok(100e-6))
        repo.insert_trial(s, cid, a, f.config(), f.ok(90e-6))
        t_a = repo.insert_trial(s, cid, a, f.config(block=256), f.ok(80e-6))
        repo.insert_trial(s, cid, a, f.config(), f.failed())
        repo.update_variant(
            s,
            a,
            status=VariantStatus.IMPROVED,
            best_trial_id=t_a,
            features={"regs": 3, "family": "tiling"},
        )
        repo.update_variant(
            s, b, status=VariantStatus.COMPILE_FAILED, status_reason="identifier undefined"
        )
        repo.update_variant(s, seed, best_trial_id=t_seed)
        repo.update_variant(s, c)  # nothing to change is not an error
        with pytest.raises(KeyError):
            repo.update_variant(s, 999, status=VariantStatus.VERIFIED)

    with database.session_scope() as s:
        va = repo.get_variant(s, a)
        assert va is not None
        assert (va.id, va.campaign_id, va.parent_id, va.source) == (a, cid, seed, "// a")
        assert va.origin is VariantOrigin.LLM and va.status is VariantStatus.IMPROVED
        assert (va.diff, va.operator, va.island, va.llm_call_id) == (
            "--- a\n+++ b\n",
            "tile-2d",
            1,
            call_id,
        )
        assert va.features == {"regs": 3, "family": "tiling"}
        vb = repo.get_variant(s, b)
        assert vb is not None and vb.status_reason == "identifier undefined"
        assert repo.get_variant(s, 999) is None
        assert [v.id for v in repo.children(s, seed)] == [a, b]
        assert [v.id for v in repo.children(s, a)] == [c]
        assert repo.children(s, c) == []
        assert [v.id for v in repo.campaign_variants(s, cid)] == [seed, a, b, c]

        tree = {n.id: n for n in repo.campaign_tree(s, cid)}
    assert list(tree) == [seed, a, b, c]
    assert tree[seed].parent_id is None and tree[seed].origin is VariantOrigin.SEED
    assert tree[seed].best_time_s == pytest.approx(100e-6) and tree[seed].n_trials == 1
    assert tree[a].parent_id == seed and tree[a].operator == "tile-2d" and tree[a].island == 1
    assert tree[a].best_time_s == pytest.approx(80e-6)  # the failed trial does not count
    assert tree[a].best_trial_id == t_a and tree[a].n_trials == 3
    assert tree[a].status is VariantStatus.IMPROVED
    assert tree[b].best_time_s is None and tree[b].n_trials == 0
    assert tree[c].parent_id == a


def test_operator_outcomes_are_the_variants_operators_without_their_sources(
        database: Database) -> None:
    with database.session_scope() as s:
        _, cid, seed = f.seed_campaign(s)
        a = repo.add_variant(s, Variant(cid, "// a", VariantOrigin.RULE, parent_id=seed,
                                        operator="restrict_const"))
        repo.add_variant(s, Variant(cid, "// b", VariantOrigin.LLM, parent_id=a,
                                    operator="fma", status=VariantStatus.IMPROVED))
        repo.add_variant(s, Variant(cid, "// c", VariantOrigin.CROSSOVER, parent_id=a))
        _, other, _ = f.seed_campaign(s, name="c2", tag="b")
        repo.add_variant(s, Variant(other, "// d", VariantOrigin.RULE, operator="unroll"))
        assert repo.operator_outcomes(s, cid) == [
            ("restrict_const", VariantOrigin.RULE, VariantStatus.PENDING),
            ("fma", VariantOrigin.LLM, VariantStatus.IMPROVED),
        ]


def test_trials_round_trip_batch_and_resume(database: Database) -> None:
    with database.session_scope() as s:
        _, cid, seed = f.seed_campaign(s)
        other = repo.add_variant(
            s, Variant(campaign_id=cid, source="// x", origin=VariantOrigin.RULE, parent_id=seed)
        )
        m = f.ok(95e-6)
        single = repo.insert_trial(s, cid, seed, f.config(block=64, unroll=2), m)
        rows = [
            repo.NewTrial(cid, other, f.config(block=32 * (i + 1)), f.ok((120 - i) * 1e-6))
            for i in range(5)
        ] + [(cid, other, f.config(), f.failed(MeasurementStatus.TIMEOUT))]
        ids = repo.insert_trials(s, rows)
        assert repo.insert_trials(s, []) == []
    assert len(ids) == 6 and ids == sorted(ids) and ids[0] > single

    with database.session_scope() as s:
        got = repo.get_trial(s, single)
        assert got is not None
        assert (got.campaign_id, got.variant_id) == (cid, seed)
        assert got.config == f.config(block=64, unroll=2)
        assert got.measurement == m
        assert got.created_at.tzinfo is UTC
        assert repo.get_trial(s, 999_999) is None
        of_other = repo.trials_of_variant(s, other)
        assert [t.id for t in of_other] == ids
        assert [t.config.block.x for t in of_other[:5] if t.config.block] == [32, 64, 96, 128, 160]
        timeout = of_other[-1].measurement
        assert timeout.status is MeasurementStatus.TIMEOUT and timeout.time is None
        assert timeout.compile_log == f.failed().compile_log

        everything = repo.finished_trials(s, cid)
        assert [t.id for t in everything] == [single, *ids]
        assert [t.id for t in repo.finished_trials(s, cid, variant_id=seed)] == [single]
        assert repo.trial_count(s, cid) == 7


def test_best_so_far_series(database: Database) -> None:
    medians = [100e-6, 110e-6, 90e-6, None, 95e-6, 70e-6, 80e-6]
    with database.session_scope() as s:
        _, cid, seed = f.seed_campaign(s)
        _, other_cid, other_seed = f.seed_campaign(s, name="other", tag="b")
        repo.insert_trial(s, other_cid, other_seed, f.config(), f.ok(1e-6))  # other campaign
        ids = [
            repo.insert_trial(s, cid, seed, f.config(), f.ok(t) if t else f.failed())
            for t in medians
        ]
    with database.session_scope() as s:
        series = repo.best_so_far_series(s, cid)
        assert repo.best_so_far_series(s, 999) == []
    ok_ids = [i for i, t in zip(ids, medians, strict=True) if t is not None]
    assert [tid for tid, _, _ in series] == ok_ids
    assert [best for _, best, _ in series] == pytest.approx(
        [100e-6, 100e-6, 90e-6, 90e-6, 70e-6, 70e-6]
    )
    assert all(isinstance(ts, datetime) and ts.tzinfo is UTC for _, _, ts in series)


def test_campaign_summaries(database: Database) -> None:
    with database.session_scope() as s:
        _, c1, seed1 = f.seed_campaign(s, name="first")
        rid2 = repo.add_recording(s, f.recording(name="gemm", tag="z"), f.manifest("gemm"))
        c2 = repo.create_campaign(
            s, Campaign(name="second", recording_id=rid2, seed=1, provenance={"driver": "580"})
        )
        # c1: the original (the seed at the recorded configuration) at 100 us, tuned at 90 us;
        # the verified child at 25 us -> 4x; a failed trial; a pending child at 10 us that
        # cannot be the best (not verified yet).
        child = repo.add_variant(
            s, Variant(campaign_id=c1, source="//", origin=VariantOrigin.LLM, parent_id=seed1)
        )
        repo.update_variant(s, child, status=VariantStatus.VERIFIED)
        pending = repo.add_variant(
            s, Variant(campaign_id=c1, source="//", origin=VariantOrigin.RULE, parent_id=seed1)
        )
        repo.insert_trial(s, c1, seed1, TrialConfig(), f.ok(100e-6))
        repo.insert_trial(s, c1, seed1, f.config(), f.ok(90e-6))
        repo.insert_trial(s, c1, child, f.config(), f.ok(25e-6))
        repo.insert_trial(s, c1, child, f.config(), f.failed())
        repo.insert_trial(s, c1, pending, f.config(), f.ok(10e-6))
        repo.set_campaign_status(s, c1, CampaignStatus.RUNNING)

    statements: list[str] = []

    from sqlalchemy import event

    def count(*args: object) -> None:
        statements.append(str(args[2]))

    event.listen(database.engine, "before_cursor_execute", count)
    try:
        with database.session_scope() as s:
            summaries = repo.list_campaign_summaries(s)
    finally:
        event.remove(database.engine, "before_cursor_execute", count)
    selects = [q for q in statements if q.lstrip().upper().startswith("SELECT")]
    # a fixed number of grouped queries (the list and db.figures' parts), not N+1
    assert len(selects) == 6, selects

    first, second = summaries
    assert (first.id, first.name, first.kernel_name, first.gpu) == (
        c1,
        "first",
        "stencil",
        "NVIDIA H200",
    )
    assert first.status is CampaignStatus.RUNNING
    assert (first.n_variants, first.n_trials) == (3, 5)
    assert first.best_time_s == pytest.approx(25e-6)
    assert first.original_s == pytest.approx(100e-6)
    assert first.best_speedup is not None
    assert first.best_speedup.value == pytest.approx(4.0)
    assert first.best_speedup.basis is SpeedupBasis.BEST_TRIAL
    assert first.figures.best_speedup_text == "4.00× best trial"
    assert first.started_at.tzinfo is UTC
    assert (second.id, second.kernel_name, second.gpu) == (c2, "gemm", None)
    assert (second.n_variants, second.n_trials, second.best_speedup) == (0, 0, None)


def _llm_call(prompt: str = "Rewrite the kernel with 2-D tiling.") -> LLMCall:
    return LLMCall(
        model_path="/models/SmolLM2-135M-Instruct-Q4_1.gguf",
        model_sha256=f.sha("model"),
        prompt=prompt,
        response="```cuda\n__global__ void k() {}\n```",
        sampling={"temperature": 0.7, "top_p": 0.95, "max_tokens": 512, "grammar": "cuda_block"},
        seed=1234,
        tokens_in=812,
        tokens_out=96,
        latency_s=1.93,
        backend="llama_cpp",
    )


def test_llm_calls_round_trip(database: Database) -> None:
    with database.session_scope() as s:
        _, cid, _ = f.seed_campaign(s)
        first = repo.add_llm_call(s, cid, _llm_call())
        second = repo.add_llm_call(s, cid, _llm_call("Unroll the inner loop."))
    with database.session_scope() as s:
        assert repo.get_llm_call(s, first) == _llm_call()
        assert repo.get_llm_call(s, 999) is None
        calls = repo.campaign_llm_calls(s, cid)
    assert [i for i, _ in calls] == [first, second]
    assert calls[1][1].prompt == "Unroll the inner loop."


def test_elites_upsert(database: Database) -> None:
    with database.session_scope() as s:
        _, cid, seed = f.seed_campaign(s)
        better = repo.add_variant(
            s, Variant(campaign_id=cid, source="//", origin=VariantOrigin.LLM, parent_id=seed)
        )
        repo.upsert_elite(s, EliteCell(cid, 0, "regs=2|smem=0", seed, 100e-6))
        repo.upsert_elite(s, EliteCell(cid, 1, "regs=2|smem=0", seed, 100e-6))
        repo.upsert_elite(s, EliteCell(cid, 0, "regs=1|smem=1", seed, 120e-6))
    with database.session_scope() as s:
        repo.upsert_elite(s, EliteCell(cid, 0, "regs=2|smem=0", better, 60e-6))
    with database.session_scope() as s:
        cells = repo.elites(s, cid)
        assert repo.elites(s, 999) == []
    assert cells == [
        EliteCell(cid, 0, "regs=1|smem=1", seed, 120e-6),
        EliteCell(cid, 0, "regs=2|smem=0", better, 60e-6),
        EliteCell(cid, 1, "regs=2|smem=0", seed, 100e-6),
    ]
    with database.engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM elite_cells").scalar_one() == 3


def test_events_paging(database: Database) -> None:
    with database.session_scope() as s:
        _, cid, _ = f.seed_campaign(s)
        _, other, _ = f.seed_campaign(s, name="other", tag="b")
        first = repo.add_event(s, cid, "campaign.start", "started", {"budget": 100})
        repo.add_event(s, other, "campaign.start", "elsewhere")
        ids = [repo.add_event(s, cid, "trial", f"trial {i}") for i in range(5)]
    with database.session_scope() as s:
        all_events = repo.events(s, cid)
        assert [e.id for e in all_events] == [first, *ids]
        assert all_events[0].data == {"budget": 100} and all_events[1].data is None
        assert all_events[0].kind == "campaign.start" and all_events[0].message == "started"
        assert all_events[0].created_at.tzinfo is UTC
        page = repo.events(s, cid, after_id=ids[1], limit=2)
        assert [e.id for e in page] == ids[2:4]
        assert repo.events(s, cid, after_id=ids[-1]) == []
    with database.engine.connect() as conn:
        # data=None is SQL NULL, not the JSON text 'null'.
        nulls = conn.exec_driver_sql("SELECT count(*) FROM events WHERE data IS NULL")
        assert nulls.scalar_one() == 6


def test_foreign_keys_are_enforced(database: Database) -> None:
    with pytest.raises(exc.IntegrityError), database.session_scope() as s:
        _, cid, _ = f.seed_campaign(s)
        repo.insert_trial(s, cid, 12345, f.config(), f.ok(1e-4))
    with database.session_scope() as s:
        assert repo.list_recordings(s) == []  # the whole scope rolled back


def test_deleting_a_campaign_cascades(database: Database) -> None:
    with database.session_scope() as s:
        _, cid, seed = f.seed_campaign(s)
        t = repo.insert_trial(s, cid, seed, f.config(), f.ok(1e-4))
        repo.update_variant(s, seed, best_trial_id=t)
        repo.add_event(s, cid, "x", "y")
        repo.upsert_elite(s, EliteCell(cid, 0, "k", seed, 1e-4))
        repo.add_llm_call(s, cid, _llm_call())
    with database.engine.begin() as conn:
        conn.exec_driver_sql("DELETE FROM campaigns")
    with database.engine.connect() as conn:
        for table in ("variants", "trials", "events", "elite_cells", "llm_calls"):
            assert conn.exec_driver_sql(f"SELECT count(*) FROM {table}").scalar_one() == 0
        assert conn.exec_driver_sql("SELECT count(*) FROM recordings").scalar_one() == 1


def test_table_counts(database: Database) -> None:
    with database.session_scope() as s:
        _, cid, seed = f.seed_campaign(s)
        repo.insert_trials(s, [(cid, seed, f.config(), f.ok(1e-4))] * 3)
    with database.session_scope() as s:
        counts = repo.table_counts(s)
    assert counts["recordings"] == counts["campaigns"] == counts["variants"] == 1
    assert counts["trials"] == 3 and counts["events"] == 0
    assert len(counts) == 7


def test_data_version_changes_on_commit_elsewhere(database: Database) -> None:
    from db.session import open_database

    reader = open_database(database.path, readonly=True)
    try:
        before = reader.data_version()
        assert reader.data_version() == before  # nothing committed in between
        with database.session_scope() as s:
            f.seed_campaign(s)
        assert reader.data_version() != before
        with reader.session_scope() as s:
            assert isinstance(repo.data_version(s), int)
    finally:
        reader.close()


def test_the_gpu_is_named_alike_from_either_form_of_provenance(database: Database) -> None:
    from r3tui.engine.report import build_report, render

    assert repo.gpu_name({"gpu": "NVIDIA H200"}) == repo.gpu_name(
        {"gpu": {"name": "NVIDIA H200", "arch": "sm_90"}}) == "NVIDIA H200"
    assert repo.gpu_name(None) is None and repo.gpu_name({"gpu": None}) is None
    with database.session_scope() as s:
        _, cid, _ = f.seed_campaign(s)
        repo.set_campaign_provenance(s, cid, {"gpu": {"name": "NVIDIA H200", "arch": "sm_90"}})
        report = build_report(s, cid)
    assert report.gpu == "NVIDIA H200"
    assert "GPU NVIDIA H200" in "\n".join(render(report)) and "'name'" not in str(render(report))
