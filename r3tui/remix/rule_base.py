"""What every rule operator shares: its result, how it declines, the kernel it edits, and the
check that a rewrite keeps the kernel's entry point (:mod:`r3tui.remix.rules` has the
operators' registry)."""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass

import tree_sitter as ts

from r3tui.analysis.body import kernel_body, pointer_uses
from r3tui.analysis.kernels import Parsed
from r3tui.analysis.per_thread import Unsupported
from r3tui.analysis.text import mask
from r3tui.remix.edits import KernelSpan, entry_point_problem, find_kernel


@dataclass(frozen=True)
class RuleResult:
    ok: bool
    source: str | None
    reason: str | None = None  # why the rule declined
    detail: str | None = None  # what it changed, for the variant's operator note


Rule = Callable[[str, str, random.Random], RuleResult]


def declined(reason: str) -> RuleResult:
    """A rule's answer where it does not apply, with the reason."""
    return RuleResult(False, None, reason)


def restructured(rewrite: Callable[[str, str, random.Random], tuple[str, str]], source: str,
                 kernel_name: str, rng: random.Random) -> RuleResult:
    """The answer of a rule whose module rewrites from the parse (coarsen, split, tile,
    stream): its new source and what changed, or declined with the reason it raised
    (:class:`~r3tui.analysis.per_thread.Unsupported`, each module's ``Declined``)."""
    try:
        out, detail = rewrite(source, kernel_name, rng)
    except Unsupported as exc:
        return declined(str(exc))
    return finish(source, out, kernel_name, detail)


def kernel_span(source: str, kernel_name: str) -> KernelSpan | RuleResult:
    """The kernel's definition, or the rule declining where the source has none."""
    span = find_kernel(source, kernel_name)
    if span is None:
        return declined(f"no __global__ function {kernel_name!r} is defined in the source")
    return span


def finish(parent: str, child: str, kernel_name: str, detail: str) -> RuleResult:
    """A rule's new source, declined where it would change the entry point the replay
    calls."""
    problem = entry_point_problem(parent, child, kernel_name)
    if problem:  # a rule that breaks the entry point is a bug in the rule; decline anyway
        return declined(f"the rewrite would break the kernel: {problem}")
    return RuleResult(True, child, None, detail)


def kernel_body_text(source: str, kernel_name: str
                     ) -> tuple[KernelSpan, str, int, str] | RuleResult:
    """The kernel's span, the masked source, where its body starts and the masked body (or
    why the rule declines: no such kernel)."""
    span = kernel_span(source, kernel_name)
    if isinstance(span, RuleResult):
        return span
    masked = mask(source)
    body_start = span.body_open + 1
    return span, masked, body_start, masked[body_start:span.body_end - 1]


def from_block_index(before: str, name: str, depth: int = 3) -> bool:
    """Whether ``name``'s initializer in ``before`` reads ``blockIdx``, itself or through the
    variables it is computed from (``i = block * nthreads + tid``, ``block = blockIdx.x +
    ...``)."""
    found = re.search(rf"(?<![\w.]){re.escape(name)}\s*=(?!=)(?P<init>[^;]*);", before)
    if found is None or depth == 0:
        return False
    init = found.group("init")
    if "blockIdx" in init:
        return True
    return any(from_block_index(before[:found.start()], other, depth - 1)
               for other in set(re.findall(r"(?<![\w.])[A-Za-z_]\w*", init)) - {name})


def matching_brace(text: str, at: int) -> int | None:
    """The index of the ``}`` closing the ``{`` at ``at`` (in masked text), or None."""
    depth = 0
    for k in range(at, len(text)):
        if text[k] == "{":
            depth += 1
        elif text[k] == "}":
            depth -= 1
            if depth == 0:
                return k
    return None


def brace_depth(text: str, at: int) -> int:
    return text.count("{", 0, at) - text.count("}", 0, at)


def defined_kernel(source: str, kernel_name: str) -> tuple[ts.Node, Parsed, KernelSpan]:
    """The body of the kernel's definition, the parse it is in and its span, for the rules
    that read the parse; :class:`~r3tui.analysis.per_thread.Unsupported` (their ``Declined``)
    where the source defines no such kernel."""
    found = kernel_body(source, kernel_name)
    span = find_kernel(source, kernel_name)
    if found is None or span is None:
        raise Unsupported(f"no __global__ function {kernel_name!r} is defined in the source")
    body, parsed = found
    return body, parsed, span


def read_only_arrays(source: str, span: KernelSpan, element: Callable[[str], bool],
                     through_ldg: bool = False) -> dict[str, str]:
    """Name -> element type of the kernel's pointer parameters (one ``*``) whose element type
    ``element`` accepts and whose every use is an element read (``through_ldg``: reads made
    through ``__ldg(&p[i])`` count as such too)."""
    return {p.name: p.element_type for p in span.params
            if p.name and p.type_tokens.count("*") == 1 and element(p.element_type)
            and all(u.kind == "read" and (through_ldg or not u.in_ldg)
                    for u in pointer_uses(source, span.name, p.name))}
