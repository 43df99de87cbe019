"""A campaign's winner as ``r3 apply`` ships it: the re-timed verdict the database holds
(:class:`Decision`, from the campaign's ``final`` or ``inner_done`` event) and the variant
``r3 export`` writes for it (:class:`_Best`: source, options, launch settings and tunables,
with what tune-app's checks on the kernel's other configurations and unit found).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from r3tui.domain import TrialConfig
from r3tui.engine.splice import EXPORTS_DIR
from r3tui.errors import R3Error

if TYPE_CHECKING:
    from sqlalchemy.orm import Session


@dataclass(frozen=True)
class _Best:
    """A campaign's best variant as ``r3 export`` wrote it."""

    campaign_id: int
    kernel: str  # as the recording names it (a C++ name expression)
    original: str  # the recorded translation unit
    source: str  # the variant's translation unit
    options: tuple[str, ...]
    block: tuple[int, int, int] | None
    launch_bounds: tuple[int, int] | None
    tunables: dict[str, Any]
    toolchain: str | None
    speedup: float | None
    bundle_path: Path
    noise: str | None = None  # why applying it would ship noise (the winner is not significant)
    # the winner over every configuration of its kernel, where tune-app checked the others
    # (engine.transfer), and why it must not ship (it failed on one of them)
    kernel_speedup: float | None = None
    unsafe: str | None = None
    neighbours: tuple[tuple[str, float, float], ...] = ()
    # dynamic shared memory the winner launches with (None: the recorded launch's)
    shared_mem_bytes: int | None = None
    # why kernel_speedup may be far off (engine.transfer.uncertainty)
    uncertain: str | None = None


@dataclass(frozen=True)
class Decision:
    """The campaign's re-timed verdict: which variant and config, and how sure."""

    variant_id: int
    config: TrialConfig
    speedup: float
    ci: tuple[float, float] | None

    @property
    def significant(self) -> bool:
        from r3tui.search.winner import beyond_noise

        return beyond_noise(self.ci)


def campaign_decision(s: Session, campaign_id: int, best_variant_id: int | None
                      ) -> Decision | None:
    """The ``final`` event (a remix campaign's best re-timed against the original), else the
    ``inner_done`` event of the report's best variant (its winner re-timed against the
    recorded configuration); None for a campaign stored before either carried a config."""
    from db import repository as repo

    final = inner = None
    for e in repo.events(s, campaign_id, limit=1_000_000):
        if not e.data:
            continue
        if e.kind == "final" and e.data.get("config"):
            final = (e.data, e.data["config"])
        elif (e.kind == "inner_done" and e.data.get("winner")
              and e.data.get("variant_id") == best_variant_id):
            inner = (e.data, e.data["winner"])
    chosen = final or inner
    if chosen is None or chosen[0].get("speedup") is None:
        return None
    data, config = chosen
    ci = data.get("ci")
    return Decision(int(data["variant_id"]), TrialConfig.from_json(config),
                     float(data["speedup"]), (float(ci[0]), float(ci[1])) if ci else None)


def load_best(s: Session, campaign_id: int, exports: Path) -> _Best:
    from db import repository as repo
    from r3tui.domain import VariantOrigin
    from r3tui.engine import transfer
    from r3tui.engine.report import build_report, export_variant

    report = build_report(s, campaign_id)
    if report.best_variant is None:
        raise R3Error(f"campaign {campaign_id} has no measured variant to apply")
    decision = campaign_decision(s, campaign_id, report.best_variant.id)
    out = exports / f"campaign-{campaign_id}"
    files = export_variant(
        s,
        campaign_id,
        decision.variant_id if decision else None,
        out,
        decision.config if decision else None,
    )
    source_file = next(p for p in files if p.suffix == ".cu")
    launch = json.loads((out / "launch.json").read_text())
    options = tuple((out / "options.txt").read_text().split())
    seeds = [v for v in repo.campaign_variants(s, campaign_id) if v.origin is VariantOrigin.SEED]
    campaign = repo.get_campaign(s, campaign_id)
    assert campaign is not None
    recording = repo.get_recording(s, campaign.recording_id)
    assert recording is not None
    block = launch.get("block")
    bounds = launch.get("launch_bounds")
    checked, unit = transfer.stored(s, campaign_id)
    return _Best(
        campaign_id,
        report.kernel,
        seeds[0].source if seeds else report.best_variant.source,
        source_file.read_text(),
        options,
        (int(block[0]), int(block[1]), int(block[2])) if block else None,
        (int(bounds[0]), int(bounds[1])) if bounds else None,
        dict(launch.get("tunables") or {}),
        launch.get("toolchain"),
        decision.speedup if decision else report.speedup,
        Path(recording.bundle_path),
        None if decision is None or decision.significant else (
            f"the winner, {decision.speedup:.3f}x"
            + (f" [{decision.ci[0]:.3f}, {decision.ci[1]:.3f}]" if decision.ci else "")
            + ", is not faster than the original beyond the noise"
        ),
        checked.get("kernel_speedup"),
        checked.get("failed") or unit.get("failed"),
        tuple(transfer.unit_parts(unit)),
        launch.get("shared_mem_bytes"),
        checked.get("uncertain"),
    )



def load_bests(s: Session, campaign_ids: list[int], into: Path) -> list[_Best]:
    return [load_best(s, campaign_id, into / EXPORTS_DIR) for campaign_id in campaign_ids]
