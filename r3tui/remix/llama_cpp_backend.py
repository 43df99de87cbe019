"""A local GGUF model through llama-cpp-python, fully offline.

The model loads once per backend (a 100 MB file to several GB).  A request is rendered with the
chat template stored in the GGUF (the same Jinja formatter ``create_chat_completion`` builds
from it), tokenized, checked against ``n_ctx`` together with ``max_tokens``
(:class:`~r3tui.remix.backends.PromptTooLong` before anything is generated), and generated
token by token under the grammar until an end-of-generation token or ``max_tokens``.

Why not ``create_chat_completion`` itself: llama-cpp-python 0.3.36 turns tokens into text
through a 32-byte buffer, and a longer token (SmolLM2 has single tokens of a newline and 30+
spaces, i.e. indentation) comes out truncated or empty, so generated code lost line breaks.
Here each token's piece is read with a buffer of the size llama.cpp asks for.  A GGUF without
a chat template falls back to ``create_chat_completion`` and its built-in format.

The weights are loaded without llama.cpp's "extra buffer types" (``use_extra_bufts``, the
CLI's ``--no-repack``), which llama-cpp-python 0.3.36 does not expose: on a CPU with AMX the
extra type is ggml's AMX matmul, and as built here its ``ldtilecfg`` faults on a tile
configuration with non-zero reserved bytes (SIGSEGV in ``ggml_backend_amx_mul_mat`` on the
first decode, every run; 2026-12-03, Xeon with amx_int8/amx_bf16).  Plain AVX-512 kernels are
used instead (how much slower they are was not measured: the AMX path does not run here).

Threads: llama-cpp-python evaluates the prompt with every core (``n_threads_batch``) and
generates with half of them; here both use ``n_threads`` (default half the cores), as
llama.cpp's CLI does.  ggml's threads wait for each other at every operation, busy-waiting, so
on a machine whose cores are busy with other work (the 2-core CPU machine while other jobs
run, or a campaign's compile workers) one descheduled thread stalls the others: a 526-token
prompt took 15.4 s with 2 threads and 3.3 s with 1 (medians of 6, alternated, 2026-12-03,
2-core machine shared with two other jobs); the answers were the same (two seeds checked).  On
an idle machine with many cores the prompt can take up to twice as long as with all of them;
that was not measured here.

Grammars are checked by llama.cpp's own parser first: ``LlamaGrammar.from_string`` does not
parse, and a grammar llama.cpp rejects would otherwise reach the sampler as a null pointer.

Tokens are drawn by :class:`GrammarCheckedSampler`, not ``Llama.generate``: llama-cpp-python
0.3.36 chains the grammar before top-k, so for every token the grammar was run over the whole
49k-token vocabulary, about 8-10 ms a token on the 2-core CPU machine, a third of the time per
token.  Here the token is drawn first (top-k 40, top-p, min-p 0.05, temperature, the seeded
draw: the chain ``generate`` used, and without a grammar the same tokens), then the grammar
checks that one token; only when it rejects it does the grammar run over the vocabulary and the
draw repeat among the tokens it allows (what llama.cpp's own ``common_sampler`` does).  Output
under a grammar still always follows it.  The distribution is not the same as grammar-first:
a drawn token the grammar allows is kept with its probability among all top-k tokens, not
renormalized among the allowed ones; greedy sampling (temperature 0) gives the same tokens as
before.  Calls record it as ``sampling["grammar_check"] = "after_sampling"``.  In the runs
below the grammar rejected 2 to 41 drawn tokens a call (of 68 to 384 generated).

Measured 2026-12-03 on the 2-core CPU machine (shared with two other jobs), SmolLM2-135M Q4_1,
spmv_csr proposal prompts (567 tokens for SEARCH/REPLACE, 509 for whole; built as the mutator
does), temperature 0.8, max_tokens 384, seeds 100-104; old (``Llama.generate``) and new
alternated call by call in one process, 5 calls each; generation rate excludes the prompt,
medians:

    grammar                   old tok/s  new tok/s  new/old
    (none)                      46.2       45.9      0.99
    search_replace_anchored     33.8       45.4      1.34
    search_replace              32.2       43.7      1.36
    fenced_cuda                 30.0       46.4      1.55

With the prompt threads above too, whole calls as ``LLMCall`` records them (prompt included,
tokens_out / latency_s), campaign settings (max_tokens 768), seeds 200-204, same conditions,
alternated, medians of 5: search_replace_anchored 10.7 -> 26.5 tokens/s (calls 23.4 -> 9.2 s),
fenced_cuda 21.2 -> 31.2 tokens/s (calls 31.3 -> 10.4 s; the answers differ in length).
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from r3tui.domain import LLMCall
from r3tui.errors import ModelError
from r3tui.remix.backends import (
    AnswerCheck,
    BackendError,
    ChatMessage,
    Completion,
    PromptTooLong,
    Sampling,
    messages_json,
    render_prompt,
)
from r3tui.remix.models import model_sha256, set_offline_environment

_TEMPLATE_KEY = "tokenizer.chat_template"
# Without a template in the GGUF the token count is estimated from the bare messages plus
# this many tokens of framing each.
_FRAMING_TOKENS = 8
# The sampler settings create_chat_completion uses besides temperature and top_p.
_TOP_K = 40
_MIN_P = 0.05


def _import_llama_cpp() -> Any:
    set_offline_environment()
    try:
        import llama_cpp
    except ImportError as exc:
        raise ModelError(
            f"llama-cpp-python cannot be imported: {exc}",
            hint="pip install -e '.[llm,model]' (README)",
        ) from exc
    return llama_cpp


# Model loads patch a module-level default (below), so they are serialized process-wide.
_LOAD_LOCK = threading.Lock()


@contextlib.contextmanager
def without_extra_buffer_types(lib: Any) -> Iterator[None]:
    """While a ``Llama`` is built, its model parameters start with ``use_extra_bufts`` off.

    ``Llama.__init__`` takes its parameters from ``llama_model_default_params()`` and offers no
    argument for this field, so the default is swapped for the duration of the load only."""
    module = lib.llama_cpp
    default = module.llama_model_default_params

    def no_extra_bufts() -> Any:
        params = default()
        params.use_extra_bufts = False
        return params

    with _LOAD_LOCK:
        module.llama_model_default_params = no_extra_bufts
        try:
            yield
        finally:
            module.llama_model_default_params = default


# Candidates the answer check is asked about when it refused the drawn token: the likeliest
# ones (top-k keeps 40 of them anyway).
_CHECKED = 64
# Where it allows none of those, it goes on down the likeliest in steps of _CHECKED, this deep
# at most, before it stands aside: a small model whose 64 likeliest are all names the unit
# does not define still ranks the defined ones somewhere (session 42: SmolLM2-135M's check
# stood aside 73 times in 24 answers, and 11 of them failed on an undefined identifier).
_CHECKED_DEEPEST = 2048

# How a grammar constrained the recorded call (``LLMCall.sampling["grammar_check"]``).
GRAMMAR_CHECKED_AFTER_SAMPLING = "after_sampling"  # GrammarCheckedSampler
GRAMMAR_APPLIED_BEFORE_SAMPLING = "before_sampling"  # create_chat_completion's own chain

# The layout of llama.cpp's ``llama_token_data`` (id, logit, p), for filling it from numpy.
_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])


class GrammarCheckedSampler:
    """Draws tokens with top-k, top-p, min-p and temperature, checking each against a grammar.

    The draw comes first, from all tokens; the grammar then checks the one token drawn.  Only
    when it rejects that token is the grammar run over the whole vocabulary and the draw
    repeated among the tokens it allows (module docstring: why, and how the distribution
    differs from running the grammar first).  One instance per call: its random state starts
    from ``sampling.seed`` and its grammar state from the grammar's root.
    """

    def __init__(
        self, lib: Any, vocab: Any, n_vocab: int, sampling: Sampling, grammar: str | None,
        check: AnswerCheck | None = None, piece: Callable[[int], str] | None = None,
    ) -> None:
        if ctypes.sizeof(lib.llama_token_data) != _TOKEN_DATA.itemsize:
            raise BackendError("llama.cpp's llama_token_data is not (int32, float, float)")
        self._lib = lib
        self._n_vocab = n_vocab
        self.rejections = 0  # drawn tokens the grammar rejected, each a pass over the vocabulary
        # the answer check (after the grammar) and each token's text for it
        self._check, self._piece = check, piece
        self._vocab = vocab
        self.check_rejections = 0  # drawn tokens the check refused
        self.check_overruled = 0  # steps where it allowed none of the likeliest: not applied
        self.check_deeper = 0  # steps where it allowed none of the 64 likeliest but a later one
        self._chain = lib.llama_sampler_chain_init(lib.llama_sampler_chain_default_params())
        self._grammar = None
        for stage in self._stages(sampling):
            lib.llama_sampler_chain_add(self._chain, stage)  # the chain owns its stages
        if grammar is not None:
            self._grammar = lib.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
            if not self._grammar:
                self.close()
                raise BackendError("llama.cpp rejected the grammar")
        token_pointer = ctypes.POINTER(lib.llama_token_data)
        self._data = (lib.llama_token_data * n_vocab)()
        self._columns = np.frombuffer(self._data, dtype=_TOKEN_DATA)
        self._ids = np.arange(n_vocab, dtype=np.int32)
        self._all = lib.llama_token_data_array(
            ctypes.cast(self._data, token_pointer), n_vocab, -1, False
        )
        self._one_data = (lib.llama_token_data * 1)()
        self._one = lib.llama_token_data_array(
            ctypes.cast(self._one_data, token_pointer), 1, -1, False
        )

    def _stages(self, sampling: Sampling) -> list[Any]:
        """The samplers ``Llama.generate`` chains for these settings, the grammar left out."""
        lib = self._lib
        if sampling.temperature == 0.0:
            return [lib.llama_sampler_init_greedy()]
        seed = lib.LLAMA_DEFAULT_SEED if sampling.seed is None else sampling.seed
        return [
            lib.llama_sampler_init_top_k(_TOP_K),
            lib.llama_sampler_init_top_p(sampling.top_p, 1),
            lib.llama_sampler_init_min_p(_MIN_P, 1),
            lib.llama_sampler_init_temp(sampling.temperature),
            lib.llama_sampler_init_dist(seed),
        ]

    def _candidates(self, ctx: Any) -> Any:
        """Every token with its logit at the context's last position, in token order."""
        logits = self._lib.llama_get_logits_ith(ctx, -1)
        if not logits:
            raise BackendError("llama.cpp returned no logits")
        columns = self._columns
        columns["id"] = self._ids
        columns["logit"] = np.ctypeslib.as_array(logits, shape=(self._n_vocab,))
        columns["p"] = 0.0
        self._all.size, self._all.selected, self._all.sorted = self._n_vocab, -1, False
        return self._all

    def _allows(self, token: int) -> bool:
        assert self._grammar is not None
        one = self._one_data[0]
        one.id, one.logit, one.p = token, 0.0, 0.0
        self._one.size, self._one.selected, self._one.sorted = 1, -1, False
        self._lib.llama_sampler_apply(self._grammar, ctypes.byref(self._one))
        return bool(one.logit != -math.inf)

    def _checked(self, answer: str, token: int) -> bool:
        """Whether the answer check allows ``token`` next.  A control token other than the
        end of generation (no text: a check passes it as nothing) is never allowed: pushed
        aside by the check, Qwen2.5-Coder took hundreds of them in a row and lost the thread
        (session 42's nbody: 4 of 12 answers cut off at max_tokens with a third of their
        text)."""
        if self._check is None or self._piece is None:
            return True
        piece = self._piece(token)
        if not piece and not self._lib.llama_vocab_is_eog(self._vocab, token):
            return False
        return self._check(answer, piece)

    def sample(self, ctx: Any, answer: str = "") -> int:
        """The next token for the context's last position (not yet accepted); ``answer``: the
        text so far, for the answer check."""
        lib = self._lib
        candidates = self._candidates(ctx)
        lib.llama_sampler_apply(self._chain, ctypes.byref(candidates))
        token = int(candidates.data[candidates.selected].id)
        grammar_ok = self._grammar is None or self._allows(token)
        if grammar_ok and self._checked(answer, token):
            return token
        if grammar_ok:
            self.check_rejections += 1
        else:
            self.rejections += 1
        candidates = self._candidates(ctx)
        if self._grammar is not None:
            lib.llama_sampler_apply(self._grammar, ctypes.byref(candidates))
        if self._check is not None:
            self._only_checked(answer)
        lib.llama_sampler_apply(self._chain, ctypes.byref(candidates))
        chosen = candidates.data[candidates.selected]
        if chosen.logit == -math.inf:
            raise BackendError("the grammar allows no token here")
        return int(chosen.id)

    def _only_checked(self, answer: str) -> None:
        """Of the candidates the grammar left, keep those of the :data:`_CHECKED` likeliest
        that the answer check allows; where it allows none, those of the next :data:`_CHECKED`,
        and so on down to :data:`_CHECKED_DEEPEST` (the check is Python: the whole vocabulary
        would take seconds a token); where it allows none of those either, leave the grammar's
        alone (counted)."""
        logits = self._columns["logit"]
        finite = np.flatnonzero(np.isfinite(logits))
        first = finite
        if finite.size > _CHECKED:
            first = finite[np.argpartition(-logits[finite], _CHECKED)[:_CHECKED]]
        allowed = [int(t) for t in first if self._checked(answer, int(t))]
        if not allowed and finite.size > _CHECKED:
            deeper = finite[np.argsort(-logits[finite], kind="stable")][:_CHECKED_DEEPEST]
            for start in range(_CHECKED, deeper.size, _CHECKED):
                allowed = [int(t) for t in deeper[start:start + _CHECKED]
                           if self._checked(answer, int(t))]
                if allowed:
                    self.check_deeper += 1
                    break
        if not allowed:
            self.check_overruled += 1
            return
        kept = logits[allowed].copy()
        logits[:] = -math.inf
        logits[allowed] = kept

    def accept(self, token: int) -> None:
        """``token`` is the answer's next token: the grammar moves past it."""
        if self._grammar is not None:
            self._lib.llama_sampler_accept(self._grammar, token)
        self._lib.llama_sampler_accept(self._chain, token)

    def close(self) -> None:
        for sampler in (self._chain, self._grammar):
            if sampler:
                self._lib.llama_sampler_free(sampler)
        self._chain = self._grammar = None


class LlamaCppBackend:
    """In-process llama.cpp; thread-safe by serializing calls (one context, one call at a time)."""

    name = "llama_cpp"

    def __init__(self, model_path: Path, *, n_ctx: int = 4096, n_threads: int | None = None):
        path = Path(model_path)
        if not path.is_file():
            raise ModelError(f"model file {path} does not exist", hint="pass --model PATH.gguf")
        self._lib = _import_llama_cpp()
        self.model_path = path
        self.n_ctx = n_ctx
        self._lock = threading.Lock()
        self._grammars_checked: dict[str, str | None] = {}
        # Tokens the grammar rejected in the last generation (GrammarCheckedSampler).
        self.grammar_rejections = 0
        # Tokens the answer check refused, steps it was overruled and steps it found an allowed
        # token only below the 64 likeliest, in the last generation.
        self.check_rejections = 0
        self.check_overruled = 0
        self.check_deeper = 0
        self.sha256 = model_sha256(path)
        # The prompt is evaluated with as many threads as the generation (llama.cpp's own
        # default), not llama-cpp-python's all cores: see the module docstring.
        threads = n_threads or max((os.cpu_count() or 1) // 2, 1)
        try:
            with without_extra_buffer_types(self._lib):
                self._llm = self._lib.Llama(
                    model_path=str(path),
                    n_ctx=n_ctx,
                    n_threads=threads,
                    n_threads_batch=threads,
                    verbose=False,
                )
        except (ValueError, RuntimeError, OSError) as exc:
            raise BackendError(f"llama.cpp cannot load {path}: {exc}") from exc
        if self._llm.model_params.use_extra_bufts:  # the swap above did not take
            raise BackendError("llama.cpp loaded the model with extra buffer types (AMX)")
        self._vocab = self._lib.llama_model_get_vocab(self._llm.model)
        self._formatter = self._make_formatter()

    # ------------------------------------------------------------------------------------
    # Tokens and text

    def piece(self, token: int, *, special: bool = False) -> bytes:
        """The bytes of one token, however long (see the module docstring)."""
        size = 64
        for _ in range(2):
            buffer = ctypes.create_string_buffer(size)
            length = self._lib.llama_token_to_piece(self._vocab, token, buffer, size, 0, special)
            if length >= 0:
                return buffer.raw[:length]
            size = -length  # llama.cpp says how many bytes the piece needs
        raise BackendError(f"llama.cpp cannot render token {token}")

    def _make_formatter(self) -> Any:
        template = self._llm.metadata.get(_TEMPLATE_KEY)
        if not template:
            return None
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        def token_text(token: int) -> str:
            return "" if token < 0 else self.piece(token, special=True).decode("utf-8", "replace")

        return Jinja2ChatFormatter(
            template=template,
            eos_token=token_text(self._llm.token_eos()),
            bos_token=token_text(self._llm.token_bos()),
        )

    def prompt_tokens(self, messages: Sequence[ChatMessage]) -> list[int]:
        """``messages`` as the model sees them: the GGUF's chat template applied, tokenized."""
        if self._formatter is None:
            text = "\n".join(f"{m.role}: {m.content}" for m in messages)
            return list(self._llm.tokenize(text.encode("utf-8"), add_bos=True, special=False))
        rendered = self._formatter(messages=messages_json(messages)).prompt
        return list(self._llm.tokenize(rendered.encode("utf-8"), add_bos=False, special=True))

    def count_prompt_tokens(self, messages: Sequence[ChatMessage]) -> int:
        extra = _FRAMING_TOKENS * len(messages) if self._formatter is None else 0
        return len(self.prompt_tokens(messages)) + extra

    # ------------------------------------------------------------------------------------
    # Grammars and generation

    def grammar_error(self, grammar: str) -> str | None:
        """``None`` if llama.cpp's grammar parser accepts ``grammar``, else why not."""
        if grammar not in self._grammars_checked:
            sampler = self._lib.llama_sampler_init_grammar(self._vocab, grammar.encode(), b"root")
            if sampler:
                self._lib.llama_sampler_free(sampler)
                self._grammars_checked[grammar] = None
            else:
                self._grammars_checked[grammar] = "llama.cpp rejected the grammar"
        return self._grammars_checked[grammar]

    def _generate(
        self, tokens: list[int], sampling: Sampling, grammar: str | None,
        check: AnswerCheck | None = None,
    ) -> tuple[str, int, str]:
        """``(text, tokens generated, finish reason)`` for a rendered prompt."""
        n_vocab = self._llm.n_vocab()
        sampler = GrammarCheckedSampler(
            self._lib, self._vocab, n_vocab, sampling, grammar, check,
            lambda token: self.piece(token).decode("utf-8", errors="replace"))
        answer = bytearray()
        generated = 0
        finish = "length"
        try:
            # A fresh context for every call: reusing the previous call's KV cache would
            # re-evaluate only the prompt's last token, alone, whose logits then differ in the
            # last bits from a batched evaluation, enough to change a sampled token (measured:
            # the same seed gave two different answers in a row).  The same seed must give
            # the same answer whatever ran before.
            self._llm.reset()
            self._llm.eval(tokens)
            while True:
                token = sampler.sample(
                    self._llm.ctx, answer.decode("utf-8", errors="replace") if check else "")
                if self._lib.llama_vocab_is_eog(self._vocab, token):
                    finish = "stop"
                    break
                sampler.accept(token)
                answer += self.piece(token)
                generated += 1
                if generated >= sampling.max_tokens:
                    break
                self._llm.eval([token])
        finally:
            self.grammar_rejections = sampler.rejections
            self.check_rejections = sampler.check_rejections
            self.check_overruled = sampler.check_overruled
            self.check_deeper = sampler.check_deeper
            sampler.close()
        return answer.decode("utf-8", errors="replace"), generated, finish

    def _chat_completion(
        self, messages: Sequence[ChatMessage], sampling: Sampling, grammar: Any
    ) -> tuple[str, int, str]:
        """The fallback for a GGUF without a chat template."""
        self._llm.reset()  # as in _generate: the answer must not depend on the last call
        response = self._llm.create_chat_completion(
            messages=messages_json(messages),
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            max_tokens=sampling.max_tokens,
            seed=sampling.seed,
            grammar=grammar,
        )
        choice = response["choices"][0]
        usage = response.get("usage") or {}
        text = choice["message"].get("content") or ""
        return text, int(usage.get("completion_tokens", 0)), choice.get("finish_reason") or "stop"

    def complete(
        self,
        messages: Sequence[ChatMessage],
        *,
        sampling: Sampling,
        grammar: str | None = None,
        grammar_name: str | None = None,
        check: AnswerCheck | None = None,
    ) -> Completion:
        with self._lock:
            if self._llm is None:
                raise BackendError("the llama.cpp backend is closed")
            tokens = self.prompt_tokens(messages)
            prompt_size = len(tokens) + (0 if self._formatter else _FRAMING_TOKENS * len(messages))
            if prompt_size + sampling.max_tokens > self.n_ctx:
                raise PromptTooLong(prompt_size, sampling.max_tokens, self.n_ctx)
            if grammar is not None:
                problem = self.grammar_error(grammar)
                if problem:
                    raise BackendError(f"grammar {grammar_name or '(unnamed)'}: {problem}")
            started = time.perf_counter()
            try:
                if self._formatter is not None:
                    text, generated, finish = self._generate(tokens, sampling, grammar, check)
                    grammar_check = GRAMMAR_CHECKED_AFTER_SAMPLING
                    checked = check is not None
                else:
                    compiled = None
                    if grammar is not None:
                        compiled = self._lib.LlamaGrammar.from_string(grammar, verbose=False)
                    text, generated, finish = self._chat_completion(messages, sampling, compiled)
                    grammar_check = GRAMMAR_APPLIED_BEFORE_SAMPLING
                    checked = False  # llama-cpp-python samples: no check runs
            except (ValueError, RuntimeError) as exc:
                raise BackendError(f"llama.cpp failed to generate: {exc}") from exc
            latency = time.perf_counter() - started
        call = LLMCall(
            model_path=str(self.model_path),
            model_sha256=self.sha256,
            prompt=render_prompt(messages),
            response=text,
            sampling={
                **sampling.to_json(grammar_name),
                "n_ctx": self.n_ctx,
                **({"grammar_check": grammar_check} if grammar is not None else {}),
                **({"answer_check": getattr(check, "name", "check"),
                    "check_rejections": self.check_rejections,
                    "check_overruled": self.check_overruled,
                    "check_deeper": self.check_deeper,
                    "check_depth": _CHECKED_DEEPEST} if checked else {}),
            },
            seed=sampling.seed,
            tokens_in=prompt_size,
            tokens_out=generated,
            latency_s=latency,
            backend=self.name,
        )
        return Completion(text=text, call=call, finish_reason=finish)

    def close(self) -> None:
        with self._lock:
            llm, self._llm = self._llm, None
            if llm is not None:
                llm.close()
