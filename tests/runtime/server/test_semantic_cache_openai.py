"""The semantic cache through the official `openai` client, against the real server process.

One server: SmolLM2-135M with the semantic cache on (MiniLM on ONNX Runtime as its
encoder) and model control, so a second version can be loaded. Greedy requests: a miss, an
exact repeat, a paraphrase, each counted under its outcome; the hits carry the first
answer and honest usage (this prompt's tokens, no `cached_tokens`); a streamed hit is one
content chunk; sampled requests bypass; a new version misses what the old one cached.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from fleetserve_runtime.testing import metric_total
from fleetserve_runtime.testing.process import free_port
from tests.runtime.server.test_openai_client import running

QUESTION = "What is the capital of France?"
PARAPHRASE = "What is France's capital?"
ADMIN_TOKEN = "admin-token-for-tests"
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """The server's inference URL and its admin URL."""
    admin_file = tmp_path_factory.mktemp("semantic") / "admin-token"
    admin_file.write_text(ADMIN_TOKEN)
    admin_port = free_port()
    with running(
        "builtin://smollm2-135m", "--generation-max-context", "512", "--threads", "2",
        "--version", "v1", "--semantic-cache-max-entries", "64",
        "--semantic-cache-encoder", "builtin://minilm-l6",
        "--model-control", "explicit", "--admin-port", str(admin_port),
        "--admin-token-file", str(admin_file), "--allowed-model-uris", "builtin://smollm2-135m",
        ready_s=240,
    ) as url:  # fmt: skip
        yield url, f"http://127.0.0.1:{admin_port}"


def outcomes(url: str, version: str = "v1") -> dict[str, float]:
    text = httpx.get(f"{url}/metrics").text
    return {
        outcome: metric_total(
            text, "fleetserve_semantic_cache_requests_total", outcome=outcome, version=version
        )
        for outcome in ("exact_hit", "semantic_hit", "miss", "bypass")
    }


def ask(
    api: openai.OpenAI, content: str, *, temperature: float = 0, **extra: object
) -> openai.types.chat.ChatCompletion:
    """A chat request, greedy unless `temperature` says otherwise; `extra` overrides fields."""
    fields: dict[str, object] = {"max_tokens": MAX_TOKENS, "temperature": temperature, **extra}
    return api.chat.completions.create(
        model="test",
        messages=[{"role": "user", "content": content}],
        **fields,  # type: ignore[arg-type]
    )


def sampled_prompt_tokens(api: openai.OpenAI, content: str) -> int:
    """The model's own count of `content`'s prompt tokens, from a generated (sampled) answer."""
    reply = ask(api, content, temperature=1.0, seed=1, max_tokens=1)
    assert reply.usage is not None
    return reply.usage.prompt_tokens


def test_exact_and_semantic_hits_then_a_new_version_misses(server: tuple[str, str]) -> None:
    url, admin = server
    with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120) as api:
        first = ask(api, QUESTION)
        assert outcomes(url) == {"exact_hit": 0, "semantic_hit": 0, "miss": 1, "bypass": 0}
        answer = first.choices[0].message.content
        assert answer
        assert "Paris" in answer

        repeat = ask(api, QUESTION)
        assert outcomes(url)["exact_hit"] == 1
        assert repeat.choices[0].message.content == answer
        assert repeat.choices[0].finish_reason == first.choices[0].finish_reason
        assert repeat.usage is not None
        assert first.usage is not None
        assert repeat.usage.prompt_tokens == first.usage.prompt_tokens
        assert repeat.usage.completion_tokens == first.usage.completion_tokens
        details = repeat.usage.prompt_tokens_details
        assert details is None or not details.cached_tokens

        paraphrased = ask(api, PARAPHRASE)
        assert outcomes(url)["semantic_hit"] == 1
        assert paraphrased.choices[0].message.content == answer
        assert paraphrased.usage is not None
        own_tokens = sampled_prompt_tokens(api, PARAPHRASE)
        assert paraphrased.usage.prompt_tokens == own_tokens
        assert own_tokens != first.usage.prompt_tokens
        assert outcomes(url)["bypass"] == 1

        chunks = list(
            api.chat.completions.create(
                model="test",
                messages=[{"role": "user", "content": QUESTION}],
                temperature=0,
                max_tokens=MAX_TOKENS,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        assert outcomes(url)["exact_hit"] == 2
        contents = [c.choices[0].delta.content for c in chunks if c.choices]
        assert [text for text in contents if text] == [answer]
        assert chunks[-1].usage is not None
        assert chunks[-1].usage.prompt_tokens == first.usage.prompt_tokens

        unrelated = ask(api, "Name a large animal that lives in the ocean.")
        assert unrelated.choices[0].message.content != answer
        assert outcomes(url)["miss"] == 2

        loaded = httpx.post(
            f"{admin}/v2/repository/models/test/load",
            json={"parameters": {"version": "v2", "uri": "builtin://smollm2-135m"}},
            headers={"authorization": f"Bearer {ADMIN_TOKEN}"},
            timeout=240,
        )
        assert loaded.status_code == 200, loaded.text
        again = ask(api, QUESTION)
        assert outcomes(url, "v2") == {"exact_hit": 0, "semantic_hit": 0, "miss": 1, "bypass": 0}
        assert again.choices[0].message.content == answer  # the same weights, generated again


def test_a_paraphrase_in_completions_is_a_semantic_hit(server: tuple[str, str]) -> None:
    """Completions are cached apart from chat: the prompt alone is embedded and compared."""
    url, _ = server
    with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120) as api:
        before = outcomes(url, "v2")
        first = api.completions.create(
            model="test", prompt="The boiling point of water is", temperature=0, max_tokens=8
        )
        second = api.completions.create(
            model="test", prompt="The boiling point of water is:", temperature=0, max_tokens=8
        )
        after = outcomes(url, "v2")
    assert after["miss"] - before["miss"] == 1
    assert after["semantic_hit"] - before["semantic_hit"] == 1
    assert second.choices[0].text == first.choices[0].text
