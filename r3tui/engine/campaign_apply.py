"""One campaign's winner written into a copy of an application's tree (``r3 apply``).

:func:`apply_campaign` splices the kernel's definition into the file that holds it, injects
its ``__launch_bounds__`` and register cap, bakes tunables into their ``#define`` where the
definition has one, and collects the rest (a block-size macro, tunables, compiler options)
for the flags file, which :func:`write_flags` writes and whose reach over the build's units
:func:`flag_scope` reports.  :class:`CampaignApply` says what was and was not applied, and why.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from r3tui.engine.campaign_winner import _Best
from r3tui.engine.splice import (
    EXACT_GRID,
    EXPORTS_DIR,
    SCALED_GRID,
    SHAPED_GRID,
    bake_define,
    block_macro,
    definition_span,
    find_unit,
    grid_launches,
    inject_maxnreg,
    reshape_reason,
    scale_launch_grids,
    splice_definition,
)

FLAGS_FILE = "r3-flags.txt"


@dataclass
class CampaignApply:
    """What ``r3 apply`` did with one campaign's winner: the file it edited, what it applied
    and what not (each with why), and, once measured, whether it ships."""

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
    recorded_block: tuple[int, int, int] | None = None
    try:
        bundle = Bundle.open(best.bundle_path)
        recorded_block = bundle.manifest.launch.block.as_tuple()
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
    # a block the host code does not take from a macro: its launches rewritten to it
    reshape: tuple[int, int, int] | None = None
    if best.block is not None:
        found = block_macro(text, best.kernel) or _launching_macro(best.kernel, tree, launcher)
        x, y, z = best.block
        if found is not None and y == 1 and z == 1:
            block_flag = (found[0], x)
        elif best.block != recorded_block:
            reshape = best.block
        max_threads = x * y * z  # every launch of the kernel takes that block
    from r3tui.engine.inner_loop import exact_axes
    from r3tui.search.source import grid_scaling

    divisors, multipliers = grid_scaling(best.source, best.tunables)
    # the launches to rewrite, when the winner's threads cover other than one element each
    # or it runs with a block the host code does not take from a macro: in the defining file
    # itself, or in the recorded unit that launches a header's kernel
    launches: Path | None = None
    launching: str | None = None
    if max(*divisors, *multipliers) > 1 or reshape is not None:
        launches = (_launching_unit(tree, launcher, units) if launcher is not None
                    else unit)
        # the launching unit's text when it is another file (read once: only ``text``, the
        # defining file's, changes below)
        launching = launches.read_text() if launches not in (None, unit) else None
        host = launching if launching is not None else text
        reason = ("the unit that launches it is not in the tree" if launches is None
                  else reshape_reason(host, best.kernel) if reshape is not None
                  else grid_launches(host, best.kernel)[1])
        if reason is not None and reshape is not None:
            x, y, z = reshape
            outcome.not_applied.append(
                f"nothing: its winner runs with block {x}x{y}x{z}, the host code does not "
                "take this kernel's block size from a #ifndef macro, and its launches cannot "
                f"be rewritten: {reason}; the rest of its configuration was measured only "
                "with that block")
            return outcome
        if reason is not None:
            per_thread = divisors[0] * divisors[1] * divisors[2]
            what = (f"covers {per_thread} elements a thread with a grid {per_thread} times "
                    "smaller" if per_thread > 1 else
                    f"shares each element among {multipliers[0] * multipliers[1] * multipliers[2]}"
                    " threads with a grid that many times larger")
            outcome.not_applied.append(
                f"nothing: its winner {what}, and its grid cannot be rescaled where the "
                f"application launches it: {reason}")
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
    if launches is not None:
        exact = exact_axes(best.source, best.kernel)
        scaled = scale_launch_grids(launching if launching is not None else text, best.kernel,
                                    multipliers, divisors, exact, block=reshape)
        assert scaled is not None, "grid_launches found every launch rewritable"
        if launches == unit:
            text = scaled[0]
        else:
            launches.write_text(scaled[0])
        where = str(launches.relative_to(tree))
        scaling = f"{'x'.join(map(str, multipliers))} / {'x'.join(map(str, divisors))}"
        stops = (f"a grid that does not divide along {', '.join(exact)}, where the kernel "
                 "never bounds its index, stops the program")
        if reshape is not None:
            outcome.applied.append(
                f"block {'x'.join(map(str, reshape))} at its {scaled[1]} launch(es) in "
                f"{where}, with the grid that covers the same threads"
                + ("" if max(*divisors, *multipliers) == 1 else f" scaled by {scaling}")
                + f" ({SHAPED_GRID} at the top of {where}"
                + (f"; {stops}" if exact else "") + ")")
        else:
            outcome.applied.append(
                f"grid of its {scaled[1]} launch(es) in {where} scaled by {scaling} "
                f"({SCALED_GRID} at the top of {where}"
                + (f"; {EXACT_GRID}: {stops}" if exact else "") + ")")
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


def _launching_unit(tree: Path, launcher: tuple[str, str | None],
                    units: dict[str, Path]) -> Path | None:
    """The file of ``tree`` that is the recorded unit ``launcher`` (its text and name), as an
    earlier campaign may have found (and edited) it already."""
    found = units.get(launcher[0]) or find_unit(tree, *launcher)
    if found is not None:
        units[launcher[0]] = found
    return found


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


# -- the flags file --------------------------------------------------------------------------
def write_flags(tree: Path, flags: dict[str, str], outcomes: list[CampaignApply]) -> list[str]:
    """The flags file written into ``tree`` from ``flags`` (as :func:`apply_campaign`
    collected them), and each campaign's flags that reach other kernels given their scope;
    where the build does not read the file, its flags are reported not applied.  Returns the
    flags as written."""
    flag_list = [_flag(k, v) for k, v in flags.items()]
    if flag_list:
        (tree / FLAGS_FILE).write_text(" ".join(flag_list) + "\n")
        if not _build_reads_flags(tree):
            for o in outcomes:
                flagged = [a for a in o.applied if FLAGS_FILE in a]
                o.applied = [a for a in o.applied if FLAGS_FILE not in a]
                o.not_applied += [f"{a}: the build does not read {FLAGS_FILE}" for a in flagged]
                o.whole_build = []
    for o in outcomes:
        o.flag_scope = [f"{flag}: {flag_scope(tree, o.file)}" for flag in o.whole_build]
    return flag_list


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
