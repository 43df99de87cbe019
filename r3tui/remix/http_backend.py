"""A model served on the site's own network through the OpenAI chat-completions API.

llama.cpp's server, llama-cpp-python's server and vLLM all answer ``POST /v1/chat/completions``.
Only the standard library is used (no new dependency on an air-gapped node).  A grammar is sent
in the ``grammar`` field that the llama.cpp servers read; the token counts come from the reply's
``usage``.  The model's file is on the server, so :attr:`LLMCall.model_sha256` is empty and
:attr:`LLMCall.model_path` names the server and the model id it reported.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

from r3tui.domain import LLMCall
from r3tui.errors import ConfigError
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

# vLLM and llama-cpp-python's server: "This model's maximum context length is 2048 tokens.
# However, you requested 3100 tokens (3000 in the messages, 100 in the completion)."
_CONTEXT_LENGTH = re.compile(r"context (?:length|window|size)(?: is| of)? (\d+)", re.IGNORECASE)
_PROMPT_TOKENS = re.compile(r"(\d+) in the (?:messages|prompt)", re.IGNORECASE)


def chat_completions_url(base_url: str) -> str:
    """``http://host:8080`` or ``http://host:8080/v1`` -> the chat-completions endpoint."""
    base = base_url.strip().rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise ConfigError(f"LLM server URL {base_url!r} must start with http:// or https://")
    if base.endswith("/chat/completions"):
        return base
    return f"{base}/chat/completions" if base.endswith("/v1") else f"{base}/v1/chat/completions"


class OpenAIHTTPBackend:
    """An OpenAI-compatible server; calls are serialized like the in-process backend's."""

    name = "http"

    def __init__(
        self,
        base_url: str,
        *,
        model_name: str | None = None,
        timeout_s: float = 300.0,
        api_key_env: str | None = None,
    ) -> None:
        self.url = chat_completions_url(base_url)
        self.model_name = model_name
        self.timeout_s = timeout_s
        self._api_key: str | None = None
        if api_key_env:
            self._api_key = os.environ.get(api_key_env)
            if not self._api_key:
                raise ConfigError(f"environment variable {api_key_env} (the API key) is not set")
        self._lock = threading.Lock()

    def _body(
        self, messages: Sequence[ChatMessage], sampling: Sampling, grammar: str | None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "messages": messages_json(messages),
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "max_tokens": sampling.max_tokens,
            "stream": False,
        }
        if self.model_name:
            body["model"] = self.model_name
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        if grammar is not None:
            body["grammar"] = grammar
        return body

    def _post(self, body: dict[str, Any], max_tokens: int) -> dict[str, Any]:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        request = urllib.request.Request(
            self.url, data=json.dumps(body).encode(), headers=headers, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as reply:
                raw = reply.read()
        except urllib.error.HTTPError as exc:
            detail, code = _error_detail(exc)
            if exc.code == 400 and (
                code == "context_length_exceeded" or "context" in detail.lower()
            ):
                raise _prompt_too_long(detail, max_tokens) from None
            raise BackendError(
                f"LLM server {self.url} answered HTTP {exc.code}: {detail}"
            ) from None
        except urllib.error.URLError as exc:
            reason = getattr(exc.reason, "strerror", None) or str(exc.reason)
            raise BackendError(f"cannot reach the LLM server {self.url}: {reason}") from None
        except TimeoutError:
            raise BackendError(
                f"the LLM server {self.url} did not answer within {self.timeout_s:g} s"
            ) from None
        except OSError as exc:  # connection reset while reading, and the like
            raise BackendError(f"the connection to {self.url} failed: {exc}") from None
        try:
            data = json.loads(raw)
        except ValueError:
            raise BackendError(
                f"the LLM server {self.url} sent malformed JSON: {_snippet(raw)}"
            ) from None
        if not isinstance(data, dict):
            raise BackendError(
                f"the LLM server {self.url} sent {type(data).__name__}, not an object"
            )
        return data

    def complete(
        self,
        messages: Sequence[ChatMessage],
        *,
        sampling: Sampling,
        grammar: str | None = None,
        grammar_name: str | None = None,
        check: AnswerCheck | None = None,  # not run: the server samples the tokens
    ) -> Completion:
        body = self._body(messages, sampling, grammar)
        with self._lock:
            started = time.perf_counter()
            data = self._post(body, sampling.max_tokens)
            latency = time.perf_counter() - started
        try:
            choice = data["choices"][0]
            text = choice["message"].get("content") or ""
        except (KeyError, IndexError, TypeError, AttributeError):
            raise BackendError(
                f"the LLM server {self.url} sent no choices[0].message: {_snippet(data)}"
            ) from None
        raw_usage = data.get("usage")
        usage: dict[str, Any] = raw_usage if isinstance(raw_usage, dict) else {}
        model = str(data.get("model") or self.model_name or "")
        call = LLMCall(
            model_path=f"{self.url}#{model}" if model else self.url,
            model_sha256="",
            prompt=render_prompt(messages),
            response=str(text),
            sampling=sampling.to_json(grammar_name),
            seed=sampling.seed,
            tokens_in=int(usage.get("prompt_tokens") or 0),
            tokens_out=int(usage.get("completion_tokens") or 0),
            latency_s=latency,
            backend=self.name,
        )
        return Completion(text=str(text), call=call, finish_reason=choice.get("finish_reason"))

    def close(self) -> None:
        """Nothing is held between requests."""


def _error_detail(exc: urllib.error.HTTPError) -> tuple[str, str | None]:
    """One line from an error reply (its JSON ``error.message`` / ``detail``, else its first
    line) and the error's ``code`` where it has one."""
    try:
        raw = exc.read()
    except OSError:
        raw = b""
    try:
        data = json.loads(raw)
    except ValueError:
        return _snippet(raw) or str(exc.reason), None
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and error.get("message"):
            code = error.get("code")
            return " ".join(str(error["message"]).split()), str(code) if code else None
        if data.get("detail"):
            return _snippet(data["detail"], 300), None
    return _snippet(raw), None


def _prompt_too_long(detail: str, max_tokens: int) -> PromptTooLong:
    context = _CONTEXT_LENGTH.search(detail)
    prompt = _PROMPT_TOKENS.search(detail)
    return PromptTooLong(
        int(prompt.group(1)) if prompt else None,
        max_tokens,
        int(context.group(1)) if context else None,
    )


def _snippet(raw: object, limit: int = 120) -> str:
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."
