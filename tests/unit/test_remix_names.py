"""The answer check of REPLACE names (r3tui.remix.names) on the examples' kernels: what it
allows, what it refuses, and that it refuses only what a token adds."""

from __future__ import annotations

from pathlib import Path

import pytest

from r3tui.remix.names import IdentifierCheck, replace_sections, unit_names, unit_types

REPO = Path(__file__).resolve().parents[2]
NBODY = (REPO / "examples" / "nbody" / "kernel.cu").read_text()
REDUCE = (REPO / "examples" / "reduce_sum" / "kernel.cu").read_text()
OPEN = "<<<<<<< SEARCH\n    float3 a = acc;\n=======\n"


def test_unit_names_are_the_codes_not_its_comments() -> None:
    names = unit_names("// uses buf\n__global__ void k(float *x) { x[0] = 1.0f; /* tmp */ }\n")
    assert {"k", "x", "float", "__global__"} <= names
    assert not {"buf", "tmp", "uses"} & names
    assert unit_types("struct Body { float m; };\ntypedef float real;\nusing idx = int;") == {
        "Body", "real", "idx"}


def test_replace_sections_finished_and_open() -> None:
    answer = ("<<<<<<< SEARCH\na;\n=======\nb;\n>>>>>>> REPLACE\n"
              "<<<<<<< SEARCH\nc;\n=======\nd")
    assert replace_sections(answer) == ["b;\n", "d"]
    assert replace_sections("<<<<<<< SEARCH\nx = a;\n") == []


@pytest.mark.parametrize("text", [
    "    float3 a2 = acc;\n",  # a new name after a type
    "    float4 *q = (float4*)pos;\n    q[0].x = 1.0f;\n",  # pointer declaration, members
    "    for (int i2 = 0, j2 = 1; i2 < j2; i2++) { acc.x += 1.0f; }\n",  # comma declaration
    "    #define TILE 64\n    int t = TILE;\n",  # a macro the answer defines
    "    __shared__ float tile[256];\n    tile[threadIdx.x] = 0.0f;\n    __syncthreads();\n",
    "    acc.x += rsqrtf(dx) * 1e-3f; // p and m are only in a comment\n",
    "    const float* __restrict__ src = pos;\n    acc.x += __ldg(&src[0].x);\n",
])
def test_what_a_unit_has_or_the_answer_declares_passes(text: str) -> None:
    assert IdentifierCheck.for_unit(NBODY).violations(OPEN + text) == 0


@pytest.mark.parametrize(("text", "undefined"), [
    ("    acc.x += m * dx;\n", 1),  # a worked example's mass, which nbody does not have
    ("    return buf[0] + scale;\n", 2),
    ("    float s = start + stride;\n", 2),
])
def test_a_name_nothing_declares_counts(text: str, undefined: int) -> None:
    assert IdentifierCheck.for_unit(NBODY).violations(OPEN + text) == undefined


def test_search_text_and_finished_answers_outside_replace_are_not_checked() -> None:
    check = IdentifierCheck.for_unit(REDUCE)
    # SEARCH text is the grammar's (anchored to the parent's own lines)
    assert check("<<<<<<< SEARCH\n", "    made_up = 1;\n")
    done = "<<<<<<< SEARCH\nx;\n=======\n    x;\n>>>>>>> REPLACE\n"
    assert check(done, "anything")


def test_a_name_being_written_passes_while_it_starts_a_known_one() -> None:
    check = IdentifierCheck.for_unit(NBODY)
    assert "pos" in unit_names(NBODY)
    answer = OPEN + "    acc.x += p"
    assert check(answer, "o")  # "po": the start of pos
    assert check(answer + "o", "s")
    assert check(answer + "os", "[j].x;\n")  # pos: done
    assert not check(answer, "q;\n")  # pq: nothing starts so
    assert not check(OPEN + "    acc.x += ", "buf")  # no name of the unit starts with buf
    assert check.refused == 2


def test_a_declared_name_is_usable_afterwards_even_in_a_later_section() -> None:
    check = IdentifierCheck.for_unit(NBODY)
    first = OPEN + "    float3 acc2 = acc;\n>>>>>>> REPLACE\n<<<<<<< SEARCH\n    x;\n=======\n"
    assert check(first, "    acc2.x += 1.0f;\n")
    assert not check(first, "    acc3.x += 1.0f;\n")


def test_only_what_the_token_adds_is_refused() -> None:
    """An answer that already uses an unknown name (written without the check) is not stuck:
    a token that adds no new violation passes."""
    check = IdentifierCheck.for_unit(NBODY)
    answer = OPEN + "    acc.x += mass;\n"
    assert check.violations(answer) == 1
    assert check(answer, "    acc.y += dx;\n")
    assert not check(answer, "    acc.y += mass2;\n")


def test_a_headers_names_pass_only_where_the_unit_includes_it() -> None:
    """NVRTC compiles the examples without math.h: NAN is undefined there (SmolLM2, session
    43: 6 of 24 answers), while a unit that includes it may use it."""
    text = "    acc.x = NAN;\n"
    assert IdentifierCheck.for_unit(NBODY).violations(OPEN + text) == 1
    with_math = "#include <math.h>\n" + NBODY
    assert IdentifierCheck.for_unit(with_math).violations(OPEN + text) == 0
    assert IdentifierCheck.for_unit("#include <cfloat>\n" + NBODY).violations(
        OPEN + "    acc.x = FLT_MAX + NAN;\n") == 1  # FLT_MAX: cfloat's; NAN: not


def test_a_name_whose_declaration_the_search_text_removes_counts_until_declared_again() -> None:
    """Replacing ``float ax = 0.0f;`` takes ax's only declaration away: its REPLACE text may
    use ax only once it declares it again (SmolLM2's nbody answers did not, session 43)."""
    check = IdentifierCheck.for_unit(NBODY)
    assert "    float ax = 0.0f;\n" in NBODY
    search = "<<<<<<< SEARCH\n    float ax = 0.0f;\n    float ay = 0.0f;\n=======\n"
    assert check.removed_by("    float ax = 0.0f;\n    float ay = 0.0f;\n") == {"ax", "ay"}
    assert check.violations(search + "    ax += 1.0f;\n") == 1
    assert check.violations(search + "    float ax = 1.0f;\n    ax += ay;\n") == 1  # ay
    assert check.violations(search + "    float ax = 0.0f, ay = 0.0f;\n    ax += ay;\n") == 0
    # a SEARCH text that only uses ax leaves its declaration where it was
    uses = "<<<<<<< SEARCH\n        ax += dx * s;\n=======\n"
    assert "        ax += dx * s;\n" in NBODY
    assert check.violations(uses + "        ax += 2.0f * dx * s;\n") == 0
    # a text the unit does not hold verbatim removes nothing (the whitespace-tolerant match
    # is the edit's, not the check's)
    assert check.removed_by("float ax=0.0f;\n") == frozenset()


def test_a_name_the_unit_has_only_as_a_member_is_not_one_of_its_names() -> None:
    """nbody reads ``pj.w``: ``w`` is no variable there (Qwen's answers wrote ``w[k]``)."""
    names = unit_names(NBODY)
    assert "pj.w" in NBODY.replace(" ", "") and "w" not in names and "x" not in names
    assert {"pj", "pos", "acc"} <= names
    assert unit_names("struct P { float w; };\n__global__ void k(P* p) { p->w = 1; }") >= {"w"}
    check = IdentifierCheck.for_unit(NBODY)
    assert check.violations(OPEN + "    acc.x += w[0];\n") == 1
    assert check.violations(OPEN + "    acc.x += pos[0].w;\n") == 0


def test_a_removed_name_is_no_prefix_to_write_on() -> None:
    """While ``pj``'s declaration is being replaced, ``pj`` may not even be started: once
    written, every token that ends it would be refused, and the check would stand aside."""
    check = IdentifierCheck.for_unit(NBODY)
    search = "<<<<<<< SEARCH\n        float4 pj = pos[j];\n=======\n        float s2 = "
    assert "        float4 pj = pos[j];\n" in NBODY
    assert not check(search, "pj")
    assert check(search, "p") and check(search, "pi")  # pi, pos: the unit's, kept


def test_a_declaration_at_the_edits_level_of_a_name_the_block_has_counts() -> None:
    """Declared twice (session 47: Qwen's ``const float eps2`` beside nbody's parameter,
    ``block`` again in reduce_sum): the compiler refuses it, so the check counts it, at the
    edit's own level only (a nested block or a ``for``'s header may shadow)."""
    check = IdentifierCheck.for_unit(NBODY)
    search = "    float ax = 0.0f;\n"
    assert search in NBODY
    head = f"<<<<<<< SEARCH\n{search}=======\n"
    assert {"eps2", "pos", "n", "pi", "ay", "i"} <= check.clashes(search)
    assert "ax" not in check.clashes(search)  # the edit replaces its declaration
    assert check.violations(head + "    const float eps2 = 0.0f;\n") == 1
    assert check.violations(head + "    float ay = 0.0f;\n") == 1
    assert check.violations(head + "    float ax = 0.0f, ay = 1.0f;\n") == 1
    assert check.violations(head + "    float ax = 0.0f;\n    float eps3 = eps2;\n") == 0
    assert check.violations(head + "    float ax = 0.0f;\n    { float ay = 1.0f; ax = ay; }\n") == 0
    assert check.violations(head + "    float ax = 0.0f;\n"
                            "    for (int i = 0; i < n; ++i) { ax += 1.0f; }\n") == 0
    # the token that finishes the name is the one refused: writing on renames it
    assert check(head, "    const float eps") and check(head + "    const float eps", "2")
    assert not check(head + "    const float eps2", " =")
    assert check(head + "    const float eps2", "_half =")
    reduce = IdentifierCheck.for_unit(REDUCE)
    line = next(t for t in REDUCE.splitlines(keepends=True) if " i = block" in t)
    assert reduce.violations(f"<<<<<<< SEARCH\n{line}=======\n"
                             "    unsigned long long block = 0;\n") == 1
    # a SEARCH text that is not the unit's, or does not balance its braces: nothing known
    assert check.clashes("    float ax=0.0f;\n") == frozenset()
    assert check.clashes("    for (int j = 0; j < n; ++j) {\n") == frozenset()


def test_a_name_declared_in_a_block_the_edit_closes_is_gone_after_it() -> None:
    check = IdentifierCheck.for_unit(NBODY)
    head = "<<<<<<< SEARCH\n    float ax = 0.0f;\n=======\n    float ax = 0.0f;\n"
    assert check.violations(head + "    { float t7 = 1.0f; ax += t7; }\n") == 0
    assert check.violations(head + "    { float t7 = 1.0f; }\n    ax += t7;\n") == 1
    # shadowing a name declared before the block keeps the outer one
    assert check.violations(head + "    { float ax = 1.0f; }\n    ax += 1.0f;\n") == 0


def test_the_end_line_waits_for_the_names_the_code_after_the_edit_uses() -> None:
    """Replacing ``float4 pi = pos[i];`` with a loop that declares ``pi`` in its body leaves
    the code after the edit without it (Qwen's grid-stride answer on nbody, session 47): the
    section may not end until ``pi`` is declared at the edit's level again."""
    check = IdentifierCheck.for_unit(NBODY)
    search = "    float4 pi = pos[i];\n"
    assert search in NBODY
    head = f"<<<<<<< SEARCH\n{search}=======\n"
    nested = head + "    for (int k = 0; k < 1; ++k) {\n        float4 pi = pos[i];\n    }\n"
    assert check.missing(search, nested[len(head):]) == {"pi"}
    for end in (">", ">>>>>>> REPLACE\n"):
        assert not check(nested, end)
        assert check(head + "    float4 pi = __ldg(&pos[i]);\n", end)
    # phi's update after the edit reads inv_r; written again, even under another form, it is there
    line = "        float inv_r = 1.0f / r;\n"
    assert check.missing(line, "        float q = 1.0f;\n") == {"inv_r"}
    assert check.missing(line, "        float inv_r = rsqrtf(r2);\n") == frozenset()
    # the end line begun before this piece is not asked about again
    assert check(nested + ">>>", ">>>> REPLACE\n")
