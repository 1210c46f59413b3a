"""The generation benchmark's workload, SSE parsing and latency math (no timings asserted)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random
import statistics
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from bench.generate_bench import (
    CONFIGS,
    OUTPUT_LENGTHS,
    PROMPT_LENGTHS,
    StreamConfigResult,
    TokenLengths,
    generate_workload,
    parse_args,
    peer_num_blocks,
    print_report,
    request_body,
    server_argv,
    single_token_words,
)
from bench.llamacpp.build import binary_path, pinned_version
from bench.stream_load import (
    StreamRecord,
    StreamRequest,
    StreamStats,
    parse_chunk,
    quantile,
    run_streaming_closed_loop,
    sse_data,
    summarise_streams,
)
from fleetserve_runtime.models.llama.checkpoint import smollm2_gguf_path

WORDS = ("alpha", "bravo", "charlie", "delta")


@pytest.mark.parametrize("profile", [PROMPT_LENGTHS, OUTPUT_LENGTHS], ids=["prompt", "output"])
def test_lengths_are_clipped_and_long_tailed(profile: TokenLengths) -> None:
    """Draws stay in bounds, centre on the median, and lean right (mean above median)."""
    rng = random.Random(0)
    draws = [profile.sample(rng) for _ in range(5_000)]
    assert min(draws) >= profile.low
    assert max(draws) <= profile.high
    assert abs(statistics.median(draws) - profile.median) <= 0.1 * profile.median
    assert statistics.mean(draws) > statistics.median(draws)
    # Both ends of the task's range are reached, so the mix spans it.
    assert {profile.low, profile.high} <= set(draws)


def test_workload_is_seeded_and_lengths_match_prompts() -> None:
    """Same seed, same requests; each prompt has one word per token it claims."""
    first = generate_workload(50, seed=3, words=WORDS)
    assert first == generate_workload(50, seed=3, words=WORDS)
    assert first != generate_workload(50, seed=4, words=WORDS)
    for item in first:
        assert item.prompt.startswith(" ")
        assert len(item.prompt.split()) == item.prompt_tokens
        assert set(item.prompt.split()) <= set(WORDS)
        assert OUTPUT_LENGTHS.low <= item.max_tokens <= OUTPUT_LENGTHS.high


def test_single_token_words_keeps_lowercase_words_after_a_space() -> None:
    """Only byte-level entries of a space plus 3–10 lowercase letters qualify."""
    vocab = {"\u0120hello": 1, "hello": 2, "\u0120Hello": 3, "\u0120ab": 4, "\u0120world": 5}
    vocab |= {"\u0120123": 6, "\u0120abcdefghijk": 7}
    assert single_token_words(vocab) == ("hello", "world")


def test_request_bodies_ask_each_server_for_exact_lengths() -> None:
    """Ours gets ignore_eos and usage; the peer gets an EOS id that matches no token."""
    item = generate_workload(1, seed=0, words=WORDS)[0]
    ours = json.loads(request_body(item, kind="fleetserve", model="m"))
    assert ours["ignore_eos"] is True
    assert ours["stream_options"] == {"include_usage": True}
    assert (ours["stream"], ours["max_tokens"], ours["prompt"]) == (
        True,
        item.max_tokens,
        item.prompt,
    )
    peer = json.loads(request_body(item, kind="transformers", model="/dir"))
    assert json.loads(peer["generation_config"]) == {"eos_token_id": -1, "do_sample": False}
    assert "ignore_eos" not in peer
    assert (peer["model"], peer["max_tokens"]) == ("/dir", item.max_tokens)


def test_llamacpp_is_asked_for_greedy_exact_lengths_with_usage() -> None:
    """llama-server reads the same keys as our runtime: greedy, ignore_eos, usage."""
    item = generate_workload(1, seed=0, words=WORDS)[0]
    body = json.loads(request_body(item, kind="llamacpp", model="m"))
    assert (body["temperature"], body["ignore_eos"]) == (0.0, True)
    assert body["stream_options"] == {"include_usage": True}
    assert (body["stream"], body["max_tokens"], body["prompt"]) == (
        True,
        item.max_tokens,
        item.prompt,
    )


def test_llamacpp_serves_our_gguf_on_one_thread_with_32_slots() -> None:
    """Same file, same core budget, a shared context that holds every stream at its longest."""
    (config,) = (c for c in CONFIGS if c.kind == "llamacpp")
    args = parse_args(["--llama-server=/bin/llama-server"])
    argv = server_argv(config, port=8123, args=args)
    assert argv[0] == "/bin/llama-server"
    assert "--cont-batching" in argv
    # Values are separate words: llama.cpp rewrites `_` in a `--flag=value` word.
    assert not [word for word in argv if word.startswith("--") and "=" in word]
    values = dict(zip(argv[1:], argv[2:], strict=False))
    assert values["--model"] == str(smollm2_gguf_path())
    assert (values["--parallel"], values["--threads"], values["--threads-batch"]) == (
        "32",
        "1",
        "1",
    )
    assert (values["--host"], values["--port"], values["--ctx-size"]) == (
        "127.0.0.1",
        "8123",
        str(32 * 41 * 16),
    )


def test_llama_server_cache_is_named_by_pin_and_cpu() -> None:
    """The cached binary's directory names the pinned sdist version; a new pin rebuilds."""
    assert pinned_version() == "0.3.36"
    assert binary_path().parent.name.startswith(f"llama-server-{pinned_version()}-")


def _result(label: str, tokens_per_s: float) -> StreamConfigResult:
    stats = StreamStats(
        sent=1, finished=1, status_counts={200: 1}, errors={}, timed_out=False, elapsed_s=1.0,
        generated_tokens=1, requested_tokens=1, short_streams=0, resent=0,
        tokens_per_s=tokens_per_s,
        ttft_p50_ms=1.0, ttft_p99_ms=1.0, itl_p50_ms=1.0, itl_p99_ms=1.0,
    )  # fmt: skip
    return StreamConfigResult(label, label, (), stats, 1.0)


def test_report_ends_with_the_llamacpp_ratios(capsys: pytest.CaptureFixture[str]) -> None:
    """The fp32 engine against llama.cpp is the last line; bf16 and int8 against it before."""
    rates = {"a": 100.0, "b": 25.0, "c": 50.0, "d": 40.0, "e": 200.0, "f": 300.0, "g": 400.0}
    print_report([_result(label, rate) for label, rate in rates.items()], context={})
    lines = capsys.readouterr().out.splitlines()
    assert lines[-6:] == [
        "generate_speedup_vs_batch1=4.00",
        "generate_speedup_vs_static=2.00",
        "generate_speedup_vs_peer=2.50",
        "generate_int8_speedup_vs_llamacpp=2.00",
        "generate_bf16_speedup_vs_llamacpp=1.50",
        "generate_speedup_vs_llamacpp=0.50",
    ]


def test_peer_cache_holds_every_stream_at_its_longest() -> None:
    """400 + 256 tokens in blocks of 16 is 41 blocks per stream."""
    assert peer_num_blocks(concurrency=32, block_size=16) == 32 * 41


@pytest.mark.parametrize(
    ("line", "payload"),
    [
        (b"data: {}\n", "{}"),
        (b"data:{}\r\n", "{}"),
        (b"data: [DONE]\n", "[DONE]"),
        (b"\n", None),
        (b": keep-alive\n", None),
        (b"event: message\n", None),
    ],
)
def test_sse_data_extracts_payloads(line: bytes, payload: str | None) -> None:
    """Data lines give their payload (one optional space dropped); other lines none."""
    assert sse_data(line) == payload


def test_parse_chunk_reads_text_usage_and_errors() -> None:
    """Completion and chat chunks, usage-only final chunks and error events."""
    text = parse_chunk('{"choices": [{"index": 0, "text": " Paris"}]}')
    assert (text.has_text, text.completion_tokens, text.error) == (True, None, None)
    chat = parse_chunk('{"choices": [{"delta": {"content": "Hi"}}]}')
    assert chat.has_text
    role_only = parse_chunk('{"choices": [{"delta": {"role": "assistant"}}]}')
    assert not role_only.has_text
    final = parse_chunk(
        '{"choices": [{"text": "", "finish_reason": "length"}],'
        ' "usage": {"completion_tokens": 20, "prompt_tokens": 5}}'
    )
    assert (final.has_text, final.completion_tokens) == (False, 20)
    usage_only = parse_chunk('{"choices": [], "usage": {"completion_tokens": 7}}')
    assert usage_only.completion_tokens == 7
    assert parse_chunk('{"error": {"message": "deadline"}}').error == "deadline"
    assert parse_chunk('{"error": "worker died"}').error == "worker died"
    with pytest.raises(ValueError, match="not a JSON object"):
        parse_chunk("[1, 2]")


def test_stream_record_latencies_and_token_count() -> None:
    """TTFT from the send, gaps between chunks, usage preferred over the chunk count."""
    record = StreamRecord(requested_tokens=4, sent_at=10.0, chunk_times=[10.5, 10.6, 10.8])
    assert record.ttft_s == pytest.approx(0.5)
    assert record.gaps_s == pytest.approx([0.1, 0.2])
    assert record.generated_tokens == 3
    record.completion_tokens = 4
    assert record.generated_tokens == 4
    assert StreamRecord(requested_tokens=1, sent_at=0.0).ttft_s is None


def test_quantile_is_nearest_rank() -> None:
    """p50 of 1..10 is 5, p99 is 10, one value is every quantile, none is NaN."""
    values = [float(v) for v in range(10, 0, -1)]
    assert quantile(values, 0.5) == 5.0
    assert quantile(values, 0.99) == 10.0
    assert quantile([3.0], 0.01) == 3.0
    assert math.isnan(quantile([], 0.5))


def test_summarise_streams_pools_gaps_and_counts_cut_streams() -> None:
    """Tokens include a stream the time limit cut; short streams are finished ones only."""
    full = StreamRecord(4, 0.0, [1.0, 1.1, 1.2, 1.3], completion_tokens=4, status=200)
    full.finished = True
    short = StreamRecord(8, 0.0, [2.0, 2.3], completion_tokens=2, status=200, finished=True)
    short.resent = 2
    cut = StreamRecord(16, 0.0, [3.0, 3.5, 4.0], status=200)
    failed = StreamRecord(4, 0.0, status=503, error="HTTP 503: queue full")
    stats = summarise_streams([full, short, cut, failed], elapsed_s=4.5, timed_out=True)
    assert (stats.sent, stats.finished, stats.timed_out) == (4, 2, True)
    assert stats.generated_tokens == 4 + 2 + 3
    assert stats.tokens_per_s == pytest.approx(9 / 4.5)
    assert (stats.requested_tokens, stats.short_streams, stats.resent) == (12, 1, 2)
    assert stats.status_counts == {200: 3, 503: 1}
    assert stats.errors == {"HTTP 503: queue full": 1}
    assert stats.ttft_p50_ms == pytest.approx(2000.0)
    assert stats.ttft_p99_ms == pytest.approx(3000.0)
    # Gaps 0.1, 0.1, 0.1, 0.3, 0.5, 0.5: the median is 0.1 s, the p99 0.5 s.
    assert stats.itl_p50_ms == pytest.approx(100.0)
    assert stats.itl_p99_ms == pytest.approx(500.0)


@contextlib.asynccontextmanager
async def _sse_server(tokens: int) -> AsyncIterator[str]:
    """Serve a completions stream of ``tokens`` one-token chunks, usage, then [DONE]."""

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if body["max_tokens"] == 0:
            return web.json_response({"error": {"message": "bad max_tokens"}}, status=400)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for _ in range(tokens):
            chunk = {"choices": [{"index": 0, "text": "x"}]}
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        final = {"choices": [], "usage": {"completion_tokens": tokens}}
        await response.write(f"data: {json.dumps(final)}\n\ndata: [DONE]\n\n".encode())
        return response

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}/v1/completions"
    finally:
        await runner.cleanup()


def test_closed_loop_reads_real_sse_over_loopback() -> None:
    """Every stream is parsed to its end; an HTTP error is counted, not raised."""

    async def scenario() -> None:
        async with _sse_server(tokens=5) as url:
            requests = [StreamRequest(json.dumps({"max_tokens": 5}).encode(), 5)] * 6
            requests.append(StreamRequest(json.dumps({"max_tokens": 0}).encode(), 0))
            stats = await run_streaming_closed_loop(
                url, requests, concurrency=3, time_limit_s=30.0, request_timeout_s=10.0
            )
            assert (stats.sent, stats.finished, stats.timed_out) == (7, 6, False)
            assert stats.status_counts == {200: 6, 400: 1}
            assert stats.generated_tokens == 30
            assert (stats.requested_tokens, stats.short_streams) == (30, 0)
            assert not math.isnan(stats.itl_p50_ms)

    asyncio.run(scenario())
