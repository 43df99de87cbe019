"""What a campaign found, read from the DB (``r3 report CAMPAIGN``), and a variant written
out as files (``r3 export CAMPAIGN``).

The report splits the best variant's speedup over the original into what each level of the
search contributed, as a product of ratios of measured medians:

- source: the best variant at the recorded configuration vs the original at it;
- options / pipeline / tunables: the best variant's fastest trial that keeps the recorded
  launch vs the variant at the recorded configuration;
- launch (block shape, launch bounds): its fastest trial overall vs that.
"""

from __future__ import annotations

import difflib
import json
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from db.figures import (
    BestSpeedup,
    CampaignFigures,
    best_speedup,
    duration_text,
    evaluations_per_s,
    rate_text,
)
from r3tui.domain import MeasurementStatus, TrialConfig, Variant, VariantOrigin, VariantStatus
from r3tui.errors import R3Error

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from db.repository import TrialRecord

_OK_STATUSES = (VariantStatus.VERIFIED, VariantStatus.IMPROVED)


def is_recorded_config(config: TrialConfig) -> bool:
    """The configuration the application launched with: nothing changed by the search."""
    return (
        not config.options
        and config.block is None
        and config.launch_bounds is None
        and not config.tunables
        and config.pipeline is None
    )


def _median(t: TrialRecord) -> float | None:
    m = t.measurement
    return m.time.median_s if m.status is MeasurementStatus.OK and m.time else None


def _best(trials: list[TrialRecord], keep: Any = None) -> float | None:
    times = [x for t in trials if (keep is None or keep(t.config)) and (x := _median(t))]
    return min(times) if times else None


@dataclass(frozen=True)
class SourceYield:
    proposals: int = 0
    applied: int = 0
    compiled: int = 0
    verified: int = 0
    improved: int = 0
    # written (`r3 tune --generate-only`) and not evaluated yet: neither applied nor not
    pending: int = 0

    @property
    def valid_fraction(self) -> float:
        """Verified among the evaluated proposals (pending ones are not known yet)."""
        evaluated = self.proposals - self.pending
        return self.verified / evaluated if evaluated else 0.0


@dataclass(frozen=True)
class Climbs:
    """What the children's climbs from their best (engine.lineage.Climb) added: how many
    climbed, the trials they took, and each climber's best before and after its climb."""

    children: int = 0
    trials: int = 0
    # variant id -> (its best before the climb, its best after), in seconds
    gains: dict[int, tuple[float, float]] = field(default_factory=dict)

    @property
    def best_gain(self) -> tuple[int, float, float] | None:
        """The climber that gained most: its id, its best before and after."""
        if not self.gains:
            return None
        vid, (before, after) = max(self.gains.items(), key=lambda kv: kv[1][0] / kv[1][1])
        return vid, before, after


def _climbs(events: list[Any], trials: dict[int, list[TrialRecord]]) -> Climbs:
    """From each child's ``inner_done`` event (``climbed``: the trials its climb added, the
    last of its trials) and its trials in the order they were stored."""
    children, added, gains = 0, 0, {}
    for e in events:
        n = int((e.data or {}).get("climbed") or 0) if e.kind == "inner_done" else 0
        if n <= 0:
            continue
        vid = int(e.data["variant_id"])
        own = trials.get(vid, [])
        before, after = _best(own[:-n]), _best(own)
        children, added = children + 1, added + n
        if before is not None and after is not None:
            gains[vid] = (before, after)
    return Climbs(children, added, gains)


@dataclass(frozen=True)
class CampaignReport:
    campaign_id: int
    name: str
    kernel: str
    status: str
    gpu: str | None
    variants: int
    trials: int
    original_s: float | None
    best_variant: Variant | None
    best_s: float | None
    best_config: TrialConfig | None
    contributions: dict[str, float] = field(default_factory=dict)
    spread: tuple[float, float] | None = None  # the best variant's re-timed CI (own baseline)
    time_split: dict[str, float] = field(default_factory=dict)
    yields: dict[str, SourceYield] = field(default_factory=dict)
    final: dict[str, Any] | None = None  # the best re-timed interleaved with the original
    # proposals counted and not stored: "declined" (a rule that does not apply to the parent),
    # "duplicate" (a source the campaign has); and the same by "why:operator"
    skipped: dict[str, int] = field(default_factory=dict)
    skipped_by_operator: dict[str, int] = field(default_factory=dict)
    # the same funnel per transformation (a rule operator or a catalogue entry for the model):
    # what each operator contributed, the counts the campaign's bandit chooses by
    operators: dict[str, SourceYield] = field(default_factory=dict)
    # the figures every screen shows (db.figures): best speedup, duration, evaluations/s
    figures: CampaignFigures | None = None
    duration_s: float | None = None  # at the time of the report, for a running campaign
    # each contribution's 95% interval where it was measured (the final re-timing's ladder of
    # steps, engine.comparison); absent where it is read off the best variant's trials
    contribution_ci: dict[str, tuple[float, float]] = field(default_factory=dict)
    climbs: Climbs = field(default_factory=Climbs)

    @property
    def speedup(self) -> float | None:
        """The best trial over the original (what ``contributions`` multiply to); the figure
        a screen shows is ``best_speedup``, re-timed where the campaign has one."""
        best = best_speedup(self.original_s, self.best_s)
        return best.value if best is not None else None

    @property
    def best_speedup(self) -> BestSpeedup | None:
        return self.figures.best_speedup if self.figures is not None else None

    @property
    def evaluations_per_s(self) -> float | None:
        return evaluations_per_s(self.trials, self.duration_s)


def _yields(variants: list[Variant], by: str = "origin") -> dict[str, SourceYield]:
    """The funnel's counts per mutation source (``by="origin"``) or per transformation
    (``by="operator"``)."""
    out: dict[str, Counter[str]] = {}
    for v in variants:
        if v.origin is VariantOrigin.SEED:
            continue
        key = v.origin.value if by == "origin" else (v.operator or "?")
        c = out.setdefault(key, Counter())
        c["proposals"] += 1
        if v.status is VariantStatus.PENDING:
            c["pending"] += 1
            continue
        if v.status is not VariantStatus.APPLY_FAILED:
            c["applied"] += 1
        if v.status not in (VariantStatus.APPLY_FAILED, VariantStatus.COMPILE_FAILED):
            c["compiled"] += 1
        if v.status in _OK_STATUSES:
            c["verified"] += 1
        if v.status is VariantStatus.IMPROVED:
            c["improved"] += 1
    return {k: SourceYield(**dict(c)) for k, c in out.items()}


def build_report(s: Session, campaign_id: int, now: datetime | None = None) -> CampaignReport:
    """``now``: the moment a running campaign's duration is counted to (default: now)."""
    from db import repository as repo
    from db.figures import figures_of

    campaign = repo.get_campaign(s, campaign_id)
    figures = figures_of(s, campaign_id)
    if campaign is None or figures is None:
        raise R3Error(f"no campaign {campaign_id} in this database", hint="list them: `r3 runs`")
    recording = repo.get_recording(s, campaign.recording_id)
    variants = repo.campaign_variants(s, campaign_id)
    trials: dict[int, list[TrialRecord]] = {}
    for t in repo.finished_trials(s, campaign_id):
        trials.setdefault(t.variant_id, []).append(t)
    original_s = figures.original_s
    # the variant of db.figures' best time: the fastest trial of the seed or a verified one
    best: tuple[float, Variant] | None = None
    for v in variants:
        if v.status in _OK_STATUSES or v.origin is VariantOrigin.SEED:
            t_best = _best(trials.get(v.id or -1, []))
            if t_best is not None and (best is None or t_best < best[0]):
                best = (t_best, v)
    contributions: dict[str, float] = {}
    best_config = None
    spread = None
    if best is not None:
        own = trials.get(best[1].id or -1, [])
        best_config = min((t for t in own if _median(t)), key=lambda t: _median(t) or 0).config
        at_recorded = _best(own, is_recorded_config)
        same_launch = _best(own, lambda c: c.block is None and c.launch_bounds is None)
        if original_s and at_recorded and same_launch:
            contributions = {
                "source": original_s / at_recorded,
                "options": at_recorded / same_launch,
                "launch": same_launch / best[0],
            }
        for e in repo.events(s, campaign_id, limit=1_000_000):
            if e.kind == "inner_done" and e.data and e.data.get("variant_id") == best[1].id:
                ci = e.data.get("ci")
                if ci:
                    spread = (float(ci[0]), float(ci[1]))
    final = None
    skipped: Counter[str] = Counter()
    skipped_by_operator: Counter[str] = Counter()
    events = repo.events(s, campaign_id, limit=1_000_000)
    for e in events:
        if e.kind == "final" and e.data and e.data.get("ci"):
            final = e.data
        elif e.kind == "skipped" and e.data:
            skipped.update(e.data.get("counts", {}))
            skipped_by_operator.update(e.data.get("by_operator", {}))
    if final and final.get("config") and best and final.get("variant_id") == best[1].id:
        # what ships: the re-timed ladder's fastest step (engine.comparison)
        best_config = TrialConfig.from_json(final["config"])
    contribution_ci: dict[str, tuple[float, float]] = {}
    if final and final.get("levels"):
        # measured step by step, interleaved with the original: these replace the figures
        # read off whichever trials the search made
        contributions = {lv["level"]: float(lv["speedup"]) for lv in final["levels"]}
        contribution_ci = {lv["level"]: (float(lv["ci"][0]), float(lv["ci"][1]))
                           for lv in final["levels"]}
    all_trials = [t for ts in trials.values() for t in ts]
    llm_s = sum(c.latency_s for _, c in repo.campaign_llm_calls(s, campaign_id))
    compile_s = sum(t.measurement.compile_time_s or 0.0 for t in all_trials)
    replay_s = sum(t.measurement.replay_wall_s or 0.0 for t in all_trials)
    duration_s = figures.duration_s(now or datetime.now(UTC))
    wall_s = duration_s or 0.0
    split = {"llm_s": llm_s, "compile_s": compile_s, "replay_s": replay_s, "wall_s": wall_s}
    if wall_s > 0:
        split["inference_share"] = min(1.0, llm_s / wall_s)
    provenance = campaign.provenance or {}
    return CampaignReport(
        campaign_id,
        campaign.name,
        recording.kernel_name if recording else "?",
        campaign.status.value,
        repo.gpu_name(provenance if isinstance(provenance, dict) else None),
        len(variants),
        len(all_trials),
        original_s,
        best[1] if best else None,
        best[0] if best else None,
        best_config,
        contributions,
        spread,
        split,
        _yields(variants),
        final,
        dict(skipped),
        dict(skipped_by_operator),
        _yields(variants, by="operator"),
        figures,
        duration_s,
        contribution_ci,
        _climbs(events, trials),
    )


def render(report: CampaignReport) -> list[str]:
    us = 1e6
    lines = [
        f"campaign {report.campaign_id} {report.name!r}: kernel {report.kernel}, "
        f"{report.status}, GPU {report.gpu or '?'}",
        f"variants: {report.variants}, trials: {report.trials}",
    ]
    if report.original_s:
        lines.append(f"original (recorded configuration): {report.original_s * us:.2f} µs")
    if report.best_variant is not None and report.best_s is not None:
        v = report.best_variant
        line = (
            f"best: variant #{v.id} ({v.origin.value}"
            + (f", {v.operator}" if v.operator else "")
            + f"): {report.best_s * us:.2f} µs"
        )
        lines.append(line)
        if report.spread:
            lines.append(
                f"  re-timed against its own recorded configuration: "
                f"[{report.spread[0]:.3f}, {report.spread[1]:.3f}] (95% CI)"
            )
        if report.final:
            f = report.final
            lines.append(
                f"  re-timed interleaved with the original ({f['rounds']} rounds): variant "
                f"#{f['variant_id']} {f['speedup']:.3f}x [{f['ci'][0]:.3f}, {f['ci'][1]:.3f}] "
                "(95% CI)"
            )
        if report.best_config is not None:
            lines.append(f"  config: {json.dumps(report.best_config.to_json())}")
        for lv in (report.final or {}).get("dropped", []):
            lines.append(
                f"  not shipped: its {lv['level']} step, {lv['speedup']:.3f}x "
                f"[{lv['ci'][0]:.3f}, {lv['ci'][1]:.3f}] over the step before it when re-timed"
            )
    best = report.best_speedup
    if best is not None:
        lines.append(
            f"best speedup: {best.text}"
            + (f" [{best.ci[0]:.3f}, {best.ci[1]:.3f}] (95% CI)" if best.ci else "")
        )
    if report.figures is not None:
        runs = report.figures.timing.n_runs
        lines.append(
            f"took {duration_text(report.duration_s)}"
            + (f" over {runs} runs" if runs > 1 else "")
            + f", {report.trials} evaluations, {rate_text(report.evaluations_per_s)}"
        )
    if report.contributions:
        ci = report.contribution_ci
        parts = ", ".join(f"{k} {x:.3f}x" + (f" [{ci[k][0]:.3f}, {ci[k][1]:.3f}]" if k in ci
                                             else "")
                          for k, x in report.contributions.items())
        how = (" (each step re-timed interleaved with the original, 95% CI)" if ci
               else " (read off the best variant's trials)")
        lines.append(f"contributions: {parts}{how}")
    t = report.time_split
    if t:
        lines.append(
            f"time: LLM {t['llm_s']:.1f} s, compile {t['compile_s']:.1f} s (summed over the "
            f"pool), replay {t['replay_s']:.1f} s, campaign wall {t['wall_s']:.1f} s"
            + (f"; inference_share: {t['inference_share']:.3f}" if "inference_share" in t else "")
        )
    for origin, y in sorted(report.yields.items()):
        lines.append(
            f"yield {origin}: {y.proposals} proposed, "
            + (f"{y.pending} pending (not evaluated yet), " if y.pending else "")
            + f"{y.applied} applied, {y.compiled} compiled, {y.verified} verified "
            f"({y.valid_fraction:.0%}), {y.improved} improved"
        )
    for operator, y in sorted(report.operators.items(), key=lambda kv: (-kv[1].improved,
                                                                         -kv[1].verified, kv[0])):
        lines.append(
            f"  operator {operator}: {y.proposals} proposed, "
            + (f"{y.pending} pending, " if y.pending else "")
            + f"{y.verified} verified, {y.improved} improved"
        )
    climbs = report.climbs
    if climbs.children:
        gain = climbs.best_gain
        lines.append(
            f"climbs from a child's best: {climbs.children} "
            f"{'child' if climbs.children == 1 else 'children'}, {climbs.trials} trials"
            + (f"; most gained: variant #{gain[0]}, {gain[1] * us:.2f} -> {gain[2] * us:.2f} µs "
               f"({gain[1] / gain[2]:.3f}x)" if gain else ""))
    if report.skipped:
        lines.append(
            "not stored: " + ", ".join(
                f"{n} {_SKIPPED_WHY.get(why, why)}" for why, n in sorted(report.skipped.items()))
        )
    return lines


_SKIPPED_WHY = {"declined": "declined (no rule applies to the parent)",
                "duplicate": "duplicate(s) of a variant the campaign has",
                "same_code": "with the same compiled code and search as a variant the campaign "
                             "has"}


def export_variant(
    s: Session,
    campaign_id: int,
    variant_id: int | None,
    out: Path,
    config: TrialConfig | None = None,
) -> list[Path]:
    """Write the variant's source, options, launch and a patch against the original; the
    configuration is ``config`` (e.g. the re-timed winner) or the variant's fastest trial's."""
    from db import repository as repo
    from r3tui.search.source import work_divisors, work_multipliers
    from r3tui.search.space import config_key

    report = build_report(s, campaign_id)
    variant = repo.get_variant(s, variant_id) if variant_id is not None else report.best_variant
    if variant is None or variant.campaign_id != campaign_id:
        raise R3Error(f"no variant {variant_id} in campaign {campaign_id}")
    own = [t for t in repo.trials_of_variant(s, variant.id or -1) if _median(t)]
    if config is not None:  # its own trials only: another config's median is not its time
        own = [t for t in own if config_key(t.config) == config_key(config)]
    else:
        config = min(own, key=lambda t: _median(t) or 0).config if own else TrialConfig()
    seeds = [v for v in repo.campaign_variants(s, campaign_id) if v.origin is VariantOrigin.SEED]
    original = seeds[0].source if seeds else ""
    recording = repo.get_recording(s, repo.get_campaign(s, campaign_id).recording_id)  # type: ignore[union-attr]
    name = recording.kernel_name if recording else "kernel"
    prepare_export_dir(out)
    files = {
        out / f"{name}.cu": variant.source,
        out / "options.txt": " ".join(config.options) + "\n",
        out / "launch.json": json.dumps(
            {
                "block": list(config.block.as_tuple()) if config.block else None,
                "launch_bounds": list(config.launch_bounds) if config.launch_bounds else None,
                "tunables": dict(config.tunables),
                # elements each thread covers along x, y and z: launch
                # ceil(work[a] / (block[a] * this[a])) blocks along each axis a instead of
                # one thread an element
                "work_per_thread": list(work_divisors(variant.source, config.tunables)),
                # threads that share each element along x, y and z: that many times more
                # blocks along each axis
                "threads_per_item": list(work_multipliers(variant.source, config.tunables)),
                # dynamic shared memory to launch with (a tiled variant's tiles, its
                # `// r3: shared` expression at this block); null: the recorded launch's
                "shared_mem_bytes": config.shared_mem_bytes,
                "toolchain": config.toolchain,
                "pipeline": config.pipeline,
                "variant_id": variant.id,
                "median_s": _median(min(own, key=lambda t: _median(t) or 0)) if own else None,
            },
            indent=2,
        )
        + "\n",
        out / f"{name}.patch": "".join(
            difflib.unified_diff(
                original.splitlines(keepends=True),
                variant.source.splitlines(keepends=True),
                fromfile=f"a/{name}.cu",
                tofile=f"b/{name}.cu",
            )
        ),
    }
    if recording is not None and variant.source != original:
        patch = application_patch(Path(recording.bundle_path), original, variant.source, name)
        if patch is not None:
            files[out / "application.patch"] = patch
    for path, text in files.items():
        try:
            path.write_text(text)
        except OSError as exc:
            raise R3Error(f"cannot write {path}: {exc.strerror or exc}") from exc
    return list(files)


def prepare_export_dir(out: Path) -> None:
    """Make the export directory, or say in one line why it cannot be one."""
    if out.exists() and not out.is_dir():
        raise R3Error(f"--out {out} exists and is not a directory",
                      hint="give a new directory to --out")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise R3Error(f"cannot create the export directory {out}: {exc.strerror or exc}",
                      hint="give a writable directory to --out") from exc


def application_patch(bundle_path: Path, original: str, variant: str, kernel: str) -> str | None:
    """For a campaign on an application's device unit: the variant's kernel definition as a
    patch of the file that defines it (a header, another unit), which is what ``r3 apply``
    writes; None for a standalone kernel, or when the bundle is not on this machine."""
    from r3tui.engine.splice import splice_definition
    from r3tui.engine.unit_source import defining_file, seed_unit
    from r3tui.record.bundle import Bundle

    try:
        bundle = Bundle.open(bundle_path)
        seed = seed_unit(bundle)
        if seed.source.text != original:
            return None
        found = defining_file(bundle, seed)
    except R3Error:
        return None
    if found is None:
        return None
    file, text = found
    spliced = splice_definition(text, variant, kernel)
    if spliced is None or spliced == text:
        return None
    return "".join(difflib.unified_diff(text.splitlines(keepends=True),
                                        spliced.splitlines(keepends=True),
                                        fromfile=f"a/{file}", tofile=f"b/{file}"))
