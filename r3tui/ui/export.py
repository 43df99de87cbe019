"""Exporting a variant: the TUI's ``e`` is ``r3 export``, in a child process.

One format for both: the TUI runs ``python -m r3tui export CAMPAIGN --variant ID --out
DIR/variant-ID`` (``r3tui.engine.report.export_variant``, which needs the search and engine
layers the UI must not import), so the folder holds what ``r3 export`` writes: ``KERNEL.cu``,
``options.txt``, ``launch.json``, ``KERNEL.patch`` (against the original) and, for a kernel
of an application's unit, ``application.patch`` (docs/tui.md).
"""

from __future__ import annotations

import difflib
import subprocess
import sys
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


def export_argv(
    db: Path, campaign_id: int, variant_id: int, out: Path, python: str = sys.executable
) -> list[str]:
    return [python, "-m", "r3tui", "export", str(campaign_id), "--variant", str(variant_id),
            "--out", str(out), "--db", str(db)]


def export_variant(db: Path, campaign_id: int, variant_id: int, root: Path) -> Path:
    """Write the variant's files under ``root/variant-<id>`` with ``r3 export``; returns that
    folder, or raises ExportError with the command's own one-line reason."""
    folder = root / f"variant-{variant_id}"
    argv = export_argv(db, campaign_id, variant_id, folder)
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ExportError(f"cannot run r3 export: {exc}") from exc
    if done.returncode != 0:
        lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
        reason = lines[-1].strip() if lines else f"exit status {done.returncode}"
        raise ExportError(f"cannot export variant {variant_id}: {reason}")
    return folder
