"""``r3 tune-app RECORDING_DIR``: tune the kernels that dominate an application's GPU time.

``r3 record -- ./app`` leaves a directory with ``recording.json`` (every kernel the application
launched, with launch counts, device time and one bundle per recorded launch configuration)
and the bundles.  This module ranks the kernels by their share of the application's kernel
device time, tunes the top replayable configurations (each an inner-only campaign of the
existing engine, compiled by nvcc from the whole translation unit) and predicts two figures
with Amdahl's law over the tuned shares:

    kernel_time_speedup = 1 / (1 - Σ share_i + Σ share_i / speedup_i)
    app_wall_speedup    = 1 / (1 - f Σ share_i + f Σ share_i / speedup_i),  f = K / W

where ``share_i`` is configuration *i*'s fraction of the total **kernel device time** ``K``
the recording measured, and ``W`` the application's wall time under ``r3 record``: the host's
work, copies and launch gaps are not sped up.  ``W`` includes the recording's own overhead
(snapshots, synchronizations), so ``f`` is understated and the wall prediction conservative
(nearer 1 than a plain run would give).  Which campaigns belong to the run, and both figures,
are written to ``RECORDING_DIR/tune-app.json``; no schema change is needed.

:mod:`r3tui.engine.app_recording` reads the recording and :mod:`r3tui.engine.prediction`
forms the two figures; this module runs the campaigns and says what they found.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

# the recording and the prediction lived here before: their names stay importable from here
from r3tui.engine.app_recording import (
    RECORDING_FILE,
    AppRecording,
    KernelShare,
    RecordedConfig,
    RecordingContext,
    in_app_reference,
    load_recording,
    most_threads_launched,
    recording_context,
)
from r3tui.engine.prediction import (
    WALL_BASIS,
    amdahl,
    app_wall_amdahl,
    kernel_fraction_of_wall,
    prediction_lines,
)
from r3tui.engine.transfer import MAX_CHECKS, Checker, ConfigCheck, others
from r3tui.engine.unit_source import OriginalUnusable
from r3tui.errors import R3Error

if TYPE_CHECKING:
    from r3tui.engine.campaign import CampaignSettings
    from r3tui.engine.gpu import RunnerSettings
    from r3tui.engine.inner import InnerSettings
    from r3tui.remix.backends import BackendSpec

__all__ = [
    "PLAN_FILE",
    "RECORDING_FILE",
    "WALL_BASIS",
    "AppRecording",
    "AppTuneResult",
    "KernelOutcome",
    "KernelShare",
    "RecordedConfig",
    "RecordingContext",
    "Tuner",
    "amdahl",
    "app_wall_amdahl",
    "campaign_tuner",
    "in_app_reference",
    "inner_tuner",
    "kernel_fraction_of_wall",
    "load_recording",
    "most_threads_launched",
    "outcome_lines",
    "prediction_lines",
    "recording_context",
    "render_ranking",
    "select",
    "tune_app",
    "write_plan",
]

PLAN_FILE = "tune-app.json"


# -- the run -------------------------------------------------------------------------------
@dataclass(frozen=True)
class KernelOutcome:
    entry_point: str
    name: str
    # the kernel's share of all kernels' device time, every configuration of it: what the
    # winner ships changes every launch of the kernel (its source, its flags, its bounds, a
    # block macro), so its speedup on the tuned configuration is taken for all of them
    # (lud on the H200: 1.076x on a configuration holding 0.76% of kernel time predicted
    # 1.0005 for the whole, where r3 apply measured 1.045; over the kernel's 60%, 1.044)
    share: float
    bundle: str | None
    campaign_id: int | None
    speedup: float | None  # re-timed winner over the recorded configuration
    ci: tuple[float, float] | None
    status: str  # tuned | no-winner | skipped: <why>
    config_share: float = 0.0  # the tuned configuration's own share
    # the winner over all of the kernel's configurations (engine.transfer), how that was
    # formed, each other configuration's check, and why it must not ship (None: it may)
    kernel_speedup: float | None = None
    kernel_basis: str | None = None
    checks: tuple[dict[str, Any], ...] = ()
    unsafe: str | None = None
    # the winner's options on the unit's other kernels (engine.transfer.UnitCheck as dicts)
    neighbours: tuple[dict[str, Any], ...] = ()
    # why the prediction may be far off: the tuned configuration's other launches do other
    # work than the replayed one (RecordedConfig.other_work); None where they do not
    other_work: str | None = None
    # why its kernel speedup may be far off: much of its time not re-timed, where the
    # configurations that were gained unlike amounts (engine.transfer.uncertainty)
    uncertain: str | None = None

    @property
    def significant(self) -> bool:
        """Faster than the recorded configuration beyond the noise, and right on every
        configuration checked (``r3 apply`` ships it)."""
        from r3tui.search.winner import beyond_noise

        return self.speedup is not None and beyond_noise(self.ci) and self.unsafe is None

    @property
    def predicted(self) -> float | None:
        """The speedup over the kernel's whole share: measured on its configurations where
        they were checked, else the tuned configuration's."""
        return self.kernel_speedup if self.kernel_speedup is not None else self.speedup


@dataclass(frozen=True)
class AppTuneResult:
    recording: str
    db: str
    created_at: str
    budget: str
    kernels: list[KernelOutcome] = field(default_factory=list)
    kernel_time_s: float = 0.0  # all kernels' device time in the recorded run
    wall_s: float = 0.0  # the recorded run's wall time, recording overhead included

    def _parts(self) -> list[tuple[float, float]]:
        """(share, speedup) of the kernels whose winner is significant: the others keep
        their original code (``r3 apply`` does not ship noise), so they count as unchanged."""
        parts = [(k.share, k.predicted) for k in self.kernels
                 if k.significant and k.predicted is not None and k.predicted > 0]
        # the unit's other kernels under a shipped winner's options, each counted once
        seen = {k.entry_point for k in self.kernels if k.significant}
        for k in self.kernels:
            if not k.significant:
                continue
            for n in k.neighbours:
                if n.get("speedup") and not n.get("failed") and n["entry_point"] not in seen:
                    seen.add(n["entry_point"])
                    parts.append((float(n["share"]), float(n["speedup"])))
        return parts

    @property
    def kernel_time_speedup(self) -> float:
        """Predicted speedup of all kernels' device time."""
        return amdahl(self._parts())

    @property
    def other_work(self) -> list[str]:
        """Why the prediction may be far off: for each counted kernel whose replayed launch
        does other work than its other launches (:attr:`KernelOutcome.other_work`, which
        tune-app prints with the kernel), a line that points there."""
        return [f"{k.name}'s replayed launch does other work than its other launches (above)"
                for k in self.kernels if k.significant and k.other_work] + [
            k.uncertain for k in self.kernels if k.significant and k.uncertain]

    @property
    def kernel_fraction(self) -> float | None:
        return kernel_fraction_of_wall(self.kernel_time_s, self.wall_s)

    @property
    def app_wall_speedup(self) -> float | None:
        """Predicted speedup of the application's wall time (None without a recorded wall)."""
        return app_wall_amdahl(self._parts(), self.kernel_fraction)

    def to_json(self) -> dict[str, Any]:
        return {
            "format_version": 1,
            "recording": self.recording,
            "db": self.db,
            "created_at": self.created_at,
            "budget": self.budget,
            "share_basis": "fraction of the total kernel device time the recording measured",
            "predicted_kernel_speedup": self.kernel_time_speedup,
            "predicted_wall_speedup": self.app_wall_speedup,
            "kernel_time_s": self.kernel_time_s,
            "wall_s": self.wall_s,
            "kernel_fraction_of_wall": self.kernel_fraction,
            "wall_basis": WALL_BASIS,
            "kernels": [asdict(k) for k in self.kernels],
        }


# tunes one bundle and returns (campaign id, speedup, CI) — the GPU part, replaceable in tests
Tuner = Callable[[Path, str], tuple[int, float | None, tuple[float, float] | None]]


def select(recording: AppRecording, top: int) -> list[tuple[KernelShare, str | None]]:
    """The ``top`` kernels by device time, each with why it is skipped (None: tune it)."""
    chosen: list[tuple[KernelShare, str | None]] = []
    for kernel in recording.kernels[:top]:
        target = kernel.target
        if target is None:
            reasons = sorted({r for c in kernel.configs for r in c.reasons})
            why = "; ".join(reasons) if reasons else "no replayable configuration recorded"
            chosen.append((kernel, f"skipped: {why}"))
        else:
            chosen.append((kernel, None))
    return chosen


def tune_app(
    recording: AppRecording, db: Path, budget: str, top: int, tuner: Tuner,
    checker: Checker | None = None, max_checks: int = MAX_CHECKS,
) -> AppTuneResult:
    """Tune the ``top`` kernels, each on its largest replayable configuration; ``checker``
    re-times each significant winner on up to ``max_checks`` other configurations of its
    kernel (engine.transfer)."""
    result = AppTuneResult(
        str(recording.path), str(db), datetime.now(UTC).isoformat(timespec="seconds"), budget,
        kernel_time_s=recording.kernel_time_s, wall_s=recording.wall_s,
    )
    for kernel, skipped in select(recording, top):
        target = kernel.target
        if skipped is not None or target is None:
            result.kernels.append(
                KernelOutcome(
                    kernel.entry_point, kernel.name, 0.0, None, None, None, None, skipped or ""
                )
            )
            continue
        assert target.bundle is not None
        try:
            campaign_id, speedup, ci = tuner(target.bundle, kernel.name)
        except OriginalUnusable as exc:  # this kernel cannot be searched; the others can
            result.kernels.append(KernelOutcome(
                kernel.entry_point, kernel.name, 0.0, str(target.bundle.relative_to(
                    recording.path)), None, None, None, f"failed: {exc.one_line()}"))
            write_plan(recording.path, result)
            continue
        outcome = KernelOutcome(
            kernel.entry_point,
            kernel.name,
            kernel.share,
            str(target.bundle.relative_to(recording.path)),
            campaign_id,
            speedup,
            ci,
            "tuned" if speedup is not None else "no-winner",
            target.share,
            other_work=target.other_work(kernel.name),
        )
        configs = others(kernel, target, max_checks)
        if checker is not None and configs and outcome.significant and speedup is not None:
            outcome = _checked(outcome, checker.configs(campaign_id, configs), db)
        result.kernels.append(outcome)
        # written after every kernel: an interrupted run still says which campaigns it made
        write_plan(recording.path, result)
    if checker is not None and max_checks > 0:
        _check_units(recording, result, checker, db, max_checks)
        write_plan(recording.path, result)
    return result


def _checked(outcome: KernelOutcome, checks: list[ConfigCheck], db: Path) -> KernelOutcome:
    """``outcome`` with its winner's checks on the kernel's other configurations, which also
    go into the campaign's ``configs`` event for ``r3 apply``."""
    from r3tui.engine import transfer

    assert outcome.speedup is not None and outcome.campaign_id is not None
    if not checks:
        return outcome
    speedup, how = transfer.kernel_speedup(outcome.share, outcome.config_share,
                                           outcome.speedup, checks)
    uncertain = transfer.uncertainty(outcome.name, outcome.share, outcome.config_share,
                                     outcome.speedup, checks)
    transfer.store(db, outcome.campaign_id, checks, speedup, how, uncertain)
    why = transfer.failure(checks)
    return replace(outcome, kernel_speedup=speedup, kernel_basis=how,
                   checks=tuple(asdict(c) for c in checks), unsafe=why, uncertain=uncertain,
                   status=f"not shippable: {why}" if why else outcome.status)


def _check_units(recording: AppRecording, result: AppTuneResult, checker: Checker,
                 db: Path, max_checks: int) -> None:
    """Each shipped winner's options on the other kernels of its unit that no campaign of
    the run ships (engine.transfer)."""
    from r3tui.engine import transfer

    by_entry = {k.entry_point: k for k in recording.kernels}
    shipped = {k.entry_point for k in result.kernels if k.significant}
    for i, outcome in enumerate(result.kernels):
        kernel = by_entry.get(outcome.entry_point)
        if not outcome.significant or outcome.campaign_id is None or kernel is None:
            continue
        near = transfer.neighbours(recording.kernels, kernel, shipped, max_checks)
        checks = checker.unit(outcome.campaign_id, near) if near else []
        if not checks:
            continue
        transfer.store_unit(db, outcome.campaign_id, checks)
        why = transfer.failure(checks)
        if why is not None and kernel.target is not None and kernel.target.bundle is not None:
            # whole-unit options that break another kernel: the winner without them, where
            # that is still faster beyond the noise (gaussian on the H100, session 44: the
            # block shape gave 9.3x, --prec-div=false changed Fan1's results by one ulp)
            campaign_id = outcome.campaign_id
            bare = checker.without_options(campaign_id, kernel.target.bundle)
            if bare is not None:
                outcome = replace(
                    outcome, speedup=bare[0], ci=bare[1], kernel_speedup=None,
                    kernel_basis=None, checks=(), unsafe=None, neighbours=(),
                    status=f"tuned without its options: {why}")
                configs = others(kernel, kernel.target, max_checks)
                if configs:
                    outcome = _checked(outcome, checker.configs(campaign_id, configs), db)
                result.kernels[i] = outcome
                continue
        result.kernels[i] = replace(
            outcome, neighbours=tuple(asdict(c) for c in checks),
            unsafe=outcome.unsafe or why,
            status=f"not shippable: {why}" if why and not outcome.unsafe else outcome.status)


def write_plan(directory: Path, result: AppTuneResult) -> Path:
    path = directory / PLAN_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result.to_json(), indent=2) + "\n")
    tmp.replace(path)
    return path


def inner_tuner(db: Path, trials: int | None, seconds: float | None,
                settings: Callable[[], InnerSettings],
                runner: RunnerSettings | None = None) -> Tuner:
    """Each bundle tuned by the engine's inner loop alone (BO over options, block shape and
    launch bounds), as ``r3 tune BUNDLE --inner-only`` would, with a budget of ``trials`` or
    ``seconds``.  ``settings`` gives the search's settings; it is called as each campaign
    starts, which is where settings that cannot be resolved fail."""
    from r3tui.engine.inner import InnerCampaign, run_inner_campaign

    def tune(bundle: Path, name: str) -> tuple[int, float | None, tuple[float, float] | None]:
        campaign_name = f"app:{name}:{time.time_ns()}"
        outcome = run_inner_campaign(
            InnerCampaign(bundle, db, trials, seconds, settings(), name=campaign_name,
                          runner=runner)
        )
        campaign_id = _campaign_named(db, campaign_name)
        winner = outcome.winner
        if winner is None:
            return campaign_id, None, None
        return campaign_id, winner.speedup, (winner.best.low, winner.best.high)

    return tune


def campaign_tuner(db: Path, variants: int | None, seconds: float | None,
                   settings: Callable[[], CampaignSettings], backend: BackendSpec | None,
                   runner: RunnerSettings | None = None) -> Tuner:
    """Each bundle tuned by a whole R³ campaign -- source (rules and ``backend``, the model),
    options and launch settings -- as ``r3 tune BUNDLE`` with the same options would, with a
    budget of ``variants`` or ``seconds``; ``settings`` gives the campaign's settings as each
    campaign starts.  The speedup is the campaign's best re-timed interleaved with the
    original."""
    from r3tui.engine.tune import CampaignJob, run_campaign

    def tune(bundle: Path, name: str) -> tuple[int, float | None, tuple[float, float] | None]:
        campaign_name = f"app:{name}:{time.time_ns()}"
        job = CampaignJob(bundle, db, settings(), backend, name=campaign_name, runner=runner)
        outcome = run_campaign(job)
        for note in outcome.notes:
            print(f"{name}: {note}")
        return (outcome.campaign_id, *_final(db, outcome.campaign_id))

    return tune


def _final(db: Path, campaign_id: int) -> tuple[float | None, tuple[float, float] | None]:
    """The campaign's best re-timed against the original (its 'final' event)."""
    from db import repository as repo
    from db.session import open_database

    with open_database(db, readonly=True, create=False) as database, database.session_scope() as s:
        finals = [e.data for e in repo.events(s, campaign_id, limit=1_000_000)
                  if e.kind == "final" and e.data and e.data.get("speedup") is not None]
    if not finals:
        return None, None
    ci = finals[-1].get("ci")
    return float(finals[-1]["speedup"]), (float(ci[0]), float(ci[1])) if ci else None


def _campaign_named(db: Path, name: str) -> int:
    from db import repository as repo
    from db.session import open_database

    with open_database(db, readonly=True, create=False) as database, database.session_scope() as s:
        ids = [c.id for c in repo.list_campaign_summaries(s) if c.name == name]
    if not ids:
        raise R3Error(f"the campaign {name!r} just run is not in {db}")
    return max(ids)


# -- what tune-app prints ------------------------------------------------------------------
def render_ranking(recording: AppRecording, top: int) -> list[str]:
    total = recording.kernel_time_s
    lines = [
        f"{len(recording.kernels)} kernels, {total * 1e3:.3f} ms of device time "
        f"(application wall {recording.wall_s:.3f} s, {recording.runtime} runtime)"
        + (f"; {recording.graph_time_s * 1e3:.3f} ms of it in CUDA graphs, not tunable"
           if recording.graph_time_s else "")
    ]
    for rank, (kernel, skipped) in enumerate(select(recording, len(recording.kernels)), 1):
        mark = "tune" if rank <= top and skipped is None else (skipped or "-")
        if rank > top and skipped is None:
            mark = "-"
        lines.append(
            f"{rank:>3}. {kernel.share:7.2%} {kernel.device_time_s * 1e3:9.3f} ms "
            f"{kernel.launches:>7} launches  {kernel.name}  [{mark}]"
        )
    return lines


def outcome_lines(k: KernelOutcome) -> list[str]:
    """What tune-app says about one kernel: its winner, and that winner over the kernel's
    other configurations."""
    if k.speedup is None:
        return [f"{k.name}: {k.status}"]
    ci = f" [{k.ci[0]:.3f}, {k.ci[1]:.3f}]" if k.ci else ""
    lines = [
        f"{k.name}: campaign {k.campaign_id}, speedup {k.speedup:.3f}x{ci} on the tuned "
        f"configuration ({k.config_share:.2%} of kernel time; the kernel holds {k.share:.2%})"
        + ("" if k.significant or k.unsafe else " (not beyond the noise: counted as unchanged)")
    ]
    for c in k.checks:
        where = f"grid {'x'.join(map(str, c['grid']))}, block {'x'.join(map(str, c['block']))}"
        if c.get("from_launch", 1) > 1:  # a later stratum of the same grid and block
            where += f", from launch {c['from_launch']}"
        if c.get("speedup") is not None:
            low, high = c["ci"] or (c["speedup"], c["speedup"])
            lines.append(f"  on {where} ({c['share']:.2%}): {c['speedup']:.3f}x "
                         f"[{low:.3f}, {high:.3f}]")
        else:
            lines.append(f"  on {where} ({c['share']:.2%}): "
                         + (f"FAILS: {c['failed']}" if c.get("failed")
                            else f"not measured: {c.get('skipped')}"))
    for n in k.neighbours:
        lines.append(f"  its options on {n['kernel']} ({n['share']:.2%}): "
                     + (f"{n['speedup']:.3f}x" if n.get("speedup") is not None else
                        f"FAILS: {n['failed']}" if n.get("failed") else
                        f"not measured: {n.get('skipped')}"))
    if k.other_work:
        lines.append(f"  {k.other_work}")
    if k.unsafe:
        lines.append(f"  not shipped: {k.unsafe}")
    elif k.kernel_speedup is not None:
        lines.append(f"  over the whole kernel: {k.kernel_speedup:.3f}x ({k.kernel_basis})")
    elif k.config_share < k.share:
        lines.append("  taken for every configuration of the kernel (none other checked)")
    return lines
