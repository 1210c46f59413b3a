"""Stream one chat answer from a runtime pod with the official `openai` client, timing it.

The e2e cluster has no gateway, so a client reaches a generative pod at its address in the
pod map (`PodAddress.url`), as the load driver reaches encoder pods. The answer is streamed
(`stream: true`, Server-Sent Events); each text delta is handed to a callback as it arrives,
so a caller can show the answer while it is being generated.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from openai import DefaultHttpx2Client, OpenAI


@dataclass(frozen=True)
class ChatAnswer:
    """One streamed answer as the client saw it."""

    text: str
    chunks: int
    """Text deltas received: more than one means the answer really arrived piece by piece."""
    ttft_s: float
    """Request sent to first text delta (queueing, prefill and the first token)."""
    elapsed_s: float
    """Request sent to the end of the stream."""
    prompt_tokens: int
    completion_tokens: int

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens per second after the first one: the stream's own generation speed."""
        after_first = self.elapsed_s - self.ttft_s
        return (self.completion_tokens - 1) / after_first if after_first > 0 else 0.0


def stream_chat(
    base_url: str,
    model: str,
    question: str,
    *,
    max_tokens: int,
    on_delta: Callable[[str], None],
    system: str = "You are a concise assistant. Answer in one or two sentences.",
    timeout_s: float = 120.0,
) -> ChatAnswer:
    """Ask `question` at `base_url` (a pod's `http://host:port`), greedily, streaming the answer.

    Raises:
        openai.APIError: The runtime refused the request or the stream ended in an error event.
        RuntimeError: The stream ended without text or without the usage chunk.
    """
    # trust_env=False: a proxy from the environment must not see loopback traffic to pods.
    http = DefaultHttpx2Client(trust_env=False)
    with OpenAI(
        base_url=f"{base_url}/v1",
        api_key="unused",
        max_retries=0,
        timeout=timeout_s,
        http_client=http,
    ) as client:
        started = time.perf_counter()
        first: float | None = None
        parts: list[str] = []
        usage = None
        stream = client.chat.completions.create(
            model=model,
            messages=[
                {"role": "system", "content": system},
                {"role": "user", "content": question},
            ],
            max_tokens=max_tokens,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                if choice.delta.content:
                    if first is None:
                        first = time.perf_counter() - started
                    parts.append(choice.delta.content)
                    on_delta(choice.delta.content)
        elapsed = time.perf_counter() - started
    if first is None or usage is None:
        raise RuntimeError(f"the stream from {base_url} ended without text or usage")
    return ChatAnswer(
        text="".join(parts),
        chunks=len(parts),
        ttft_s=first,
        elapsed_s=elapsed,
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
    )
