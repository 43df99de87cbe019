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
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass

from r3tui.analysis.body import (
    PointerUse,
    body_identifiers,
    for_loops,
    pointer_uses,
    scalar_aliases,
)
from r3tui.analysis.text import mask
from r3tui.errors import ConfigError
from r3tui.remix.coarsen import Declined
from r3tui.remix.coarsen import coarsen as coarsen_kernel
from r3tui.remix.edits import KernelSpan, entry_point_problem, find_kernel
from r3tui.remix.split import split_loop as split_kernel_loop
from r3tui.remix.tile import tile_loop


@dataclass(frozen=True)
class RuleResult:
    ok: bool
    source: str | None
    reason: str | None = None  # why the rule declined
    detail: str | None = None  # what it changed, for the variant's operator note


Rule = Callable[[str, str, random.Random], RuleResult]

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


def _declined(reason: str) -> RuleResult:
    return RuleResult(False, None, reason)


def _kernel(source: str, kernel_name: str) -> KernelSpan | RuleResult:
    span = find_kernel(source, kernel_name)
    if span is None:
        return _declined(f"no __global__ function {kernel_name!r} is defined in the source")
    return span


def _finish(parent: str, child: str, kernel_name: str, detail: str) -> RuleResult:
    problem = entry_point_problem(parent, child, kernel_name)
    if problem:  # a rule that breaks the entry point is a bug in the rule; decline anyway
        return _declined(f"the rewrite would break the kernel: {problem}")
    return RuleResult(True, child, None, detail)


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
    span = _kernel(source, kernel_name)
    if isinstance(span, RuleResult):
        return span
    if span.declarations and span.extern_c:
        # a pointee's const would differ from the prototype's (__restrict__ alone, a top-level
        # qualifier of the parameter, is not part of the function's type)
        return _declined("the kernel is also declared elsewhere; qualifiers would mismatch")
    read_only = set(read_only_pointers(source, span))
    if not read_only:
        return _declined("no pointer parameter is only read")
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
        return _declined(f"every read-only pointer parameter is already {qualified}")
    out = source
    for start, end, text in sorted(edits, reverse=True):
        out = out[:start] + text + out[end:]
    return _finish(source, out, kernel_name, f"{qualified} on " + ", ".join(changed))


def ldg_loads(source: str, kernel_name: str, rng: random.Random) -> RuleResult:
    """Element reads of read-only pointer parameters through ``__ldg(&p[i])``: all of them,
    or (by the rng) those of one parameter."""
    span = _kernel(source, kernel_name)
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
        return _declined("no read-only pointer parameter of a type __ldg loads is read")
    chosen = eligible if rng.random() < 0.5 or len(eligible) == 1 else [rng.choice(eligible)]
    reads: dict[int, PointerUse] = {}
    for name in chosen:
        for use in pointer_uses(source, span.name, name):
            if use.kind == "read" and not use.in_ldg:
                reads[use.start] = use
    if not reads:
        return _declined("every read of the read-only parameters already goes through __ldg")
    body = _rewrite_reads(source, span.body_open, span.body_end, reads)
    out = source[: span.body_open] + body + source[span.body_end :]
    return _finish(source, out, kernel_name, "__ldg loads of " + ", ".join(chosen))


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
    span = _kernel(source, kernel_name)
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
        return _declined("no innermost (or inner-unrolled) for loop in a { } block without an "
                         "unroll pragma")
    line_start, at = rng.choice(candidates)
    line = source.count("\n", 0, at) + 1
    macro, constant = f"R3_UNROLL_{line}", f"r3_unroll_{line}"
    if re.search(rf"\b{macro}\b", source):
        return _declined(f"{macro} is already a name in the source")
    indent = source[line_start:at]
    factors = " ".join(str(f) for f in UNROLL_FACTORS)
    inserted = (f"{indent}// r3: tune {macro} {factors}\n"
                f"#ifndef {macro}\n#define {macro} {UNROLL_DEFAULT}\n#endif\n"
                f"{indent}constexpr int {constant} = {macro};\n"
                f"{indent}#pragma unroll {constant}\n")
    out = source[:line_start] + inserted + source[line_start:]
    return _finish(source, out, kernel_name,
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

    span = _kernel(source, kernel_name)
    if isinstance(span, RuleResult):
        return span
    try:
        tuned = {t.name for t in parse_tunables(source)}
    except DeclarationError as exc:
        return _declined(f"the source's r3 declarations do not parse: {exc}")
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
        return _declined("no #ifndef-guarded #define NAME <integer> that the kernel uses and "
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
        return _declined(f"the declaration would not parse: {exc}")
    return _finish(source, out, kernel_name, f"tunable {name} in {values}")


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
    span = _kernel(source, kernel_name)
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
        return _declined("no shared-memory tree reduction (a[tid] op= a[tid + s] with a "
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
    return _finish(source, out, kernel_name,
                   f"the tree reduction of {array} at line {line} in warp shuffles")

# `int i = blockIdx.x * blockDim.x + threadIdx.x;` in any of its usual spellings
_GLOBAL_X = (r"(?:blockIdx\.x\s*\*\s*blockDim\.x|blockDim\.x\s*\*\s*blockIdx\.x)\s*\+\s*"
             r"threadIdx\.x|threadIdx\.x\s*\+\s*(?:blockIdx\.x\s*\*\s*blockDim\.x|"
             r"blockDim\.x\s*\*\s*blockIdx\.x)")
_INDEX = re.compile(
    r"(?P<decl>(?:const\s+)?(?P<type>int|unsigned(?:\s+int)?|long(?:\s+long)?|size_t|"
    r"unsigned\s+long(?:\s+long)?)\s+(?P<i>[A-Za-z_]\w*)\s*=\s*(?:\(\s*\w+(?:\s+\w+)*\s*\)\s*)?"
    rf"\(?\s*(?:{_GLOBAL_X})\s*\)?\s*;)")
# the guard right after it: `if (i >= n) return;` / `if (i >= n) { return; }`
_EARLY_RETURN = re.compile(
    r"\s*if\s*\(\s*(?P<i>[A-Za-z_]\w*)\s*(?P<op>>=|>)\s*(?P<bound>[^;{}()]+(?:\([^;{}()]*\)"
    r"[^;{}()]*)*)\)\s*(?:return\s*;|\{\s*return\s*;\s*\})")
# or the guard that encloses the rest of the body: `if (i < n) { ... }` and nothing after it
_ENCLOSING = re.compile(
    r"\s*if\s*\(\s*(?P<i>[A-Za-z_]\w*)\s*(?P<op><=|<)\s*(?P<bound>[^;{}()]+(?:\([^;{}()]*\)"
    r"[^;{}()]*)*)\)\s*\{")
_SYNC = re.compile(r"__syncthreads|__syncwarp|\.sync\s*\(|__shared__|\bgrid_group\b|"
                   r"__threadfence_block|\bthis_grid\b")
WPT_FACTORS = (1, 2, 4, 8, 16)
# rules whose variants need a launch the search sets (another grid, or dynamic shared memory):
# never offered for an application's kernel, whose host code sets its launch
LAUNCH_RULES = frozenset({"grid_stride", "strided_accumulate", "coarsen", "split_loop",
                          "tile_shared"})


def _kernel_body(source: str, kernel_name: str) -> tuple[KernelSpan, str, int, str] | RuleResult:
    """The kernel's span, the masked source, where its body starts and the masked body (or
    why the rule declines: no such kernel)."""
    span = _kernel(source, kernel_name)
    if isinstance(span, RuleResult):
        return span
    masked = mask(source)
    body_start = span.body_open + 1
    return span, masked, body_start, masked[body_start:span.body_end - 1]


def _work_per_thread(indent: str, macro: str) -> str:
    """The declarations of a tunable elements-a-thread count that divides the launch's grid
    (``WPT_FACTORS``, 1 by default: the recorded grid, the original's work)."""
    factors = " ".join(str(f) for f in WPT_FACTORS)
    return (f"{indent}// r3: tune {macro} {factors}\n"
            f"{indent}// r3: work_per_thread {macro}\n"
            f"#ifndef {macro}\n#define {macro} 1\n#endif\n")


def grid_stride(source: str, kernel_name: str, rng: random.Random) -> RuleResult:
    """A kernel that gives each thread one element along x (``int i = blockIdx.x *
    blockDim.x + threadIdx.x;`` then ``if (i >= n) return;``, or ``if (i < n) { ... }``
    around the rest of its body) made a grid-stride loop over the rest of its body, with the
    number of elements per thread a tunable that divides the launch's grid
    (``// r3: work_per_thread R3_WPT_<line>``, 1 2 4 8 16; 1 launches the recorded grid and
    does what the original did).

    The rest of the body becomes a lambda called once per element, so its ``return``
    statements still end one element's work.  Only for bodies without barriers, warp
    synchronization or shared memory (threads of a block would run different numbers of
    elements), that never assign the index, and never for an application's kernel, whose grid
    its host code computes (the campaign does not offer the rule there).
    """
    found = _kernel_body(source, kernel_name)
    if isinstance(found, RuleResult):
        return found
    span, _, body_start, body = found
    index = _INDEX.search(body)
    if index is None:
        return _declined("no `int i = blockIdx.x * blockDim.x + threadIdx.x;` in the kernel")
    name = index.group("i")
    guard = _EARLY_RETURN.match(body, index.end())
    rest_at, rest_end = (guard.end(), len(body)) if guard is not None else (0, 0)
    if guard is None:  # `if (i < n) { REST }` closing the body
        guard = _ENCLOSING.match(body, index.end())
        close = _matching_brace(body, guard.end() - 1) if guard is not None else None
        if guard is None or close is None or body[close + 1:].strip():
            guard = None
        else:
            rest_at, rest_end = guard.end(), close
    if guard is None or guard.group("i") != name:
        return _declined(f"no `if ({name} >= bound) return;` or `if ({name} < bound) {{ ... }}` "
                         "around the rest of the body right after the index")
    bound = guard.group("bound").strip()
    if re.search(rf"\b{re.escape(name)}\b", bound) or re.search(r"\+\+|--|[^=!<>]=[^=]", bound):
        return _declined("the guard's bound depends on the index or assigns")
    if _brace_depth(body, index.start()) != 0:
        return _declined("the index is not declared at the top of the kernel's body")
    rest = body[rest_at:rest_end]
    if _SYNC.search(body):
        return _declined("the body synchronizes threads or uses shared memory")
    if re.search(rf"(?<![\w.]){re.escape(name)}\s*(?:[-+*/%&|^]?=(?!=)|\+\+|--)|"
                 rf"(?:\+\+|--)\s*{re.escape(name)}\b|&\s*{re.escape(name)}\b", rest):
        return _declined(f"the body assigns or takes the address of {name}")
    line = source.count("\n", 0, body_start + index.start()) + 1
    macro = f"R3_WPT_{line}"
    if re.search(rf"\b{macro}\b", source):
        return _declined(f"{macro} is already a name in the source")
    condition = (f"{name} < ({bound})" if guard.group("op") in (">=", "<") else
                 f"{name} <= ({bound})")
    kind = re.sub(r"^const\s+", "", index.group("type"))
    decl_at = body_start + index.start()
    line_start = source.rfind("\n", 0, decl_at) + 1
    indent = re.match(r"[ \t]*", source[line_start:]).group(0)  # type: ignore[union-attr]
    factors = " ".join(str(f) for f in WPT_FACTORS)
    rest_text = source[body_start + rest_at:body_start + rest_end]
    header = _work_per_thread(indent, macro)
    loop = (f"{indent}auto r3_element_{line} = [&]({kind} {name}) {{{rest_text}\n{indent}}};\n"
            f"{indent}for ({kind} {name} = {index.group(0).split('=', 1)[1].strip()[:-1]}; "
            f"{condition}; {name} += ({kind})blockDim.x * gridDim.x) {{\n"
            f"{indent}    r3_element_{line}({name});\n{indent}}}\n")
    if source[line_start:decl_at].strip():
        return _declined(f"the declaration of {name} does not start its line")
    out = source[:line_start] + header + loop + source[span.body_end - 1:]
    return _finish(source, out, kernel_name,
                   f"a grid-stride loop over {name} at line {line}, {macro} elements a thread "
                   f"in {{{factors}}}")


# `buf[tid] = (i < n) ? x[i] : 0.0f;`: one element a thread into shared memory, zero past n
_GUARDED_LOAD = re.compile(
    r"(?P<lhs>(?P<arr>[A-Za-z_]\w*)\s*\[\s*[A-Za-z_]\w*\s*\])\s*=\s*\(\s*"
    r"(?P<i>[A-Za-z_]\w*)\s*<\s*(?P<bound>[^?;{}]+?)\s*\)\s*\?\s*(?P<value>[^:;?{}]+?)\s*:"
    r"\s*(?P<zero>[^:;?{}]+?)\s*;")
_SHARED_ARRAY = r"__shared__\s+(?P<type>(?:unsigned\s+|signed\s+)?[A-Za-z_]\w*)\s+{arr}\s*\["
_GRID_THREADS = ("gridDim.x * gridDim.y * gridDim.z * blockDim.x * blockDim.y * blockDim.z")


def _from_block_index(before: str, name: str, depth: int = 3) -> bool:
    """Whether ``name``'s initializer in ``before`` reads ``blockIdx``, itself or through the
    variables it is computed from (``i = block * nthreads + tid``, ``block = blockIdx.x +
    ...``)."""
    found = re.search(rf"(?<![\w.]){re.escape(name)}\s*=(?!=)(?P<init>[^;]*);", before)
    if found is None or depth == 0:
        return False
    init = found.group("init")
    if "blockIdx" in init:
        return True
    return any(_from_block_index(before[:found.start()], other, depth - 1)
               for other in set(re.findall(r"(?<![\w.])[A-Za-z_]\w*", init)) - {name})


def strided_accumulate(source: str, kernel_name: str, rng: random.Random) -> RuleResult:
    """A block reduction that loads one element a thread into shared memory
    (``buf[tid] = (i < n) ? x[i] : 0;``) made to accumulate several first: each thread sums
    ``x[i]``, ``x[i + T]``, ... (``T`` the grid's threads) in a register of the shared array's
    type and stores that sum, so the tree, its barriers and the block's atomic are paid once
    for several elements.  The number of elements a thread takes is a tunable that divides the
    launch's grid (``// r3: work_per_thread R3_WPT_<line>``, 1 2 4 8 16; 1 launches the
    recorded grid and sums what the original summed).  ``i`` must be the thread's index over
    the whole grid (each thread its own element), as a one-element-a-thread load implies; a
    kernel where it is not fails verification.  Never for an application's kernel, whose
    grid its host code computes.
    """
    found = _kernel_body(source, kernel_name)
    if isinstance(found, RuleResult):
        return found
    _, _, body_start, body = found
    load = _GUARDED_LOAD.search(body)
    if load is None:
        return _declined("no `buf[tid] = (i < n) ? x[i] : 0;` load into shared memory")
    name, arr = load.group("i"), load.group("arr")
    shared = re.search(_SHARED_ARRAY.format(arr=re.escape(arr)), body)
    if shared is None:
        return _declined(f"{arr} is not a __shared__ array of the kernel")
    value, bound = load.group("value"), load.group("bound")
    if not re.search(rf"\[[^\]]*\b{re.escape(name)}\b[^\]]*\]", value):
        return _declined(f"the loaded value does not index with {name}")
    if re.search(r"\+\+|--|[^=!<>]=[^=]", value + bound) or re.search(
            rf"\b{re.escape(name)}\b", bound):
        return _declined("the load or its bound assigns, or the bound depends on the index")
    if not _from_block_index(body[:load.start()], name):
        return _declined(f"{name} is not set from the block's index before the load")
    after = body[load.end():]
    if re.search(rf"(?<![\w.]){re.escape(name)}\s*(?:[-+*/%&|^]?=(?!=)|\+\+|--)", after):
        return _declined(f"{name} is assigned after the load")
    line = source.count("\n", 0, body_start + load.start()) + 1
    macro, acc, k = f"R3_WPT_{line}", f"r3_acc_{line}", f"r3_k_{line}"
    if re.search(rf"\b(?:{macro}|{acc}|{k})\b", source):
        return _declined(f"{macro} is already a name in the source")
    at = body_start + load.start()
    line_start = source.rfind("\n", 0, at) + 1
    if source[line_start:at].strip():
        return _declined("the load does not start its line")
    indent = re.match(r"[ \t]*", source[line_start:]).group(0)  # type: ignore[union-attr]
    factors = " ".join(str(f) for f in WPT_FACTORS)
    original = source[at:body_start + load.end()]
    each = re.sub(rf"(?<![\w.]){re.escape(name)}\b", k, source[
        body_start + load.start("value"):body_start + load.end("value")])
    limit = source[body_start + load.start("bound"):body_start + load.end("bound")]
    zero = source[body_start + load.start("zero"):body_start + load.end("zero")]
    lhs = source[body_start + load.start("lhs"):body_start + load.end("lhs")]
    text = (_work_per_thread(indent, macro)
            + f"{indent}// was: {original.strip()}\n"
            f"{indent}{shared.group('type')} {acc} = {zero};\n"
            f"{indent}for (auto {k} = {name}; {k} < {limit}; "
            f"{k} += (decltype({k})){_GRID_THREADS}) {{\n"
            f"{indent}    {acc} += {each};\n{indent}}}\n"
            f"{indent}{lhs} = {acc};")
    out = source[:line_start] + text + source[body_start + load.end():]
    return _finish(source, out, kernel_name,
                   f"{macro} elements a thread summed before the reduction at line {line}, "
                   f"in {{{factors}}}")


# `for (int c = START; c < BOUND; c += STRIDE) {` (or `c = c + STRIDE`; a brace-less body too)
_STRIDED_FOR = re.compile(
    r"for\s*\(\s*(?P<type>int|unsigned(?:\s+int)?|long(?:\s+long)?|size_t|unsigned\s+long"
    r"(?:\s+long)?)\s+(?P<c>[A-Za-z_]\w*)\s*=\s*(?P<start>[^;]+?)\s*;\s*(?P=c)\s*<\s*"
    r"(?P<bound>[^;]+?)\s*;\s*(?P=c)\s*(?:\+=|=\s*(?P=c)\s*\+)\s*(?P<stride>[^;]+?)\s*\)\s*")
# element type -> (vector type, lanes)
VECTORS = {"float": ("float4", 4), "int": ("int4", 4), "unsigned": ("uint4", 4),
           "unsigned int": ("uint4", 4), "double": ("double2", 2)}
_LANES = "xyzw"
_JUMPS = re.compile(r"\b(?:break|continue|return|goto)\b|__syncthreads|__syncwarp|\.sync\s*\(")


def _pointer_type(text: str, name: str) -> str | None:
    """The element type ``name`` is declared to point to (``const float* __restrict__ x``,
    ``float *yr = ...``), if the text declares it once as a pointer to a vectorizable type."""
    found = re.findall(
        rf"(?<![\w.])(?:const\s+)?(unsigned\s+int|unsigned|float|double|int)\s*(?:const\s*)?"
        rf"\*\s*(?:const\s+)?(?:__restrict__\s+)?{re.escape(name)}\b(?!\s*\[)", text)
    kinds = {" ".join(k.split()) for k in found}
    return kinds.pop() if len(kinds) == 1 else None


def _thread_bound(before: str, expr: str) -> bool:
    """Whether ``expr`` reads the thread's position (threadIdx, blockIdx, blockDim, gridDim),
    itself or through the variables it is computed from in ``before``."""
    if re.search(r"\b(?:threadIdx|blockIdx|blockDim|gridDim)\b", expr):
        return True
    return any(_from_block_index(before, v, 3) or _reads_thread(before, v)
               for v in set(re.findall(r"(?<![\w.])[A-Za-z_]\w*", expr)))


def _reads_thread(before: str, name: str) -> bool:
    found = re.search(rf"(?<![\w.]){re.escape(name)}\s*=(?!=)(?P<init>[^;]*);", before)
    return found is not None and bool(
        re.search(r"\b(?:threadIdx|blockDim|gridDim)\b", found.group("init")))


def _kept_original(masked: str, at: int) -> bool:
    """Whether the loop at ``at`` is the original this rule kept in the ``else`` branch of a
    vectorized loop (rewriting it again would nest a copy in the copy)."""
    opening = masked.rfind("{", 0, at)
    head = masked[:opening].rstrip()
    return (opening >= 0 and not masked[opening + 1:at].strip() and head.endswith("else")
            and head[:-4].rstrip().endswith("}") and "r3_v" in head[-4000:])


def vector_access(source: str, kernel_name: str, rng: random.Random) -> RuleResult:
    """A loop over a thread's strided elements (``for (int c = tid; c < n; c += nthreads)``,
    or a grid-stride loop) whose body touches arrays only at ``[c]`` made to touch them as
    vectors: each thread takes 4 consecutive floats (``float4``; 2 doubles) per step, the body
    repeated once per lane with ``a[c]`` read from, and written to, the lane of a vector loaded
    before and stored after.  The elements each thread handles change, not which elements are
    handled, so the rule needs iterations that do not depend on each other (accumulations
    such as ``s += x[c]`` change only their rounding).  At run time the vector loop runs only
    where ``n`` is a multiple of the lanes and every array is aligned to the vector; otherwise
    the original loop does.  A random one of the kernel's eligible loops is rewritten.
    """
    span = _kernel(source, kernel_name)
    if isinstance(span, RuleResult):
        return span
    masked = mask(source)
    body_start = span.body_open + 1
    body_end = span.body_end - 1
    candidates = []
    why = "no `for (int c = START; c < N; c += STRIDE)` loop over a thread's elements"
    for loop in _STRIDED_FOR.finditer(masked, body_start, body_end):
        c = loop.group("c")
        if "r3_v" in masked[loop.start():loop.end()] or _kept_original(masked, loop.start()):
            continue
        if masked[loop.end()] == "{":
            close = _matching_brace(masked, loop.end())
            if close is None:
                continue
            inner = (loop.end() + 1, close)
            stmt_end = close + 1
        else:
            semi = masked.find(";", loop.end())
            inner = (loop.end(), semi + 1)
            stmt_end = semi + 1
        text = masked[inner[0]:inner[1]]
        before = masked[body_start:loop.start()]
        start, bound, stride = (loop.group(k) for k in ("start", "bound", "stride"))
        if not (_thread_bound(before, start) and _thread_bound(before, stride)):
            why = f"the loop over {c} does not start at the thread's index and stride over threads"
            continue
        if re.search(rf"\b{re.escape(c)}\b", bound + stride) or re.search(
                r"\+\+|--|[^=!<>]=[^=]", bound + stride):
            why = f"the loop over {c} has a bound or stride that changes"
            continue
        if _JUMPS.search(text) or "for" in re.findall(r"[A-Za-z_]\w*", text):
            why = f"the loop over {c} has a jump, a barrier or a loop in its body"
            continue
        arrays = set(re.findall(rf"(?<![\w.])([A-Za-z_]\w*)\s*\[\s*{re.escape(c)}\s*\]",
                                text))
        if not arrays:
            why = f"the loop over {c} touches no array at [{c}]"
            continue
        others = re.findall(r"(?<![\w.])([A-Za-z_]\w*)\s*\[(?P<i>[^\]]*)\]", text)
        if any(a in arrays and i.strip() != c for a, i in others):
            why = f"an array the loop over {c} touches at [{c}] is also touched elsewhere"
            continue
        if re.search(rf"(?<![\w.]){re.escape(c)}\s*(?:[-+*/%&|^]?=(?!=)|\+\+|--)|"
                     rf"(?:\+\+|--)\s*{re.escape(c)}\b|&\s*{re.escape(c)}\b", text):
            why = f"the body assigns {c}"
            continue
        declared = masked[:span.body_end]
        kinds = {a: _pointer_type(declared, a) for a in arrays}
        if any(k not in VECTORS for k in kinds.values()) or len(
                {VECTORS[k][1] for k in kinds.values() if k}) != 1:
            why = "an array is not a pointer to float, double or int, or their widths differ"
            continue
        if any(re.search(rf"(?<![\w.]){re.escape(a)}\s*(?:[-+]?=(?!=)|\+\+|--)", text)
               or re.search(rf"&\s*{re.escape(a)}\s*\[", text) for a in arrays):
            why = "the body moves an array's pointer or takes an element's address"
            continue
        candidates.append((loop, inner, stmt_end, arrays, kinds))
    if not candidates:
        return _declined(why)
    loop, inner, stmt_end, arrays, kinds = rng.choice(candidates)
    c, ctype = loop.group("c"), loop.group("type")
    lanes = VECTORS[next(iter(kinds.values()))][1]  # type: ignore[index]
    line = source.count("\n", 0, loop.start()) + 1
    c4 = f"r3_v{line}_{c}"
    if re.search(rf"\b{c4}\b", source):
        return _declined(f"{c4} is already a name in the source")
    start, bound, stride = (source[loop.start(k):loop.end(k)] for k in ("start", "bound", "stride"))
    raw = source[inner[0]:inner[1]]
    written = {a for a in arrays if re.search(
        rf"(?<![\w.]){re.escape(a)}\s*\[\s*{re.escape(c)}\s*\]\s*(?:[-+*/%&|^]?=(?!=)|\+\+|--)"
        rf"|(?:\+\+|--)\s*{re.escape(a)}\s*\[", mask(raw))}
    # written in every lane and never read: no load before (the store writes every lane)
    plain = mask(raw)
    stored_only = set() if re.search(r"\b(?:if|switch|while)\b|\?", plain) else {
        a for a in written
        if all(plain[m.end():].lstrip().startswith("=") and not
               plain[m.end():].lstrip().startswith("==")
               for m in re.finditer(rf"(?<![\w.]){re.escape(a)}\s*\[\s*{re.escape(c)}\s*\]",
                                    plain))}
    line_start = source.rfind("\n", 0, loop.start()) + 1
    indent = re.match(r"[ \t]*", source[line_start:]).group(0)  # type: ignore[union-attr]
    pad, pad2 = indent + "    ", indent + "        "
    vec = {a: VECTORS[kinds[a]][0] for a in sorted(arrays)}  # type: ignore[index]
    aligned = " && ".join(f"((unsigned long long)({a}) % sizeof({vec[a]})) == 0"
                          for a in sorted(arrays))
    loads = "".join(
        f"{pad2}{vec[a]} r3_{a}_{line};\n" if a in stored_only else
        f"{pad2}{vec[a]} r3_{a}_{line} = reinterpret_cast<"
        f"{'' if a in written else 'const '}{vec[a]}*>({a})[{c4}];\n" for a in sorted(arrays))
    lanes_text = ""
    for lane in range(lanes):
        each = raw
        for a in sorted(arrays):
            each = re.sub(rf"(?<![\w.]){re.escape(a)}\s*\[\s*{re.escape(c)}\s*\]",
                          f"r3_{a}_{line}.{_LANES[lane]}", each)
        lanes_text += (f"{pad2}{{\n{pad2}    const {ctype} {c} = {c4} * {lanes} + {lane};\n"
                       f"{pad2}    (void){c};\n{pad2}    {each.strip()}\n{pad2}}}\n")
    stores = "".join(f"{pad2}reinterpret_cast<{vec[a]}*>({a})[{c4}] = r3_{a}_{line};\n"
                     for a in sorted(written))
    original = source[loop.start():stmt_end].replace("\n", "\n    ")
    text = (f"if ((({bound}) % {lanes}) == 0 && {aligned}) {{\n"
            f"{pad}// {lanes} lanes a step (made by the R3 rule vector_access)\n"
            f"{pad}for ({ctype} {c4} = {start}; {c4} < ({bound}) / {lanes}; {c4} += {stride}) "
            f"{{\n{loads}{lanes_text}{stores}{pad}}}\n"
            f"{indent}}} else {{\n{pad}{original}\n{indent}}}")
    out = source[:loop.start()] + text + source[stmt_end:]
    return _finish(source, out, kernel_name,
                   f"the loop over {c} at line {line} touches {', '.join(sorted(arrays))} "
                   f"{lanes} elements at a time")


def _matching_brace(text: str, at: int) -> int | None:
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


def _brace_depth(text: str, at: int) -> int:
    return text.count("{", 0, at) - text.count("}", 0, at)



def coarsen(source: str, kernel_name: str, rng: random.Random) -> RuleResult:
    """Thread coarsening with the loops jammed along one axis of the grid, its factor a
    tunable that divides the grid along that axis (:mod:`r3tui.remix.coarsen`)."""
    try:
        out, detail = coarsen_kernel(source, kernel_name, rng)
    except Declined as exc:
        return _declined(str(exc))
    return _finish(source, out, kernel_name, detail)


def split_loop(source: str, kernel_name: str, rng: random.Random) -> RuleResult:
    """A thread's summing loop split over several threads an element, combined with warp
    shuffles, their number a tunable that multiplies the grid along x
    (:mod:`r3tui.remix.split`)."""
    try:
        out, detail = split_kernel_loop(source, kernel_name, rng)
    except Declined as exc:
        return _declined(str(exc))
    return _finish(source, out, kernel_name, detail)


def tile_shared(source: str, kernel_name: str, rng: random.Random) -> RuleResult:
    """A loop's reads that the block's threads share, staged in shared memory tiles of a
    tunable number of iterations (:mod:`r3tui.remix.tile`)."""
    try:
        out, detail = tile_loop(source, kernel_name, rng)
    except Declined as exc:
        return _declined(str(exc))
    return _finish(source, out, kernel_name, detail)


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
}


def apply_rule(name: str, source: str, kernel_name: str, rng: random.Random) -> RuleResult:
    """Run the rule called ``name``; a rule that fails on odd text declines, never raises."""
    try:
        rule = RULES[name]
    except KeyError:
        raise ConfigError(f"unknown rule {name!r}", hint=f"known: {', '.join(RULES)}") from None
    try:
        return rule(source, kernel_name, rng)
    except (ValueError, IndexError) as exc:  # text the analysis does not expect
        return _declined(f"{name} cannot analyse this source: {exc}")
