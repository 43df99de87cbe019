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

Grammars are checked by llama.cpp's own parser first: ``LlamaGrammar.from_string`` does not
parse, and a grammar llama.cpp rejects would otherwise reach the sampler as a null pointer.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from r3tui.domain import LLMCall
from r3tui.errors import ModelError
from r3tui.remix.backends import (
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
            f"llama-cpp-python cannot be imported: {exc}", hint="pip install 'r3tui[llm]'"
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
        self.sha256 = model_sha256(path)
        try:
            with without_extra_buffer_types(self._lib):
                self._llm = self._lib.Llama(
                    model_path=str(path), n_ctx=n_ctx, n_threads=n_threads, verbose=False
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
        self, tokens: list[int], sampling: Sampling, grammar: Any
    ) -> tuple[str, int, str]:
        """``(text, tokens generated, finish reason)`` for a rendered prompt."""
        if sampling.seed is not None:
            self._llm.set_seed(sampling.seed)
        # Forget the previous call's context: ``generate`` would otherwise reuse its KV cache
        # and re-evaluate only the prompt's last token, alone, whose logits then differ in the
        # last bits from a batched evaluation, enough to change a sampled token (measured:
        # the same seed gave two different answers in a row).  The same seed must give the
        # same answer whatever ran before.
        self._llm.reset()
        answer = bytearray()
        generated = 0
        finish = "length"
        for token in self._llm.generate(
            tokens,
            top_k=_TOP_K,
            top_p=sampling.top_p,
            min_p=_MIN_P,
            temp=sampling.temperature,
            repeat_penalty=1.0,
            grammar=grammar,
        ):
            if self._lib.llama_vocab_is_eog(self._vocab, token):
                finish = "stop"
                break
            answer += self.piece(token)
            generated += 1
            if generated >= sampling.max_tokens:
                break
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
    ) -> Completion:
        with self._lock:
            if self._llm is None:
                raise BackendError("the llama.cpp backend is closed")
            tokens = self.prompt_tokens(messages)
            prompt_size = len(tokens) + (0 if self._formatter else _FRAMING_TOKENS * len(messages))
            if prompt_size + sampling.max_tokens > self.n_ctx:
                raise PromptTooLong(prompt_size, sampling.max_tokens, self.n_ctx)
            compiled = None
            if grammar is not None:
                problem = self.grammar_error(grammar)
                if problem:
                    raise BackendError(f"grammar {grammar_name or '(unnamed)'}: {problem}")
                compiled = self._lib.LlamaGrammar.from_string(grammar, verbose=False)
            started = time.perf_counter()
            try:
                if self._formatter is not None:
                    text, generated, finish = self._generate(tokens, sampling, compiled)
                else:
                    text, generated, finish = self._chat_completion(messages, sampling, compiled)
            except (ValueError, RuntimeError) as exc:
                raise BackendError(f"llama.cpp failed to generate: {exc}") from exc
            latency = time.perf_counter() - started
        call = LLMCall(
            model_path=str(self.model_path),
            model_sha256=self.sha256,
            prompt=render_prompt(messages),
            response=text,
            sampling={**sampling.to_json(grammar_name), "n_ctx": self.n_ctx},
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
