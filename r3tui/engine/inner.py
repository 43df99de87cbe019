"""``r3 tune BUNDLE --inner-only``: the recorded source's configurations searched, every
trial in the experiment database.

The evaluation of configurations lives in :mod:`r3tui.engine.evaluator` and the inner loop
in :mod:`r3tui.engine.inner_loop`; their public names are imported here too, since the rest
of the tree imports them from this module.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from r3tui.engine.evaluator import (
    KernelSource,
    NotRetimed,
    ReplayEvaluator,
    compile_failure,
    compile_request,
)
from r3tui.engine.inner_loop import (
    Evaluator,
    InnerResult,
    InnerSettings,
    Progress,
    bayes_settings,
    build_space,
    launch_facts,
    make_strategy,
    run_inner,
    with_app_limits,
)

if TYPE_CHECKING:
    from r3tui.engine.gpu import RunnerSettings
    from r3tui.record.bundle import Bundle
    from r3tui.replay.worker import WorkerInfo
    from r3tui.search import DeviceLimits

__all__ = [
    "Evaluator",
    "InnerCampaign",
    "InnerResult",
    "InnerSettings",
    "KernelSource",
    "NotRetimed",
    "Progress",
    "ReplayEvaluator",
    "bayes_settings",
    "build_space",
    "compile_failure",
    "compile_request",
    "device_limits",
    "launch_facts",
    "make_strategy",
    "provenance",
    "run_inner",
    "run_inner_campaign",
    "seed_source",
    "with_app_limits",
]


@dataclass(frozen=True)
class InnerCampaign:
    """``r3 tune BUNDLE --inner-only``: the recorded source alone, its configurations searched."""

    bundle_path: Path
    db_path: Path
    budget_trials: int | None = 50
    budget_seconds: float | None = None
    settings: InnerSettings = field(default_factory=InnerSettings)
    resume_campaign: int | None = None
    name: str | None = None
    timeout_s: float = 60.0  # per candidate, before the watchdog restarts the worker
    runner: RunnerSettings | None = None  # where candidates run (None: the local runner)


def seed_source(bundle: Bundle) -> KernelSource:
    """What a search on ``bundle`` starts from: the recorded source, or the device unit of an
    application's kernel (:mod:`r3tui.engine.unit_source`)."""
    from r3tui.engine.unit_source import seed_unit

    return seed_unit(bundle).source


def provenance(info: WorkerInfo, toolchain: str) -> dict[str, object]:
    from r3tui.compile.base import get_toolchain

    return {
        "gpu": info.gpu,
        "arch": info.arch,
        "driver_version": info.driver_version,
        "toolchain": toolchain,
        "toolchain_version": get_toolchain(toolchain).version(),
        "limits": dict(info.limits),
    }


def device_limits(info: WorkerInfo | None) -> DeviceLimits:
    """The launch limits of the worker's GPU (shared memory up to the opt-in limit), or the
    conservative defaults (48 KiB of shared memory) where no GPU has reported them."""
    from r3tui.search import DeviceLimits

    return DeviceLimits.from_json(info.limits) if info is not None and info.limits else (
        DeviceLimits())


def run_inner_campaign(job: InnerCampaign, progress: Progress | None = None) -> InnerResult:
    """Record-replay + BO on the original source, every trial in the experiment database."""
    from db import repository as repo
    from db.session import open_database
    from r3tui.domain import Campaign, CampaignStatus, Variant, VariantOrigin
    from r3tui.engine.lifecycle import campaign_run, finish
    from r3tui.engine.unit_source import preflight, searched_launch, seed_unit
    from r3tui.errors import R3Error
    from r3tui.record.bundle import Bundle
    from r3tui.record.registration import recording_of
    from r3tui.search import Budget

    bundle = Bundle.open(job.bundle_path, verify=True)
    manifest = bundle.manifest
    seed = seed_unit(bundle)
    source = seed.source
    launch, kept = searched_launch(bundle, seed)
    text = source.text
    settings = job.settings
    database = open_database(job.db_path, create=True, upgrade=True)
    from r3tui.engine.gpu import open_runner, report_load
    from r3tui.engine.inner_loop import preload

    with open_runner(job.bundle_path, job.timeout_s, job.runner,
                     lambda: preload(settings)) as runner:
        info = runner.info
        # before any campaign row: an original that does not compile ends here, in one line
        checked = preflight(source, settings.toolchain, info.arch)
        settings = with_app_limits(replace(settings, toolchain=checked.toolchain),
                                   job.bundle_path)
        with database.session_scope() as s:
            if job.resume_campaign is None:
                recording_id = repo.add_recording(s, recording_of(bundle), manifest.to_json())
                campaign_id = repo.create_campaign(
                    s,
                    Campaign(
                        name=job.name or f"{manifest.kernel.name}-inner",
                        recording_id=recording_id,
                        seed=settings.seed,
                        settings={
                            "mode": "inner-only",
                            **settings.__dict__,
                            "budget_trials": job.budget_trials,
                            "budget_seconds": job.budget_seconds,
                        },
                        provenance=provenance(info, settings.toolchain),
                        status=CampaignStatus.RUNNING,
                    ),
                )
                variant_id = repo.add_variant(s, Variant(campaign_id, text, VariantOrigin.SEED))
                history = []
            else:
                campaign_id = job.resume_campaign
                if repo.get_campaign(s, campaign_id) is None:
                    raise R3Error(f"no campaign {campaign_id} in {job.db_path}")
                seeds = [
                    v
                    for v in repo.campaign_variants(s, campaign_id)
                    if v.origin is VariantOrigin.SEED
                ]
                if not seeds or seeds[0].id is None:
                    raise R3Error(f"campaign {campaign_id} has no seed variant to resume")
                variant_id = seeds[0].id
                history = [
                    (t.config, t.measurement)
                    for t in repo.finished_trials(s, campaign_id, variant_id=variant_id)
                ]
                repo.set_campaign_status(s, campaign_id, CampaignStatus.RUNNING)
            repo.add_event(
                s,
                campaign_id,
                "start" if not history else "resume",
                f"inner search on {info.gpu}, {len(history)} trials already stored"
                + (f"; {checked.note}" if checked.note else ""),
            )
            if info.l2_note:
                repo.add_event(s, campaign_id, "timing", info.l2_note)
        space = build_space(launch, source, settings, device_limits(info))
        notes = [kept] if kept else []
        if space.launch_notes() or notes:
            with database.session_scope() as s:
                repo.add_event(s, campaign_id, "launch",
                               "; ".join([*notes, *space.launch_notes()]))
        search = make_strategy(space, settings)
        search.resume(history)
        budget = Budget(max_trials=job.budget_trials, max_seconds=job.budget_seconds)
        started = time.monotonic()
        with campaign_run(database, campaign_id), report_load(database, campaign_id, runner):
            evaluator = ReplayEvaluator(source, runner)
            result = run_inner(
                database, campaign_id, variant_id, search, evaluator, budget, settings, progress
            )
        finish(database, campaign_id, CampaignStatus.FINISHED,
               f"{result.trials} trial(s) done", {"wall_s": time.monotonic() - started})
    database.close()
    return replace(result, launch_notes=space.launch_notes(), campaign_id=campaign_id)
