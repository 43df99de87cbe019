"""Exporting a variant: what someone needs to use it outside R³.

One folder per variant: ``kernel.cu`` (its source), ``options.txt`` (the compiler flags of
its best configuration, one a line), ``launch.json`` (block shape, launch bounds, tunables,
toolchain, pipeline and the measured time), ``variant.patch`` (a unified diff against its
parent) and ``variant.json`` (lineage, status, features).
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path

from db.series import VariantDetail
from r3tui.errors import R3Error


class ExportError(R3Error):
    """The export folder cannot be written."""


def patch_of(detail: VariantDetail) -> str:
    """The diff against the parent: as stored, or computed from the two sources."""
    if detail.diff:
        return detail.diff
    if detail.parent_source is None:
        return ""
    return "".join(
        difflib.unified_diff(
            detail.parent_source.splitlines(keepends=True),
            detail.source.splitlines(keepends=True),
            f"variant-{detail.node.parent_id}/kernel.cu",
            f"variant-{detail.node.id}/kernel.cu",
        )
    )


def export_variant(detail: VariantDetail, root: Path) -> Path:
    """Write the variant's files under ``root/variant-<id>``; returns that folder."""
    node = detail.node
    folder = root / f"variant-{node.id}"
    trial = detail.best_trial
    config = trial.config.to_json() if trial else None
    launch = {
        "toolchain": config["toolchain"] if config else None,
        "block": config["block"] if config else None,
        "launch_bounds": config["launch_bounds"] if config else None,
        "tunables": config["tunables"] if config else {},
        "pipeline": config["pipeline"] if config else None,
        "median_s": trial.measurement.time.median_s if trial and trial.measurement.time else None,
        "trial_id": trial.id if trial else None,
    }
    meta = {
        "variant_id": node.id,
        "parent_id": node.parent_id,
        "origin": node.origin.value,
        "operator": node.operator,
        "status": node.status.value,
        "status_reason": node.status_reason,
        "island": node.island,
        "features": detail.features,
        "llm_call_id": detail.llm_call_id,
        "created_at": detail.created_at.isoformat(),
    }
    try:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "kernel.cu").write_text(detail.source)
        options = list(config["options"]) if config else []
        (folder / "options.txt").write_text("".join(f"{o}\n" for o in options))
        (folder / "launch.json").write_text(json.dumps(launch, indent=2) + "\n")
        (folder / "variant.patch").write_text(patch_of(detail))
        (folder / "variant.json").write_text(json.dumps(meta, indent=2) + "\n")
    except OSError as exc:
        raise ExportError(f"cannot write the export to {folder}: {exc.strerror}") from exc
    return folder
