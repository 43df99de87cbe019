"""The one interface every language model sits behind, and how to open one.

A backend answers a list of chat messages with a :class:`Completion`: the text and the
:class:`~r3tui.domain.LLMCall` that records everything needed to replay the search without a
model (the prompt as JSON, sampling parameters with the grammar's name, seed, token counts,
latency, model file and hash).  Three backends share it: llama.cpp in-process
(:mod:`~r3tui.remix.llama_cpp_backend`), an OpenAI-compatible server
(:mod:`~r3tui.remix.http_backend`) and recorded answers (:mod:`~r3tui.remix.recorded`).

Errors: a prompt longer than the context raises :class:`PromptTooLong` before anything is
generated (the mutator turns it into a failed proposal, or retries with a shorter prompt); a
model or server that cannot be used raises :class:`BackendError`.  Both are
:class:`~r3tui.errors.ModelError`, so the CLI ends them in one line.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from r3tui.domain import LLMCall
from r3tui.errors import ConfigError, ModelError


class BackendError(ModelError):
    """The model or the server cannot answer (not loadable, unreachable, malformed reply)."""


class PromptTooLong(ModelError):
    """The rendered prompt plus the answer's token budget does not fit the model's context."""

    def __init__(self, prompt_tokens: int | None, max_tokens: int, n_ctx: int | None) -> None:
        size = f"{prompt_tokens} tokens" if prompt_tokens is not None else "too long"
        context = f"the model's context of {n_ctx}" if n_ctx else "the model's context"
        super().__init__(
            f"the prompt is {size}; with {max_tokens} tokens for the answer it does not fit "
            f"{context}",
            hint="shorten the kernel or the inspirations, lower max_tokens or raise n_ctx",
        )
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.n_ctx = n_ctx


@dataclass(frozen=True)
class ChatMessage:
    role: str  # "system" | "user" | "assistant"
    content: str


@dataclass(frozen=True)
class Sampling:
    """How to draw one answer; recorded with every call."""

    temperature: float = 0.8
    top_p: float = 0.95
    max_tokens: int = 768  # bounded: a small model under a grammar can go on forever
    seed: int | None = None  # None: the mutator draws one from the campaign's rng

    def __post_init__(self) -> None:
        if not 0.0 <= self.temperature <= 5.0:
            raise ConfigError(f"temperature must be in [0, 5], got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_tokens < 1:
            raise ConfigError(f"max_tokens must be positive, got {self.max_tokens}")

    def to_json(self, grammar_name: str | None = None) -> dict[str, Any]:
        return {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_tokens": self.max_tokens,
            "seed": self.seed,
            "grammar": grammar_name,
        }


@dataclass(frozen=True)
class Completion:
    text: str
    call: LLMCall
    finish_reason: str | None = None  # "stop" | "length" (cut off at max_tokens) | ...


# Whether appending a piece of text to the answer so far keeps it acceptable (for example
# :class:`r3tui.remix.names.IdentifierCheck`); a backend that samples tokens itself asks it for
# each token after the grammar, one that cannot (a server) ignores it.
AnswerCheck = Callable[[str, str], bool]


class LLMBackend(Protocol):
    """A language model that answers chat messages; one call at a time per instance."""

    name: str

    def complete(
        self,
        messages: Sequence[ChatMessage],
        *,
        sampling: Sampling,
        grammar: str | None = None,
        grammar_name: str | None = None,
        check: AnswerCheck | None = None,
    ) -> Completion: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class BackendSpec:
    """Which model to talk to, and how."""

    kind: str = "llama_cpp"  # "llama_cpp" | "http"
    model_path: Path | None = None  # the GGUF file (llama_cpp)
    base_url: str | None = None  # e.g. http://gpu-login:8080 (http)
    model_name: str | None = None  # the server's model id (http); default: whatever it serves
    n_ctx: int = 4096
    n_threads: int | None = None  # llama.cpp's default: half the cores
    timeout_s: float = 300.0  # http: one request, generation included
    api_key_env: str | None = None  # http: name of the environment variable with the key

    def __post_init__(self) -> None:
        if self.kind not in BACKEND_OPENERS:
            raise ConfigError(
                f"unknown LLM backend {self.kind!r}", hint=f"known: {', '.join(BACKEND_OPENERS)}"
            )
        if self.n_ctx < 256:
            raise ConfigError(f"n_ctx must be at least 256, got {self.n_ctx}")
        if self.timeout_s <= 0:
            raise ConfigError(f"timeout_s must be positive, got {self.timeout_s}")


def _open_llama_cpp(spec: BackendSpec) -> LLMBackend:
    if spec.model_path is None:
        raise ConfigError("the llama_cpp backend needs a model path")
    from r3tui.remix.llama_cpp_backend import LlamaCppBackend

    return LlamaCppBackend(spec.model_path, n_ctx=spec.n_ctx, n_threads=spec.n_threads)


def _open_http(spec: BackendSpec) -> LLMBackend:
    if spec.base_url is None:
        raise ConfigError("the http backend needs a base URL", hint="e.g. http://host:8080")
    from r3tui.remix.http_backend import OpenAIHTTPBackend

    return OpenAIHTTPBackend(
        spec.base_url,
        model_name=spec.model_name,
        timeout_s=spec.timeout_s,
        api_key_env=spec.api_key_env,
    )


# backend kind -> how it is opened (BackendSpec checks the kind against these names)
BACKEND_OPENERS: dict[str, Callable[[BackendSpec], LLMBackend]] = {
    "llama_cpp": _open_llama_cpp,
    "http": _open_http,
}


def open_backend(spec: BackendSpec) -> LLMBackend:
    """The backend ``spec`` names, ready to answer (a llama.cpp model is loaded here)."""
    return BACKEND_OPENERS[spec.kind](spec)


def messages_json(messages: Sequence[ChatMessage]) -> list[dict[str, str]]:
    return [{"role": m.role, "content": m.content} for m in messages]


def render_prompt(messages: Sequence[ChatMessage]) -> str:
    """The prompt as :class:`~r3tui.domain.LLMCall` stores it: the messages as JSON.

    The same text for every backend (not the model's chat template), so that a campaign
    recorded with one model can be replayed and compared without it.
    """
    return json.dumps(messages_json(messages), ensure_ascii=False, separators=(",", ":"))


def parse_prompt(prompt: str) -> list[ChatMessage]:
    """The messages of a stored prompt (inverse of :func:`render_prompt`)."""
    try:
        data = json.loads(prompt)
        return [ChatMessage(str(m["role"]), str(m["content"])) for m in data]
    except (ValueError, TypeError, KeyError) as exc:
        raise ConfigError(f"a recorded prompt is not a JSON list of messages: {exc}") from None
