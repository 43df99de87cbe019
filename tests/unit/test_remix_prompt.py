"""Prompts built from real kernels and the templates shipped in the package."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from r3tui.remix.backends import ChatMessage, Sampling, parse_prompt, render_prompt
from r3tui.remix.catalogue import transformation
from r3tui.remix.mutation import GRAMMAR_FOR_FORMAT, load_grammar
from r3tui.remix.prompt import (
    Inspiration,
    MutationContext,
    VariantProfile,
    build_messages,
    describe_profile,
    quote_error_line,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
STENCIL = (EXAMPLES / "stencil7" / "kernel.cu").read_text()


def test_prompt_names_the_kernel_the_change_and_the_measurements() -> None:
    profile = VariantProfile(
        median_s=91.2e-6,
        registers=32,
        spills_bytes=0,
        occupancy=0.5,
        shared_mem_bytes=0,
        achieved_fraction=0.55,
        ceiling="bandwidth",
        compile_warnings='kernel.cu(3): warning #177-D: variable "x" was declared\n but never used',
    )
    faster = STENCIL.replace("long long idx", "long long index").replace("[idx", "[index")
    ctx = MutationContext(
        "stencil7",
        STENCIL,
        profile,
        (Inspiration(faster, 80.5e-6), Inspiration(STENCIL, None)),
        transformation("restrict_const"),
        "search_replace",
    )
    system, user = build_messages(ctx)
    assert system.role == "system" and user.role == "user"
    assert "one small, named change" in system.content
    text = user.content
    assert "`stencil7`" in text and STENCIL.strip() in text
    assert "Measured: median time 91.2 µs, 32 registers per thread, no register spills, " in text
    assert "occupancy 50%, 55% of the GPU's bandwidth ceiling." in text
    assert 'warning #177-D: variable "x" was declared but never used' in text
    assert transformation("restrict_const").instruction in text
    assert "parameter types exactly as they are" in text
    assert "<<<<<<< SEARCH" in text and ">>>>>>> REPLACE" in text
    # Inspirations show the kernel function only (the comments are the parent's already).
    assert "(median 80.5 µs)" in text and "(not timed)" in text
    assert text.count("// 3-D 7-point Jacobi stencil") == 1
    assert "long long index" in text


def test_a_compiler_error_is_told_with_the_line_it_names() -> None:
    """NVRTC's real first error on a kernel with a name it does not declare: the failure a
    repair turn shows quotes that line of the failed kernel (a small model cannot count)."""
    from r3tui.compile.base import CompileRequest, first_error_line, get_toolchain

    broken = STENCIL.replace("in[idx]", "buf[idx]", 1)
    compiled = get_toolchain("nvrtc").compile(CompileRequest(broken, "stencil7"))
    error = first_error_line(compiled.log)
    assert not compiled.ok and '"buf" is undefined' in error
    number = int(error.split("(")[1].split(")")[0])
    line = broken.splitlines()[number - 1].strip()
    assert "buf[idx]" in line
    assert quote_error_line(f"compile_failed: {error}", broken) == (
        f"compile_failed: {error} (line {number} is `{line}`)")
    # nothing to quote: a mismatch, a line past the end, a blank line
    for failure in ("wrong_result: max abs error 3.5 at out[7]", "kernel.cu(9999): error: x",
                    "kernel.cu(2): error: y"):
        assert quote_error_line(failure, "int a;\n\n") == failure


def test_a_repair_shows_the_generic_example_where_asked_and_the_worked_one_else() -> None:
    shuffle = transformation("warp_shuffle_reduction")
    assert shuffle.example is not None and "buf[tid]" in shuffle.example[0]

    def user(**changes: object) -> str:
        ctx = MutationContext("stencil7", STENCIL, transformation=shuffle, **changes)  # type: ignore[arg-type]
        return build_messages(ctx)[1].content

    failure = 'compile_failed: kernel.cu(29): error: identifier "buf" is undefined'
    generic = user(repair=failure, repair_example="generic")
    assert "for example a change of another kind:" in generic and "buf[tid]" not in generic
    assert "__ldg(&a[i])" in generic
    # as campaigns recorded before it asked (a re-run asks their very prompts), and a change
    # that is not a repair: the transformation's worked example
    for text in (user(repair=failure), user(repair_example="generic")):
        assert "for example this change in another kernel:" in text and "buf[tid]" in text


def test_whole_format_asks_for_one_code_block_and_nothing_measured_is_said() -> None:
    ctx = MutationContext("stencil7", STENCIL, None, (), transformation("fuse_loops"), "whole")
    _, user = build_messages(ctx)
    assert "complete new kernel in one ```cuda code block" in user.content
    assert "Measured" not in user.content and "SEARCH" not in user.content


def test_prompt_needs_a_transformation_and_a_known_format() -> None:
    with pytest.raises(ValueError, match="transformation"):
        build_messages(MutationContext("stencil7", STENCIL))
    with pytest.raises(ValueError, match="edit_format"):
        MutationContext("stencil7", STENCIL, edit_format="diff")


def test_profile_lines() -> None:
    assert describe_profile(None) == ""
    assert describe_profile(VariantProfile()) == ""
    assert describe_profile(VariantProfile(median_s=0.0123, spills_bytes=48)) == (
        "Measured: median time 12.30 ms, 48 bytes of register spills.\n"
    )


def test_stored_prompt_is_json_of_the_messages_and_round_trips() -> None:
    messages = [ChatMessage("system", "s"), ChatMessage("user", 'k<<<"{}"\n∑')]
    stored = render_prompt(messages)
    assert stored.startswith('[{"role":"system"')
    assert parse_prompt(stored) == messages
    with pytest.raises(Exception, match="JSON list"):
        parse_prompt("not json")


def test_sampling_is_validated_and_recorded_with_the_grammar() -> None:
    assert Sampling(seed=3).to_json("search_replace") == {
        "temperature": 0.8,
        "top_p": 0.95,
        "max_tokens": 768,
        "seed": 3,
        "grammar": "search_replace",
    }
    with pytest.raises(Exception, match="max_tokens"):
        Sampling(max_tokens=0)


def test_grammars_ship_with_the_package() -> None:
    for name in GRAMMAR_FOR_FORMAT.values():
        text = load_grammar(name)
        assert text.count("root ") == 1 and "::=" in text
    with pytest.raises(Exception, match="no grammar"):
        load_grammar("json")


def test_importing_remix_loads_no_model_library() -> None:
    code = (
        "import sys, r3tui.remix\n"
        "print(','.join(m for m in ('llama_cpp', 'skopt', 'cuda.bindings.nvrtc') "
        "if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert result.stdout.strip() == ""


def test_anchored_grammar_lists_the_parent_lines_as_literals() -> None:
    from r3tui.remix.mutation import anchored_search_grammar, gbnf_literal

    assert gbnf_literal('a "b"\\\t\n\x01') == 'a \\"b\\"\\\\\\t\\n\\x01'
    grammar = anchored_search_grammar(STENCIL)
    assert 'extern \\"C\\" __global__ void stencil7(' in grammar
    lines = STENCIL.splitlines()
    start = next(line for line in grammar.splitlines() if line.startswith("search ::="))
    first = int(start.split()[2].removeprefix("pl").removesuffix("-0-0"))
    assert lines[first].startswith('extern "C"')  # comment lines never start a SEARCH
    assert f"pt{len(lines) - 1} ::= " in grammar and "code-line line{0,29}" not in grammar


def test_the_worked_example_declares_no_name_the_kernel_uses() -> None:
    """Qwen2.5-Coder copied the shared-memory example's `float acc = 0.0f;` into nbody, whose
    output parameter is `acc`: declared twice in 4 of 11 answers (session 37)."""
    from dataclasses import replace

    from r3tui.remix.prompt import apart

    nbody = (EXAMPLES / "nbody" / "kernel.cu").read_text()
    tile = transformation("shared_memory_tile")
    assert tile.example is not None
    before, after = apart(tile.example, nbody)
    # acc, pi and j are nbody's; tile and base are not, p and f are used, not declared
    assert "float acc2 = 0.0f;" in before and "float pi2 = " in after and "int j2 = 0" in after
    assert "acc += " not in after and "__shared__ float tile[256];" in after
    assert "base + threadIdx.x" in after and "f(pi2, tile[j2])" in after
    # a kernel that uses none of them sees the example as written
    assert apart(tile.example, "__global__ void k(float* out) { out[0] = 1.0f; }") == tile.example
    ctx = MutationContext("nbody", nbody, transformation=tile)
    assert "float acc2 = 0.0f;" in build_messages(ctx)[1].content
    recorded = replace(ctx, example_names="as_written")  # campaigns recorded before
    assert "float acc2" not in build_messages(recorded)[1].content
