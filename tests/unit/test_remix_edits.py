"""Parsing model answers and applying them to real kernels, with hypothesis on tricky text."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from r3tui.remix.edits import (
    Edit,
    apply_edits,
    apply_whole,
    entry_point_problem,
    find_kernel,
    parse_search_replace,
    parse_whole,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SGEMM = (EXAMPLES / "sgemm" / "kernel.cu").read_text()
PTR_STRUCT = (EXAMPLES / "ptr_struct" / "kernel.cu").read_text()
SOFTMAX = (EXAMPLES / "softmax" / "kernel.cu").read_text()


def block(search: str, replace: str) -> str:
    return f"<<<<<<< SEARCH\n{search}=======\n{replace}>>>>>>> REPLACE\n"


# ----------------------------------------------------------------------------------------
# parsing


def test_search_replace_blocks_are_parsed_in_order_with_prose_and_fences_around() -> None:
    answer = (
        "Sure! Here is the change:\n```cuda\n"
        + block("    float sum = 0.0f;\n", "    float sum = 0.0f;  // acc\n")
        + "```\nand a second one\n\r\n"
        + block("a\n", "")
    )
    parsed = parse_search_replace(answer)
    assert parsed.ok, parsed.reason
    assert parsed.edits == (
        Edit("    float sum = 0.0f;\n", "    float sum = 0.0f;  // acc\n"),
        Edit("a\n", ""),
    )


def test_a_block_written_twice_is_one_edit_and_still_applies() -> None:
    """SmolLM2 often repeats its first block; applied twice, the copy's SEARCH is gone."""
    one = block("    float sum = 0.0f;\n", "    float sum = 0.0f;  // acc\n")
    parsed = parse_search_replace(one + one)
    assert parsed.ok and len(parsed.edits) == 1
    applied = apply_edits(SGEMM, parsed.edits)
    assert applied.ok, applied.reason
    assert "float sum = 0.0f;  // acc" in (applied.source or "")
    other = block("    float sum = 0.0f;\n", "    double sum = 0.0;\n")
    assert len(parse_search_replace(one + other).edits) == 2  # different: both kept


def test_marker_lengths_and_crlf_are_tolerated() -> None:
    answer = "<<<<<<<< SEARCH\r\nx = 1;\r\n=====\r\nx = 2;\r\n>>>>>>> REPLACE\r\n"
    parsed = parse_search_replace(answer)
    assert parsed.ok and parsed.edits == (Edit("x = 1;\n", "x = 2;\n"),)


def test_fenced_code_inside_a_section_is_not_code() -> None:
    parsed = parse_search_replace(
        "<<<<<<< SEARCH\n```cuda\nx = 1;\n```\n=======\n```\nx = 2;\n```\n>>>>>>> REPLACE\n"
    )
    assert parsed.edits == (Edit("x = 1;\n", "x = 2;\n"),)


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        ("I would tile it.", "no SEARCH/REPLACE block"),
        ("<<<<<<< SEARCH\nx\n=======\ny\n", "ends inside edit 1"),
        ("<<<<<<< SEARCH\nx\n", "ends inside edit 1"),
        ("<<<<<<< SEARCH\nx\n>>>>>>> REPLACE\n", "no '=======' line"),
        ("<<<<<<< SEARCH\nx\n=======\ny\n<<<<<<< SEARCH\n", "no '>>>>>>> REPLACE' line"),
    ],
)
def test_malformed_answers_are_failures_with_a_reason(answer: str, reason: str) -> None:
    parsed = parse_search_replace(answer)
    assert not parsed.ok and reason in (parsed.reason or "")


def test_whole_kernel_answer_takes_the_block_with_the_kernel() -> None:
    answer = "Try:\n```\nnvcc -O3\n```\n```cuda\n__global__ void k(float* y) { y[0] = 1; }\n```\n"
    parsed = parse_whole(answer)
    assert parsed.ok and parsed.source == "__global__ void k(float* y) { y[0] = 1; }\n"
    assert "not closed" in (parse_whole("```cuda\n__global__ void k() {\n").reason or "")
    assert not parse_whole("no code here").ok
    assert parse_whole("__global__ void k() {}").ok  # code without a fence


# ----------------------------------------------------------------------------------------
# applying to the example kernels


def test_exact_edit_on_sgemm_keeps_everything_else() -> None:
    search = "    for (int k = 0; k < K; ++k) {\n"
    result = apply_edits(SGEMM, [Edit(search, "    #pragma unroll 4\n" + search)], "sgemm")
    assert result.ok and not result.tolerant
    assert result.source == SGEMM.replace(search, "    #pragma unroll 4\n" + search)


def test_whitespace_tolerant_match_reindents_the_replacement() -> None:
    # The model dropped the indentation and squeezed the spaces of the loop it copied.
    search = "float sum = 0.0f;\nfor (int k = 0;  k < K; ++k) {\n"
    replace = "float sum = 0.0f;\n#pragma unroll 2\nfor (int k = 0; k < K; ++k) {\n"
    result = apply_edits(SGEMM, [Edit(search, replace)], "sgemm")
    assert result.ok and result.tolerant, result.reason
    assert result.source is not None
    assert "    float sum = 0.0f;\n    #pragma unroll 2\n    for (int k = 0; k < K; ++k) {\n" in (
        result.source
    )


def test_ambiguous_and_missing_searches_fail() -> None:
    twice = apply_edits(SOFTMAX, [Edit("        __syncthreads();\n", "")], "softmax")
    assert not twice.ok and "occurs" in (twice.reason or "") and "ambiguous" in (twice.reason or "")
    missing = apply_edits(SGEMM, [Edit("for (int j = 0; j < N; ++j) {\n", "")], "sgemm")
    assert not missing.ok and "not in the kernel" in (missing.reason or "")
    empty = apply_edits(SGEMM, [Edit("  \n", "x")], "sgemm")
    assert not empty.ok and "empty" in (empty.reason or "")
    assert not apply_edits(SGEMM, [], "sgemm").ok


def test_a_match_in_the_middle_of_a_line_is_not_taken() -> None:
    source = "int a = 1;\nint b = a = 1;\n"
    result = apply_edits(source, [Edit("a = 1;\n", "a = 2;\n")])
    assert not result.ok  # neither line is exactly "a = 1;"; the tolerant match finds none


def test_edits_that_change_the_signature_or_drop_the_kernel_fail() -> None:
    head = (
        'extern "C" __global__ void sgemm(int M, int N, int K, float alpha, const float* A, '
        "const float* B,\n"
    )
    renamed = apply_edits(SGEMM, [Edit(head, head.replace("sgemm", "sgemm2"))], "sgemm")
    assert not renamed.ok and "entry point sgemm is gone" in (renamed.reason or "")
    typed = apply_edits(SGEMM, [Edit(head, head.replace("int K", "long K"))], "sgemm")
    assert not typed.ok and "parameters of sgemm changed" in (typed.reason or "")
    qualified = head.replace("const float* A", "const float* __restrict__ A")
    fine = apply_edits(SGEMM, [Edit(head, qualified.replace("alpha", "scale"))], "sgemm")
    assert fine.ok, fine.reason  # qualifiers and parameter names may change
    noop = apply_edits(SGEMM, [Edit(head, head)], "sgemm")
    assert not noop.ok and "unchanged" in (noop.reason or "")


def test_whole_kernel_answer_is_spliced_into_the_parent() -> None:
    span = find_kernel(PTR_STRUCT, "ptr_struct")
    assert span is not None
    kernel = PTR_STRUCT[span.start : span.body_end].replace("a * pair.x[i]", "pair.x[i] * a")
    result = apply_whole(PTR_STRUCT, f"// the faster kernel\n{kernel}\n", "ptr_struct")
    assert result.ok, result.reason
    assert result.source is not None
    assert "struct Pair {" in result.source  # the model left the struct out; it is kept
    assert "pair.x[i] * a" in result.source
    assert result.source.startswith("// Batched AXPY")


def test_whole_kernel_answer_with_other_code_replaces_the_file() -> None:
    answer = (
        "#define TILE 16\n"
        'extern "C" __global__ void sgemm(int M, int N, int K, float alpha, const float* A,\n'
        "    const float* B, float beta, float* C) { C[0] = alpha; }\n"
    )
    result = apply_whole(SGEMM, answer, "sgemm")
    assert result.ok and result.source == answer
    dropped = apply_whole(SGEMM, "__global__ void other(float* C) {}\n", "sgemm")
    assert not dropped.ok and "gone" in (dropped.reason or "")
    same = apply_whole(SGEMM, SGEMM, "sgemm")
    assert not same.ok and "unchanged" in (same.reason or "")


def test_find_kernel_skips_comments_declarations_and_templates() -> None:
    source = (
        "// __global__ void k(int x) {}\n"
        '__global__ void k(const char* s = "(", int n);\n'
        "template <typename T> __global__ void k(T* y, int n) { y[n] = T(); }\n"
    )
    span = find_kernel(source, "k<float>")
    assert span is not None and span.declarations == 1
    assert [p.name for p in span.params] == ["y", "n"]
    assert span.signature() == (("T", "*"), ("int",))
    assert entry_point_problem(source, source, "k<float>") is None


# ----------------------------------------------------------------------------------------
# properties

LINE_CHARS = st.characters(
    codec="utf-8",
    exclude_categories=("Cs", "Cc"),
    exclude_characters="\r\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029",
)
LINES = st.lists(st.text(LINE_CHARS, max_size=12), min_size=1, max_size=12)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(lines=LINES, data=st.data(), crlf=st.booleans())
def test_a_unique_exact_block_is_replaced_and_the_line_ending_kept(
    lines: list[str], data: st.DataObject, crlf: bool
) -> None:
    start = data.draw(st.integers(0, len(lines) - 1))
    stop = data.draw(st.integers(start + 1, len(lines)))
    window = lines[start:stop]
    assume(any(line.strip() for line in window))
    text = "".join(line + "\n" for line in lines)
    search = "".join(line + "\n" for line in window)
    before = "".join(line + "\n" for line in lines[:start])
    line_starts = [0] + [i + 1 for i, c in enumerate(text) if c == "\n"]
    assume(sum(text.startswith(search, at) for at in line_starts) == 1)  # overlaps count
    replacement = data.draw(st.lists(st.text(LINE_CHARS, max_size=8), max_size=3))
    replace = "".join(line + "\n" for line in replacement)
    assume(replace != search)
    source = text.replace("\n", "\r\n") if crlf else text
    result = apply_edits(source, [Edit(search, replace)])
    expected = before + replace + "".join(line + "\n" for line in lines[stop:])
    assert result.ok, result.reason
    assert result.source == (expected.replace("\n", "\r\n") if crlf else expected)


@settings(max_examples=150, deadline=None)
@given(
    indent=st.sampled_from(["", "  ", "    ", "\t", "\t  "]),
    model_indent=st.sampled_from(["", " ", "\t", "        "]),
    trailing=st.sampled_from(["", " ", "\t", "  "]),
    body=st.lists(st.text(LINE_CHARS, min_size=1, max_size=10), min_size=1, max_size=4),
)
def test_reindented_search_text_still_applies_once(
    indent: str, model_indent: str, trailing: str, body: list[str]
) -> None:
    body = [f"x{i}_{line.strip() or 'y'}" for i, line in enumerate(body)]
    source = "".join(f"{indent}{line}\n" for line in ["{", *body, "}"])
    search = "".join(f"{model_indent}{line}{trailing}\n" for line in body)
    replace = "".join(f"{model_indent}{line};\n" for line in body)
    result = apply_edits(source, [Edit(search, replace)])
    assert result.ok, result.reason
    assert result.source == "".join(
        f"{indent}{line}\n" for line in ["{", *(b + ";" for b in body), "}"]
    )


@settings(max_examples=100, deadline=None)
@given(lines=LINES, repeat=st.integers(2, 3))
def test_search_text_occurring_several_times_is_ambiguous(lines: list[str], repeat: int) -> None:
    chunk = "".join(f"k{line}\n" for line in lines)
    source = "int a;\n" + chunk * repeat + "int b;\n"
    result = apply_edits(source, [Edit(chunk, "")])
    assert not result.ok and "ambiguous" in (result.reason or "")


@settings(max_examples=200, deadline=None)
@given(
    source=st.text(max_size=200),
    search=st.text(max_size=40),
    replace=st.text(max_size=40),
    answer=st.text(max_size=300),
)
def test_parsing_and_applying_never_raise(
    source: str, search: str, replace: str, answer: str
) -> None:
    result = apply_edits(source, [Edit(search, replace)], "k")
    assert result.ok == (result.source is not None)
    assert result.ok or result.reason
    for parsed in (parse_search_replace(answer), parse_whole(answer)):
        assert parsed.ok or parsed.reason
    whole = apply_whole(source, answer, "k")
    assert whole.ok or whole.reason


def test_empty_replace_deletes_lines_and_unicode_survives() -> None:
    source = "// Größe ∑\nint a;\nint b;  // 日本\nint c;\n"
    result = apply_edits(source, [Edit("int b;  // 日本\n", "")])
    assert result.ok and result.source == "// Größe ∑\nint a;\nint c;\n"
    tabbed = apply_edits("\tint a;\r\n\tint b;\r\n", [Edit("int a;\n", "int z;\n")])
    assert tabbed.ok and tabbed.source == "\tint z;\r\n\tint b;\r\n"


def test_a_repeated_block_is_applied_once() -> None:
    search = "    float sum = 0.0f;\n"
    once = Edit(search, "    float sum = 0.0f;  // accumulator\n")
    result = apply_edits(SGEMM, [once, once], "sgemm")
    assert result.ok and result.source == SGEMM.replace(search, once.replace)
    clash = apply_edits(SGEMM, [once, Edit(search, "    float sum = 1.0f;\n")], "sgemm")
    assert not clash.ok and "edit 2" in (clash.reason or "")


def test_complete_edits_before_a_cut_off_or_malformed_one_are_kept() -> None:
    first = block("a\n", "b\n")
    cut = parse_search_replace(first + "<<<<<<< SEARCH\nc\n=======\nd")
    assert cut.ok and cut.edits == (Edit("a\n", "b\n"),)
    assert cut.dropped and "ends inside edit 2" in cut.dropped
    malformed = parse_search_replace(first + "<<<<<<< SEARCH\nc\n>>>>>>> REPLACE\n")
    assert malformed.ok and malformed.edits == (Edit("a\n", "b\n"),)
    assert malformed.dropped and "edit 2 has no '======='" in malformed.dropped
    assert parse_search_replace(first).dropped is None


def test_partial_application_skips_edits_that_do_not_apply_and_names_them() -> None:
    loop = "    for (int k = 0; k < K; ++k) {\n"
    edits = [Edit("no such line\n", "x\n"), Edit(loop, "    #pragma unroll 4\n" + loop),
             Edit("   \n", "y\n")]
    strict = apply_edits(SGEMM, edits, "sgemm")
    assert not strict.ok and "edit 1" in (strict.reason or "")
    partial = apply_edits(SGEMM, edits, "sgemm", partial=True)
    assert partial.ok and partial.source == SGEMM.replace(loop, "    #pragma unroll 4\n" + loop)
    assert partial.skipped == ("edit 1: its SEARCH text is not in the kernel",
                               "edit 3: its SEARCH text is empty")
    none_apply = apply_edits(SGEMM, edits[:1], "sgemm", partial=True)
    assert not none_apply.ok and "unchanged" in (none_apply.reason or "")
    assert "edit 1: its SEARCH text is not in the kernel" in (none_apply.reason or "")
    # the entry-point check still holds for what was applied
    broken = [Edit("no such line\n", "x\n"),
              Edit("                                 float beta, float* C)\n",
                   "                                 double beta, float* C)\n")]
    assert not apply_edits(SGEMM, broken, "sgemm", partial=True).ok
