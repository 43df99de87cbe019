"""The prompt for one mutation: the parent, what it measured, a few inspirations, one change.

Templates are text files in ``prompts/`` (``string.Template``, ``$name`` placeholders, so the
braces of CUDA code need no escaping), loaded with :mod:`importlib.resources` so they work from
a wheel.  The prompt is short and concrete: a small model follows one named change far better
than a general request, and every token of prompt is a token less for the answer.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from string import Template

from r3tui.remix.backends import ChatMessage
from r3tui.remix.catalogue import Transformation
from r3tui.remix.edits import base_name, find_kernel

EDIT_FORMATS = ("search_replace", "whole")
MAX_INSPIRATIONS = 3
_WARNING_CHARS = 300


@dataclass(frozen=True)
class VariantProfile:
    """What the parent measured, as far as it is known (``None``: not measured)."""

    median_s: float | None = None
    registers: int | None = None
    spills_bytes: int | None = None
    occupancy: float | None = None  # 0..1, achieved or theoretical
    shared_mem_bytes: int | None = None
    achieved_fraction: float | None = None  # of the GPU's ceiling below
    ceiling: str | None = None  # "bandwidth" | "FLOP/s"
    compile_warnings: str | None = None


@dataclass(frozen=True)
class Inspiration:
    """A variant from the archive shown to the model for ideas."""

    source: str
    median_s: float | None = None


@dataclass(frozen=True)
class MutationContext:
    kernel_name: str
    parent_source: str
    profile: VariantProfile | None = None
    inspirations: tuple[Inspiration, ...] = ()
    transformation: Transformation | None = None  # None: the mutator picks one
    edit_format: str | None = None  # "search_replace" | "whole"; None: the mutator's setting
    # Whether a source is already a variant of the campaign: rules then try their next
    # transformation instead of proposing a duplicate (None: every source counts as new).
    is_known: Callable[[str], bool] | None = None
    # An application's kernel (a device unit): the model is shown the kernel and the device
    # code it reaches, within ``view_chars``, and a change outside the kernel's definition is
    # refused, since ``r3 apply`` writes back only that definition.
    confined: bool = False
    # the host code computes the grid in a way r3 apply cannot rescale (an application's
    # kernel launched other than by `<<<grid, ...>>>`): no rule whose variant needs another
    # grid is offered
    grid_fixed: bool = False
    # the recorded work is as wide along x as along y: a rule whose variant computes what the
    # original computes at the transposed launch (SQUARE_WORK_RULES: swap_xy) covers it only
    # then, so it is offered only then (the engine sets it from the recording's work)
    square_work: bool = False
    view_chars: int = 8000
    # The parent is the model's own change, which failed as this says (the compiler's first
    # error, or the verification's mismatch): the model is asked to fix it (a repair turn).
    repair: str | None = None
    # a repair's format example: the transformation's worked one ("worked", as campaigns
    # recorded before session 33 asked), or the generic one ("generic"), whose names a small
    # model cannot copy into the kernel (Qwen2.5-Coder-1.5B's first repair on reduce_sum
    # used the worked example's `buf`)
    repair_example: str = "worked"
    # the worked example's own names: "apart" (since session 37: a name it declares that the
    # kernel also uses is renamed, :func:`apart`) or "as_written" (as campaigns recorded before
    # asked)
    example_names: str = "apart"
    # transformation names, the one to try first first (the campaign's bandit); None: the
    # mutator's generator picks (r3tui.search.bandit)
    preference: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.edit_format is not None and self.edit_format not in EDIT_FORMATS:
            raise ValueError(f"edit_format must be one of {EDIT_FORMATS}, not {self.edit_format!r}")


@functools.cache
def template(name: str) -> Template:
    """``prompts/<name>.txt`` as a template."""
    text = resources.files("r3tui.remix").joinpath("prompts", f"{name}.txt").read_text("utf-8")
    return Template(text)


def format_seconds(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if seconds < 1.0:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def describe_profile(profile: VariantProfile | None) -> str:
    """One line of measurements (and one of compiler warnings), or nothing."""
    if profile is None:
        return ""
    parts = []
    if profile.median_s is not None:
        parts.append(f"median time {format_seconds(profile.median_s)}")
    if profile.registers is not None:
        parts.append(f"{profile.registers} registers per thread")
    if profile.spills_bytes is not None:
        parts.append(
            "no register spills" if profile.spills_bytes == 0 else
            f"{profile.spills_bytes} bytes of register spills"
        )  # fmt: skip
    if profile.occupancy is not None:
        parts.append(f"occupancy {profile.occupancy:.0%}")
    if profile.shared_mem_bytes:
        parts.append(f"{profile.shared_mem_bytes} bytes of shared memory")
    if profile.achieved_fraction is not None:
        ceiling = profile.ceiling or "peak"
        parts.append(f"{profile.achieved_fraction:.0%} of the GPU's {ceiling} ceiling")
    text = f"Measured: {', '.join(parts)}.\n" if parts else ""
    if profile.compile_warnings and profile.compile_warnings.strip():
        warnings = " ".join(profile.compile_warnings.split())
        if len(warnings) > _WARNING_CHARS:
            warnings = warnings[:_WARNING_CHARS] + "..."
        text += f"Compiler warnings: {warnings}\n"
    return text


def _code(source: str) -> str:
    text = source.replace("\r\n", "\n").replace("\r", "\n")
    return text if text.endswith("\n") else text + "\n"


def _inspiration_code(source: str, kernel_name: str) -> str:
    """The inspiration's kernel function only: the rest the model already has from the parent."""
    text = _code(source)
    span = find_kernel(text, kernel_name)
    return _code(text[span.start : span.body_end]) if span is not None else text


def describe_inspirations(inspirations: Sequence[Inspiration], kernel_name: str) -> str:
    blocks = []
    for inspiration in list(inspirations)[:MAX_INSPIRATIONS]:
        median = (
            f"median {format_seconds(inspiration.median_s)}"
            if inspiration.median_s is not None
            else "not timed"
        )
        code = _inspiration_code(inspiration.source, kernel_name)
        blocks.append(template("inspiration").substitute(median=median, source=code))
    return "".join(blocks)


CONFINED_NOTE = (" Change only the definition of `{kernel}`; the code around it is shown for "
                 "reference and stays as it is.")
# shown where a transformation has no worked example of its own
GENERIC_EXAMPLE = ("    float v = a[i];", "    float v = __ldg(&a[i]);")
REPAIR_NOTE = ("The kernel below is your change for this task: {instruction} It failed: "
               "{failure}. Fix that failure, keep the change, and change nothing else.")
REPAIR_CHARS = 600  # of the failure shown to the model
# the compiler's first error names its line: "kernel.cu(38): error: ..." (NVRTC and nvcc)
_ERROR_LINE = re.compile(r"\((\d+)\): (?:catastrophic )?error")


def quote_error_line(failure: str, source: str) -> str:
    """The failure with the line its compiler error names quoted from ``source`` (the kernel
    that failed, as compiled): a small model cannot count to line 38 (session 33: 0 of 4
    repairs compiled, one for an error on a line it had duplicated after the kernel).  The
    campaign records the failure with its quote (the variant's ``repair`` feature), so a
    re-run from recorded answers asks the very prompt it recorded."""
    found = _ERROR_LINE.search(failure)
    lines = _code(source).splitlines()
    if found is None or not 1 <= int(found.group(1)) <= len(lines):
        return failure
    line = lines[int(found.group(1)) - 1].strip()
    return f"{failure} (line {found.group(1)} is `{line}`)" if line else failure


def shown_source(ctx: MutationContext) -> str:
    """The parent as the model sees it: whole, or for an application's kernel the kernel and
    the device code it reaches (never host code), sized to ``ctx.view_chars``."""
    if not ctx.confined:
        return ctx.parent_source
    from r3tui.analysis.device_unit import kernel_view

    return kernel_view(ctx.parent_source, base_name(ctx.kernel_name), ctx.view_chars).text


def apart(example: tuple[str, str], kernel_source: str) -> tuple[str, str]:
    """``example`` (before, after) with each name it declares that the kernel also uses
    renamed (``acc`` -> ``acc2``), the names of both sides alike: a small model copies the
    example's declarations, and one of a name the kernel has is declared twice (Qwen2.5-Coder
    on nbody, whose output is the parameter ``acc``: 4 of 11 answers, session 37)."""
    from r3tui.analysis.body import declared_names
    from r3tui.analysis.facts import words

    before, after = example
    used = words(kernel_source)
    taken = used | words(before) | words(after)
    for name in sorted((declared_names(before) | declared_names(after)) & used):
        k = 2
        while f"{name}{k}" in taken:
            k += 1
        taken.add(f"{name}{k}")
        pattern = re.compile(rf"\b{re.escape(name)}\b")
        before, after = (pattern.sub(f"{name}{k}", before), pattern.sub(f"{name}{k}", after))
    return before, after


def build_messages(ctx: MutationContext) -> list[ChatMessage]:
    """The system and user messages asking for ``ctx.transformation`` on the parent."""
    if ctx.transformation is None:
        raise ValueError("a prompt needs a transformation; the mutator picks one")
    instruction = ctx.transformation.instruction
    if ctx.repair is not None:
        failure = " ".join(ctx.repair.split())[:REPAIR_CHARS]
        instruction = REPAIR_NOTE.format(instruction=instruction, failure=failure)
    if ctx.confined:
        instruction += CONFINED_NOTE.format(kernel=ctx.kernel_name)
    before, after = ctx.transformation.example or GENERIC_EXAMPLE
    worked = ctx.transformation.example is not None
    if ctx.repair is not None and ctx.repair_example == "generic":
        (before, after), worked = GENERIC_EXAMPLE, False
    shown = shown_source(ctx)
    if ctx.example_names == "apart":
        before, after = apart((before, after), shown)
    user = template(ctx.edit_format or "search_replace").substitute(
        kernel_name=ctx.kernel_name,
        source=_code(shown),
        profile=describe_profile(ctx.profile),
        inspirations=describe_inspirations(ctx.inspirations, ctx.kernel_name),
        instruction=instruction,
        example_lead="this change in another kernel" if worked else "a change of another kind",
        example_before=before.rstrip("\n"),
        example_after=after.rstrip("\n"),
    )
    system = template("system").substitute().strip()
    return [ChatMessage("system", system), ChatMessage("user", user.strip() + "\n")]
