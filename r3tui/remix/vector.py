"""The ``vector_access`` rule: a thread's strided loop made to touch its arrays through
``float4``/``int4``/``double2``, read from the masked text."""

from __future__ import annotations

import random
import re

from r3tui.analysis.text import mask
from r3tui.remix.rule_base import (
    RuleResult,
    declined,
    finish,
    from_block_index,
    kernel_span,
    matching_brace,
)

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


def pointer_type(text: str, name: str) -> str | None:
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
    return any(from_block_index(before, v, 3) or _reads_thread(before, v)
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
    span = kernel_span(source, kernel_name)
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
            close = matching_brace(masked, loop.end())
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
        kinds = {a: pointer_type(declared, a) for a in arrays}
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
        return declined(why)
    loop, inner, stmt_end, arrays, kinds = rng.choice(candidates)
    c, ctype = loop.group("c"), loop.group("type")
    lanes = VECTORS[next(iter(kinds.values()))][1]  # type: ignore[index]
    line = source.count("\n", 0, loop.start()) + 1
    c4 = f"r3_v{line}_{c}"
    if re.search(rf"\b{c4}\b", source):
        return declined(f"{c4} is already a name in the source")
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
    return finish(source, out, kernel_name,
                   f"the loop over {c} at line {line} touches {', '.join(sorted(arrays))} "
                   f"{lanes} elements at a time")
