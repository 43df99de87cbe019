"""Parsing a model's answer and applying it to the parent kernel; finding the kernel in a source.

Two answer formats.  SEARCH/REPLACE blocks edit the parent::

    <<<<<<< SEARCH
    lines copied from the parent
    =======
    the lines that replace them
    >>>>>>> REPLACE

and a single fenced code block (```` ```cuda ```` ... ```` ``` ````) is the whole new kernel.
Text around the blocks is ignored.  Applying is strict about meaning and lenient about
layout: an edit's SEARCH text must occur exactly once, matched exactly first, then line by line
ignoring indentation and runs of spaces; a missing or ambiguous match, an edit that changes
nothing, or a result whose kernel entry point is gone or has another parameter list is a failed
:class:`ApplyResult` with the reason (recorded as ``apply_failed``), never an exception.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from r3tui.analysis.kernels import base_name

SEARCH_MARK = "<<<<<<< SEARCH"
DIVIDER = "======="
REPLACE_MARK = ">>>>>>> REPLACE"

# Models miscount the marker characters; five to nine of them are taken as a marker.
_SEARCH_LINE = re.compile(r"^[ \t]*<{5,9}[ \t]*SEARCH[ \t]*$")
_DIVIDER_LINE = re.compile(r"^[ \t]*={5,9}[ \t]*$")
_REPLACE_LINE = re.compile(r"^[ \t]*>{5,9}[ \t]*REPLACE[ \t]*$")
_FENCE_LINE = re.compile(r"^[ \t]*```")
_FENCED = re.compile(r"^[ \t]*```[ \t]*[A-Za-z0-9_+.-]*[ \t]*\n(.*?)^[ \t]*```", re.M | re.S)


@dataclass(frozen=True)
class Edit:
    search: str
    replace: str


@dataclass(frozen=True)
class ParsedAnswer:
    """What a model's answer says to do: edits, or a whole new source; or why it says nothing."""

    ok: bool
    edits: tuple[Edit, ...] = ()
    source: str | None = None  # the whole-kernel answer
    reason: str | None = None
    # what was left out of an answer that still has complete edits (e.g. a last edit cut off)
    dropped: str | None = None


@dataclass(frozen=True)
class ApplyResult:
    ok: bool
    source: str | None
    reason: str | None = None
    tolerant: bool = False  # some edit matched only once whitespace was ignored
    skipped: tuple[str, ...] = ()  # partial mode: the edits that did not apply, and why


def _lf(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")


# ----------------------------------------------------------------------------------------
# Parsing


def _section(lines: list[str]) -> str:
    # A model often fences the code inside a section as well; the fence is not code.
    if lines and _FENCE_LINE.match(lines[0]):
        lines = lines[1:]
    if lines and _FENCE_LINE.match(lines[-1]):
        lines = lines[:-1]
    return "".join(line + "\n" for line in lines)


def parse_search_replace(answer: str) -> ParsedAnswer:
    """The SEARCH/REPLACE blocks of ``answer``, in order.

    A malformed or cut-off block after complete ones ends the answer there: the complete edits
    are kept, and what was left out is said in ``dropped`` (small models often run out of
    tokens in a last, extra edit).  With no complete edit the answer fails."""
    edits: list[Edit] = []
    state = "outside"
    search: list[str] = []
    replace: list[str] = []
    for line in _lf(answer).split("\n"):
        if state == "outside":
            if _SEARCH_LINE.match(line):
                state, search, replace = "search", [], []
        elif state == "search":
            if _DIVIDER_LINE.match(line):
                state = "replace"
            elif _SEARCH_LINE.match(line) or _REPLACE_LINE.match(line):
                return _partial(edits, f"edit {len(edits) + 1} has no '{DIVIDER}' line")
            else:
                search.append(line)
        elif _REPLACE_LINE.match(line):
            edit = Edit(_section(search), _section(replace))
            # Small models often write their first block twice; applied twice, the copy's
            # SEARCH text is gone and the whole answer would fail for a repetition.
            if edit not in edits:
                edits.append(edit)
            state = "outside"
        elif _SEARCH_LINE.match(line) or _DIVIDER_LINE.match(line):
            return _partial(edits, f"edit {len(edits) + 1} has no '{REPLACE_MARK}' line")
        else:
            replace.append(line)
    if state != "outside":
        return _partial(
            edits, f"the answer ends inside edit {len(edits) + 1} (cut off at max_tokens?)"
        )
    if not edits:
        return ParsedAnswer(False, reason="the answer has no SEARCH/REPLACE block")
    return ParsedAnswer(True, edits=tuple(edits))


def _partial(edits: list[Edit], problem: str) -> ParsedAnswer:
    if not edits:
        return ParsedAnswer(False, reason=problem)
    return ParsedAnswer(True, edits=tuple(edits), dropped=problem)


def parse_whole(answer: str) -> ParsedAnswer:
    """The fenced code block of ``answer`` that defines a ``__global__`` function."""
    text = _lf(answer)
    blocks = [m.group(1) for m in _FENCED.finditer(text)]
    for block in blocks:
        if "__global__" in block:
            return ParsedAnswer(True, source=block)
    if blocks:
        return ParsedAnswer(False, reason="no code block in the answer defines a __global__ kernel")
    if re.search(r"^[ \t]*```", text, re.M):
        return ParsedAnswer(False, reason="the code block is not closed (cut off at max_tokens?)")
    if "__global__" in text:
        return ParsedAnswer(True, source=text)  # code without a fence
    return ParsedAnswer(False, reason="the answer has no code block")


# ----------------------------------------------------------------------------------------
# Applying


def _key(line: str) -> str:
    return " ".join(line.split())


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip(" \t"))]


def _whole_line_occurrences(text: str, search: str) -> list[int]:
    """Offsets where ``search`` occurs as whole lines (never from the middle of a line)."""
    found = []
    at = text.find(search)
    while at != -1:
        end = at + len(search)
        starts_line = at == 0 or text[at - 1] == "\n"
        ends_line = search.endswith("\n") or end == len(text) or text[end] == "\n"
        if starts_line and ends_line:
            found.append(at)
        at = text.find(search, at + 1)
    return found


def _apply_tolerant(source: str, search: str, replace: str) -> tuple[str | None, str | None]:
    """``(new source, None)`` or ``(None, why not)`` matching line by line on :func:`_key`."""
    wanted = [_key(line) for line in search.split("\n")]
    wanted = [k for k in wanted if k]
    lines = source.split("\n")
    code = [(i, _key(line)) for i, line in enumerate(lines) if _key(line)]
    keys = [k for _, k in code]
    size = len(wanted)
    starts = [s for s in range(len(keys) - size + 1) if keys[s : s + size] == wanted]
    if not starts:
        return None, "its SEARCH text is not in the kernel"
    if len(starts) > 1:
        return None, f"its SEARCH text occurs {len(starts)} times (ambiguous)"
    first, last = code[starts[0]][0], code[starts[0] + size - 1][0]
    search_first = next(line for line in search.split("\n") if line.strip())
    old_indent, new_indent = _indent(search_first), _indent(lines[first])
    body = replace[:-1] if replace.endswith("\n") else replace
    replaced = body.split("\n") if replace else []
    if old_indent != new_indent:
        replaced = [
            new_indent + line[len(old_indent) :] if line.startswith(old_indent) and line else line
            for line in replaced
        ]
    return "\n".join(lines[:first] + replaced + lines[last + 1 :]), None


def apply_edits(
    source: str, edits: Sequence[Edit], kernel_name: str | None = None, partial: bool = False
) -> ApplyResult:
    """``source`` with every edit applied in order; with ``kernel_name``, also check that the
    kernel is still there with the same parameter list (:func:`entry_point_problem`).

    An edit that does not apply (SEARCH text empty, absent or ambiguous) fails the whole answer,
    or with ``partial`` is skipped and named in ``skipped``, as long as another edit applies:
    the result is then a different change than the model meant, which compile and verification
    on the recorded data judge like any other."""
    crlf = "\r\n" in source
    current = _lf(source)
    original = current
    tolerant = False
    if not edits:
        return ApplyResult(False, None, "no edits to apply")
    applied: list[tuple[str, str]] = []
    skipped: list[str] = []
    for number, edit in enumerate(edits, start=1):
        search, replace = _lf(edit.search), _lf(edit.replace)
        problem: str | None = None
        if not search.strip():
            problem = "its SEARCH text is empty"
        elif (search, replace) in applied:
            continue  # small models repeat a block; the change is made once
        else:
            applied.append((search, replace))
            found = _whole_line_occurrences(current, search)
            if len(found) == 1:
                at = found[0]
                current = current[:at] + replace + current[at + len(search) :]
                continue
            if len(found) > 1:
                problem = f"its SEARCH text occurs {len(found)} times (ambiguous)"
            else:
                updated, problem = _apply_tolerant(current, search, replace)
                if updated is not None:
                    current, tolerant = updated, True
                    continue
        if not partial:
            return ApplyResult(False, None, f"edit {number}: {problem}")
        skipped.append(f"edit {number}: {problem}")
    if current == original:
        reason = "the edits leave the kernel unchanged"
        return ApplyResult(False, None, f"{reason}; {'; '.join(skipped)}" if skipped else reason)
    if kernel_name is not None:
        problem = entry_point_problem(original, current, kernel_name)
        if problem:
            return ApplyResult(False, None, problem, tolerant)
    return ApplyResult(
        True, current.replace("\n", "\r\n") if crlf else current, None, tolerant, tuple(skipped)
    )


def apply_whole(parent: str, answer_source: str, kernel_name: str) -> ApplyResult:
    """The whole-kernel answer as the new source.  An answer that is only the kernel function
    (no other declarations) replaces the parent's kernel function and keeps the rest of the
    parent (its structs, macros and helpers, which a model tends to leave out)."""
    crlf = "\r\n" in parent
    parent_lf, answer = _lf(parent), _lf(answer_source)
    new = answer
    span = find_kernel(answer, kernel_name)
    parent_span = find_kernel(parent_lf, kernel_name)
    if span is not None and parent_span is not None:
        outside = _COMMENTS.sub("", answer[: span.start] + answer[span.body_end :])
        if not outside.strip():
            kernel = answer[span.start : span.body_end]
            new = parent_lf[: parent_span.start] + kernel + parent_lf[parent_span.body_end :]
    if not new.endswith("\n"):
        new += "\n"
    if new.strip() == parent_lf.strip():
        return ApplyResult(False, None, "the answer is the parent kernel unchanged")
    problem = entry_point_problem(parent_lf, new, kernel_name)
    if problem:
        return ApplyResult(False, None, problem)
    return ApplyResult(True, new.replace("\n", "\r\n") if crlf else new)


# ----------------------------------------------------------------------------------------
# Finding the kernel

_COMMENTS = re.compile(r"//[^\n]*|/\*.*?(?:\*/|\Z)", re.DOTALL)
_QUALIFIERS = frozenset({"const", "volatile", "__restrict__", "__restrict", "restrict"})
_TOKENS = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|::|[0-9]+|\S")


def mask_source(source: str) -> str:
    """``source`` with comments, literals and preprocessor lines blanked, offsets kept; a
    preprocessor line starts with ';' so that it ends a declaration head."""
    from r3tui.analysis.text import mask

    return mask(source, directives=True)


def matching(masked: str, open_at: int) -> int | None:
    """Index of the bracket closing the one at ``open_at`` in masked text, or None."""
    pairs = {"(": ")", "[": "]", "{": "}"}
    opener = masked[open_at]
    closer = pairs[opener]
    depth = 0
    for index in range(open_at, len(masked)):
        char = masked[index]
        if char == opener:
            depth += 1
        elif char == closer:
            depth -= 1
            if depth == 0:
                return index
    return None


@dataclass(frozen=True)
class Param:
    text: str  # as written
    start: int  # offsets of the text in the source
    end: int
    name: str | None
    type_tokens: tuple[str, ...]  # the type without qualifiers and name: ("float", "*")

    @property
    def is_pointer(self) -> bool:
        return "*" in self.type_tokens

    @property
    def element_type(self) -> str:
        """``"unsigned int"`` for ``const unsigned int* p``."""
        head = self.type_tokens[: self.type_tokens.index("*")] if self.is_pointer else ()
        return " ".join(head)

    def qualifiers(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Qualifier words before and after the first ``*``."""
        tokens = _TOKENS.findall(self.text)
        star = tokens.index("*") if "*" in tokens else len(tokens)
        before = tuple(t for t in tokens[:star] if t in _QUALIFIERS)
        after = tuple(t for t in tokens[star:] if t in _QUALIFIERS)
        return before, after


@dataclass(frozen=True)
class KernelSpan:
    """Where a ``__global__`` function's definition is in a source (offsets into it)."""

    name: str
    start: int  # the first character of the definition (template header, extern "C")
    params_open: int  # the '('
    params_close: int  # the ')'
    body_open: int  # the '{'
    body_end: int  # after the matching '}'
    params: tuple[Param, ...]
    declarations: int  # other declarations of the same function in the source
    extern_c: bool = False  # C linkage: parameter qualifiers do not reach its symbol

    def signature(self) -> tuple[tuple[str, ...], ...]:
        """What the replay depends on: each parameter's type, qualifiers and name aside."""
        return tuple(p.type_tokens for p in self.params)


def _param(text: str, start: int, end: int) -> Param:
    tokens = [t for t in _TOKENS.findall(mask_source(text)) if t not in _QUALIFIERS]
    name = None
    if len(tokens) >= 2 and re.match(r"^[A-Za-z_]\w*$", tokens[-1]):
        name = tokens.pop()
    return Param(text, start, end, name, tuple(tokens))


def find_kernel(source: str, kernel_name: str) -> KernelSpan | None:
    """The definition of the ``__global__`` function ``kernel_name`` in ``source``, if any
    (the first one; read from the parse, :func:`r3tui.analysis.kernels.kernel_declarations`)."""
    from r3tui.analysis.kernels import kernel_declarations

    name = base_name(kernel_name)
    if not re.match(r"^[A-Za-z_]\w*$", name):
        return None
    found = kernel_declarations(source, name)
    definitions = [d for d in found if d.defined]
    if not definitions:
        return None
    d = definitions[0]
    params = tuple(_param(source[a:b], a, b) for a, b in (
        (a, b) for a, b in d.params) if source[a:b].strip() not in ("", "void"))
    return KernelSpan(name, d.start, d.params_open, d.params_close, d.body_open, d.end,
                      params, len(found) - len(definitions), d.extern_c)


def entry_point_problem(parent: str, child: str, kernel_name: str) -> str | None:
    """Why ``child`` cannot replace ``parent`` for the recorded launches, or ``None``.

    The replay calls the kernel by name with the recorded argument bytes, so the kernel must be
    defined and take the same parameter types; qualifiers and parameter names may change.
    """
    before = find_kernel(_lf(parent), kernel_name)
    after = find_kernel(_lf(child), kernel_name)
    name = base_name(kernel_name)
    if after is None:
        return f"the kernel entry point {name} is gone (no __global__ {name} definition)"
    if before is None:
        return None
    if before.signature() != after.signature():
        old = ", ".join(" ".join(t) for t in before.signature())
        new = ", ".join(" ".join(t) for t in after.signature())
        return f"the parameters of {name} changed from ({old}) to ({new})"
    return None


def outside_kernel_problem(parent: str, child: str, kernel_name: str) -> str | None:
    """Why ``child`` changes ``parent`` outside the kernel's definition, or ``None``: for an
    application's kernel only the definition is written back to the application's file."""
    before = find_kernel(_lf(parent), kernel_name)
    after = find_kernel(_lf(child), kernel_name)
    if before is None or after is None:
        return None  # entry_point_problem says why
    old, new = _lf(parent), _lf(child)
    if old[: before.start] != new[: after.start] or old[before.body_end :] != new[after.body_end :]:
        return (f"it changes code outside the definition of {base_name(kernel_name)} "
                "(only the kernel is written back to the application)")
    return symbol_problem(before, after)


def symbol_problem(before: KernelSpan, after: KernelSpan) -> str | None:
    """Why ``after`` would not keep the symbol the application launches, or ``None``: with
    C++ linkage a pointee's ``const``/``volatile`` is part of the mangled name, so the host
    code's launches and prototypes would name another function."""
    if before.extern_c:
        return None
    for old, new in zip(before.params, after.params, strict=False):
        was, now = _pointee_cv(old), _pointee_cv(new)
        if was != now:
            return (f"it changes the type of parameter {old.name or '?'} of {before.name} "
                    f"({old.text.strip()} -> {new.text.strip()}): with C++ linkage that "
                    "changes the kernel's mangled name, which the application launches")
    return None


def _pointee_cv(param: Param) -> frozenset[str]:
    """The const/volatile written before a pointer parameter's ``*`` (its pointee's)."""
    if not param.is_pointer:
        return frozenset()
    before, _ = param.qualifiers()
    return frozenset(q for q in before if q in ("const", "volatile"))
