"""Deterministic source operators: the catalogue's mechanical changes, made without a model.

Every operator is ``(source, kernel_name, rng) -> RuleResult``.  It either declines with a
reason (``ok=False``: not applicable to this kernel, recorded as ``apply_failed``) or returns a
source that keeps the kernel's entry point and parameter types; whether the change is correct
for the recorded data is for the replay to verify, as for any variant.  The ``rng`` picks among
the places and values an operator could use, so a campaign's seed fixes what it does.

The analysis reads the parse (:mod:`r3tui.analysis.body`) and is conservative: a pointer
parameter counts as "only read" when every use of it is an element read ``p[...]`` (through
``__ldg`` too) or initializes a ``const`` pointer; anything else (``*p``, ``&p[i]``, ``p + i``
passed to a call, code the parser could not read) counts as a write.

This module holds the small operators and the registry (:data:`RULES`); those that restructure
a kernel have modules of their own: :mod:`~r3tui.remix.stride` (grid-stride loops, strided
accumulation), :mod:`~r3tui.remix.vector`, :mod:`~r3tui.remix.coarsen`,
:mod:`~r3tui.remix.split`, :mod:`~r3tui.remix.tile`, :mod:`~r3tui.remix.stream` and
:mod:`~r3tui.remix.swap`, on :mod:`~r3tui.remix.rule_base`.
"""

from __future__ import annotations

import random
import re

from r3tui.analysis.body import (
    PointerUse,
    body_identifiers,
    for_loops,
    pointer_uses,
    scalar_aliases,
)
from r3tui.analysis.per_thread import declared_at_assignment, index_named
from r3tui.analysis.text import mask
from r3tui.errors import ConfigError
from r3tui.remix.coarsen import coarsen as coarsen_kernel
from r3tui.remix.edits import KernelSpan
from r3tui.remix.rule_base import (
    Rule,
    RuleResult,
    declined,
    finish,
    kernel_span,
    restructured,
)
from r3tui.remix.split import split_loop as split_kernel_loop
from r3tui.remix.stream import stream as stream_kernel
from r3tui.remix.stride import grid_stride, strided_accumulate
from r3tui.remix.swap import swap_axes
from r3tui.remix.tile import tile_loop
from r3tui.remix.vector import vector_access

# Element types __ldg has an overload for (sm_35 and later).
LDG_TYPES = frozenset(
    {
        "char", "signed char", "unsigned char", "short", "unsigned short", "int",
        "unsigned int", "unsigned", "long", "unsigned long", "long long",
        "unsigned long long", "float", "double", "char2", "char4", "uchar2", "uchar4",
        "short2", "short4", "ushort2", "ushort4", "int2", "int4", "uint2", "uint4",
        "longlong2", "ulonglong2", "float2", "float4", "double2",
    }
)  # fmt: skip


def read_only_pointers(source: str, span: KernelSpan) -> list[str]:
    """Names of the kernel's pointer parameters that the body reads and never writes."""
    names = []
    for param in span.params:
        if param.is_pointer and param.name:
            uses = pointer_uses(source, span.name, param.name)
            # An unused parameter is not "read": qualifying it would change nothing.
            if uses and all(use.kind != "other" for use in uses):
                names.append(param.name)
    return names


# ----------------------------------------------------------------------------------------
# The rules


def restrict_const(source: str, kernel_name: str, rng: random.Random) -> RuleResult:
    """``const T* __restrict__`` on every pointer parameter the kernel only reads; with C++
    linkage ``__restrict__`` alone, since the pointee's ``const`` would change the kernel's
    mangled name, the symbol the application launches (``__ldg`` gives the read-only loads)."""
    span = kernel_span(source, kernel_name)
    if isinstance(span, RuleResult):
        return span
    if span.declarations and span.extern_c:
        # a pointee's const would differ from the prototype's (__restrict__ alone, a top-level
        # qualifier of the parameter, is not part of the function's type)
        return declined("the kernel is also declared elsewhere; qualifiers would mismatch")
    read_only = set(read_only_pointers(source, span))
    if not read_only:
        return declined("no pointer parameter is only read")
    edits: list[tuple[int, int, str]] = []
    changed = []
    for param in span.params:
        if param.name not in read_only:
            continue
        before, after = param.qualifiers()
        text = param.text
        if "__restrict__" not in after and "__restrict" not in after:
            star = text.rindex("*")
            text = f"{text[: star + 1].rstrip()} __restrict__ {text[star + 1 :].lstrip()}"
        if "const" not in before and span.extern_c:
            text = "const " + text
        if text != param.text:
            edits.append((param.start, param.end, text))
            changed.append(param.name)
    qualified = "const __restrict__" if span.extern_c else "__restrict__"
    if not edits:
        return declined(f"every read-only pointer parameter is already {qualified}")
    out = source
    for start, end, text in sorted(edits, reverse=True):
        out = out[:start] + text + out[end:]
    return finish(source, out, kernel_name, f"{qualified} on " + ", ".join(changed))


def ldg_loads(source: str, kernel_name: str, rng: random.Random) -> RuleResult:
    """Element reads of read-only pointer parameters through ``__ldg(&p[i])``: all of them,
    or (by the rng) those of one parameter."""
    span = kernel_span(source, kernel_name)
    if isinstance(span, RuleResult):
        return span
    by_name = {p.name: p for p in span.params if p.name}
    aliases = scalar_aliases(source)
    eligible = []
    for name in read_only_pointers(source, span):
        param = by_name[name]
        uses = pointer_uses(source, span.name, name)
        element = aliases.get(param.element_type, param.element_type)
        if element in LDG_TYPES and any(u.kind == "read" for u in uses):
            eligible.append(name)
    if not eligible:
        return declined("no read-only pointer parameter of a type __ldg loads is read")
    chosen = eligible if rng.random() < 0.5 or len(eligible) == 1 else [rng.choice(eligible)]
    reads: dict[int, PointerUse] = {}
    for name in chosen:
        for use in pointer_uses(source, span.name, name):
            if use.kind == "read" and not use.in_ldg:
                reads[use.start] = use
    if not reads:
        return declined("every read of the read-only parameters already goes through __ldg")
    body = _rewrite_reads(source, span.body_open, span.body_end, reads)
    out = source[: span.body_open] + body + source[span.body_end :]
    return finish(source, out, kernel_name, "__ldg loads of " + ", ".join(chosen))


def _rewrite_reads(source: str, start: int, end: int, reads: dict[int, PointerUse]) -> str:
    """``source[start:end]`` with every read in ``reads`` (nested ones too) wrapped in __ldg."""
    out = []
    cursor = start
    for at in sorted(reads):
        use = reads[at]
        if at < cursor or at >= end or use.index_open is None or use.index_close is None:
            continue
        name = source[at : use.index_open].strip()
        inner = _rewrite_reads(source, use.index_open + 1, use.index_close, reads)
        out.append(source[cursor:at])
        out.append(f"__ldg(&{name}[{inner}])")
        cursor = use.index_close + 1
    out.append(source[cursor:end])
    return "".join(out)


UNROLL_FACTORS = (1, 2, 4, 8, 16)
UNROLL_DEFAULT = 4


def unroll_pragma(source: str, kernel_name: str, rng: random.Random) -> RuleResult:
    """A tunable unroll factor on one ``for`` loop without an unroll pragma, one that is
    innermost or whose inner loops are all unrolled already.

    Inside the kernel's body, on the lines before the loop: the tunable's declaration
    ``// r3: tune R3_UNROLL_<line> 1 2 4 8 16``, its ``#ifndef``-guarded default (4), and
    ``constexpr int r3_unroll_<line> = R3_UNROLL_<line>;`` named by ``#pragma unroll``.  The
    pragma's argument must be a constant expression: a macro there is not expanded.  The
    search then sizes the factor with ``-DR3_UNROLL_<line>=v`` as it sizes any tunable, and
    ``r3 apply`` ships the value it chose (1 keeps the loop rolled).  Only a loop that is a
    statement of a ``{ }`` block: a declaration before the single statement of a brace-less
    ``if`` would change what the ``if`` guards.
    """
    span = kernel_span(source, kernel_name)
    if isinstance(span, RuleResult):
        return span
    candidates = []
    for loop in for_loops(source, span.name):
        if not (loop.innermost or loop.inner_unrolled) or not loop.in_block:
            continue
        at = loop.start
        line_start = source.rfind("\n", 0, at) + 1
        if source[line_start:at].strip():
            continue  # the loop does not start its line (`if (c) for (...)`): no room
        previous = source[: max(line_start - 1, 0)].rsplit("\n", 1)[-1].strip()
        if previous.startswith("#pragma") and "unroll" in previous:
            continue
        candidates.append((line_start, at))
    if not candidates:
        return declined("no innermost (or inner-unrolled) for loop in a { } block without an "
                         "unroll pragma")
    line_start, at = rng.choice(candidates)
    line = source.count("\n", 0, at) + 1
    macro, constant = f"R3_UNROLL_{line}", f"r3_unroll_{line}"
    if re.search(rf"\b{macro}\b", source):
        return declined(f"{macro} is already a name in the source")
    indent = source[line_start:at]
    factors = " ".join(str(f) for f in UNROLL_FACTORS)
    inserted = (f"{indent}// r3: tune {macro} {factors}\n"
                f"#ifndef {macro}\n#define {macro} {UNROLL_DEFAULT}\n#endif\n"
                f"{indent}constexpr int {constant} = {macro};\n"
                f"{indent}#pragma unroll {constant}\n")
    out = source[:line_start] + inserted + source[line_start:]
    return finish(source, out, kernel_name,
                   f"unroll factor {macro} in {{{factors}}} on the loop at line {line}")


_DEFINE = re.compile(
    r"^[ \t]*#[ \t]*define[ \t]+([A-Za-z_]\w*)[ \t]+([0-9]+)[ \t]*(?://.*)?$", re.M
)
_THREADS_NAME = re.compile(r"THREAD", re.IGNORECASE)


def _tunable_values(name: str, value: int) -> list[int]:
    if value & (value - 1) == 0:  # a power of two: its neighbours among the powers of two
        values = [value // 4, value // 2, value, value * 2]
    else:
        values = [value // 2, value, value * 2]
    cap = 1024 if _THREADS_NAME.search(name) else max(value * 2, 1)
    return sorted({v for v in values if 1 <= v <= cap})


def expose_tunable(source: str, kernel_name: str, rng: random.Random) -> RuleResult:
    """``// r3: tune NAME ...`` for one ``#ifndef NAME`` / ``#define NAME <integer>`` that the
    kernel uses and that is not yet tuned.

    Only a guarded macro: ``-DNAME=v`` reaches the code through the guard, where a plain
    ``#define`` would override it and the tunable would change nothing (also in the
    application's build, where ``r3 apply`` sends it through ``r3-flags.txt``).  The
    declaration goes at the top of the kernel's body, inside its definition, so that an
    application's kernel (whose edits must stay there) gets it too.  A thread-count constant
    (its name says THREAD) that sizes per-thread storage also gets
    ``// r3: require BLOCK_THREADS <= NAME``, so the tuner never launches more threads than it.
    """
    from r3tui.search.source import DeclarationError, parse_relations, parse_tunables

    span = kernel_span(source, kernel_name)
    if isinstance(span, RuleResult):
        return span
    try:
        tuned = {t.name for t in parse_tunables(source)}
    except DeclarationError as exc:
        return declined(f"the source's r3 declarations do not parse: {exc}")
    candidates = []
    used = body_identifiers(source, span.name)
    masked = mask(source)  # a #define in a comment is not one
    for match in _DEFINE.finditer(masked):
        name, value = match.group(1), int(match.group(2))
        values = _tunable_values(name, value)
        if name in tuned or name.startswith("__") or value < 1 or len(values) < 2:
            continue
        if name not in used:
            continue  # the kernel does not use it: tuning it changes nothing
        at = masked.rfind("\n", 0, match.start()) + 1
        previous = masked[masked.rfind("\n", 0, max(at - 1, 0)) + 1 : at]
        if not re.match(rf"[ \t]*#[ \t]*if(?:ndef[ \t]+{name}\b|[ \t]+!defined)", previous):
            continue  # unguarded: a -D would not reach the code
        candidates.append((name, values))
    if not candidates:
        return declined("no #ifndef-guarded #define NAME <integer> that the kernel uses and "
                         "is not yet tuned")
    name, values = rng.choice(candidates)
    lines = [f"// r3: tune {name} {' '.join(str(v) for v in values)}"]
    if _THREADS_NAME.search(name):
        lines.append(f"// r3: require BLOCK_THREADS <= {name}")
    body = span.body_open + 1
    indent = "    "
    out = source[:body] + "\n" + "".join(indent + line + "\n" for line in lines) + \
        source[body:].lstrip(" \t").removeprefix("\n")
    try:
        parse_tunables(out)
        parse_relations(out)
    except DeclarationError as exc:
        return declined(f"the declaration would not parse: {exc}")
    return finish(source, out, kernel_name, f"tunable {name} in {values}")


# -- block reductions to warp shuffles -------------------------------------------------------
_W = r"\s*"
_ID = r"[A-Za-z_]\w*"
_TYPE = r"(?:(?:unsigned|signed|const|int|long|size_t)\s+)*"
# `for (int s = 1; s < n; s *= 2) { if (tid % (2 * s) == 0 && tid + s < n) { STEP }
#  __syncthreads(); }`
_INTERLEAVED = re.compile(
    rf"for{_W}\({_W}{_TYPE}(?P<s>{_ID}){_W}={_W}1{_W};"
    rf"{_W}(?P=s){_W}<{_W}(?P<n>{_ID}){_W};{_W}(?P=s){_W}(?:\*={_W}2|<<={_W}1){_W}\){_W}\{{"
    rf"{_W}if{_W}\({_W}\(?{_W}(?P<tid>{_ID}){_W}%{_W}\({_W}2{_W}\*{_W}(?P=s){_W}\){_W}\)?{_W}"
    rf"=={_W}0{_W}&&{_W}(?P=tid){_W}\+{_W}(?P=s){_W}<{_W}(?P=n){_W}\){_W}"
    rf"(?P<step>\{{[^{{}}]*\}}|[^;{{}}]*;){_W}__syncthreads{_W}\({_W}\){_W};{_W}\}}")
# `for (int s = blockDim.x / 2; s > 0; s >>= 1) { if (tid < s) STEP __syncthreads(); }`
_SEQUENTIAL = re.compile(
    rf"for{_W}\({_W}{_TYPE}(?P<s>{_ID}){_W}={_W}"
    rf"(?P<n>blockDim\.x){_W}(?:/{_W}2|>>{_W}1){_W};{_W}(?P=s){_W}>{_W}0{_W};{_W}(?P=s){_W}"
    rf"(?:>>={_W}1|/={_W}2){_W}\){_W}\{{{_W}if{_W}\({_W}(?P<tid>{_ID}){_W}<{_W}(?P=s){_W}\){_W}"
    rf"(?P<step>\{{[^{{}}]*\}}|[^;{{}}]*;){_W}__syncthreads{_W}\({_W}\){_W};{_W}\}}")
# what unroll_pragma (or a plain pragma) put on the lines before a loop
_UNROLL_BEFORE = re.compile(
    r"(?:^[ \t]*//[ \t]*r3:[ \t]*tune[ \t]+(?P<macro>R3_UNROLL_\d+)\b[^\n]*\n"
    r"[ \t]*#[ \t]*ifndef[ \t]+(?P=macro)[ \t]*\n[ \t]*#[ \t]*define[ \t]+(?P=macro)\b[^\n]*\n"
    r"[ \t]*#[ \t]*endif[^\n]*\n[ \t]*constexpr[ \t]+int[ \t]+(?P<const>r3_unroll_\d+)[ \t]*="
    r"[ \t]*(?P=macro)[ \t]*;[ \t]*\n[ \t]*#[ \t]*pragma[ \t]+unroll[ \t]+(?P=const)[ \t]*\n"
    r"|^[ \t]*#[ \t]*pragma[ \t]+unroll\b[^\n]*\n)\Z", re.M)
_LINEAR_TIDS = ("threadIdx.x", "threadIdx.x+blockDim.x*(threadIdx.y+blockDim.y*threadIdx.z)")


def _reduction_step(step: str, tid: str, stride: str) -> tuple[str, str] | None:
    """``(array, combine)`` of a tree step ``a[tid] += a[tid + s];`` or ``a[tid] =
    f(a[tid], a[tid + s]);``, ``combine`` a format with ``{a}`` and ``{b}``; None otherwise."""
    text = "".join(step.strip().strip("{}").split())
    mine, theirs = rf"(?P<arr>{_ID})\[{tid}\]", rf"(?P=arr)\[{tid}\+{stride}\]"
    found = re.fullmatch(rf"{mine}\+={theirs};", text)
    if found:
        return found.group("arr"), "{a} + {b}"
    found = re.fullmatch(rf"{mine}=(?P<f>{_ID})\((?P=arr)\[{tid}\],{theirs}\);", text)
    if found:
        return found.group("arr"), found.group("f") + "({a}, {b})"
    found = re.fullmatch(rf"{mine}=(?P=arr)\[{tid}\]\+{theirs};", text)
    if found:
        return found.group("arr"), "{a} + {b}"
    return None


def warp_shuffle_reduction(source: str, kernel_name: str, rng: random.Random) -> RuleResult:
    """A shared-memory tree reduction (a ``__syncthreads`` per level, ``a[tid] += a[tid + s]``
    or ``a[tid] = f(a[tid], a[tid + s])``) done with warp shuffles instead: each warp combines
    its 32 values with ``__shfl_down_sync``, warp 0 combines the warps' results, and ``a[0]``
    holds the block's result after a barrier, as after the loop.  Two barriers instead of one
    per level.

    Only where ``tid`` is the thread's linear index in the block (``threadIdx.x`` with a 1-D
    block, or the flattened x-y-z index), and for blocks of whole warps: the variant declares
    ``// r3: require BLOCK_THREADS % 32 == 0`` (and the 1-D block where it needs it), so the
    tuner never launches it otherwise.  Values combine in another order: a float sum moves in
    its last bits, which the buffers' tolerances must allow, as the replay verifies.
    """
    span = kernel_span(source, kernel_name)
    if isinstance(span, RuleResult):
        return span
    masked = mask(source)
    body = masked[span.body_open:span.body_end]
    candidates = []
    for pattern in (_INTERLEAVED, _SEQUENTIAL):
        for found in pattern.finditer(body):
            tid, stride = found.group("tid"), found.group("s")
            step = _reduction_step(found.group("step"), re.escape(tid), re.escape(stride))
            init = re.search(rf"\b{re.escape(tid)}\s*=\s*([^;,]+);", body[:found.start()])
            if step is None or init is None:
                continue
            linear = "".join(init.group(1).split())
            linear = linear if linear in _LINEAR_TIDS else linear[1:-1]
            if linear not in _LINEAR_TIDS:
                continue
            candidates.append((span.body_open + found.start(), span.body_open + found.end(),
                               tid, found.group("n"), step, linear == "threadIdx.x"))
    if not candidates:
        return declined("no shared-memory tree reduction (a[tid] op= a[tid + s] with a "
                         "__syncthreads per level) over the thread's linear index")
    start, end, tid, count, (array, combine), one_d = rng.choice(candidates)
    line_start = source.rfind("\n", 0, start) + 1
    # an unroll pragma on the loop goes with it (and the tunable unroll_pragma declared for
    # it: a factor that reaches no loop would only widen the search)
    pragma = _UNROLL_BEFORE.search(source[:line_start])
    cut = line_start if pragma is None else pragma.start()
    indent = source[line_start:start] if not source[line_start:start].strip() else "    "
    shuffled = combine.format(a="r3_v", b="__shfl_down_sync(0xffffffffu, r3_v, r3_o)")
    guarded = combine.format(a="r3_v", b="r3_other")
    lines = [
        "{  // the tree reduction of " + array + " in warp shuffles",
        f"    auto r3_v = {array}[{tid}];",
        "    for (int r3_o = 16; r3_o > 0; r3_o /= 2) {",
        f"        r3_v = {shuffled};",
        "    }",
        "    __syncthreads();  // every thread has read its own value",
        f"    if ({tid} % 32 == 0) {{",
        f"        {array}[{tid} / 32] = r3_v;",
        "    }",
        "    __syncthreads();",
        f"    if ({tid} < 32) {{",
        f"        int r3_warps = ((int)({count}) + 31) / 32;",
        f"        r3_v = {array}[{tid} < r3_warps ? {tid} : 0];",
        "        for (int r3_o = 16; r3_o > 0; r3_o /= 2) {",
        "            auto r3_other = __shfl_down_sync(0xffffffffu, r3_v, r3_o);",
        f"            if ((int)({tid}) + r3_o < r3_warps) {{",
        f"                r3_v = {guarded};",
        "            }",
        "        }",
        f"        if ({tid} == 0) {{",
        f"            {array}[0] = r3_v;",
        "        }",
        "    }",
        "    __syncthreads();",
        "}",
    ]
    replacement = ("\n" + indent).join(lines)
    requires = ["BLOCK_THREADS % 32 == 0"] + (["BLOCK_Y == 1 && BLOCK_Z == 1"] if one_d else [])
    declared = "".join(f"{indent}// r3: require {r}\n" for r in requires)
    out = source[:cut] + declared + source[line_start:start] + replacement + source[end:]
    line = source.count("\n", 0, start) + 1
    return finish(source, out, kernel_name,
                   f"the tree reduction of {array} at line {line} in warp shuffles")

def coarsen(source: str, kernel_name: str, rng: random.Random) -> RuleResult:
    """Thread coarsening with the loops jammed along one axis of the grid, its factor a
    tunable that divides the grid along that axis (:mod:`r3tui.remix.coarsen`)."""
    return restructured(coarsen_kernel, source, kernel_name, rng)


def split_loop(source: str, kernel_name: str, rng: random.Random) -> RuleResult:
    """A thread's summing loop split over several threads an element, combined with warp
    shuffles, their number a tunable that multiplies the grid along x
    (:mod:`r3tui.remix.split`)."""
    return restructured(split_kernel_loop, source, kernel_name, rng)


def tile_shared(source: str, kernel_name: str, rng: random.Random) -> RuleResult:
    """A loop's reads that the block's threads share, staged in shared memory tiles of a
    tunable number of iterations (:mod:`r3tui.remix.tile`)."""
    return restructured(tile_loop, source, kernel_name, rng)


def stream_axis(source: str, kernel_name: str, rng: random.Random) -> RuleResult:
    """A stencil's neighbours along z or y kept in registers while each thread walks a
    tunable number of points along that axis (:mod:`r3tui.remix.stream`)."""
    return restructured(stream_kernel, source, kernel_name, rng)


def swap_xy(source: str, kernel_name: str, rng: random.Random) -> RuleResult:
    """The x and y axes of the thread grid exchanged in the kernel's body, so that the lanes of
    a warp walk the other index (:mod:`r3tui.remix.swap`)."""
    return restructured(swap_axes, source, kernel_name, rng)


# rules whose variants need a launch the search sets (another grid, or dynamic shared memory):
# not offered for an application's kernel whose host code sets a grid r3 apply cannot rescale
# (MutationContext.grid_fixed)
LAUNCH_RULES = frozenset({"grid_stride", "strided_accumulate", "coarsen", "split_loop",
                          "tile_shared", "stream_axis"})
# of those, the ones whose variants need dynamic shared memory the launch sets: never offered
# for an application's kernel (MutationContext.confined), whose host code sets the launch's
# bytes as r3 apply leaves them
SHARED_MEMORY_RULES = frozenset({"tile_shared"})


# rules that read the kernel's grid index from its declaration
INDEX_RULES = frozenset({"grid_stride", "coarsen", "split_loop", "tile_shared", "stream_axis"})

# rules whose variant is correct only where the recorded work is as wide along x as along y:
# it computes what the original computes at the transposed launch, which covers the work only
# then (MutationContext.square_work)
SQUARE_WORK_RULES = frozenset({"swap_xy"})


RULES: dict[str, Rule] = {
    "restrict_const": restrict_const,
    "ldg_loads": ldg_loads,
    "unroll_pragma": unroll_pragma,
    "expose_tunable": expose_tunable,
    "warp_shuffle_reduction": warp_shuffle_reduction,
    "grid_stride": grid_stride,
    "strided_accumulate": strided_accumulate,
    "vector_access": vector_access,
    "coarsen": coarsen,
    "split_loop": split_loop,
    "tile_shared": tile_shared,
    "stream_axis": stream_axis,
    "swap_xy": swap_xy,
}


def apply_rule(name: str, source: str, kernel_name: str, rng: random.Random) -> RuleResult:
    """Run the rule called ``name``; a rule that fails on odd text declines, never raises."""
    try:
        rule = RULES[name]
    except KeyError:
        raise ConfigError(f"unknown rule {name!r}", hint=f"known: {', '.join(RULES)}") from None
    if name in INDEX_RULES:  # `int i; ... i = blockIdx.x * ...;` read as a declaration,
        # and an index spelled out in bound checks before it is declared, declared first
        source = index_named(declared_at_assignment(source, kernel_name), kernel_name)
    try:
        return rule(source, kernel_name, rng)
    except (ValueError, IndexError) as exc:  # text the analysis does not expect
        return declined(f"{name} cannot analyse this source: {exc}")
