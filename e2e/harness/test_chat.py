"""`fleetserve_e2e.chat.stream_chat` against a real runtime serving a weightless generator."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from fleetserve_e2e.chat import stream_chat
from fleetserve_e2e.ports import free_port
from fleetserve_e2e.processes import start_process
from fleetserve_e2e.waiting import wait_until

RUNTIME = Path(sys.executable).with_name("fleetserve-runtime")
OUTPUT_TOKENS = 12
MODEL = "chat-test"


@pytest.fixture(scope="module")
def generator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A runtime answering OUTPUT_TOKENS words per generation, 5 ms per token."""
    port = free_port()
    uri = f"builtin://synthetic-generate?per_token_ms=5&output_tokens={OUTPUT_TOKENS}"
    argv = [str(RUNTIME), "serve", "--model", uri, "--name", MODEL]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--threads", "1"]
    process = start_process(
        "runtime", argv, log_path=tmp_path_factory.mktemp("chat") / "runtime.log"
    )
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        process.ensure_running()
        return httpx.get(f"{url}/v2/health/ready", trust_env=False).status_code == 200

    try:
        wait_until(ready, timeout_s=60.0, what="the runtime to be ready")
        yield url
    finally:
        process.stop()


def test_stream_chat_hands_over_each_delta_as_it_arrives(generator: str) -> None:
    """Every delta reaches the callback in order; the answer is their concatenation."""
    seen: list[str] = []
    answer = stream_chat(generator, MODEL, "Say something.", max_tokens=32, on_delta=seen.append)
    # One delta per word; the end-of-sequence token counts as generated but shows no text.
    assert answer.chunks == len(seen) == OUTPUT_TOKENS
    assert answer.completion_tokens == OUTPUT_TOKENS + 1
    assert answer.text == "".join(seen)
    assert answer.text.strip()
    assert answer.prompt_tokens > 0
    assert 0 < answer.ttft_s < answer.elapsed_s
    assert answer.decode_tokens_per_s > 0


def test_stream_chat_raises_the_runtime_refusal(generator: str) -> None:
    """A model the runtime does not serve is its 404, not an empty answer."""
    with pytest.raises(openai.NotFoundError):
        stream_chat(generator, "not-served", "Hello", max_tokens=8, on_delta=print)
