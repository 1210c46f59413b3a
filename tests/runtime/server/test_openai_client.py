"""The official `openai` client, unchanged, against the real server process over loopback.

Chat and completions, whole and streamed, usage, stop strings; a key the server does not
implement (`extra_body`) is a `BadRequestError` naming it; a prompt over the context
is one 400 (`BadRequestError`, never retried: the server counts one request); a full queue
is a 503 whose `Retry-After` the client honours; a client that hangs up mid-stream frees its
sequence and KV blocks at once. The SmolLM2 test (one server, loaded once) checks a real
answer and seeded sampling.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import httpx2
import openai
import pytest
import torch
from openai.types.chat import ChatCompletionTokenLogprob

from fleetserve_runtime.models.llama.config import Checkpoint
from fleetserve_runtime.testing import metric_total
from fleetserve_runtime.testing.process import free_port, wait_ready
from tests.runtime.models.llama.test_model import reference_model

CLI = Path(sys.executable).with_name("fleetserve-runtime")
CONTEXT = 64
LLM = f"builtin://synthetic-generate?per_token_ms=2&output_tokens=12&context_length={CONTEXT}"
RETRY_AFTER_S = 2
MESSAGES: list[openai.types.chat.ChatCompletionMessageParam] = [
    {"role": "user", "content": "tell me about rivers"}
]


@contextmanager
def running(model: str, *args: str, ready_s: float = 60) -> Iterator[str]:
    """`fleetserve-runtime serve` of `model` as "test" on a free loopback port; its URL."""
    port = free_port()
    proc = subprocess.Popen(
        [str(CLI), "serve", "--port", str(port), "--device", "cpu", "--no-warmup"]
        + ["--model", model, "--name", "test", "--threads", "1", *args],
        env={**os.environ, "FLEETSERVE_LOG_LEVEL": "warning"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc, ready_s)
        yield url
    finally:
        proc.kill()
        proc.wait(10)


def client(url: str, *, max_retries: int = 0) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{url}/v1", api_key="unused", max_retries=max_retries, timeout=20
    )


def metric(url: str, name: str, **labels: str) -> float:
    """Sum of the samples of `name` whose labels include `labels`."""
    return metric_total(httpx.get(f"{url}/metrics").text, name, **labels)


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with running(LLM) as url:
        yield url


def test_chat_whole_and_streamed(server: str) -> None:
    """The client parses both; the streamed deltas add up to the whole answer and its usage."""
    with client(server) as api:
        whole = api.chat.completions.create(model="test", messages=MESSAGES, temperature=0)
        stream = api.chat.completions.create(
            model="test",
            messages=MESSAGES,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert whole.choices[0].message.content
    assert text == whole.choices[0].message.content
    assert whole.choices[0].finish_reason == "stop"
    assert chunks[-1].choices == []
    assert chunks[-1].usage == whole.usage
    assert whole.usage is not None
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens


def test_completions_whole_and_streamed_with_a_stop_string(server: str) -> None:
    """Legacy completions: `max_tokens`, and a stop string cut from the text."""
    with client(server) as api:
        free = api.completions.create(model="test", prompt="once upon", max_tokens=8, temperature=0)
        assert free.usage is not None
        stop = " " + free.choices[0].text.split()[4]
        streamed = api.completions.create(
            model="test", prompt="once upon", max_tokens=8, temperature=0, stop=stop, stream=True
        )
        chunks = list(streamed)
    assert free.choices[0].finish_reason == "length"
    assert free.usage.completion_tokens == 8
    text = "".join(chunk.choices[0].text for chunk in chunks)
    assert text == free.choices[0].text[: free.choices[0].text.index(stop)]
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_prompt_over_the_context_is_one_bad_request(server: str) -> None:
    """`BadRequestError` naming the limit; the client does not retry a 400 (one counted)."""
    before = metric(server, "fleetserve_requests_total", code="400")
    long_prompt = " ".join(["word"] * CONTEXT)
    with client(server, max_retries=3) as api, pytest.raises(openai.BadRequestError) as caught:
        api.chat.completions.create(
            model="test", messages=[{"role": "user", "content": long_prompt}]
        )
    assert caught.value.code == "context_length_exceeded"
    assert caught.value.param == "messages"
    assert f"context of {CONTEXT} tokens" in caught.value.message
    assert metric(server, "fleetserve_requests_total", code="400") == before + 1


def test_an_unknown_extra_body_key_is_a_bad_request(server: str) -> None:
    """A `guided_json` (vLLM's) sent through `extra_body` is refused by name, not ignored."""
    with client(server) as api, pytest.raises(openai.BadRequestError) as caught:
        api.chat.completions.create(
            model="test", messages=MESSAGES, extra_body={"guided_json": {"type": "object"}}
        )
    assert caught.value.param == "guided_json"
    assert "unsupported parameter: 'guided_json'" in caught.value.message


def test_logprobs_chat_and_completions_whole_and_streamed(server: str) -> None:
    """The client parses both shapes; streamed entries are the whole answer's entries."""
    with client(server) as api:
        whole = api.chat.completions.create(
            model="test", messages=MESSAGES, temperature=0, logprobs=True, top_logprobs=2
        )
        stream = api.chat.completions.create(
            model="test",
            messages=MESSAGES,
            temperature=0,
            logprobs=True,
            top_logprobs=2,
            stream=True,
        )
        chunks = list(stream)
        echoed = api.completions.create(
            model="test", prompt="once upon", max_tokens=5, temperature=0, logprobs=1, echo=True
        )
        pieces = list(
            api.completions.create(
                model="test",
                prompt="once upon",
                max_tokens=5,
                temperature=0,
                logprobs=1,
                echo=True,
                stream=True,
            )
        )
        alone = api.completions.create(
            model="test", prompt="once upon", max_tokens=0, logprobs=1, echo=True
        )
        with pytest.raises(openai.BadRequestError) as caught:
            api.chat.completions.create(
                model="test", messages=MESSAGES, logprobs=True, top_logprobs=21
            )
    assert caught.value.param == "top_logprobs"
    content = whole.choices[0].logprobs.content if whole.choices[0].logprobs else None
    assert content
    assert all(len(entry.top_logprobs) == 2 for entry in content)
    streamed = [
        entry
        for chunk in chunks
        if chunk.choices and chunk.choices[0].logprobs and chunk.choices[0].logprobs.content
        for entry in chunk.choices[0].logprobs.content
    ]
    assert streamed == content
    logprobs = echoed.choices[0].logprobs
    assert logprobs is not None
    assert logprobs.token_logprobs
    assert logprobs.tokens
    assert echoed.choices[0].text.startswith("once upon")
    first: object = logprobs.token_logprobs[0]  # the client's type says float; JSON null
    assert first is None
    joined = [
        value
        for piece in pieces
        if piece.choices[0].logprobs
        for value in piece.choices[0].logprobs.token_logprobs or []
    ]
    assert joined == logprobs.token_logprobs
    assert "".join(piece.choices[0].text for piece in pieces) == echoed.choices[0].text
    only = alone.choices[0]
    assert only.text == "once upon"
    assert only.logprobs is not None
    assert only.logprobs.tokens
    assert only.logprobs.tokens == logprobs.tokens[: len(only.logprobs.tokens)]
    assert alone.usage is not None
    assert alone.usage.completion_tokens == 0


def test_n_choices_carry_their_own_logprobs_whole_and_streamed(server: str) -> None:
    """`n=2` with `logprobs`: each choice lists its own tokens' entries, under its index.

    The synthetic model puts a logit of 30 on its own choice and 0 elsewhere; a bias of 30 on
    "in" and "wind" (ids 20, 21) makes three equal tokens, so the seeded choices differ
    (choice 1 draws from seed + 1) and entries copied from the other choice would show. The
    entries are the raw model's: a biased token keeps its unbiased log-probability (about
    -30). Seeded, the streamed answer repeats the whole one.
    """
    asked: dict[str, Any] = {
        "model": "test",
        "messages": MESSAGES,
        "n": 2,
        "temperature": 1,
        "seed": 5,
        "max_tokens": 6,
        "logit_bias": {"20": 30, "21": 30},
        "logprobs": True,
        "top_logprobs": 1,
    }
    with client(server) as api:
        whole = api.chat.completions.create(**asked)
        chunks = list(api.chat.completions.create(**asked, stream=True))
    assert [choice.index for choice in whole.choices] == [0, 1]
    entries = {}
    for choice in whole.choices:
        assert choice.logprobs is not None
        assert choice.logprobs.content
        # The synthetic tokens are words, each decoded alone (without the space between).
        tokens = [entry.token for entry in choice.logprobs.content if entry.token]
        assert tokens == (choice.message.content or "").split()
        entries[choice.index] = choice.logprobs.content
    assert [entry.token for entry in entries[0]] != [entry.token for entry in entries[1]]
    biased = [
        entry for listed in entries.values() for entry in listed if entry.token in {"in", "wind"}
    ]
    assert biased
    assert all(entry.logprob < -20 for entry in biased)
    texts: dict[int, str] = {0: "", 1: ""}
    streamed: dict[int, list[ChatCompletionTokenLogprob]] = {0: [], 1: []}
    for chunk in chunks:
        for part in chunk.choices:
            texts[part.index] += part.delta.content or ""
            if part.logprobs and part.logprobs.content:
                streamed[part.index].extend(part.logprobs.content)
    assert texts == {choice.index: choice.message.content for choice in whole.choices}
    assert streamed == entries


def test_a_cache_salt_keeps_prefix_cache_hits_among_its_own_requests(server: str) -> None:
    """A `cache_salt` (vLLM's key, through `extra_body`): no hit across salts, or none.

    `cached_tokens` would otherwise tell any caller whether someone sent this prefix.
    """
    prompt = " ".join(f"salted{i}" for i in range(40))

    def cached(salt: str | None) -> int:
        extra = {} if salt is None else {"cache_salt": salt}
        with client(server) as api:
            answer = api.completions.create(
                model="test", prompt=prompt, max_tokens=2, temperature=0, extra_body=extra
            )
        assert answer.usage is not None
        assert answer.usage.prompt_tokens_details is not None
        return answer.usage.prompt_tokens_details.cached_tokens or 0

    assert cached(None) == 0
    assert cached("tenant-a") == 0
    assert cached("tenant-b") == 0
    assert cached(None) > 0
    assert cached("tenant-a") > 0
    assert cached("tenant-b") > 0


def test_unknown_model_is_not_found(server: str) -> None:
    """`NotFoundError` for a model name the server does not serve; `models.list` has ours."""
    with client(server) as api:
        with pytest.raises(openai.NotFoundError):
            api.chat.completions.create(model="gpt-4o", messages=MESSAGES)
        assert [model.id for model in api.models.list()] == ["test"]


@pytest.fixture(scope="module")
def slow_server() -> Iterator[str]:
    """One sequence at a time, one waiting, 20 ms a token: easy to fill, slow to finish.

    60 tokens keep a sequence running 1.2 s: long enough that a second client, started once
    the first runs, is still queued behind it on a busy machine (at 20 tokens the first could
    finish before the second arrived, and the queue was never seen full).
    """
    slow = "builtin://synthetic-generate?per_token_ms=20&output_tokens=60&context_length=4096"
    with running(
        slow,
        "--generation-max-running-sequences", "1",
        "--generation-max-step-tokens", "64",
        "--max-instances", "1",
        "--max-queue-size", "1",
        "--retry-after-s", str(RETRY_AFTER_S),
        "--default-timeout-ms", "60000",
        "--max-timeout-ms", "60000",
        "--generation-allow-ignore-eos",
        "--generation-max-output-tokens", "2000",
    ) as url:  # fmt: skip
        yield url


def wait_until(url: str, name: str, value: float, timeout_s: float = 20) -> None:
    """Poll `/metrics` until the gauge `name` reads `value`."""
    deadline = time.monotonic() + timeout_s
    while metric(url, name) != value:
        assert time.monotonic() < deadline, f"{name} never reached {value}"
        time.sleep(0.01)


def test_full_queue_is_a_503_whose_retry_after_the_client_honours(slow_server: str) -> None:
    """A full queue answers 503 + Retry-After; the client waits that long, then succeeds.

    The client's own backoff before a first retry is under a second, so a gap of at least
    `Retry-After` between its two attempts shows the header was honoured.
    """
    url = slow_server
    before = {code: metric(url, "fleetserve_requests_total", code=code) for code in ("200", "503")}
    results: list[str | None] = []

    def occupy() -> None:
        with client(url) as api:
            reply = api.chat.completions.create(model="test", messages=MESSAGES)
            results.append(reply.choices[0].message.content)

    busy = [threading.Thread(target=occupy) for _ in range(2)]
    busy[0].start()
    wait_until(url, "fleetserve_running_sequences", 1)
    busy[1].start()
    wait_until(url, "fleetserve_waiting_sequences", 1)
    with client(url) as api, pytest.raises(openai.APIStatusError) as refused:
        api.chat.completions.create(model="test", messages=MESSAGES)
    assert refused.value.status_code == 503
    assert refused.value.response.headers["retry-after"] == str(RETRY_AFTER_S)
    attempts: list[float] = []
    hooks = {"request": [lambda _: attempts.append(time.monotonic())]}
    with (
        httpx2.Client(event_hooks=hooks) as http,
        openai.OpenAI(
            base_url=f"{url}/v1", api_key="unused", max_retries=1, timeout=20, http_client=http
        ) as api,
    ):
        retried = api.chat.completions.create(model="test", messages=MESSAGES)
    for thread in busy:
        thread.join()
    assert retried.choices[0].message.content
    assert len(results) == 2
    assert len(attempts) == 2
    assert attempts[1] - attempts[0] >= RETRY_AFTER_S
    assert metric(url, "fleetserve_requests_total", code="503") == before["503"] + 2
    assert metric(url, "fleetserve_requests_total", code="200") == before["200"] + 3


def post_raw(port: int, path: str, body: bytes) -> socket.socket:
    """Send one JSON POST over a new raw connection, leaving the socket open."""
    head = (
        f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json"
        f"\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(head + body)
    return sock


@pytest.mark.parametrize("stream", [True, False], ids=["streaming", "whole"])
def test_client_hanging_up_frees_its_sequence_at_once(slow_server: str, stream: bool) -> None:
    """Hang up mid-generation: running sequences and KV usage go back to 0 at once.

    The generation would otherwise run for its whole 2000 tokens (about 40 s); it is
    cancelled at the engine's next step, long before the bound below. A stream is closed
    after its first text chunk, a whole answer while it is being generated.
    """
    url = slow_server
    closed_before = metric(url, "fleetserve_requests_total", code="499")
    tokens_before = metric(url, "fleetserve_generation_tokens_total")
    body = (
        b'{"model":"test","stream":%s,"max_tokens":2000,"ignore_eos":true,'
        b'"messages":[{"role":"user","content":"go on"}]}' % (b"true" if stream else b"false")
    )
    port = int(url.rsplit(":", 1)[1])
    with post_raw(port, "/v1/chat/completions", body) as sock:
        if stream:
            received = sock.recv(65536)
            while received.count(b"data: ") < 2:  # the role chunk, then the first text
                received += sock.recv(65536)
            assert received.startswith(b"HTTP/1.1 200")
        wait_until(url, "fleetserve_running_sequences", 1)
        assert metric(url, "fleetserve_kv_cache_usage_ratio") > 0
    wait_until(url, "fleetserve_running_sequences", 0, timeout_s=5)
    assert metric(url, "fleetserve_kv_cache_usage_ratio") == 0
    assert metric(url, "fleetserve_requests_total", code="499") == closed_before + 1
    assert metric(url, "fleetserve_generation_tokens_total") - tokens_before < 500


def test_client_hanging_up_while_queued_leaves_the_queue(slow_server: str) -> None:
    """A request that waits for a running slot and is abandoned leaves the queue at once."""
    url = slow_server
    port = int(url.rsplit(":", 1)[1])
    long = (  # 40 s of tokens: the waiting one is not admitted within the bounds below
        b'{"model":"test","max_tokens":2000,"ignore_eos":true,'
        b'"messages":[{"role":"user","content":"first"}]}'
    )
    with post_raw(port, "/v1/chat/completions", long) as running_one:
        wait_until(url, "fleetserve_running_sequences", 1)
        with post_raw(port, "/v1/chat/completions", long.replace(b"first", b"second")):
            wait_until(url, "fleetserve_waiting_sequences", 1)
        wait_until(url, "fleetserve_waiting_sequences", 0, timeout_s=5)
        assert metric(url, "fleetserve_running_sequences") == 1
        running_one.close()
    wait_until(url, "fleetserve_running_sequences", 0, timeout_s=5)


@pytest.fixture(scope="module")
def smollm2_server() -> Iterator[str]:
    """One SmolLM2-135M server for the tests that need a real model's answers."""
    with running(
        "builtin://smollm2-135m", "--generation-max-context", "512", "--threads", "2",
        ready_s=240,
    ) as url:  # fmt: skip
        yield url


def smollm2_client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)


def test_smollm2_answers_and_seeded_sampling_is_reproducible(smollm2_server: str) -> None:
    """SmolLM2-135M through the client: a right answer greedily, and `seed` reproduces samples."""
    with smollm2_client(smollm2_server) as api:
        answer = api.chat.completions.create(
            model="test",
            messages=[{"role": "user", "content": "What is the capital of France?"}],
            temperature=0,
            max_tokens=12,
        )
        assert "Paris" in (answer.choices[0].message.content or "")

        def sample(seed: int) -> str:
            reply = api.chat.completions.create(
                model="test",
                messages=[{"role": "user", "content": "Invent a name for a cat."}],
                temperature=1.0,
                seed=seed,
                max_tokens=12,
            )
            return reply.choices[0].message.content or ""

        assert sample(7) == sample(7)
        assert len({sample(seed) for seed in range(4)}) > 1


def reference_logprobs(
    checkpoint: Checkpoint, ids: list[int], new_tokens: int
) -> tuple[torch.Tensor, list[int]]:
    """Transformers' Llama on the checkpoint's weights, independent of ours.

    Greedy `new_tokens` after `ids`, then one full forward over prompt and completion
    (teacher forcing): each position's log-softmax row, and the tokens.
    """
    reference = reference_model(checkpoint.config)
    reference.load_state_dict(dict(checkpoint.weights), strict=False)
    with torch.inference_mode():
        tokens = list(ids)
        for _ in range(new_tokens):
            logits = reference(torch.tensor([tokens])).logits[0, -1]
            tokens.append(int(logits.argmax()))
        rows = torch.log_softmax(reference(torch.tensor([tokens])).logits[0].float(), dim=-1)
    return rows, tokens


def test_smollm2_logprobs_match_an_independent_full_forward(
    smollm2_server: str, smollm2_checkpoint: Checkpoint
) -> None:
    """Echoed prompt and greedy completion against transformers' teacher-forced forward.

    The prompt was sent once before (its blocks are in the prefix cache): the scored request
    must not reuse them, or its first positions would have no logits.
    """
    codec = smollm2_checkpoint.codec
    ids = codec.encode("The capital of France is Paris. The capital of Italy is", add_special=True)
    new = 6
    with smollm2_client(smollm2_server) as api:
        api.completions.create(model="test", prompt=ids, max_tokens=1, temperature=0)
        scored = api.completions.create(
            model="test", prompt=ids, max_tokens=new, temperature=0, logprobs=5, echo=True
        )
        streamed = list(
            api.completions.create(
                model="test",
                prompt=ids,
                max_tokens=new,
                temperature=0,
                logprobs=5,
                echo=True,
                stream=True,
            )
        )
        alone = api.completions.create(
            model="test", prompt=ids, max_tokens=0, logprobs=1, echo=True
        )
        chat = api.chat.completions.create(
            model="test",
            messages=[{"role": "user", "content": "Name a river."}],
            temperature=0,
            max_tokens=8,
            logprobs=True,
            top_logprobs=5,
        )
    rows, tokens = reference_logprobs(smollm2_checkpoint, ids, new)
    logprobs = scored.choices[0].logprobs
    assert logprobs is not None
    assert logprobs.tokens
    assert logprobs.token_logprobs
    assert logprobs.top_logprobs
    assert scored.usage is not None
    assert scored.usage.prompt_tokens_details is not None
    assert scored.usage.prompt_tokens_details.cached_tokens == 0
    assert logprobs.tokens == [codec.decode([token]) for token in tokens]
    first: object = logprobs.token_logprobs[0]  # the client's type says float; JSON null
    assert first is None
    expected = [float(rows[p - 1, tokens[p]]) for p in range(1, len(tokens))]
    reported = [float(value or 0.0) for value in logprobs.token_logprobs[1:]]
    assert reported == pytest.approx(expected, abs=2e-3)
    assert sum(reported) == pytest.approx(sum(expected), abs=1e-2)
    for p, top in enumerate(logprobs.top_logprobs[1:], start=1):
        assert top is not None
        best = torch.topk(rows[p - 1], 5).values.tolist()
        listed = sorted(top.values(), reverse=True)[:5]
        assert listed == pytest.approx(best[: len(listed)], abs=2e-3)
    for p in range(len(ids), len(tokens)):  # greedy: each output token is the most likely
        top = logprobs.top_logprobs[p]
        assert top is not None
        assert logprobs.token_logprobs[p] == max(top.values())
    joined = [
        value
        for chunk in streamed
        if chunk.choices[0].logprobs
        for value in chunk.choices[0].logprobs.token_logprobs or []
    ]
    assert joined == pytest.approx(logprobs.token_logprobs, abs=1e-5)
    prompt_only = alone.choices[0].logprobs
    assert prompt_only is not None
    assert prompt_only.token_logprobs
    assert alone.choices[0].text == codec.decode(ids)
    assert len(prompt_only.token_logprobs) == len(ids)
    assert prompt_only.token_logprobs == pytest.approx(
        logprobs.token_logprobs[: len(ids)], abs=1e-5
    )
    content = chat.choices[0].logprobs.content if chat.choices[0].logprobs else None
    assert content
    assert "".join(entry.token for entry in content) == chat.choices[0].message.content
    for entry in content:
        values = [top.logprob for top in entry.top_logprobs]
        assert values == sorted(values, reverse=True)
        assert entry.logprob == values[0]
        assert bytes(entry.bytes or []) == entry.token.encode()
