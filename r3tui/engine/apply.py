"""``r3 apply CAMPAIGN... --into DIR``: write tuned kernels back into an application's tree.

For each campaign its best variant is exported the way ``r3 export`` does
(:func:`r3tui.engine.report.export_variant`, into ``DIR/r3-exports/campaign-N``), then applied
to a copy of the source tree:

- source: the kernel's definition from the variant's translation unit replaces the original
  definition in the tree's file (the file whose text is the campaign's original source);
- ``__launch_bounds__``: injected on the kernel's definition;
- launch configuration: a tuned block shape becomes ``-DMACRO=VALUE`` when the host code
  launches the kernel with a block size that is a ``#ifndef``-guarded macro; otherwise it is
  reported as not applied;
- compiler options and source tunables: written to ``r3-flags.txt``, which the build must read
  (the example Makefile does).  Options apply to every kernel of every unit the build compiles
  with that file, and each is reported so ("affects every kernel of main.cu"); when two
  campaigns of one unit disagree, the one first on the command line wins and the other is
  reported.

A campaign counts towards the predicted speedups (kernel time, and wall time with the
kernels' share of the recorded wall) only when everything its best configuration changed was
applied.  ``r3-apply.patch`` is a unified diff against the original tree; ``r3-apply.json``
says what was and was not applied, and why.

Unless ``--no-run``, both trees are built and measured in interleaved pairs
(:func:`r3tui.engine.app_run.measure`): each tuned kernel's own device time and all kernels'
(under the interposer, no snapshots), and the application's time key or wall time.  A
campaign ships only when its own kernel's device time is faster beyond the noise (the whole
95% interval above 1); the others are reverted by writing the tree again without them, and
when something still ships, that final tree is built and measured again, so the printed
figures are those of what ships.  When nothing ships, the figures are those of the tree
before reverting, and say so.  ``--no-run`` ships the patch unmeasured.

:mod:`r3tui.engine.campaign_winner` loads each campaign's winner and
:mod:`r3tui.engine.campaign_apply` writes one into the tree; this module copies the tree,
applies every campaign there, and writes the patch and the summary.
"""

from __future__ import annotations

import difflib
import json
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from r3tui.engine.app_recording import RecordingContext

# editing the tree and loading the winners lived here before: their names stay importable
from r3tui.engine.campaign_apply import FLAGS_FILE, CampaignApply, apply_campaign, write_flags
from r3tui.engine.campaign_winner import (
    Decision,
    _Best,
    campaign_decision,
    load_best,
    load_bests,
)
from r3tui.engine.prediction import WALL_BASIS, amdahl, app_wall_amdahl, kernel_fraction_of_wall
from r3tui.engine.splice import EXPORTS_DIR
from r3tui.errors import R3Error

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

__all__ = [
    "FLAGS_FILE",
    "ORIGINAL_SUFFIX",
    "PATCH_FILE",
    "SUMMARY_FILE",
    "ApplyResult",
    "CampaignApply",
    "Decision",
    "_Best",
    "apply_campaign",
    "apply_campaigns",
    "campaign_decision",
    "check_into",
    "load_best",
    "load_bests",
    "outcome_lines",
    "r3_output",
    "tree_ignore",
    "unified_patch",
    "write_summary",
    "write_tree",
]

PATCH_FILE = "r3-apply.patch"
SUMMARY_FILE = "r3-apply.json"
_BUILD_OUTPUTS = (".git", "*.o", "*.so", "*.a", "__pycache__", EXPORTS_DIR)


@dataclass
class ApplyResult:
    source_tree: str
    into: str
    campaigns: list[CampaignApply]
    flags: list[str]
    patch: str
    predicted_kernel_speedup: float | None
    predicted_wall_speedup: float | None = None
    kernel_fraction_of_wall: float | None = None
    # why the prediction may be far off: a shipped kernel's replayed launch does other work
    # than its other launches (RecordedConfig.other_work), or much of its time was not
    # re-timed where the rest gained unlike amounts (engine.transfer.uncertainty)
    prediction_other_work: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("patch")
        data["patch_file"] = PATCH_FILE
        data["wall_basis"] = WALL_BASIS
        return data


def unified_patch(original: Path, patched: Path) -> str:
    """A ``diff -ru``-style patch of text files that differ or were added."""
    chunks: list[str] = []
    for path in sorted(p for p in patched.rglob("*") if p.is_file()):
        rel = path.relative_to(patched)
        if rel.parts[0] in (EXPORTS_DIR, PATCH_FILE, SUMMARY_FILE) or ".git" in rel.parts:
            continue
        old_path = original / rel
        try:
            new = path.read_text()
            old = old_path.read_text() if old_path.is_file() else ""
        except UnicodeDecodeError:
            continue  # binaries: build outputs, not sources
        if old == new:
            continue
        chunks.append(
            "".join(
                difflib.unified_diff(
                    old.splitlines(keepends=True),
                    new.splitlines(keepends=True),
                    fromfile=f"a/{rel}" if old_path.is_file() else "/dev/null",
                    tofile=f"b/{rel}",
                )
            )
        )
    return "".join(chunks)


def check_into(source_tree: Path, into: Path) -> None:
    """``into`` may lie inside the source tree (``r3 apply 1 --into patched`` run there):
    every copy of the tree leaves it out (:func:`tree_ignore`)."""
    if not source_tree.is_dir():
        raise R3Error(f"source tree {source_tree} is not a directory")
    if into.exists() and not into.is_dir():
        raise R3Error(f"--into {into} exists and is not a directory",
                      hint="give a new directory to --into")
    if into.resolve() == source_tree.resolve():
        raise R3Error("--into must not be the source tree itself",
                      hint="give a new directory to --into")
    if into.exists() and any(into.iterdir()):
        raise R3Error(f"{into} exists and is not empty", hint="give a new directory to --into")


ORIGINAL_SUFFIX = ".original"  # r3 apply builds the original beside DIR, in DIR.original


def tree_ignore(*excluded: Path) -> Callable[[str, list[str]], set[str]]:
    """For ``shutil.copytree`` of an application's tree: build outputs, R³'s own
    directories (recordings, bundles, earlier ``r3 apply`` outputs and their originals) and
    the ``excluded`` directories (``--into`` and its original when they lie in the tree)."""
    patterns = shutil.ignore_patterns(*_BUILD_OUTPUTS)
    skip = {path.resolve() for path in excluded}

    def ignore(directory: str, names: list[str]) -> set[str]:
        ignored = set(patterns(directory, names))
        for name in names:
            path = Path(directory) / name
            if name in ignored or path.is_symlink() or not path.is_dir():
                continue
            if path.resolve() in skip or r3_output(path):
                ignored.add(name)
        return ignored

    return ignore


def r3_output(path: Path) -> bool:
    """Whether the directory is one R³ wrote: a recording (``recording.json``), a bundle
    (a manifest and its blobs), an ``r3 apply`` tree or its ``.original``, or a directory
    holding only such (``recordings/``)."""
    from r3tui.record.app_dump import RECORDING_NAME
    from r3tui.record.bundle import BLOB_DIR, MANIFEST_NAME

    if (path / RECORDING_NAME).is_file() or (path / SUMMARY_FILE).is_file():
        return True
    if (path / MANIFEST_NAME).is_file() and (path / BLOB_DIR).is_dir():
        return True
    if path.name.endswith(ORIGINAL_SUFFIX):
        applied = path.with_name(path.name[: -len(ORIGINAL_SUFFIX)])
        if (applied / SUMMARY_FILE).is_file():
            return True
    try:
        children = list(path.iterdir())
    except OSError:  # unreadable: copytree reports it, as it did before
        return False
    return bool(children) and all(
        child.is_dir() and not child.is_symlink() and r3_output(child) for child in children)


def apply_campaigns(
    s: Session,
    campaign_ids: list[int],
    source_tree: Path,
    into: Path,
    context: RecordingContext | None = None,
    include_noise: bool = False,
) -> ApplyResult:
    """Copy ``source_tree`` to ``into`` and apply every campaign there: its re-timed winner,
    and nothing when that winner is not faster than the original beyond the noise (unless
    ``include_noise``)."""
    check_into(source_tree, into)
    bests = load_bests(s, campaign_ids, into)
    return write_tree(bests, source_tree, into, context, include_noise)


def write_tree(
    bests: list[_Best],
    source_tree: Path,
    into: Path,
    context: RecordingContext | None = None,
    include_noise: bool = False,
    withheld: dict[int, str] | None = None,
) -> ApplyResult:
    """``into`` (empty, or holding only the exports) made a copy of ``source_tree`` with the
    campaigns applied, except those in ``withheld`` (campaign -> why), which are reported."""
    shutil.copytree(
        source_tree,
        into,
        ignore=tree_ignore(into, into.with_name(into.name + ORIGINAL_SUFFIX)),
        dirs_exist_ok=True,
        symlinks=True,
    )
    context = context or RecordingContext()
    flags: dict[str, str] = {}
    owners: dict[str, int] = {}
    outcomes = []
    units: dict[str, Path] = {}
    for best in bests:
        share = (context.shares or {}).get(best.campaign_id)
        outcome = apply_campaign(best, into, flags, owners, share, units, include_noise,
                                 (withheld or {}).get(best.campaign_id),
                                 context.max_threads.get(best.campaign_id))
        outcome.entry_point = _entry_point(best, context)
        outcomes.append(outcome)
    flag_list = write_flags(into, flags, outcomes)
    patch = unified_patch(source_tree, into)
    (into / PATCH_FILE).write_text(patch)
    parts = [
        (o.share, o.speedup)
        for o in outcomes
        if o.complete and o.share is not None and o.speedup is not None and o.speedup > 0
    ]
    # the unit's other kernels, where the campaign's options reached the build
    counted = {o.entry_point for o in outcomes if o.complete}
    for o, best in zip(outcomes, bests, strict=True):
        o.neighbours = list(best.neighbours) if o.complete and o.whole_build else []
        for entry, share, speedup in o.neighbours:
            if entry not in counted:
                counted.add(entry)
                parts.append((share, speedup))
    fraction = kernel_fraction_of_wall(context.kernel_time_s, context.wall_s)
    known = context.shares is not None
    result = ApplyResult(
        str(source_tree), str(into), outcomes, flag_list, patch,
        amdahl(parts) if known else None,
        app_wall_amdahl(parts, fraction) if known else None,
        fraction,
        [context.other_work[o.campaign_id] for o in outcomes
         if o.complete and o.campaign_id in context.other_work]
        + [best.uncertain for o, best in zip(outcomes, bests, strict=True)
           if o.complete and best.uncertain],
    )
    write_summary(into, result)
    return result


def write_summary(into: Path, result: ApplyResult, **extra: Any) -> None:
    (into / SUMMARY_FILE).write_text(json.dumps({**result.to_json(), **extra}, indent=2) + "\n")


def _entry_point(best: _Best, context: RecordingContext) -> str | None:
    """The kernel's lowered name: from recording.json, else from its bundle's manifest."""
    if best.campaign_id in context.entry_points:
        return context.entry_points[best.campaign_id]
    try:
        from r3tui.record.bundle import Bundle

        return Bundle.open(best.bundle_path).manifest.kernel.entry_point
    except Exception:  # the bundle may live on another node
        return None


# -- what r3 apply prints ---------------------------------------------------------------------
def outcome_lines(result: ApplyResult) -> list[str]:
    lines = []
    for o in result.campaigns:
        lines.append(f"campaign {o.campaign_id} ({o.kernel}) -> {o.file or '?'}")
        lines += [f"  applied: {line}" for line in o.applied]
        lines += [f"  not applied: {line}" for line in o.not_applied]
        lines += [f"  flag {line}" for line in o.flag_scope]
    return lines
