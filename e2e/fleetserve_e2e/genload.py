"""A load driver of streamed generations: `LoadDriver`, each request an SSE completion.

Requests follow the HTTPRoute's weights exactly as `LoadDriver`'s do; each is a
`POST /v1/completions` with `stream: true`, read to its end, so the runtime records a
time to first token and one inter-token gap per further token. A stream that began with
200 but ended with an error event (the engine failed midway) is recorded as a 500, as the
runtime counts it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import httpx

from fleetserve_e2e.loadgen import NO_ANSWER, LoadDriver
from fleetserve_e2e.pod_map import PodAddress

__all__ = ["StreamingLoadDriver"]

MIDSTREAM_ERROR = 500


@dataclass
class StreamingLoadDriver(LoadDriver):
    """Sends `rate_rps` streamed completions of `max_tokens` tokens per second."""

    max_tokens: int = 16

    async def _send(self, client: httpx.AsyncClient, pod: PodAddress, text: str) -> int:
        body = {"model": self.model, "prompt": text, "max_tokens": self.max_tokens,
                "stream": True, "temperature": 0}  # fmt: skip
        try:
            async with client.stream("POST", f"{pod.url}/v1/completions", json=body) as answer:
                if answer.status_code != 200:
                    await answer.aread()
                    return answer.status_code
                async for line in answer.aiter_lines():
                    payload = line.removeprefix("data:").strip()
                    if line.startswith("data:") and payload != "[DONE]":
                        event = json.loads(payload)
                        if isinstance(event, dict) and "error" in event:
                            return MIDSTREAM_ERROR
        except httpx.HTTPError:
            return NO_ANSWER
        return 200
