"""Whether a REPLACE section may end: its brackets must balance as its SEARCH section's do.

An edit replaces whole lines of the kernel, and the rest of the unit stays as it was, so the
unit still parses only where the REPLACE text opens and closes as many braces, parentheses and
brackets as the SEARCH text it replaces.  A model that loses count (a loop body closed once too
often, an ``if`` left open) makes an answer no compiler takes: Qwen2.5-Coder-1.5B's
generate-only answers on nbody and reduce_sum (session 41, 24 with the names check) failed
three times on "expected a declaration" or "expected a '}'" at the end of the unit.

:class:`BalanceCheck` is asked, for each token the sampler draws, whether appending it to the
answer makes a REPLACE section close a block its SEARCH section does not (its running count
goes below the lowest the SEARCH text reaches: a ``}`` past the function's end), or starts the
``>>>>>>> REPLACE`` line that ends a section whose counts differ from its SEARCH section's;
such a token is refused and the sampler draws another (a closing brace where one is missing,
the end line where a brace would be one too many).  The end line is refused as well where the
section's code is its SEARCH text's (an edit that changes nothing, which fails the answer:
one of Qwen's 24 in session 42).  Refused at the end line alone, Qwen went
on writing other text after the section (two of its 24 answers on reduce_sum and nbody,
session 42).  Conditional directives count as a fourth kind of bracket: ``#if``, ``#ifdef``
and ``#ifndef`` open, ``#endif`` closes (SmolLM2-135M asked to expose a tunable, with the
directives above the kernel to search in, left "the #if for this directive is missing" or its
``#endif`` missing in 5 of 8 answers, session 47).  Comments and literals do not count.
Like the names check it runs in the llama.cpp backend's sampler after the grammar;
:class:`Checks` asks several in turn.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from r3tui.analysis.text import code_key, mask
from r3tui.remix.backends import AnswerCheck
from r3tui.remix.edits import DIVIDER, SEARCH_MARK

_SEARCH = SEARCH_MARK + "\n"
_DIVIDER = DIVIDER + "\n"
_PAIRS = (("{", "}"), ("(", ")"), ("[", "]"))
# a conditional directive's line: "if", "ifdef", "ifndef" open, "endif" closes
_CONDITIONAL = re.compile(r"^[ \t]*#[ \t]*(ifn?def|if|endif)\b", re.M)


def _conditionals(code: str) -> list[int]:
    """+1 for each conditional directive of ``code`` that opens, -1 for each that closes."""
    return [-1 if m.group(1) == "endif" else 1 for m in _CONDITIONAL.finditer(code)]


def balance(text: str) -> tuple[int, ...]:
    """Opened minus closed braces, parentheses, brackets and conditional directives of
    ``text`` (code only)."""
    code = mask(text)
    pairs = (code.count(o) - code.count(c) for o, c in _PAIRS)
    return (*pairs, sum(_conditionals(code)))


def _lowest(steps: Sequence[int]) -> int:
    depth = low = 0
    for step in steps:
        depth += step
        low = min(low, depth)
    return low


def lowest(text: str) -> tuple[int, ...]:
    """The lowest running balance of each kind of bracket over ``text`` (code only), 0 at
    least: how many blocks it closes that it did not open."""
    code = mask(text)
    pairs = tuple(_lowest([1 if ch == o else -1 for ch in code if ch in (o, c)])
                  for o, c in _PAIRS)
    return (*pairs, _lowest(_conditionals(code)))


def _section(text: str) -> tuple[str, str, int | None] | None:
    """The last SEARCH/REPLACE section of ``text`` once it has reached its REPLACE part:
    ``(search, replace, end)`` where ``end`` is where its end line begins (a line starting with
    ``>``), None while it is still open; None where there is no such section."""
    divider = text.rfind("\n" + _DIVIDER)
    if divider < 0:
        return None
    start = text.rfind(_SEARCH, 0, divider + 1)
    if start < 0:
        return None
    body = divider + 1 + len(_DIVIDER)
    at = text.find("\n>", body - 1)
    end = at + 1 if at >= 0 else None
    return text[start + len(_SEARCH):divider + 1], text[body:end], end


def ended_by(answer: str, piece: str) -> tuple[str, str] | None:
    """``(SEARCH text, REPLACE text)`` of the section whose end line (the first line of its
    REPLACE part that starts with ``>``) ``piece`` begins, else None (no end line yet, or one
    begun before this piece)."""
    if not piece or ">" not in piece:
        return None
    after, before = _section(answer + piece), _section(answer)
    if after is None or after[2] is None or (before is not None and before[2] is not None):
        return None
    return after[0], after[1]


class BalanceCheck:
    """Refuses the token that makes a REPLACE section close a block its SEARCH text does not,
    and the one that ends a section whose brackets do not balance as its SEARCH text's or whose
    code is the SEARCH text's."""

    name = "balance"

    def __init__(self) -> None:
        self.refused = 0

    def __call__(self, answer: str, piece: str) -> bool:
        ok = self._closes_more(answer, piece) and self._ends_balanced(answer, piece)
        if not ok:
            self.refused += 1
        return ok

    @staticmethod
    def _closes_more(answer: str, piece: str) -> bool:
        """False where ``piece`` makes the REPLACE text close a block its SEARCH text does
        not (a ``}`` past the function's end): refused at that token, before the model goes
        on as if the section were done."""
        # an "endif" this piece completes (its letters may have come in earlier pieces)
        endif = "endif" in (answer[-4:] + piece)
        if not piece or not (any(c in piece for _, c in _PAIRS) or endif):
            return True
        section = _section(answer + piece)
        if section is None or section[2] is not None:
            return True  # not in a REPLACE section, or its end line begun
        search, replace, _ = section
        floor = lowest(search)
        now, before = lowest(replace), lowest(replace[: len(replace) - len(piece)])
        return all(n >= f or n >= b for n, f, b in zip(now, floor, before, strict=True))

    @staticmethod
    def _ends_balanced(answer: str, piece: str) -> bool:
        ending = ended_by(answer, piece)
        if ending is None:
            return True  # not ending a section, or its end was begun before this token
        search, replace = ending
        # a section whose code is its SEARCH text's changes nothing: not an edit
        return balance(search) == balance(replace) and code_key(search) != code_key(replace)


class Checks:
    """Several answer checks asked in turn: a piece passes when every one allows it."""

    def __init__(self, checks: Sequence[AnswerCheck]) -> None:
        self.checks = tuple(checks)
        self.name = "+".join(getattr(c, "name", "check") for c in self.checks)

    def __call__(self, answer: str, piece: str) -> bool:
        return all(check(answer, piece) for check in self.checks)

    @property
    def refused(self) -> int:
        return sum(getattr(c, "refused", 0) for c in self.checks)
