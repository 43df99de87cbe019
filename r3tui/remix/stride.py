"""Rules that give a thread more elements along x and divide the launch's grid by a tunable:
``grid_stride`` (a body run per element in a grid-stride loop, read from the parse) and
``strided_accumulate`` (a block reduction's threads each sum several elements before it,
read from the masked text, with vector loads where the elements are one array's)."""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

import tree_sitter as ts

from r3tui.analysis.body import kernel_body
from r3tui.analysis.kernels import Parsed
from r3tui.analysis.per_thread import (
    TOGETHER,
    changed_target,
    grid_indices,
    lvalue_base,
    single_init,
    statements,
    walk,
)
from r3tui.analysis.text import mask
from r3tui.remix.rule_base import (
    RuleResult,
    declined,
    finish,
    from_block_index,
    kernel_body_text,
)
from r3tui.remix.vector import VECTORS, pointer_type

WPT_FACTORS = (1, 2, 4, 8, 16)
# a reduction's threads each sum up to 256 elements first: every block ends in an atomic on
# one address, and reduce_sum's 2^26 elements in blocks of 256 threads at 16 a thread are
# still 16,384 blocks, each adding to the same double
ACCUMULATE_FACTORS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def _work_per_thread(indent: str, macro: str, values: tuple[int, ...] = WPT_FACTORS) -> str:
    """The declarations of a tunable elements-a-thread count that divides the launch's grid
    (``values``, 1 by default: the recorded grid, the original's work)."""
    factors = " ".join(str(f) for f in values)
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
    statements still end one element's work.  Only for bodies where the threads of a block do
    not work together (barriers, warp operations, shared memory: they would run different
    numbers of elements) and that never assign the index or take its address; read from the
    parse (:mod:`r3tui.analysis.per_thread`).  For an application's kernel the campaign offers
    it only where ``r3 apply`` can rescale the host code's grid.
    """
    found = kernel_body(source, kernel_name)
    if found is None:
        return declined(f"no __global__ function {kernel_name!r} is defined in the source")
    body, parsed = found
    together = TOGETHER.search(mask(parsed.text(body)))
    if together is not None:
        return declined(f"the body uses {together.group(0)}: its threads do not each work "
                        "alone")
    index = next((ix for ix in grid_indices(body, parsed) if ix.axis == "x"), None)
    if index is None:
        return declined("no `int i = blockIdx.x * blockDim.x + threadIdx.x;` at the top of "
                        "the kernel's body")
    name = index.name
    top = [n for n in statements(body) if n.type != "comment"]
    at = next(k for k, n in enumerate(top) if n.id == index.node.id)
    guard = _guard(top[at + 1] if at + 1 < len(top) else None, name, parsed)
    if guard is None:
        return declined(f"no `if ({name} >= bound) return;` or `if ({name} < bound) {{ ... }}` "
                        "around the rest of the body right after the index")
    op, bound, rest = guard
    if rest.enclosing and at + 2 < len(top):
        return declined(f"statements follow the `if ({name} < bound) {{ ... }}` around the "
                        "rest of the body")
    if any(n.type == "identifier" and parsed.text(n) == name for n in walk(bound)) or any(
            n.type in ("assignment_expression", "update_expression", "call_expression")
            for n in walk(bound)):
        return declined("the guard's bound depends on the index, assigns or calls")
    char = parsed.char
    rest_text = source[char(rest.start):char(rest.end)]
    for node in (n for lo in rest.nodes for n in walk(lo)):
        target = changed_target(node)
        base = lvalue_base(target) if target is not None else None
        if base is not None and parsed.text(base) == name:
            return declined(f"the body assigns or takes the address of {name}")
    decl_at = char(index.node.start_byte)
    line = source.count("\n", 0, decl_at) + 1
    macro = f"R3_WPT_{line}"
    if re.search(rf"\b{macro}\b", source):
        return declined(f"{macro} is already a name in the source")
    line_start = source.rfind("\n", 0, decl_at) + 1
    if source[line_start:decl_at].strip():
        return declined(f"the declaration of {name} does not start its line")
    condition = (f"{name} < ({parsed.text(bound)})" if op in (">=", "<") else
                 f"{name} <= ({parsed.text(bound)})")
    value = single_init(index.node)
    assert value is not None  # a grid index is a declaration with one initializer
    kind = index.type
    indent = source[line_start:decl_at]
    factors = " ".join(str(f) for f in WPT_FACTORS)
    header = _work_per_thread(indent, macro)
    loop = (f"{indent}auto r3_element_{line} = [&]({kind} {name}) {{{rest_text}\n{indent}}};\n"
            f"{indent}for ({kind} {name} = {parsed.text(value[1])}; "
            f"{condition}; {name} += ({kind})blockDim.x * gridDim.x) {{\n"
            f"{indent}    r3_element_{line}({name});\n{indent}}}\n")
    out = source[:line_start] + header + loop + source[char(body.end_byte) - 1:]
    return finish(source, out, kernel_name,
                  f"a grid-stride loop over {name} at line {line}, {macro} elements a thread "
                  f"in {{{factors}}}")


@dataclass(frozen=True)
class _Rest:
    """What the grid-stride loop runs per element: the statements after the guard (or inside
    the enclosing ``if``), from byte ``start`` to ``end``."""

    nodes: tuple[ts.Node, ...]
    start: int
    end: int
    enclosing: bool


def _guard(node: ts.Node | None, name: str, parsed: Parsed
           ) -> tuple[str, ts.Node, _Rest] | None:
    """``if (NAME >= bound) return;`` (or ``>``, or ``{ return; }``), or
    ``if (NAME < bound) { ... }`` (or ``<=``): its operator, its bound and the rest of the
    body it guards."""
    if node is None or node.type != "if_statement" or node.child_by_field_name(
            "alternative") is not None:
        return None
    condition = node.child_by_field_name("condition")
    consequence = node.child_by_field_name("consequence")
    while condition is not None and condition.type in ("condition_clause",
                                                      "parenthesized_expression"):
        inner = [c for c in condition.named_children if c.type != "comment"]
        condition = inner[0] if len(inner) == 1 else None
    if condition is None or consequence is None or condition.type != "binary_expression":
        return None
    left, right = condition.child_by_field_name("left"), condition.child_by_field_name("right")
    op_node = condition.child_by_field_name("operator")
    if left is None or right is None or op_node is None or parsed.text(left) != name:
        return None
    op = parsed.text(op_node)
    body = node.parent
    assert body is not None
    if op in (">=", ">"):
        returns = consequence.type == "return_statement" and not consequence.named_children
        if consequence.type == "compound_statement":
            inner = [c for c in statements(consequence) if c.type != "comment"]
            returns = (len(inner) == 1 and inner[0].type == "return_statement"
                       and not inner[0].named_children)
        if not returns:
            return None
        after = [n for n in statements(body) if n.start_byte >= node.end_byte]
        return op, right, _Rest(tuple(after), node.end_byte, body.end_byte - 1, False)
    if op in ("<", "<=") and consequence.type == "compound_statement":
        return op, right, _Rest(tuple(statements(consequence)), consequence.start_byte + 1,
                                consequence.end_byte - 1, True)
    return None


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
    launch's grid (``// r3: work_per_thread R3_WPT_<line>``, ``ACCUMULATE_FACTORS``: 1 to 256;
    1 launches the recorded grid and sums what the original summed).  ``i`` must be the
    thread's index over the whole grid (each thread its own element), as a one-element-a-thread
    load implies; a kernel where it is not fails verification.  For an application's kernel
    the campaign offers it only where ``r3 apply`` can rescale the host code's grid.
    """
    found = kernel_body_text(source, kernel_name)
    if isinstance(found, RuleResult):
        return found
    span, _, body_start, body = found
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
    vec, start, lanes_v, vn = (f"R3_VEC_{line}", f"r3_from_{line}", f"r3_v_{line}",
                               f"r3_vn_{line}")
    if re.search(rf"\b(?:{macro}|{acc}|{k}|{vec}|{start}|{lanes_v}|{vn})\b", source):
        return declined(f"{macro} is already a name in the source")
    at = body_start + load.start()
    line_start = source.rfind("\n", 0, at) + 1
    if source[line_start:at].strip():
        return declined("the load does not start its line")
    indent = re.match(r"[ \t]*", source[line_start:]).group(0)  # type: ignore[union-attr]
    factors = " ".join(str(f) for f in ACCUMULATE_FACTORS)
    original = source[at:body_start + load.end()]
    each = re.sub(rf"(?<![\w.]){re.escape(name)}\b", k, source[
        body_start + load.start("value"):body_start + load.end("value")])
    limit = source[body_start + load.start("bound"):body_start + load.end("bound")]
    zero = source[body_start + load.start("zero"):body_start + load.end("zero")]
    lhs = source[body_start + load.start("lhs"):body_start + load.end("lhs")]
    stride = f"(decltype({k})){_GRID_THREADS}"
    vector = _vector_part(source[span.start:span.body_end], source[
        body_start + load.start("value"):body_start + load.end("value")], name, indent,
        (vec, start, lanes_v, vn, acc, k), limit, stride)
    text = (_work_per_thread(indent, macro, ACCUMULATE_FACTORS)
            + f"{indent}// was: {original.strip()}\n"
            f"{indent}{shared.group('type')} {acc} = {zero};\n"
            + (vector or "")
            + f"{indent}for (auto {k} = {start if vector else name}; {k} < {limit}; "
            f"{k} += {stride}) {{\n"
            f"{indent}    {acc} += {each};\n{indent}}}\n"
            f"{indent}{lhs} = {acc};")
    out = source[:line_start] + text + source[body_start + load.end():]
    return finish(source, out, kernel_name,
                   f"{macro} elements a thread summed before the reduction at line {line}, "
                   f"in {{{factors}}}" + (f", loaded {vec} at a time" if vector else ""))


# `x[i]`: the one array read of a summed value, at the thread's index
_READ = r"(?<![\w.])(?P<arr>[A-Za-z_]\w*)\s*\[\s*{name}\s*\]"


def _vector_part(kernel: str, value: str, name: str, indent: str, names: tuple[str, ...],
                 limit: str, stride: str) -> str | None:
    """Where every use of the index in the summed value is one read ``x[i]`` of one array of
    floats or doubles: the first part of the thread's sum loaded through ``float4`` (4 floats;
    ``double2``, 2 doubles) at a time, a tunable (``R3_VEC_<line>``, 1 or the lanes; 1 sums
    what the original summed, one element at a time) that takes effect where the array is
    aligned to the vector at run time; the elements past the last whole vector are left to
    the scalar loop that follows (starting at ``r3_from``).  None where the value does not
    qualify."""
    vec, start, lane_var, vn, acc, k = names
    read = re.compile(_READ.format(name=re.escape(name)))
    arrays = {m.group("arr") for m in read.finditer(value)}
    others = read.sub("", value)
    if len(arrays) != 1 or re.search(rf"(?<![\w.]){re.escape(name)}\b", others):
        return None
    (arr,) = arrays
    element = pointer_type(kernel, arr)
    if element not in ("float", "double"):
        return None
    vector_type, lanes = VECTORS[element]
    summed = "".join(
        f"{indent}        {acc} += "
        + read.sub(f"{lane_var}.{lane}", value) + ";\n"
        for lane in "xyzw"[:lanes])
    return (f"{indent}// r3: tune {vec} 1 {lanes}\n"
            f"#ifndef {vec}\n#define {vec} 1\n#endif\n"
            f"{indent}auto {start} = {name};\n"
            f"#if {vec} > 1\n"
            f"{indent}if (reinterpret_cast<unsigned long long>({arr}) % sizeof({vector_type}) "
            f"== 0) {{\n"
            f"{indent}    const auto {vn} = (decltype({start}))(({limit}) / {lanes});\n"
            f"{indent}    for (auto {k} = {name}; {k} < {vn}; {k} += {stride}) {{\n"
            f"{indent}        const {vector_type} {lane_var} = "
            f"reinterpret_cast<const {vector_type}*>({arr})[{k}];\n"
            + summed
            + f"{indent}    }}\n"
            f"{indent}    {start} = {vn} * {lanes} + {name};\n"
            f"{indent}}}\n"
            f"#endif\n")
