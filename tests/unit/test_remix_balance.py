"""The brackets check of a model's SEARCH/REPLACE answer while it is sampled
(r3tui.remix.balance): the token that ends a REPLACE section is refused unless the section's
braces, parentheses and brackets balance as its SEARCH section's."""

from __future__ import annotations

import pytest

from r3tui.remix.balance import BalanceCheck, Checks, balance
from r3tui.remix.mutation import MutatorSettings, answer_check
from r3tui.remix.names import IdentifierCheck

SEARCH = "<<<<<<< SEARCH\n    for (int k = 0; k < n; ++k) {\n        s += x[k];\n=======\n"


def pieces(text: str, size: int = 3) -> list[str]:
    """``text`` cut as a sampler would hand it over, a few characters a token."""
    return [text[i:i + size] for i in range(0, len(text), size)]


def feed(check: BalanceCheck, answer: str) -> tuple[str, str | None]:
    """Append ``answer``'s pieces one by one as the sampler does, up to the first the check
    refuses; returns the text kept and that piece (None: all kept)."""
    kept = ""
    for piece in pieces(answer):
        if not check(kept, piece):
            return kept, piece
        kept += piece
    return kept, None


def test_balance_counts_code_only() -> None:
    assert balance("if (a) { b[i] = f(c); }") == (0, 0, 0, 0)
    assert balance("for (int k = 0; k < n; ++k) {\n") == (1, 0, 0, 0)
    assert balance("}\n}\n") == (-2, 0, 0, 0)
    # a comment's or a literal's brackets are not code
    assert balance('    // close } here\n    printf("{(");\n    c = \'}\';\n') == (0, 0, 0, 0)
    assert balance("x = a[(i + 1] ;") == (0, 1, 0, 0)


@pytest.mark.parametrize("replace", [
    "    #pragma unroll 4\n    for (int k = 0; k < n; ++k) {\n        s += x[k];\n",
    "    for (int k = 0; k < n; k += 2) {\n        s += x[k] + (k + 1 < n ? x[k + 1] : 0.0f);\n",
    "    {\n    }\n    for (int k = 0; k < n; ++k) {  // } in a comment\n        s += x[k];\n",
])
def test_a_section_that_balances_as_its_search_ends(replace: str) -> None:
    check = BalanceCheck()
    answer = SEARCH + replace + ">>>>>>> REPLACE\n"
    kept, refused = feed(check, answer)
    assert refused is None and kept == answer and check.refused == 0


@pytest.mark.parametrize("replace, why", [
    ("    for (int k = 0; k < n; ++k) {\n        s += x[k];\n    }\n", "closes the loop"),
    ("    for (int k = 0; k < n; ++k)\n        s += x[k];\n", "opens no brace"),
    ("    for (int k = 0; k < n; ++k) {\n        s += f(x[k];\n", "a parenthesis left open"),
])
def test_the_end_of_a_section_that_does_not_balance_is_refused(replace: str, why: str) -> None:
    check = BalanceCheck()
    answer = SEARCH + replace + ">>>>>>> REPLACE\n"
    kept, refused = feed(check, answer)
    # every piece before the end line is kept; the one that starts it is refused (the sampler
    # then draws another token: a closing brace, more code)
    assert refused is not None and ">" in refused, why
    assert kept + refused == answer[: len(kept) + len(refused)], why
    assert len(kept) <= len(SEARCH + replace) < len(kept) + len(refused), why
    assert check.refused == 1 and not check(kept, refused), why


def test_pieces_before_and_after_the_end_line_are_not_its_business() -> None:
    check = BalanceCheck()
    unbalanced = SEARCH + "    s = 0;\n"
    # code with '>' inside a REPLACE section, on a line that does not start with it
    assert check(unbalanced, "    if (a > b) {\n")
    # outside any section, and in a SEARCH section
    assert check("", "<<<<<<< SEARCH\n") and check("<<<<<<< SEARCH\n", "  x >>= 1;\n")
    # the end line begun before this piece (under another check, say): not refused again
    begun = unbalanced + ">>>>"
    assert check(begun, ">>> REPLACE\n")
    # a second section is judged on its own SEARCH text
    second = (SEARCH + "    for (int k = 0; k < n; ++k) {\n        s += x[k];\n>>>>>>> REPLACE\n"
              "<<<<<<< SEARCH\n    s = 0;\n=======\n    s = 0.0f;\n")
    assert check(second, ">>>>>>> REPLACE\n")
    assert not check(second + "    }\n", ">>>>>>> REPLACE\n")
    assert check.refused == 1


def test_checks_ask_each_and_count_what_each_refused() -> None:
    names = IdentifierCheck.for_unit("__global__ void k(float* x, int n) { x[0] = n; }")
    both = Checks([names, BalanceCheck()])
    assert both.name == "identifiers+balance"
    inside = "<<<<<<< SEARCH\n    x[0] = n;\n=======\n"
    assert both(inside, "    x[0] = n + 1;\n")
    assert not both(inside, "    y[0] = n;\n")  # a name the unit lacks
    assert not both(inside + "    x[0] = (n;\n", ">>>>>>> REPLACE\n")  # left open
    assert both.refused == 2


def test_the_settings_choose_the_checks() -> None:
    unit = "__global__ void k(float* x) { x[0] = 1.0f; }"
    both = answer_check(unit, MutatorSettings())
    assert isinstance(both, Checks) and both.name == "identifiers+balance"
    only = answer_check(unit, MutatorSettings(check_names=False))
    assert isinstance(only, BalanceCheck)
    assert isinstance(answer_check(unit, MutatorSettings(check_balance=False)), IdentifierCheck)
    assert answer_check(unit, MutatorSettings(check_names=False, check_balance=False)) is None


def test_a_brace_that_closes_a_block_the_search_text_does_not_is_refused_at_once() -> None:
    """reduce_sum's answer of session 42: the SEARCH text is the whole reduction loop
    (balanced), the REPLACE text the loop, the last step, and a '}' that ends the function;
    refused only at the end line, Qwen went on writing other text.  The '}' itself is refused
    (lowest()), while a '}' that closes what the REPLACE text opened passes."""
    from r3tui.remix.balance import lowest

    search = ("<<<<<<< SEARCH\n    for (int s = 1; s < n; s *= 2) {\n        a[t] += a[t + s];\n"
              "    }\n=======\n")
    replace = ("    for (int s = 1; s < n; s *= 2) {\n        a[t] += a[t + s];\n    }\n"
               "    if (t == 0) {\n        atomicAdd(out, a[0]);\n    }\n")
    assert lowest(replace) == (0, 0, 0, 0) and lowest("}\n{") == (-1, 0, 0, 0)
    check = BalanceCheck()
    assert all(check(search + replace[:i], replace[i]) for i in range(len(replace)))
    assert not check(search + replace, "}")
    assert not check(search + replace, "}\n>>>>>>> REPLACE\n")
    assert check(search + replace, ">>>>>>> REPLACE\n")
    assert check.refused == 2
    # a SEARCH text that itself closes a block: its REPLACE may close one too
    closing = "<<<<<<< SEARCH\n        x = 1;\n    }\n=======\n        x = 2;\n"
    assert check(closing, "    }\n") and check(closing + "    }\n", ">>>>>>> REPLACE\n")


def test_a_section_that_changes_nothing_may_not_end() -> None:
    check = BalanceCheck()
    same = SEARCH + "    for (int k = 0;  k < n; ++k) {   // the same loop\n        s += x[k];\n"
    assert not check(same, ">>>>>>> REPLACE\n")
    changed = (SEARCH + "    #pragma unroll 4\n    for (int k = 0; k < n; ++k) {\n"
               "        s += x[k];\n")
    assert check(changed, ">>>>>>> REPLACE\n")


def feed_tokens(answer: str, words: list[str]) -> list[str]:
    """``answer`` fed in 3-character pieces except that each of ``words`` comes whole, as a
    tokenizer hands over a common word; what the check kept before it refused a piece."""
    check, kept, at = BalanceCheck(), list[str](), 0
    while at < len(answer):
        piece = next((w for w in words if answer.startswith(w, at)), answer[at:at + 3])
        if not check("".join(kept), piece):
            break
        kept.append(piece)
        at += len(piece)
    return kept


def test_conditional_directives_balance_as_a_fourth_bracket() -> None:
    """SmolLM2 asked to expose a tunable left an ``#endif`` without its ``#if`` or the other
    way round in 5 of 8 answers (session 47): such a section may not end."""
    from r3tui.remix.balance import lowest

    guarded = "#ifndef TILE\n#define TILE 16\n#endif\n"
    assert balance(guarded) == (0, 0, 0, 0)
    assert balance("  #  if defined(A)\n#ifdef B\n") == (0, 0, 0, 2)
    assert balance("#endif\n") == (0, 0, 0, -1) and lowest("#endif\n#if X\n") == (0, 0, 0, -1)
    # a directive's word in a comment, or as part of a longer name, is no directive
    assert balance("// #endif\n#ifdefined\n    x = endif;\n") == (0, 0, 0, 0)

    search = "<<<<<<< SEARCH\n#define TILE 16\n=======\n"
    whole = search + "// r3: tune TILE 8 16 32\n" + guarded + ">>>>>>> REPLACE\n"
    kept, refused = feed(BalanceCheck(), whole)
    assert refused is None and kept == whole
    # the #endif of a guard the SEARCH text does not open is refused at once
    stray = search + "#define TILE 16\n#endif\n>>>>>>> REPLACE\n"
    kept, refused = feed(BalanceCheck(), stray)
    assert refused is not None and "#endif" not in kept
    assert kept.startswith(search + "#define TILE 16\n#")
    one = "".join(feed_tokens(stray, ["#", "endif", "\n"]))
    assert one == search + "#define TILE 16\n#"  # a tokenizer's "endif": refused at once
    # an #ifndef left open may not end its section
    open_guard = search + "#ifndef TILE\n#define TILE 16\n>>>>>>> REPLACE\n"
    kept, refused = feed(BalanceCheck(), open_guard)
    assert refused is not None and ">" in refused and ">>>>>>> REPLACE" not in kept
