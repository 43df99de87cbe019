"""What a kernel's threads do alone, read from the parse: the indices a thread takes from its
block and thread coordinates, which locals depend on them, and what each statement of the body
is to one thread's elements.

The facts :mod:`r3tui.remix.coarsen` rewrites by.  A kernel whose threads each work alone
(no barrier, shared memory or warp operation) and that takes an index along an axis of the
grid (``int row = blockIdx.y * blockDim.y + threadIdx.y;``) is read as: the locals that
depend on the index (through their initializers, or by being assigned where the index is
read), to a fixed point; and for each statement, whether it reads none of them (``plain``),
declares one (``declaration``), holds statements that do while its own clauses do not
(``kept``: a loop over ``k`` in sgemm), ends an element's work at the top of the body
(``guard``: ``if (row >= M) return;``), or depends on them as a whole (``each``).  Where the
body has what this reading cannot follow, :class:`Unsupported` says what.  Names are taken as
names: a local declared twice is one name, so whatever is decided for it holds for both.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass

import tree_sitter as ts

from r3tui.analysis.kernels import Parsed
from r3tui.analysis.text import mask

# what makes a block's threads work together, or a thread's work depend on time
TOGETHER = re.compile(
    r"\b(?:__syncthreads\w*|__syncwarp|__shfl\w*|__ballot\w*|__any_sync|__all_sync"
    r"|__match\w*|__activemask|__reduce_\w+_sync|cooperative_groups|this_thread_block"
    r"|this_grid|tiled_partition|__shared__|asm|goto|__nanosleep|clock|clock64"
    r"|__globaltimer|setjmp)\b")
_LOOPS = frozenset({"for_statement", "while_statement", "do_statement", "for_range_loop"})
_INTEGER_TYPE = re.compile(
    r"^(?:const\s+)?(?:(?:unsigned|signed)\s+)?(?:int|long|long\s+long|short|unsigned|size_t"
    r"|ptrdiff_t|u?int(?:32|64)_t|Index_t|index_t)(?:\s+int)?$")
# calls that neither write memory nor have effects a thread without work must not make
_PURE_CALL = re.compile(
    r"^(?:make_\w+|__(?!trap|brkpt|prof_trigger)\w+|(?:std::)?(?:min|max|abs|fabs\w*|sqrt\w*"
    r"|rsqrt\w*|cbrt\w*|exp\w*|log\w*|pow\w*|sin\w*|cos\w*|tan\w*|atan2?\w*|fma\w*|floor\w*"
    r"|ceil\w*|round\w*|trunc\w*|fmin\w*|fmax\w*|erf\w*|tanh\w*|copysign\w*|hypot\w*"
    r"|static_cast|reinterpret_cast|const_cast)|float\d?|double\d?|int\d?|uint\d?)$")


_ARITHMETIC = (r"(?:(?:unsigned|signed)\s+)?(?:char|short|int|long(?:\s+long)?|float|double|bool"
               r"|unsigned|size_t|ptrdiff_t|u?int(?:8|16|32|64)_t|__half|half)")


# what a pure function never does
_IMPURE = re.compile(r"\b(?:asm|atomic\w*|printf|malloc|free|new|delete|__trap|goto|volatile"
                     r"|__shared__|__syncthreads\w*|static)\b")


def _function_declarator(function: ts.Node) -> ts.Node | None:
    """A function definition's declarator of its name and parameters (through pointers and
    references of the return type)."""
    node = function.child_by_field_name("declarator")
    while node is not None and node.type != "function_declarator":
        node = node.child_by_field_name("declarator")
    return node


def _defined_name(function: ts.Node, parsed: Parsed) -> str | None:
    """The unqualified name a function definition defines."""
    node = _function_declarator(function)
    named = node.child_by_field_name("declarator") if node is not None else None
    if named is None:
        return None
    return re.sub(r"<.*>$", "", parsed.text(named)).split("::")[-1].strip()


def arithmetic_type(name: str, source: str) -> bool:
    """Whether ``name`` is an arithmetic type: a built-in one, or a name ``source`` defines as
    one (``#define FLOAT double``, ``typedef float real;``, through such names)."""
    return re.fullmatch(_ARITHMETIC, resolved_type(name, source)) is not None


def resolved_type(name: str, source: str) -> str:
    """``name`` with the ``typedef``s and object-like ``#define``s of ``source`` that name a
    type followed, four deep at most (lulesh's ``Real_t`` -> ``real8`` -> ``double``)."""
    for _ in range(5):
        if re.fullmatch(_ARITHMETIC, name) or not re.fullmatch(r"[A-Za-z_]\w*", name):
            return name
        found = re.search(rf"^[ \t]*#[ \t]*define[ \t]+{name}[ \t]+(?P<a>\w+(?:[ \t]+\w+)?)"
                          rf"[ \t]*$|\btypedef\s+(?P<b>\w+(?:\s+\w+)?)\s+{name}\s*;", source,
                          re.MULTILINE)
        if found is None:
            return name
        name = re.sub(r"\s+", " ", found.group("a") or found.group("b")).strip()
    return name


class Unsupported(Exception):
    """What in a kernel's body this reading cannot follow (one line, for a rule's reason)."""


@dataclass(frozen=True)
class GridIndex:
    """``int NAME = blockIdx.A * blockDim.A + threadIdx.A;`` at the top of a body."""

    axis: str  # "x", "y" or "z"
    node: ts.Node  # its declaration, a statement of the body
    name: str
    type: str  # the declared type, without const


def check_alone(body: ts.Node, parsed: Parsed) -> None:
    """:class:`Unsupported` where the body's threads work together or hold what this reading
    cannot follow (a parse error, a lambda, a label, preprocessor lines with code)."""
    together = TOGETHER.search(mask(parsed.text(body)))
    if together is not None:
        raise Unsupported(f"the body uses {together.group(0)}: its threads do not each work "
                          "alone")
    for node in walk(body):
        if node.type == "ERROR" or node.is_missing:
            raise Unsupported("the parser could not read part of the kernel's body")
        if node.type == "lambda_expression":
            raise Unsupported("the body defines a lambda")
        if node.type.startswith("preproc") and not harmless_directive(node, parsed):
            raise Unsupported("the body holds preprocessor lines other than #pragma and a "
                              "tunable's #ifndef/#define")
        if node.type == "labeled_statement":
            raise Unsupported("the body has a label")


def harmless_directive(node: ts.Node, parsed: Parsed) -> bool:
    """A ``#pragma``, or a tunable's default (``#ifndef N`` / ``#define N v`` / ``#endif``,
    as the rules write it): lines that hold no code."""
    if node.type == "preproc_call":
        return parsed.text(node).lstrip().startswith("#pragma")
    if node.type in ("preproc_def", "preproc_arg", "preproc_directive"):
        return True
    if node.type == "preproc_ifdef":
        return all(c.type in ("identifier", "preproc_def", "comment")
                   for c in node.named_children)
    return False


def walk(node: ts.Node, skip: Collection[int] = ()) -> list[ts.Node]:
    """``node`` and every node under it, in source order; those whose id is in ``skip`` are
    left out with everything under them."""
    out, stack = [], [node]
    while stack:
        current = stack.pop()
        if current.id in skip:
            continue
        out.append(current)
        stack.extend(reversed(current.children))
    return out


def statements(block: ts.Node) -> list[ts.Node]:
    """A compound statement's children that are statements, declarations, pragmas or
    comments (not its braces)."""
    return [c for c in block.children if c.type not in ("{", "}")]


_INDEX_FORMS = (
    "blockIdx.{a}*blockDim.{a}+threadIdx.{a}", "blockDim.{a}*blockIdx.{a}+threadIdx.{a}",
    "threadIdx.{a}+blockIdx.{a}*blockDim.{a}", "threadIdx.{a}+blockDim.{a}*blockIdx.{a}",
)


def single_init(node: ts.Node) -> tuple[ts.Node, ts.Node] | None:
    """``(name, value)`` of a declaration of one plain name with an initializer
    (``int i = ...;``); None for anything else."""
    if node.type != "declaration":
        return None
    declarators = node.children_by_field_name("declarator")
    if len(declarators) != 1 or declarators[0].type != "init_declarator":
        return None
    name_node = declarators[0].child_by_field_name("declarator")
    value = declarators[0].child_by_field_name("value")
    if name_node is None or name_node.type != "identifier" or value is None:
        return None
    return name_node, value


def grid_indices(body: ts.Node, parsed: Parsed) -> list[GridIndex]:
    out = []
    for node in statements(body):
        init = single_init(node)
        if init is None:
            continue
        name_node, value = init
        compact = _compact(parsed.text(value))
        kind = parsed.text(node)[:name_node.start_byte - node.start_byte].strip()
        kind = re.sub(r"^const\s+|\s+const$", "", kind)
        if not _INTEGER_TYPE.match(kind):
            continue
        for axis in "xyz":
            if compact in (form.format(a=axis) for form in _INDEX_FORMS):
                out.append(GridIndex(axis, node, parsed.text(name_node), kind))
    return out


def _kernel_statements(source: str, kernel: str
                       ) -> tuple[ts.Node, Parsed, list[ts.Node]] | None:
    """The kernel's body, its parse and the body's top-level statements (None: no such
    kernel)."""
    from r3tui.analysis.body import kernel_body

    found = kernel_body(source, kernel)
    if found is None:
        return None
    body, parsed = found
    return body, parsed, statements(body)


def _edited(parsed: Parsed, edits: list[tuple[int, int, str]]) -> str:
    """The parsed text with ``edits`` (start, end, text: byte spans that do not overlap; an
    insertion has start == end) made, in order of place."""
    data = parsed.data
    out, cursor = [], 0
    for start, end, text in sorted(edits, key=lambda e: (e[0], e[1])):
        out.append(data[cursor:start].decode("utf-8", "replace"))
        out.append(text)
        cursor = end
    out.append(data[cursor:].decode("utf-8", "replace"))
    return "".join(out)


def declared_at_assignment(source: str, kernel: str) -> str:
    """``source`` with each grid index that ``kernel`` declares first and assigns later, in the
    older C style (``int i, j; ... i = blockDim.x * blockIdx.x + threadIdx.x;``), declared
    where it is assigned (``int i = ...;``), so the rules that read an index declaration find
    it; ``source`` itself where there is none.  Only where that changes nothing: the
    assignment is a statement at the top of the body, the index is an integer declared at the
    top of the body before it without an initializer and named nowhere in between, and
    nothing else assigns it or takes its address."""
    found = _kernel_statements(source, kernel)
    if found is None:
        return source
    body, parsed, top = found
    edits: list[tuple[int, int, str]] = []
    for k, node in enumerate(top):
        assigned = _index_assignment(node, parsed)
        if assigned is None:
            continue
        name, value = assigned
        declaration = next((d for d in top[:k] if d.type == "declaration"
                            and name in _uninitialized(d, parsed)), None)
        if declaration is None:
            continue
        first = declaration.children_by_field_name("declarator")[0]
        kind = parsed.data[declaration.start_byte:first.start_byte].decode().strip()
        if not _INTEGER_TYPE.match(kind) or re.match(r"const\b", kind):
            continue
        between = top[top.index(declaration) + 1:k]
        if any(_names(n, parsed, name) for n in between):
            continue
        writes = [n for n in walk(body) if (t := write_target(n)) is not None
                  and (b := lvalue_base(t)) is not None and parsed.text(b) == name]
        taken = [n for n in walk(body) if n.type == "pointer_expression"
                 and parsed.text(n).lstrip().startswith("&") and _names(n, parsed, name)]
        if len(writes) != 1 or taken:
            continue
        edits.append(_drop_declarator(declaration, parsed, name))
        edits.append((node.start_byte, node.end_byte, f"{kind} {name} = {value};"))
    return _edited(parsed, edits) if edits else source


def index_named(source: str, kernel: str) -> str:
    """``source`` with each grid index that ``kernel`` declares at the top of its body (``int
    xidx = blockIdx.x * blockDim.x + threadIdx.x;``) but spells out in statements before its
    declaration (Rodinia gaussian's Fan2: ``if (threadIdx.x + blockIdx.x * blockDim.x >= ...)
    return;`` first) declared at the top of the body instead, and those spellings replaced by
    its name, so the rules that read an index and its bound checks find them; ``source``
    itself where there is none.  Only where the statements before it name nothing of that
    name (no use, no shadowing declaration); the name is an ``int``-like type where the sum
    is ``unsigned``, which differs only for a bound below zero, where the original's
    comparison lets every thread through (replay verifies the variant either way)."""
    found = _kernel_statements(source, kernel)
    if found is None:
        return source
    body, parsed, top = found
    edits: list[tuple[int, int, str]] = []
    for index in grid_indices(body, parsed):
        k = top.index(index.node)
        before = top[:k]
        forms = {form.format(a=index.axis) for form in _INDEX_FORMS}
        spelled = [n for statement in before for n in walk(statement)
                   if n.type in ("binary_expression", "parenthesized_expression")
                   and _compact(parsed.text(n)) in forms]
        # the outermost spellings only (a parenthesized sum holds the sum)
        spelled = [n for n in spelled if not any(
            o is not n and o.start_byte <= n.start_byte and n.end_byte <= o.end_byte
            for o in spelled)]
        if not spelled or any(_names(n, parsed, index.name) for n in before):
            continue
        line_start = parsed.line_start(index.node.start_byte)
        indent = parsed.data[line_start:index.node.start_byte].decode()
        declaration = parsed.text(index.node)
        first = parsed.line_start(top[0].start_byte)
        edits.append((*_own_line(index.node, parsed), ""))  # grid_indices: one name
        edits.append((first, first, f"{indent}{declaration}\n"))
        edits.extend((n.start_byte, n.end_byte, index.name) for n in spelled)
    return _edited(parsed, edits) if edits else source


def _compact(text: str) -> str:
    """``text`` without white space or the parentheses around the whole of it."""
    compact = re.sub(r"\s+", "", text)
    while compact.startswith("(") and compact.endswith(")"):
        compact = compact[1:-1]
    return compact


_RELATIONAL = frozenset({"<", "<=", ">", ">="})


def single_element_axes(body: ts.Node, parsed: Parsed, indices: list[GridIndex]) -> set[str]:
    """The axes of ``indices`` along which one index value alone does the work: a statement of
    the body ends the thread unless the index equals a constant (``if (... || layer != 0)
    return;``, sgemm's third axis).  A thread there computes one element at most, so giving it
    several along that axis gains nothing."""
    by_name = {ix.name: ix.axis for ix in indices}
    out: set[str] = set()

    def disjuncts(node: ts.Node) -> list[ts.Node]:
        while node.type in ("parenthesized_expression", "condition_clause") and (
                node.named_child_count == 1):
            node = node.named_children[0]
        op = node.child_by_field_name("operator") if node.type == "binary_expression" else None
        if op is not None and parsed.text(op) == "||":
            left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
            return [*(disjuncts(left) if left else []), *(disjuncts(right) if right else [])]
        return [node]

    for statement in statements(body):
        if statement.type != "if_statement":
            continue
        condition = statement.child_by_field_name("condition")
        consequence = statement.child_by_field_name("consequence")
        if condition is None or consequence is None:
            continue
        # the return is the consequence or one of its own statements: one nested deeper
        # does not end every such thread
        direct = (statements(consequence) if consequence.type == "compound_statement"
                  else [consequence])
        if not any(n.type == "return_statement" for n in direct):
            continue
        for part in disjuncts(condition):
            op = part.child_by_field_name("operator") if part.type == "binary_expression" \
                else None
            if op is None or parsed.text(op) != "!=":
                continue
            sides = [part.child_by_field_name("left"), part.child_by_field_name("right")]
            kinds = sorted(s.type for s in sides if s is not None)
            if kinds != ["identifier", "number_literal"]:
                continue
            name = next(parsed.text(s) for s in sides if s is not None and s.type == "identifier")
            if name in by_name:
                out.add(by_name[name])
    return out


def unchecked_axes(source: str, kernel: str) -> tuple[str, ...]:
    """The axes along which ``kernel`` takes a grid index (``int i = blockIdx.x * blockDim.x +
    threadIdx.x;``, or assigned so later) and never orders it (``<``, ``<=``, ``>``, ``>=``),
    nor a local computed from it by arithmetic, nor the axis's ``blockIdx``/``threadIdx``,
    against anything: every thread of the grid touches its element, so only a grid that
    covers the work exactly keeps it within its arrays (cfd's and hotspot3D's kernels, whose
    host code sizes the work to a multiple of the block).  An equality (``i == 0``, a
    boundary) is not a bound; a value read from memory at the index is not the index.  Empty
    where the kernel is not found or takes no such index."""
    from r3tui.analysis.body import kernel_body

    text = declared_at_assignment(source, kernel)
    found = kernel_body(text, kernel)
    if found is None:
        return ()
    body, parsed = found
    out = []
    for index in grid_indices(body, parsed):
        names = {index.name}
        while True:  # the locals whose value comes from the index, to a fixed point
            grown = set(names)
            for node in walk(body):
                target, value = None, None
                if node.type == "init_declarator":
                    target, value = declared_name(node), node.child_by_field_name("value")
                elif node.type == "assignment_expression":
                    left = node.child_by_field_name("left")
                    target = lvalue_base(left) if left is not None else None
                    value = node.child_by_field_name("right")
                if target is not None and value is not None and _arithmetic_of(value, parsed,
                                                                               names):
                    grown.add(parsed.text(target))
            if grown == names:
                break
            names = grown
        builtins = re.compile(rf"\b(?:blockIdx|threadIdx)\s*\.\s*{index.axis}\b")
        ordered = any(
            node.type == "binary_expression" and (op := node.child_by_field_name("operator"))
            is not None and parsed.text(op) in _RELATIONAL
            and (_arithmetic_of(node, parsed, names) or builtins.search(parsed.text(node)))
            for node in walk(body))
        if not ordered and index.axis not in out:
            out.append(index.axis)
    return tuple(a for a in "xyz" if a in out)


def _arithmetic_of(node: ts.Node, parsed: Parsed, names: set[str]) -> bool:
    """Whether ``node`` reads one of ``names`` other than inside a subscript (``a[i]``: a
    value from memory, not the index)."""
    stack = [node]
    while stack:
        n = stack.pop()
        if n.type == "subscript_expression":
            argument = n.child_by_field_name("argument")
            if argument is not None:
                stack.append(argument)
            continue
        if n.type == "identifier" and parsed.text(n) in names:
            return True
        stack.extend(n.children)
    return False


def _index_assignment(node: ts.Node, parsed: Parsed) -> tuple[str, str] | None:
    """``(name, value)`` of a statement ``NAME = <a grid index>;``."""
    if node.type != "expression_statement" or not node.named_children:
        return None
    expression = node.named_children[0]
    if expression.type != "assignment_expression":
        return None
    left, right = expression.child_by_field_name("left"), expression.child_by_field_name("right")
    op = expression.child_by_field_name("operator")
    if left is None or right is None or left.type != "identifier" or (
            op is not None and parsed.text(op) != "="):
        return None
    compact = _compact(parsed.text(right))
    if not any(compact == form.format(a=a) for form in _INDEX_FORMS for a in "xyz"):
        return None
    return parsed.text(left), parsed.text(right)


def _uninitialized(declaration: ts.Node, parsed: Parsed) -> set[str]:
    """The plain names a declaration declares without an initializer."""
    return {parsed.text(d) for d in declaration.children_by_field_name("declarator")
            if d.type == "identifier"}


def _names(node: ts.Node, parsed: Parsed, name: str) -> bool:
    return any(n.type == "identifier" and parsed.text(n) == name for n in walk(node))


def _own_line(node: ts.Node, parsed: Parsed) -> tuple[int, int]:
    """The span that removes ``node``: its whole line where nothing else is on it, else the
    node alone."""
    start, end = parsed.line_start(node.start_byte), node.end_byte
    after = parsed.data.find(b"\n", end)
    if after != -1 and not parsed.data[end:after].strip():
        end = after + 1
    if parsed.data[start:node.start_byte].strip():
        start = node.start_byte
    return start, end


def _drop_declarator(declaration: ts.Node, parsed: Parsed, name: str
                     ) -> tuple[int, int, str]:
    """The edit that removes ``name`` from a declaration (the whole line where it is the only
    name)."""
    declarators = declaration.children_by_field_name("declarator")
    at = next(k for k, d in enumerate(declarators) if parsed.text(d) == name)
    if len(declarators) == 1:
        return (*_own_line(declaration, parsed), "")
    if at == 0:
        return declarators[0].start_byte, declarators[1].start_byte, ""
    return declarators[at - 1].end_byte, declarators[at].end_byte, ""


def axis_alone(masked: str, axis: str) -> bool:
    """Whether the body reads the axis's block index, thread index and block size once each
    (in the index) and the grid's size not at all."""
    def count(what: str) -> int:
        return len(re.findall(rf"\b{what}\s*\.\s*{axis}\b", masked))

    return (count("blockIdx"), count("threadIdx"), count("blockDim"), count("gridDim")) == (
        1, 1, 1, 0)


class IndexDependence:
    """The body of one kernel read against the indices ``indices``: its locals, its top-level
    statements (an ``if (i < n) { ... }`` closing the body flattened), and the locals that
    depend on the indices (:attr:`dependent`)."""

    def __init__(self, source: str, body: ts.Node, parsed: Parsed,
                 indices: tuple[GridIndex, ...]) -> None:
        self.source, self.body, self.parsed = source, body, parsed
        self.indices = tuple(sorted(indices, key=lambda ix: ix.axis))
        # the source's __device__ functions read so far: pure, and where they may write
        self._pure: dict[str, bool] = {}
        self._refs: dict[str, set[int] | None] = {}
        self.locals = self._locals()
        self.top = self._top_level()
        self.dependent = self._dependence()

    # ---- analysis -------------------------------------------------------------------------

    def text(self, node: ts.Node) -> str:
        return self.parsed.text(node)

    def _locals(self) -> dict[str, ts.Node]:
        """Every local the body declares -> its (first) declarator's name node."""
        found: dict[str, ts.Node] = {}
        for node in walk(self.body):
            if node.type not in ("declaration", "parameter_declaration"):
                continue
            for declarator in node.children_by_field_name("declarator"):
                name = declared_name(declarator)
                if name is None:
                    continue
                # a name declared twice (in two blocks, or the two copies of the code after
                # a guard that an earlier coarsening wrote) is treated as one: every
                # declaration of a dependent name becomes an array and every use is indexed
                found.setdefault(self.text(name), name)
        return found

    def _statements(self) -> list[ts.Node]:
        """The body's statements but comments and a bare ``return;`` that ends it (kmeans'
        ``invert_mapping``: nothing of a thread's work follows it)."""
        top = [n for n in statements(self.body) if n.type != "comment"]
        if top and top[-1].type == "return_statement" and not top[-1].named_children:
            top.pop()
        return top

    def _top_level(self) -> list[ts.Node]:
        """The body's statements, with an ``if (i < n) { ... }`` that closes the body
        flattened: its statements follow it (it becomes a guard)."""
        top = self._statements()
        last = top[-1] if top else None
        if (last is not None and last.type == "if_statement"
                and last.child_by_field_name("alternative") is None):
            consequence = last.child_by_field_name("consequence")
            condition = last.child_by_field_name("condition")
            if (consequence is not None and consequence.type == "compound_statement"
                    and condition is not None
                    and not any(n.type == "return_statement" for n in walk(consequence))
                    and self.bounds(condition, enclosing=True)):
                return top + [n for n in statements(consequence) if n.type != "comment"]
        return top

    def bounds(self, condition: ts.Node, *, enclosing: bool, name: str | None = None
                ) -> bool:
        """Whether ``condition`` compares an index (``name``, or any) with an upper bound:
        ``i >= n`` (or ``n <= i``, ``i > n``) ending the thread, or ``i < n`` around its
        work."""
        names = {name} if name is not None else {ix.name for ix in self.indices}
        for node in walk(condition):
            if node.type != "binary_expression":
                continue
            left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
            op = node.child_by_field_name("operator")
            if left is None or right is None or op is None:
                continue
            operator = self.text(op)
            if enclosing:
                operator = {"<": ">=", "<=": ">", ">": "<=", ">=": "<"}.get(operator, "")
            if ((self.text(left) in names and operator in (">=", ">"))
                    or (self.text(right) in names and operator in ("<=", "<"))):
                return True
        return False

    def mentions(self, node: ts.Node, names: set[str]) -> bool:
        return any(n.type == "identifier" and self.text(n) in names for n in walk(node))

    def header(self, node: ts.Node) -> list[ts.Node]:
        """The parts of a kept statement that run once for all elements: a loop's or an
        if's clauses (not their bodies)."""
        bodies = {b.id for b in self.blocks(node)}
        return [c for c in node.children if c.id not in bodies]

    @staticmethod
    def blocks(node: ts.Node) -> list[ts.Node]:
        """The statements nested in ``node`` that the rewrite descends into."""
        if node.type == "compound_statement":
            return [node]
        if node.type in ("for_statement", "while_statement", "for_range_loop",
                         "do_statement"):
            inner = node.child_by_field_name("body")
            return [inner] if inner is not None else []
        if node.type == "if_statement":
            out = []
            consequence = node.child_by_field_name("consequence")
            if consequence is not None:
                out.append(consequence)
            alternative = node.child_by_field_name("alternative")
            if alternative is not None:  # an else_clause
                out.extend(c for c in alternative.named_children if c.type != "comment")
            return out
        return []

    def kind(self, node: ts.Node, names: set[str], top: bool = False) -> str:
        """``plain`` (runs once, reads no dependent local), ``declaration`` (declares a
        dependent local), ``kept`` (runs once; what it holds is rewritten), ``guard`` (ends an
        element's work: top level only) or ``each`` (runs once per element)."""
        if node.type == "declaration":
            declared = self.declared_by(node)
            return "declaration" if declared & names or self.mentions(node, names) else "plain"
        if not self.mentions(node, names):
            return "plain"
        if top and node.type == "if_statement" and self.guard_parts(node, names) is not None:
            return "guard"
        if self.blocks(node) and not any(self.mentions(h, names) for h in self.header(node)):
            return "kept"
        return "each"

    def guard_parts(self, node: ts.Node, names: set[str]) -> tuple[ts.Node, ts.Node] | None:
        """An ``if (COND) return;`` or ``if (COND) { ...; return; }`` whose condition depends
        on the index: (condition, consequence)."""
        condition = node.child_by_field_name("condition")
        consequence = node.child_by_field_name("consequence")
        if (condition is None or consequence is None or not self.mentions(condition, names)
                or node.child_by_field_name("alternative") is not None):
            return None
        if consequence.type == "return_statement":
            return condition, consequence
        if consequence.type != "compound_statement":
            return None
        inner = [n for n in statements(consequence) if n.type != "comment"]
        returns = [n for n in walk(consequence) if n.type == "return_statement"]
        if inner and inner[-1].type == "return_statement" and returns == [inner[-1]]:
            return condition, consequence
        return None

    def _dependence(self) -> set[str]:
        """The locals that hold one value per element: the index, those computed from it,
        and those assigned where an element's work runs; to a fixed point."""
        names = {ix.name for ix in self.indices}
        while True:
            before = set(names)
            self._grow(self.top, names, top=True)
            if names == before:
                return names

    def _grow(self, nodes: list[ts.Node], names: set[str], top: bool = False) -> None:
        for node in nodes:
            kind = self.kind(node, names, top)
            if kind == "declaration":
                names.update(self.dependent_declared(node, names))
            elif kind == "kept":
                for block in self.blocks(node):
                    inner = (statements(block) if block.type == "compound_statement"
                             else [block])
                    self._grow([n for n in inner if n.type != "comment"], names)
            elif kind in ("each", "guard"):
                names.update(self.assigned(node))

    def dependent_declared(self, declaration: ts.Node, names: set[str]) -> set[str]:
        """The names a declaration of dependent locals declares that depend on ``names``:
        all of them where it declares one, else each whose declarator (its initializer, an
        array's size) reads them, or that already does."""
        declarators = declaration.children_by_field_name("declarator")
        if len(declarators) <= 1:
            return self.declared_by(declaration)
        out = set()
        for declarator in declarators:
            name = declared_name(declarator)
            if name is not None and (self.text(name) in names
                                     or self.mentions(declarator, names)):
                out.add(self.text(name))
        return out

    def declared_by(self, declaration: ts.Node) -> set[str]:
        """The names a declaration declares."""
        return {self.text(n) for d in declaration.children_by_field_name("declarator")
                if (n := declared_name(d)) is not None}

    def declared_within(self, node: ts.Node) -> set[str]:
        """The names the declarations in ``node`` (itself included) declare."""
        return {name for d in walk(node) if d.type == "declaration"
                for name in self.declared_by(d)}

    def assigned(self, node: ts.Node) -> set[str]:
        """The locals declared outside ``node`` that ``node`` assigns, takes the address of,
        or passes to a call that may write them (a non-const reference parameter of a
        function the source defines, or any argument of a call it cannot read)."""
        inside = self.declared_within(node)
        out = set()
        for n in walk(node):
            targets = []
            target = changed_target(n)
            if target is not None:
                targets.append(target)
            if n.type == "call_expression" and not self.pure(n):
                targets.extend(self._written_arguments(n))
            for t in targets:
                base = lvalue_base(t)
                if base is not None and self.text(base) in self.locals:
                    out.add(self.text(base))
        return out - inside

    def _written_arguments(self, call: ts.Node) -> list[ts.Node]:
        """The arguments of ``call`` it may write through: those at a reference, pointer or
        array parameter not declared ``const`` of the function the source defines (every
        overload; a local array passed there decays to a pointer), or all of them where the
        source defines none of that name."""
        arguments = call.child_by_field_name("arguments")
        function = call.child_by_field_name("function")
        if arguments is None or function is None:
            return []
        given = [a for a in arguments.named_children if a.type != "comment"]
        name = re.sub(r"<.*>$", "", self.text(function)).split("::")[-1].strip()
        positions = self._reference_parameters(name)
        if positions is None:
            return given
        return [a for k, a in enumerate(given) if k in positions]

    def _reference_parameters(self, name: str) -> set[int] | None:
        """The positions of the parameters that the functions ``name`` the source defines
        may write through: references, pointers and arrays whose type is not ``const``
        (None: it defines none)."""
        if name not in self._refs:
            self._refs[name] = self._find_reference_parameters(name)
        return self._refs[name]

    def _definitions(self, name: str) -> list[ts.Node]:
        """The function definitions of ``name`` in the parse the body belongs to."""
        root = self.body
        while root.parent is not None:
            root = root.parent
        return [f for f in walk(root) if f.type == "function_definition"
                and _defined_name(f, self.parsed) == name]

    def _find_reference_parameters(self, name: str) -> set[int] | None:
        found = self._definitions(name)
        if not found:
            return None
        positions: set[int] = set()
        for function in found:
            node = _function_declarator(function)
            params = node.child_by_field_name("parameters") if node is not None else None
            if params is None:
                return None
            declared = [p for p in params.named_children if p.type != "comment"]
            for k, param in enumerate(declared):
                declarator = param.child_by_field_name("declarator")
                by_reference = declarator is not None and any(
                    x.type in ("reference_declarator", "pointer_declarator", "array_declarator")
                    for x in walk(declarator))
                head = self.parsed.data[param.start_byte:(
                    declarator.start_byte if declarator is not None else param.end_byte)]
                if by_reference and not re.search(rb"\bconst\b", head):
                    positions.add(k)
        return positions

    # ---- checks ---------------------------------------------------------------------------

    def check_each(self, node: ts.Node) -> None:
        """A statement that runs once per element cannot leave the thread or a loop
        outside it."""
        for n in walk(node):
            if n.type == "return_statement":
                raise Unsupported(f"line {self.line(n)}: a return that depends on the index "
                               "is not a guard at the top of the body")
            if n.type in ("break_statement", "continue_statement"):
                up = n.parent
                while up is not None and up.id != node.id:
                    if up.type in _LOOPS or (n.type == "break_statement"
                                             and up.type == "switch_statement"):
                        break
                    up = up.parent
                if up is None or up.id == node.id:
                    raise Unsupported(f"line {self.line(n)}: a {self.text(n).rstrip(';')} "
                                   "leaves a loop that does not depend on the index")

    def touches_memory(self, node: ts.Node, skip: Collection[int] = ()) -> bool:
        """Whether ``node`` reads or writes memory, or calls what might (the nodes whose id
        is in ``skip`` aside, with everything under them)."""
        for n in walk(node, skip):
            if n.type == "subscript_expression":
                base = lvalue_base(n)
                if base is None or not self.local_array(self.text(base)):
                    return True
            if n.type == "pointer_expression" and self.text(n).lstrip().startswith("*"):
                return True
            if n.type == "field_expression" and "->" in self.text(n):
                return True
            if n.type == "call_expression" and not self.pure(n):
                return True
        return False

    def writes_memory(self, node: ts.Node) -> bool:
        """Whether ``node`` writes anything but a local, or calls what might."""
        for n in walk(node):
            target = write_target(n)
            if target is not None:
                base = lvalue_base(target)
                if base is None or self.text(base) not in self.locals or (
                        target.type != "identifier" and not self.local_array(self.text(base))):
                    return True
            if n.type == "call_expression" and not self.pure(n):
                return True
        return False

    def local_array(self, name: str) -> bool:
        declarator = self.locals.get(name)
        parent = declarator.parent if declarator is not None else None
        return parent is not None and parent.type == "array_declarator"

    def pure(self, call: ts.Node, seen: frozenset[str] = frozenset()) -> bool:
        """Whether a call has no effect but its value: a math function, a cast the parser
        read as a call, or a ``__device__`` function of the source that is pure."""
        function = call.child_by_field_name("function")
        name = self.text(function) if function is not None else ""
        if function is not None and function.type == "parenthesized_expression":
            # `(FLOAT)(n - 1)`: the parser reads a cast to a type it does not know as a call
            return arithmetic_type(name.strip()[1:-1].strip(), self.source)
        name = re.sub(r"<.*>$", "", name).strip()
        if _PURE_CALL.match(name) and not name.startswith("atomic"):
            return True
        return self.pure_device_function(name, seen)

    def pure_device_function(self, name: str, seen: frozenset[str] = frozenset()) -> bool:
        """Whether ``name`` is a ``__device__`` function the source defines (every overload)
        that writes nothing but its own locals and calls only what is pure (``bezier``'s
        ``BezierBlend``): a call to it has no effect but its value."""
        if not re.fullmatch(r"[A-Za-z_]\w*", name) or name in seen or len(seen) > 4:
            return False
        if name in self._pure:
            return self._pure[name]
        found = self._definitions(name)
        pure = bool(found) and all(self._pure_body(f, seen | {name}) for f in found)
        self._pure[name] = pure
        return pure

    def _pure_body(self, function: ts.Node, seen: frozenset[str]) -> bool:
        body = function.child_by_field_name("body")
        declarator = function.child_by_field_name("declarator")
        if body is None or declarator is None:
            return False
        head = self.parsed.data[function.start_byte:declarator.start_byte].decode(
            "utf-8", "replace")
        if "__device__" not in head or _IMPURE.search(mask(self.text(body))):
            return False
        # locals and parameters taken by value, not through a pointer or reference (an array
        # parameter is a pointer)
        own: set[str] = set()
        for node in walk(function):
            if node.type in ("declaration", "parameter_declaration"):
                through = {"pointer_declarator", "reference_declarator"} | (
                    {"array_declarator"} if node.type == "parameter_declaration" else set())
                for d in node.children_by_field_name("declarator"):
                    n = declared_name(d)
                    if n is not None and not any(x.type in through for x in walk(d)):
                        own.add(self.text(n))
        for node in walk(body):
            target = write_target(node)
            if target is not None:
                base = lvalue_base(target)
                if base is None or self.text(base) not in own:
                    return False
            if node.type == "call_expression" and not self.pure(node, seen):
                return False
        return True

    def line(self, node: ts.Node) -> int:
        return self.source.count("\n", 0, self.parsed.char(node.start_byte)) + 1

    def flattened(self) -> bool:
        return len(self.top) > len(self._statements())

    def closing_at(self) -> int:
        """Where the flattened ``if (i < n) { ... }`` stands among the top statements."""
        return len(self._statements()) - 1


@dataclass(frozen=True)
class CountedLoop:
    """``for (T k = START; k < END; ++k) BODY`` (or ``<=``, ``k++``, ``k += 1``): the parts
    a rule reads and edits."""

    node: ts.Node
    counter: str
    counter_type: str  # as declared, without const
    start: ts.Node
    condition: ts.Node
    op: str  # "<" or "<="
    end: ts.Node
    update: ts.Node
    body: ts.Node


def counted_loop(reading: IndexDependence, node: ts.Node) -> CountedLoop:
    """``node`` (a ``for`` statement) read as a loop that declares its counter, tests it
    against an end that does not depend on it, and steps it by one; :class:`Unsupported`
    saying which of these it is not."""
    r = reading
    init = node.child_by_field_name("initializer")
    condition = node.child_by_field_name("condition")
    update = node.child_by_field_name("update")
    body = node.child_by_field_name("body")
    if init is None or init.type != "declaration" or condition is None \
            or update is None or body is None:
        raise Unsupported("the loop does not declare its counter, test it and step it")
    declarators = init.children_by_field_name("declarator")
    if len(declarators) != 1 or declarators[0].type != "init_declarator":
        raise Unsupported("the loop declares more than its counter")
    name = declarators[0].child_by_field_name("declarator")
    value = declarators[0].child_by_field_name("value")
    if name is None or name.type != "identifier" or value is None:
        raise Unsupported("the loop's counter is not a plain local")
    counter = r.text(name)
    kind = re.sub(r"^const\s+", "", r.text(init)[:name.start_byte - init.start_byte].strip())
    if re.search(r"\bauto\b", kind) or not kind:
        raise Unsupported("the loop's counter is declared `auto`")
    op = condition.child_by_field_name("operator")
    left = condition.child_by_field_name("left")
    end = condition.child_by_field_name("right")
    if condition.type != "binary_expression" or op is None or left is None or end is None \
            or r.text(op) not in ("<", "<=") or r.text(left) != counter:
        raise Unsupported(f"the loop's test is not `{counter} < END` (or `<=`)")
    if r.mentions(end, {counter}):
        raise Unsupported("the loop's end depends on its counter")
    if re.sub(r"\s+", "", r.text(update)) not in (
            f"++{counter}", f"{counter}++", f"{counter}+=1", f"{counter}={counter}+1"):
        raise Unsupported(f"the loop does not step {counter} by one")
    return CountedLoop(node, counter, kind, value, condition, r.text(op), end, update, body)


def declared_name(declarator: ts.Node) -> ts.Node | None:
    """The identifier a declarator declares (through pointers, arrays, initializers)."""
    node: ts.Node | None = declarator
    while node is not None and node.type != "identifier":
        if node.type in ("init_declarator", "pointer_declarator", "array_declarator",
                         "reference_declarator", "parenthesized_declarator",
                         "attributed_declarator"):
            inner = node.child_by_field_name("declarator")
            if inner is None:
                inner = next((c for c in node.named_children if "declarator" in c.type
                              or c.type == "identifier"), None)
            node = inner
        else:
            return None
    return node


def lvalue_base(node: ts.Node) -> ts.Node | None:
    """The variable an lvalue names: ``x``, ``x[i]``, ``x.f``, ``x[i].f`` -> ``x``."""
    current: ts.Node | None = node
    while current is not None:
        if current.type == "identifier":
            return current
        if current.type in ("subscript_expression", "field_expression"):
            current = current.child_by_field_name("argument")
        elif current.type == "parenthesized_expression":
            current = current.named_children[0] if current.named_children else None
        else:
            return None
    return None


def changed_target(node: ts.Node) -> ts.Node | None:
    """What ``node`` writes (an assignment's or increment's target) or takes the address of
    (``&x``'s operand); None for anything else."""
    target = write_target(node)
    if target is None and node.type == "pointer_expression":
        operator = node.child_by_field_name("operator")
        if operator is not None and operator.type == "&":
            target = node.child_by_field_name("argument")
    return target


def write_target(node: ts.Node) -> ts.Node | None:
    """What an assignment or an increment writes (None: ``node`` is neither)."""
    if node.type == "assignment_expression":
        return node.child_by_field_name("left")
    if node.type == "update_expression":
        return node.child_by_field_name("argument")
    return None
