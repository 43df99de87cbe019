"""One lexical view of CUDA C++ text for the scans that work on characters: the text with its
comments and the insides of its string and character literals blanked, offsets kept, so that
braces, names and ``#`` inside them are never read as code.

It serves every layer that scans text (the rule operators and edits of the remix layer,
``__launch_bounds__`` injection, the recorder's include and launch scans, ``r3 apply``'s
block macro); declarations and definitions come from the parse (:mod:`r3tui.analysis.kernels`).
"""

from __future__ import annotations

import re
from functools import lru_cache


def mask(text: str, directives: bool = False, literals: bool = True) -> str:
    """``text`` with comments blanked and the characters between a literal's quotes blanked
    (newlines kept, so offsets and line numbers hold).  ``directives``: each preprocessor
    directive, continuation lines included, blanked as well and started with ``;`` so that it
    ends a declaration head the way a statement would.  ``literals=False``: literals are kept
    as written (only comments go)."""
    return _mask(text, directives, literals)


@lru_cache(maxsize=64)
def _mask(text: str, directives: bool, literals: bool) -> str:
    out = list(text)
    n = len(text)

    def blank(start: int, end: int) -> None:
        for j in range(start, end):
            if out[j] != "\n":
                out[j] = " "

    i = 0
    line_start = True  # only blanks since the last newline (a directive may start here)
    while i < n:
        ch = text[i]
        two = text[i : i + 2]
        if two == "//":
            end = text.find("\n", i)
            end = n if end < 0 else end
            blank(i, end)
            i = end
        elif two == "/*":
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            blank(i, end)
            i = end
        elif ch in "\"'":
            end = i + 1
            while end < n and text[end] != ch and text[end] != "\n":
                end += 2 if text[end] == "\\" else 1
            end = min(end + 1, n)
            if literals:
                blank(i + 1, end - 1)
            line_start = False
            i = end
        elif ch == "#" and line_start and directives:
            end = _directive_end(text, i)
            blank(i, end)
            out[i] = ";"
            i = end
        else:
            if ch == "\n":
                line_start = True
            elif ch not in " \t\r\f\v":
                line_start = False
            i += 1
    return "".join(out)


def _directive_end(text: str, start: int) -> int:
    """Where the directive starting at ``start`` ends: its line's newline, past every line
    that ends in a backslash (a comment inside it is blanked with it)."""
    i = start
    while True:
        end = text.find("\n", i)
        if end < 0:
            return len(text)
        if text[start:end].rstrip("\r").endswith("\\"):
            i = end + 1
            continue
        return end


def split_top_level(text: str, pairs: str = "()[]{}") -> list[str]:
    """``text`` split at commas outside the bracket ``pairs`` (opening, closing, ...): an
    argument list, or a demangled signature's parameters with ``pairs="()[]<>"``."""
    opening, closing = pairs[0::2], pairs[1::2]
    parts, depth, start = [], 0, 0
    for index, ch in enumerate(text):
        if ch in opening:
            depth += 1
        elif ch in closing:
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:index])
            start = index + 1
    parts.append(text[start:])
    return parts


def code_key(text: str) -> str:
    """``text`` as code: comments dropped (``// r3:`` declarations kept, since they change
    what is searched), each line's runs of spaces one space, blank lines dropped, literals as
    written (line breaks stay: they end preprocessor directives).  Two sources with the same
    key are the same program: a variant that differs from another only in comments,
    indentation or blank lines is a duplicate."""
    pairs = zip(text.split("\n"), mask(text, literals=False).split("\n"), strict=True)
    lines = (" ".join((line if _R3_DECLARATION.match(line) else masked).split())
             for line, masked in pairs)
    return "\n".join(line for line in lines if line)


_R3_DECLARATION = re.compile(r"[ \t]*//[ \t]*r3[ \t]*:")


_VECTOR_TYPE = re.compile(
    r"\b(?:float|int|uint|double|half|__half|bfloat16|__nv_bfloat16|short|ushort|char|uchar|"
    r"long|ulong|longlong|ulonglong)([234])\b")


def vector_width(text: str) -> int:
    """The widest CUDA vector type (``float4``: 4, ``half2``: 2) the code of ``text`` names,
    comments and string literals aside; 1 for scalar code."""
    widths = [int(m.group(1)) for m in _VECTOR_TYPE.finditer(mask(text))]
    return max(widths, default=1)
