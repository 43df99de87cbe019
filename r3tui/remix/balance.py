"""Whether a REPLACE section may end: its brackets must balance as its SEARCH section's do.

An edit replaces whole lines of the kernel, and the rest of the unit stays as it was, so the
unit still parses only where the REPLACE text opens and closes as many braces, parentheses and
brackets as the SEARCH text it replaces.  A model that loses count (a loop body closed once too
often, an ``if`` left open) makes an answer no compiler takes: Qwen2.5-Coder-1.5B's
generate-only answers on nbody and reduce_sum (session 41, 24 with the names check) failed
three times on "expected a declaration" or "expected a '}'" at the end of the unit.

:class:`BalanceCheck` is asked, for each token the sampler draws, whether appending it to the
answer starts the ``>>>>>>> REPLACE`` line that ends a section whose bracket counts differ
from its SEARCH section's; such a token is refused and the sampler draws another (a closing
brace, more code).  Comments and literals do not count.  Like the names check it runs in the
llama.cpp backend's sampler after the grammar; :class:`Checks` asks several in turn.
"""

from __future__ import annotations

from collections.abc import Sequence

from r3tui.analysis.text import mask
from r3tui.remix.backends import AnswerCheck

_SEARCH = "<<<<<<< SEARCH\n"
_DIVIDER = "=======\n"
_PAIRS = (("{", "}"), ("(", ")"), ("[", "]"))


def balance(text: str) -> tuple[int, ...]:
    """Opened minus closed braces, parentheses and brackets of ``text`` (code only)."""
    code = mask(text)
    return tuple(code.count(o) - code.count(c) for o, c in _PAIRS)


def _closing(text: str) -> tuple[str, str] | None:
    """``(search, replace)`` of the last section when ``text`` has begun its end line (a line
    starting with ``>`` after the divider), else None."""
    divider = text.rfind("\n" + _DIVIDER)
    if divider < 0:
        return None
    body = divider + 1 + len(_DIVIDER)
    end = text.find("\n>", body - 1)
    if end < 0:
        return None
    start = text.rfind(_SEARCH, 0, divider + 1)
    if start < 0:
        return None
    return text[start + len(_SEARCH):divider + 1], text[body:end + 1]


class BalanceCheck:
    """Refuses the token that ends a REPLACE section whose brackets do not balance as its
    SEARCH section's."""

    name = "balance"

    def __init__(self) -> None:
        self.refused = 0

    def __call__(self, answer: str, piece: str) -> bool:
        if not piece or ">" not in piece:
            return True
        after = _closing(answer + piece)
        if after is None or _closing(answer) is not None:
            return True  # not ending a section, or its end was begun before this token
        search, replace = after
        ok = balance(search) == balance(replace)
        if not ok:
            self.refused += 1
        return ok


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
