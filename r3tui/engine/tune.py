"""``r3 tune`` (outer + inner loop), ``r3 tune --generate-only`` and ``r3 evaluate``.

Wires a campaign to its recording, the database, the replay worker, the compile pool and the
remix layer, and keeps the campaign's status honest: running while it runs, finished when
the budget is spent, stopped on request, crashed (and resumable) when anything escapes.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from r3tui.engine.campaign import CampaignRun, CampaignSettings, Progress
from r3tui.engine.control import CampaignControl
from r3tui.engine.gpu import RunnerSettings, open_runner, report_load
from r3tui.engine.inner import (
    KernelSource,
    ReplayEvaluator,
    device_limits,
    provenance,
    with_app_limits,
)
from r3tui.engine.lifecycle import campaign_run, finish
from r3tui.engine.unit_source import preflight, recorded_arch, searched_launch, seed_unit

if TYPE_CHECKING:
    from db.session import Database
    from r3tui.remix.backends import BackendSpec, LLMBackend
    from r3tui.remix.mutation import Mutator


@dataclass(frozen=True)
class CampaignJob:
    bundle_path: Path | None  # None: the recording's stored path (resume / evaluate)
    db_path: Path
    settings: CampaignSettings = field(default_factory=CampaignSettings)
    backend: BackendSpec | None = None  # None: rule mutations only
    resume_campaign: int | None = None
    name: str | None = None
    timeout_s: float = 60.0  # per candidate, before the watchdog restarts the worker
    runner: RunnerSettings | None = None  # where candidates run (None: the local runner)


@dataclass(frozen=True)
class CampaignOutcome:
    campaign_id: int
    proposals: int
    status: str
    timing: dict[str, float]
    # what the user should know about how it ran: the device unit searched, a toolchain that
    # took over, why it stopped early
    notes: tuple[str, ...] = ()


def make_mutator(settings: CampaignSettings, backend: BackendSpec | None) -> Mutator:
    """The campaign's mutation sources: the model ``backend`` names (if any) and the rules."""
    from r3tui.remix.backends import open_backend

    llm = open_backend(backend) if backend is not None and settings.llm_share > 0 else None
    return make_mutator_from(settings, llm)


def make_mutator_from(settings: CampaignSettings, llm: LLMBackend | None) -> Mutator:
    from r3tui.remix.mutation import Mutator, MutatorSettings

    return Mutator(
        llm,
        MutatorSettings(
            edit_format=settings.edit_format,
            llm_share=settings.llm_share if llm is not None else 0.0,
            check_names=settings.check_names,
            check_balance=settings.check_balance,
        ),
    )


def _open_campaign(job: CampaignJob, database: Database) -> tuple[int, CampaignSettings, Path]:
    """Create the campaign (or find the one to resume); returns its id, settings, bundle."""
    from db import repository as repo
    from r3tui.domain import Campaign, CampaignStatus
    from r3tui.errors import R3Error
    from r3tui.record.bundle import Bundle
    from r3tui.record.registration import recording_of

    with database.session_scope() as s:
        if job.resume_campaign is None:
            if job.bundle_path is None:
                raise R3Error("a new campaign needs a recording bundle")
            bundle = Bundle.open(job.bundle_path, verify=True)
            recording_id = repo.add_recording(s, recording_of(bundle), bundle.manifest.to_json())
            settings = job.settings
            campaign_id = repo.create_campaign(
                s,
                Campaign(
                    name=job.name or f"{bundle.manifest.kernel.name}-remix",
                    recording_id=recording_id,
                    seed=settings.seed,
                    settings={
                        "mode": "remix",
                        **settings.to_json(),
                        "model": _model_json(job.backend),
                    },
                    status=CampaignStatus.CREATED,
                ),
            )
            return campaign_id, settings, job.bundle_path
        campaign = repo.get_campaign(s, job.resume_campaign)
        if campaign is None:
            raise R3Error(f"no campaign {job.resume_campaign} in {job.db_path}")
        if campaign.settings.get("mode") != "remix":
            raise R3Error(
                f"campaign {job.resume_campaign} is an inner-only search",
                hint="resume it with `r3 tune BUNDLE --inner-only --resume ID`",
            )
        recording = repo.get_recording(s, campaign.recording_id)
        assert recording is not None
        bundle_path = job.bundle_path or Path(recording.bundle_path)
        # the stored settings, with the budget this invocation gives
        stored = CampaignSettings.from_json(dict(campaign.settings))
        settings = replace(stored, variants=job.settings.variants, seconds=job.settings.seconds)
        return job.resume_campaign, settings, bundle_path


def _model_json(spec: BackendSpec | None) -> dict[str, Any] | None:
    if spec is None:
        return None
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in spec.__dict__.items()}


def run_campaign(
    job: CampaignJob,
    progress: Progress | None = None,
    *,
    generate_only: int | None = None,
    evaluate_only: bool = False,
    control: CampaignControl | None = None,
) -> CampaignOutcome:
    """Run (or resume) a campaign.  ``generate_only=N`` writes N pending proposals and touches
    no GPU; ``evaluate_only`` evaluates the pending ones and proposes nothing."""
    from db import repository as repo
    from db.session import open_database
    from r3tui.domain import CampaignStatus
    from r3tui.engine.inner_loop import preload
    from r3tui.record.bundle import Bundle

    control = control or CampaignControl()
    database = open_database(job.db_path, create=True, upgrade=True)
    try:
        campaign_id, settings, bundle_path = _open_campaign(job, database)
        bundle = Bundle.open(bundle_path, verify=True)
        seed = seed_unit(bundle)
        source = seed.source
        launch, kept = searched_launch(bundle, seed)
        mutator = None if evaluate_only else make_mutator(settings, job.backend)
        needs_gpu = generate_only is None
        with (
            control.signals(),
            open_runner(bundle_path, job.timeout_s, job.runner,
                        lambda: preload(settings.inner)) if needs_gpu
            else nullcontext(None) as gpu,
        ):
            evaluator_for = None
            checked = None
            if gpu is not None:
                with campaign_run(database, campaign_id):  # the original must compile first
                    checked = preflight(source, settings.inner.toolchain, gpu.info.arch)
                settings = replace(settings, inner=replace(settings.inner,
                                                           toolchain=checked.toolchain))
            settings = replace(settings, inner=with_app_limits(settings.inner, bundle_path))
            with database.session_scope() as s:
                if seed.unit is not None and job.resume_campaign is None:
                    repo.add_event(s, campaign_id, "unit", f"searching {seed.describe()}",
                                   {"file": seed.unit.file, "dropped": list(seed.unit.dropped)})
                if checked is not None and checked.note:
                    repo.add_event(s, campaign_id, "toolchain", checked.note)
                if kept is not None and job.resume_campaign is None:
                    repo.add_event(s, campaign_id, "launch", kept)
                if gpu is not None:
                    runner, info = gpu, gpu.info
                    if info.l2_note:
                        repo.add_event(s, campaign_id, "timing", info.l2_note)

                    def evaluator_for(src: KernelSource) -> ReplayEvaluator:
                        return ReplayEvaluator(src, runner)

                    repo.set_campaign_provenance(
                        s, campaign_id, provenance(info, settings.inner.toolchain)
                    )
                repo.set_campaign_status(s, campaign_id, CampaignStatus.RUNNING)
                repo.add_event(
                    s,
                    campaign_id,
                    "start" if job.resume_campaign is None else "resume",
                    _start_message(generate_only, evaluate_only),
                )
            run = CampaignRun(
                database,
                campaign_id,
                settings,
                source,
                launch,
                device_limits(gpu.info if gpu is not None else None),
                mutator,
                evaluator_for,
                control=control,
                progress=progress,
            )
            with campaign_run(database, campaign_id), report_load(database, campaign_id, gpu):
                if generate_only is not None:
                    # the model's changes compiled here, for the recorded GPU, as they come
                    run.compile_arch = recorded_arch(bundle)
                    made = len(run.generate(generate_only))
                elif evaluate_only:
                    made = run.evaluate_pending()
                else:
                    made = run.run()
        timing = {
            "wall_s": run.timing.wall_s(),
            "llm_s": run.timing.llm_s,
            "llm_wait_s": run.timing.llm_wait_s,
            "evaluate_s": run.timing.evaluate_s,
        }
        stopped = control.stop_requested
        status = (
            CampaignStatus.STOPPED
            if stopped
            else (CampaignStatus.PAUSED if generate_only is not None else CampaignStatus.FINISHED)
        )
        finish(database, campaign_id, status,
               f"{made} variant(s) {'written' if generate_only is not None else 'done'}; "
               + ("stopped by request" if stopped else run.stop_reason or "budget spent"),
               timing)
        notes = tuple(n for n in (
            f"searched {seed.describe()}" if seed.unit is not None else None,
            checked.note if checked is not None else None,
            gpu.info.l2_note if gpu is not None else None,
            run.stop_reason) if n)
        return CampaignOutcome(campaign_id, made, status.value, timing, notes)
    finally:
        database.close()


def _start_message(generate_only: int | None, evaluate_only: bool) -> str:
    if generate_only is not None:
        return f"generating {generate_only} pending variant(s), no GPU"
    if evaluate_only:
        return "evaluating pending variants"
    return "outer loop: remix + inner BO on replay"
