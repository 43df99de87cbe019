"""``r3 tune --replay-llm CAMPAIGN``: re-run a campaign from its recorded LLM answers.

The re-run is a new campaign in the same database.  It makes the recorded proposals again, in
their recorded order, from the same parents and inspirations with the same random draws; the
LLM's answers come from the recorded calls (no model is loaded) and must be asked for by the
very same prompt, so every child's source is re-derived, not copied.  Every variant is then
evaluated afresh on this GPU: the re-run reproduces the tree exactly and measures it again.

With ``generate_only`` (``--replay-llm N --generate-only``) no GPU is touched: the tree is
re-made and checked the same way, and its variants stay pending for ``r3 evaluate`` — the
re-run a machine without a GPU can make (the shipped demo's LLM campaign, for one).
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path

from r3tui.domain import VariantOrigin, VariantStatus
from r3tui.engine.campaign import CampaignRun, CampaignSettings, Progress
from r3tui.engine.control import CampaignControl
from r3tui.engine.gpu import RunnerSettings
from r3tui.engine.tune import CampaignOutcome


def replay_tree(run: CampaignRun, old_campaign_id: int, evaluate: bool = True) -> int:
    """Re-make the old campaign's proposals in ``run`` and evaluate them (``evaluate``; else
    they stay pending); returns how many."""
    from db import repository as repo
    from r3tui.remix.recorded import ReplayDiverged

    with run.database.session_scope() as s:
        old = repo.campaign_variants(s, old_campaign_id)
    seed = run.seed_variant()
    if evaluate and seed.status is VariantStatus.PENDING:
        run.evaluate(seed)
    mapping = {v.id: seed for v in old if v.origin is VariantOrigin.SEED}
    made = 0
    for ov in old:
        if ov.origin is VariantOrigin.SEED or run.control.stop_requested:
            continue
        assert ov.id is not None and ov.parent_id is not None
        parent = mapping.get(ov.parent_id)
        if parent is None:
            raise ReplayDiverged(f"variant {ov.id}'s parent {ov.parent_id} was not re-made")
        request = run.request_for(
            int(ov.features.get("index", made)),
            ov.island,
            ov.parent_id,
            [int(i) for i in ov.features.get("inspirations", [])],
            as_parent=parent,
            as_of_call=ov.llm_call_id,  # shown what that call was shown, not what came later
        )
        # asked as it was: with the bandit's order then (none before it existed) and, for a
        # repair turn, the failure it fixed
        preference = ov.features.get("preference")
        request = replace(request, preference=tuple(preference) if preference else None,
                          repair=ov.features.get("repair"),
                          repair_example=ov.features.get("repair_example"),
                          # recorded since session 37; before, the examples were as written
                          example_names=ov.features.get("example_names", "as_written"))
        proposal, _ = run.generate_proposal(request)
        variant = run.store_proposal(request, proposal)
        failed = VariantStatus.APPLY_FAILED
        if variant is None or variant.source != ov.source or (
                (variant.status is failed) != (ov.status is failed)):
            raise ReplayDiverged(
                f"variant {ov.id} ({ov.origin.value}:{ov.operator}) came out differently "
                f"from its recorded answer ("
                + ("not stored)" if variant is None else f"re-made as variant {variant.id})")
            )
        mapping[ov.id] = variant
        made += 1
        if evaluate and variant.status is VariantStatus.PENDING:
            run.evaluate(variant)
    return made


def replay_campaign(
    db_path: Path,
    old_campaign_id: int,
    bundle_path: Path | None = None,
    progress: Progress | None = None,
    *,
    control: CampaignControl | None = None,
    runner_settings: RunnerSettings | None = None,
    generate_only: bool = False,
) -> CampaignOutcome:
    from db import repository as repo
    from db.session import open_database
    from r3tui.domain import Campaign, CampaignStatus
    from r3tui.engine.gpu import open_runner, report_load
    from r3tui.engine.inner import device_limits, provenance
    from r3tui.engine.lifecycle import campaign_run, finish
    from r3tui.engine.tune import make_mutator_from
    from r3tui.engine.unit_source import searched_launch, seed_unit
    from r3tui.errors import R3Error
    from r3tui.record.bundle import Bundle
    from r3tui.remix.recorded import RecordedBackend

    control = control or CampaignControl()
    database = open_database(db_path, create=False, upgrade=True)
    try:
        with database.session_scope() as s:
            old = repo.get_campaign(s, old_campaign_id)
            if old is None:
                raise R3Error(f"no campaign {old_campaign_id} in {db_path}")
            if old.settings.get("mode") != "remix":
                raise R3Error(f"campaign {old_campaign_id} made no proposals to re-run")
            recording = repo.get_recording(s, old.recording_id)
            assert recording is not None
            calls = [c for _, c in repo.campaign_llm_calls(s, old_campaign_id)]
            settings = CampaignSettings.from_json(dict(old.settings))
            new_id = repo.create_campaign(
                s,
                Campaign(
                    name=f"{old.name}-rerun",
                    recording_id=old.recording_id,
                    seed=old.seed,
                    settings={**dict(old.settings), "replay_of": old_campaign_id},
                    status=CampaignStatus.RUNNING,
                ),
            )
            repo.add_event(
                s,
                new_id,
                "start",
                f"re-run of campaign {old_campaign_id} from {len(calls)} recorded "
                "LLM answers, no model loaded",
            )
        path = bundle_path or Path(recording.bundle_path)
        bundle = Bundle.open(path, verify=True)
        mutator = make_mutator_from(settings, RecordedBackend(calls) if calls else None)
        with (
            control.signals(),
            nullcontext(None) if generate_only
            else open_runner(path, 60.0, runner_settings) as runner,
        ):
            info = runner.info if runner is not None else None
            evaluator_for = None
            if runner is not None and info is not None:
                from r3tui.engine.inner import KernelSource, ReplayEvaluator

                gpu = runner

                def evaluator_for(src: KernelSource) -> ReplayEvaluator:
                    return ReplayEvaluator(src, gpu)

                with database.session_scope() as s:
                    repo.set_campaign_provenance(
                        s, new_id, provenance(info, settings.inner.toolchain))
            seed = seed_unit(bundle)
            run = CampaignRun(
                database,
                new_id,
                settings,
                seed.source,
                searched_launch(bundle, seed)[0],  # as the campaign it re-runs searched
                device_limits(info),
                mutator,
                evaluator_for,
                control=control,
                progress=progress,
            )
            with campaign_run(database, new_id), report_load(database, new_id, runner):
                made = replay_tree(run, old_campaign_id, evaluate=not generate_only)
        status = (CampaignStatus.STOPPED if control.stop_requested
                  else CampaignStatus.PAUSED if generate_only else CampaignStatus.FINISHED)
        timing = {"wall_s": run.timing.wall_s(), "llm_s": 0.0, "evaluate_s": run.timing.evaluate_s}
        done = ("re-made, pending (evaluate them on a GPU: r3 evaluate)" if generate_only
                else "re-made and evaluated")
        finish(database, new_id, status, f"{made} variant(s) {done}", timing)
        return CampaignOutcome(new_id, made, status.value, timing)
    finally:
        database.close()
