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
"""

from __future__ import annotations

import difflib
import json
import re
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from r3tui.domain import TrialConfig
from r3tui.engine.application import RecordingContext
from r3tui.engine.splice import (
    EXPORTS_DIR,
    bake_define,
    block_macro,
    definition_span,
    find_unit,
    inject_maxnreg,
    splice_definition,
)
from r3tui.errors import R3Error

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

FLAGS_FILE = "r3-flags.txt"
PATCH_FILE = "r3-apply.patch"
SUMMARY_FILE = "r3-apply.json"
_BUILD_OUTPUTS = (".git", "*.o", "*.so", "*.a", "__pycache__", EXPORTS_DIR)


@dataclass
class CampaignApply:
    campaign_id: int
    kernel: str
    file: str | None = None
    applied: list[str] = field(default_factory=list)
    not_applied: list[str] = field(default_factory=list)
    speedup: float | None = None
    share: float | None = None
    entry_point: str | None = None  # the kernel's lowered name, as the interposer sees it
    whole_build: list[str] = field(default_factory=list)  # its flags that reach other kernels
    flag_scope: list[str] = field(default_factory=list)  # which kernels those flags affect
    # the unit's other kernels its options reach, as tune-app measured them with and without
    # those options: (entry point, share, speedup), counted in the prediction
    neighbours: list[tuple[str, float, float]] = field(default_factory=list)
    measured: dict[str, Any] | None = None  # its own kernel's device time, original/patched
    shipped: bool | None = None  # None: not measured (--no-run, or nothing applied)

    @property
    def complete(self) -> bool:
        return self.file is not None and not self.not_applied


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

    def to_json(self) -> dict[str, Any]:
        from r3tui.engine.application import WALL_BASIS

        data = asdict(self)
        data.pop("patch")
        data["patch_file"] = PATCH_FILE
        data["wall_basis"] = WALL_BASIS
        return data


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
    )


# -- editing the tree ----------------------------------------------------------------------
def apply_campaign(
    best: _Best,
    tree: Path,
    flags: dict[str, str],
    option_owner: dict[str, int],
    share: float | None,
    units: dict[str, Path],
    include_noise: bool = False,
    withheld: str | None = None,
    max_threads: int | None = None,
) -> CampaignApply:
    """Apply one campaign's best variant to ``tree`` in place; ``flags`` (flag -> owner text)
    and ``option_owner`` collect what goes into the flags file; ``units`` remembers which file
    held which recorded source, since an earlier campaign may already have edited it.
    ``withheld``: why nothing of it is applied (it was measured and not shipped).
    ``max_threads``: the most threads per block the application launched the kernel with.

    The winner's configuration was measured as a whole: when its block shape cannot be set
    in the host code, or its ``__launch_bounds__`` is below a block the application launches,
    nothing of it is applied (a part of it is a combination nobody measured, and bounds
    below the block make those launches fail while the application runs on)."""
    from r3tui.analysis import check_candidate
    from r3tui.engine.unit_source import defining_file, seed_unit
    from r3tui.errors import KernelNotFound
    from r3tui.record.bundle import Bundle
    from r3tui.search import inject_launch_bounds

    outcome = CampaignApply(best.campaign_id, best.kernel, share=share,
                            speedup=best.kernel_speedup or best.speedup)
    if withheld is not None:
        outcome.not_applied += [withheld] if withheld else []
        return outcome
    if best.unsafe is not None:
        outcome.not_applied.append(f"nothing: {best.unsafe}")
        return outcome
    if best.noise is not None and not include_noise:
        # Amdahl without this kernel is the kernel unchanged: the prediction stays honest
        outcome.not_applied.append(f"nothing: {best.noise} (--include-noise applies it)")
        return outcome
    # the file to edit: the recorded source, or for a campaign on an application's device
    # unit the header or unit that defines the kernel (only the definition is written back);
    # `launcher`: the recorded unit, where the launches are, when that is another file
    hint, defining = None, best.original
    launcher: tuple[str, str | None] | None = None
    try:
        bundle = Bundle.open(best.bundle_path)
        sources = bundle.manifest.kernel.sources
        hint = sources[0].name if sources else None
        seed = seed_unit(bundle)
        found = defining_file(bundle, seed) if seed.source.text == best.original else None
        if found is not None:
            if seed.unit is not None and seed.unit.file is not None:
                launcher = (seed.recorded_text, hint)
            hint, defining = found
    except Exception:  # the bundle may live on another node: the tree text still identifies it
        hint = None
    unit = units.get(defining) or find_unit(tree, defining, hint)
    if unit is None:
        outcome.not_applied.append("source: no file in the tree holds the recorded source")
        return outcome
    units[defining] = unit
    outcome.file = str(unit.relative_to(tree))
    text = unit.read_text()
    block_flag = None
    if best.block is not None:
        found = block_macro(text, best.kernel) or _launching_macro(best.kernel, tree, launcher)
        x, y, z = best.block
        if found is None or y != 1 or z != 1:
            outcome.not_applied.append(
                f"nothing: its winner runs with block {x}x{y}x{z}, and the host code does not "
                "take this kernel's block size from a #ifndef macro"
                + ("" if found is None else " (and it is not 1-D)")
                + "; the rest of its configuration was measured only with that block")
            return outcome
        block_flag = (found[0], x)
        max_threads = x  # every launch of the kernel takes its block from that macro
    from r3tui.search.source import work_divisor, work_multipliers

    per_thread = work_divisor(best.source, best.tunables)
    sharing = work_multipliers(best.source, best.tunables)
    if per_thread > 1 or max(sharing) > 1:
        what = (f"covers {per_thread} elements a thread with a grid {per_thread} times smaller"
                if per_thread > 1 else
                f"shares each element among {sharing[0] * sharing[1] * sharing[2]} threads "
                "with a grid that many times larger")
        outcome.not_applied.append(
            f"nothing: its winner {what}, and the application's host code computes the grid")
        return outcome
    if best.shared_mem_bytes is not None:  # a tiled winner's `// r3: shared` size
        outcome.not_applied.append(
            f"nothing: its winner launches with {best.shared_mem_bytes} bytes of dynamic shared "
            "memory, and the application's host code sets the launch's")
        return outcome
    if best.launch_bounds is not None and max_threads and best.launch_bounds[0] < max_threads:
        outcome.not_applied.append(
            f"nothing: its winner's __launch_bounds__({best.launch_bounds[0]}) is below the "
            f"{max_threads} threads per block the application launches this kernel with "
            "(those launches would fail)")
        return outcome
    refusal = (check_candidate(best.original, best.source)
               if best.source != best.original else None)
    if refusal is not None and refusal.refused:
        # only a kernel definition is spliced, but nothing a model wrote that could run on
        # the host goes into a tree that is built and run (docs/verification.md)
        outcome.not_applied.append(f"source: refused as unsafe: {refusal.reason}")
    elif best.source != best.original:
        spliced = splice_definition(text, best.source, best.kernel)
        if spliced is None:
            outcome.not_applied.append("source: kernel definition not found uniquely")
        else:
            text = spliced
            outcome.applied.append("source: kernel definition replaced")
    if best.launch_bounds is not None:
        threads, blocks = best.launch_bounds
        span = definition_span(text, best.kernel)
        try:
            if span is None:
                raise KernelNotFound(f"no unique definition of {best.kernel} in {outcome.file}")
            # on the kernel's own definition: a same-named kernel elsewhere keeps its bounds
            start, end = span
            bounded = inject_launch_bounds(text[start:end], best.kernel, threads, blocks or None)
            text = text[:start] + bounded + text[end:]
            outcome.applied.append(f"__launch_bounds__({threads}, {blocks})")
        except KernelNotFound as exc:
            outcome.not_applied.append(f"__launch_bounds__: {exc}")
    options = _options(best, outcome)
    registers = dict(options).get("maxrregcount")
    if registers is not None:
        # a register cap for this kernel alone, where CUDA allows it: -maxrregcount in the
        # flags file would reach every kernel of the unit
        span = definition_span(text, best.kernel)
        capped = (inject_maxnreg(text[span[0]:span[1]], best.kernel, int(registers))
                  if span is not None else None)
        if span is not None and capped is not None:
            text = text[:span[0]] + capped + text[span[1]:]
            options = [o for o in options if o[0] != "maxrregcount"]
            outcome.applied.append(f"__maxnreg__({registers}) on {best.kernel} (this kernel only, "
                                   "instead of -maxrregcount for the whole unit)")
    baked: set[str] = set()
    for key, value in sorted(best.tunables.items()):
        # a tunable whose guarded #define lies in the kernel's definition (a rule's unroll
        # factor) gets its value there: no flag, and no build that must read one
        span = definition_span(text, best.kernel)
        written = bake_define(text[span[0]:span[1]], key, str(value)) if span else None
        if span is not None and written is not None:
            text = text[:span[0]] + written + text[span[1]:]
            baked.add(key)
            outcome.applied.append(f"tunable {key}={value} (its #define in {best.kernel})")
    unit.write_text(text)
    if block_flag is not None:
        _add_flag(flags, option_owner, f"-D{block_flag[0]}=", str(block_flag[1]), best, outcome,
                  "block")
    for key, value in sorted(best.tunables.items()):
        if key not in baked:
            _add_flag(flags, option_owner, f"-D{key}=", str(value), best, outcome, "tunable")
    if options:
        from r3tui.compile.options import render

        for (name, _), token in zip(options, render("nvcc", tuple(options)), strict=True):
            _add_flag(flags, option_owner, f"option:{name}", token, best, outcome, "option")
    return outcome


def _launching_macro(kernel: str, tree: Path, launcher: tuple[str, str | None] | None
                     ) -> tuple[str, str] | None:
    """For a kernel defined in a header: the block-size macro of its launches in the recorded
    unit (``launcher``: its recorded text and name), where the host code is."""
    if launcher is None:
        return None
    unit = find_unit(tree, *launcher)
    return block_macro(unit.read_text(), kernel) if unit is not None else None


def _options(best: _Best, outcome: CampaignApply) -> list[tuple[str, str]]:
    """The winner's compiler options as nvcc's canonical (name, value) pairs; what cannot
    ship is reported in ``outcome``."""
    if not best.options:
        return []
    if best.toolchain not in (None, "nvcc", "nvrtc"):  # NVRTC's spelling is nvcc's
        outcome.not_applied.append(
            f"options {' '.join(best.options)}: found with {best.toolchain}, not nvcc")
        return []
    from r3tui.compile.options import canonicalize
    from r3tui.errors import ConfigError

    try:
        return list(canonicalize("nvcc", best.options))
    except ConfigError as exc:
        outcome.not_applied.append(f"options {' '.join(best.options)}: {exc}")
        return []


def _add_flag(
    flags: dict[str, str],
    owner: dict[str, int],
    key: str,
    value: str,
    best: _Best,
    outcome: CampaignApply,
    what: str,
) -> None:
    """One flag of the shared flags file; a clash with an earlier campaign's value is
    reported, not applied (the unit has one command line)."""
    flag = value if key.startswith("option:") else key + value
    if key in flags and flags[key] != value:
        outcome.not_applied.append(
            f"{what} {flag}: campaign {owner[key]} already set {_flag(key, flags[key])}"
        )
        return
    flags[key] = value
    owner.setdefault(key, best.campaign_id)
    outcome.applied.append(f"{what} {flag} (in {FLAGS_FILE})")
    if what in ("option", "tunable"):  # a block macro is named for this kernel's launches
        outcome.whole_build.append(flag)


def _flag(key: str, value: str) -> str:
    return value if key.startswith("option:") else key + value


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


def load_bests(s: Session, campaign_ids: list[int], into: Path) -> list[_Best]:
    return [load_best(s, campaign_id, into / EXPORTS_DIR) for campaign_id in campaign_ids]


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
    from r3tui.engine.application import amdahl, app_wall_amdahl, kernel_fraction_of_wall

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
    flag_list = [_flag(k, v) for k, v in flags.items()]
    if flag_list:
        (into / FLAGS_FILE).write_text(" ".join(flag_list) + "\n")
        if not _build_reads_flags(into):
            for o in outcomes:
                flagged = [a for a in o.applied if FLAGS_FILE in a]
                o.applied = [a for a in o.applied if FLAGS_FILE not in a]
                o.not_applied += [f"{a}: the build does not read {FLAGS_FILE}" for a in flagged]
                o.whole_build = []
    for o in outcomes:
        o.flag_scope = [f"{flag}: {flag_scope(into, o.file)}" for flag in o.whole_build]
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


def build_units(tree: Path) -> list[Path]:
    """The tree's ``.cu`` files that no other ``.cu`` file includes: the units a build
    compiles on their own."""
    cu = sorted(p for p in tree.rglob("*.cu")
                if p.is_file() and EXPORTS_DIR not in p.relative_to(tree).parts)
    texts = {p: p.read_text(errors="replace") for p in cu}
    return [p for p in cu
            if not any(q != p and re.search(rf'#\s*include\s*["<][^">]*\b{re.escape(p.name)}[">]',
                                            texts[q]) for q in cu)]


def flag_scope(tree: Path, defining: str | None) -> str:
    """Which kernels a flag of the flags file reaches, for a kernel defined in ``defining``
    (a path relative to ``tree``)."""
    units = build_units(tree)
    names = [str(u.relative_to(tree)) for u in units]
    if len(units) <= 1:
        return f"affects every kernel of {names[0] if names else defining or 'the unit'}"
    own = [str(u.relative_to(tree)) for u in units
           if defining is not None and (str(u.relative_to(tree)) == defining or
                                        Path(defining).name in u.read_text(errors="replace"))]
    where = (f"; the build compiles {len(units)} units separately, so it could be limited to "
             f"{' and '.join(own)}'s compile line") if own else ""
    return (f"affects every kernel of every unit built with {FLAGS_FILE} "
            f"({', '.join(names)}){where}")


def _build_reads_flags(tree: Path) -> bool:
    for name in ("Makefile", "makefile", "GNUmakefile", "CMakeLists.txt"):
        build = tree / name
        if build.is_file() and FLAGS_FILE in build.read_text(errors="replace"):
            return True
    return False


# -- what r3 apply prints ---------------------------------------------------------------------
def outcome_lines(result: ApplyResult) -> list[str]:
    lines = []
    for o in result.campaigns:
        lines.append(f"campaign {o.campaign_id} ({o.kernel}) -> {o.file or '?'}")
        lines += [f"  applied: {line}" for line in o.applied]
        lines += [f"  not applied: {line}" for line in o.not_applied]
        lines += [f"  flag {line}" for line in o.flag_scope]
    return lines
