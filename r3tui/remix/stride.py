"""Rules that give a thread more elements along x and divide the launch's grid by a tunable:
``grid_stride`` (a body run per element in a grid-stride loop) and ``strided_accumulate``
(a block reduction's threads each sum several elements before it), read from the masked
text."""

from __future__ import annotations

import random
import re

from r3tui.remix.rule_base import (
    RuleResult,
    brace_depth,
    declined,
    finish,
    from_block_index,
    kernel_body_text,
    matching_brace,
)

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
    found = kernel_body_text(source, kernel_name)
    if isinstance(found, RuleResult):
        return found
    span, _, body_start, body = found
    index = _INDEX.search(body)
    if index is None:
        return declined("no `int i = blockIdx.x * blockDim.x + threadIdx.x;` in the kernel")
    name = index.group("i")
    guard = _EARLY_RETURN.match(body, index.end())
    rest_at, rest_end = (guard.end(), len(body)) if guard is not None else (0, 0)
    if guard is None:  # `if (i < n) { REST }` closing the body
        guard = _ENCLOSING.match(body, index.end())
        close = matching_brace(body, guard.end() - 1) if guard is not None else None
        if guard is None or close is None or body[close + 1:].strip():
            guard = None
        else:
            rest_at, rest_end = guard.end(), close
    if guard is None or guard.group("i") != name:
        return declined(f"no `if ({name} >= bound) return;` or `if ({name} < bound) {{ ... }}` "
                         "around the rest of the body right after the index")
    bound = guard.group("bound").strip()
    if re.search(rf"\b{re.escape(name)}\b", bound) or re.search(r"\+\+|--|[^=!<>]=[^=]", bound):
        return declined("the guard's bound depends on the index or assigns")
    if brace_depth(body, index.start()) != 0:
        return declined("the index is not declared at the top of the kernel's body")
    rest = body[rest_at:rest_end]
    if _SYNC.search(body):
        return declined("the body synchronizes threads or uses shared memory")
    if re.search(rf"(?<![\w.]){re.escape(name)}\s*(?:[-+*/%&|^]?=(?!=)|\+\+|--)|"
                 rf"(?:\+\+|--)\s*{re.escape(name)}\b|&\s*{re.escape(name)}\b", rest):
        return declined(f"the body assigns or takes the address of {name}")
    line = source.count("\n", 0, body_start + index.start()) + 1
    macro = f"R3_WPT_{line}"
    if re.search(rf"\b{macro}\b", source):
        return declined(f"{macro} is already a name in the source")
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
        return declined(f"the declaration of {name} does not start its line")
    out = source[:line_start] + header + loop + source[span.body_end - 1:]
    return finish(source, out, kernel_name,
                   f"a grid-stride loop over {name} at line {line}, {macro} elements a thread "
                   f"in {{{factors}}}")


# `buf[tid] = (i < n) ? x[i] : 0.0f;`: one element a thread into shared memory, zero past n
_GUARDED_LOAD = re.compile(
    r"(?P<lhs>(?P<arr>[A-Za-z_]\w*)\s*\[\s*[A-Za-z_]\w*\s*\])\s*=\s*\(\s*"
    r"(?P<i>[A-Za-z_]\w*)\s*<\s*(?P<bound>[^?;{}]+?)\s*\)\s*\?\s*(?P<value>[^:;?{}]+?)\s*:"
    r"\s*(?P<zero>[^:;?{}]+?)\s*;")
_SHARED_ARRAY = r"__shared__\s+(?P<type>(?:unsigned\s+|signed\s+)?[A-Za-z_]\w*)\s+{arr}\s*\["
_GRID_THREADS = ("gridDim.x * gridDim.y * gridDim.z * blockDim.x * blockDim.y * blockDim.z")


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
    found = kernel_body_text(source, kernel_name)
    if isinstance(found, RuleResult):
        return found
    _, _, body_start, body = found
    load = _GUARDED_LOAD.search(body)
    if load is None:
        return declined("no `buf[tid] = (i < n) ? x[i] : 0;` load into shared memory")
    name, arr = load.group("i"), load.group("arr")
    shared = re.search(_SHARED_ARRAY.format(arr=re.escape(arr)), body)
    if shared is None:
        return declined(f"{arr} is not a __shared__ array of the kernel")
    value, bound = load.group("value"), load.group("bound")
    if not re.search(rf"\[[^\]]*\b{re.escape(name)}\b[^\]]*\]", value):
        return declined(f"the loaded value does not index with {name}")
    if re.search(r"\+\+|--|[^=!<>]=[^=]", value + bound) or re.search(
            rf"\b{re.escape(name)}\b", bound):
        return declined("the load or its bound assigns, or the bound depends on the index")
    if not from_block_index(body[:load.start()], name):
        return declined(f"{name} is not set from the block's index before the load")
    after = body[load.end():]
    if re.search(rf"(?<![\w.]){re.escape(name)}\s*(?:[-+*/%&|^]?=(?!=)|\+\+|--)", after):
        return declined(f"{name} is assigned after the load")
    line = source.count("\n", 0, body_start + load.start()) + 1
    macro, acc, k = f"R3_WPT_{line}", f"r3_acc_{line}", f"r3_k_{line}"
    if re.search(rf"\b(?:{macro}|{acc}|{k})\b", source):
        return declined(f"{macro} is already a name in the source")
    at = body_start + load.start()
    line_start = source.rfind("\n", 0, at) + 1
    if source[line_start:at].strip():
        return declined("the load does not start its line")
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
    return finish(source, out, kernel_name,
                   f"{macro} elements a thread summed before the reduction at line {line}, "
                   f"in {{{factors}}}")
