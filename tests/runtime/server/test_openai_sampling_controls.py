"""The sampling controls over HTTP with the official `openai` client, whole and streamed.

The synthetic model gives its chosen token a logit of 30 and every other token 0, so a
`logit_bias` of 35 on "in" (id 20) and 34 on "wind" (id 21) leaves those two in charge (for
this prompt the model's own choice is never either of them) and the penalties decide
between them, predictably:

- none: "in" every time (35 > 34);
- `presence_penalty` 2: "in", then "wind" (33 < 34), then "in" for good (33 > 32);
- `frequency_penalty` 2: they alternate, each use costing 2;
- `repetition_penalty` 1.1: "in", "wind" (35/1.1 < 34), then "in" (31.8 > 30.9).

`n` > 1: choices whole and streamed, told apart by `index`, sharing the prompt's blocks.

SmolLM2 checks that a penalty changes a real model's greedy answer, which repeats itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from tests.runtime.server.test_openai_client import LLM, MESSAGES, client, metric, running

SMOLLM2_ARGS = ("--generation-max-context", "512", "--threads", "2")

BLOCK_SIZE = 16
"""The server's KV block size (`generation.block_size`'s default)."""
IN, WIND = "20", "21"
STEER = {IN: 35, WIND: 34}


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with running(LLM) as url:
        yield url


def chat_whole_and_streamed(
    api: openai.OpenAI, **body: Any
) -> tuple[ChatCompletion, list[ChatCompletionChunk]]:
    """One chat request asked whole, then streamed with usage in the last chunk."""
    whole = api.chat.completions.create(model="test", messages=MESSAGES, **body)
    chunks = list(
        api.chat.completions.create(
            model="test",
            messages=MESSAGES,
            stream=True,
            stream_options={"include_usage": True},
            **body,
        )
    )
    return whole, chunks


def ask(url: str, **body: Any) -> tuple[list[str], str, int]:
    """Words, finish reason and completion tokens of one chat answer, whole and streamed alike.

    Both ways must give the same answer; the streamed one asks for usage in the last chunk.
    """
    with client(url) as api:
        whole, chunks = chat_whole_and_streamed(api, **body)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    text = whole.choices[0].message.content or ""
    assert whole.usage is not None
    assert chunks[-1].usage is not None
    assert streamed == text
    assert reasons[-1] == whole.choices[0].finish_reason
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    return text.split(), whole.choices[0].finish_reason, whole.usage.completion_tokens


def test_logit_bias_steers_the_answer(server: str) -> None:
    """A bias of 35 beats the model's own choice: "in" every time."""
    words, reason, tokens = ask(server, temperature=0, max_tokens=4, logit_bias=STEER)
    assert (words, reason, tokens) == (["in"] * 4, "length", 4)


@pytest.mark.parametrize(
    ("controls", "expected"),
    [
        pytest.param({"presence_penalty": 2}, "in wind in in", id="presence_penalty"),
        pytest.param({"frequency_penalty": 2}, "in wind in wind", id="frequency_penalty"),
        pytest.param(
            {"extra_body": {"repetition_penalty": 1.1}},
            "in wind in in",
            id="repetition_penalty",
        ),
    ],
)
def test_penalties_change_the_greedy_answer(
    server: str, controls: dict[str, Any], expected: str
) -> None:
    """Each penalty turns "in in in in" into what its arithmetic says."""
    words, _, _ = ask(server, temperature=0, max_tokens=4, logit_bias=STEER, **controls)
    assert " ".join(words) == expected


def test_min_p_drops_the_unlikely_tokens(server: str) -> None:
    """`min_p` 0.5 leaves only the likeliest tokens; without it (same seed) others come.

    Biased to 31 each, "in" and "wind" are 0.42 likely, the model's own token 0.16.
    """
    body: dict[str, Any] = {"temperature": 1, "seed": 3, "max_tokens": 12}
    body["logit_bias"] = {IN: 31, WIND: 31}
    free, _, _ = ask(server, **body)
    floored, _, _ = ask(server, **body, extra_body={"min_p": 0.5})
    assert set(floored) <= {"in", "wind"}
    assert not set(free) <= {"in", "wind"}


def test_min_tokens_holds_back_the_end_of_sequence(server: str) -> None:
    """The model ends after 12 tokens; `min_tokens` 15 masks its end until then."""
    _, reason, tokens = ask(server, temperature=0, max_tokens=30)
    assert (reason, tokens) == ("stop", 13)
    _, _, held = ask(server, temperature=0, max_tokens=30, extra_body={"min_tokens": 15})
    assert held >= 15


def test_a_stop_token_id_ends_the_answer_unseen(server: str) -> None:
    """Biased to be drawn first, stop token "in" ends the answer at once, not shown."""
    words, reason, tokens = ask(
        server,
        temperature=0,
        max_tokens=4,
        logit_bias={IN: 100},
        extra_body={"stop_token_ids": [int(IN)]},
    )
    assert (words, reason, tokens) == ([], "stop", 1)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        pytest.param({"logit_bias": {"99999": 1}}, "logit_bias", id="logit-bias-past-vocab"),
        pytest.param({"presence_penalty": 3}, "presence_penalty", id="presence-over-2"),
        pytest.param({"extra_body": {"min_p": 2}}, "min_p", id="min-p-over-1"),
        pytest.param(
            {"extra_body": {"stop_token_ids": [99999]}}, "stop_token_ids", id="stop-id-past-vocab"
        ),
    ],
)
def test_out_of_range_controls_are_bad_requests(
    server: str, body: dict[str, Any], param: str
) -> None:
    """The client raises `BadRequestError` naming the key."""
    with client(server) as api, pytest.raises(openai.BadRequestError) as caught:
        api.chat.completions.create(model="test", messages=MESSAGES, **body)
    assert caught.value.param == param


def test_smollm2_frequency_penalty_breaks_a_repetition() -> None:
    """Greedy SmolLM2 asked to repeat a word repeats it; a frequency penalty of 2 stops it."""
    with running("builtin://smollm2-135m", *SMOLLM2_ARGS, ready_s=180) as url:
        body: dict[str, Any] = {"temperature": 0, "max_tokens": 24}
        messages: list[openai.types.chat.ChatCompletionMessageParam] = [
            {"role": "user", "content": "Write the word cat twenty times."}
        ]
        with client(url) as api:
            plain = api.chat.completions.create(model="test", messages=messages, **body)
            penalised = api.chat.completions.create(
                model="test", messages=messages, frequency_penalty=2, **body
            )
    text = plain.choices[0].message.content or ""
    assert text.lower().count("cat") >= 5
    assert (penalised.choices[0].message.content or "").lower().count("cat") < 5


def by_index(chunks: list[Any], text: Callable[[Any], str | None]) -> dict[int, str]:
    """The streamed text of each choice, told apart by the chunks' `index`."""
    texts: dict[int, str] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (text(choice) or "")
    return texts


def test_n_chat_choices_whole_and_streamed(server: str) -> None:
    """Three seeded choices, told apart: their own texts, one finish each, usage of all."""
    body: dict[str, Any] = {"temperature": 1, "seed": 5, "max_tokens": 4, "n": 3}
    body["logit_bias"] = {IN: 30, WIND: 30}  # three equal tokens: the choices differ
    with client(server) as api:
        one = api.chat.completions.create(model="test", messages=MESSAGES, max_tokens=1)
        whole, chunks = chat_whole_and_streamed(api, **body)
    assert [choice.index for choice in whole.choices] == [0, 1, 2]
    texts = [choice.message.content for choice in whole.choices]
    assert len(set(texts)) > 1
    assert whole.usage is not None
    assert one.usage is not None
    assert whole.usage.prompt_tokens == one.usage.prompt_tokens
    assert whole.usage.completion_tokens == 12
    assert by_index(chunks, lambda c: c.delta.content) == dict(enumerate(texts))
    roles = [c.choices[0].index for c in chunks if c.choices and c.choices[0].delta.role]
    assert roles == [0, 1, 2]
    reasons = sorted(c.choices[0].index for c in chunks if c.choices and c.choices[0].finish_reason)
    assert reasons == [0, 1, 2]
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 12


def test_n_completions_whole_and_streamed(server: str) -> None:
    """The legacy API's choices, whole and streamed; a greedy n gives the same text twice."""
    with client(server) as api:
        whole = api.completions.create(
            model="test", prompt="rivers run", max_tokens=3, temperature=0, n=2
        )
        chunks = list(
            api.completions.create(
                model="test", prompt="rivers run", max_tokens=3, temperature=0, n=2, stream=True
            )
        )
    texts = [choice.text for choice in whole.choices]
    assert [choice.index for choice in whole.choices] == [0, 1]
    assert texts[0] == texts[1] != ""
    assert whole.usage is not None
    assert whole.usage.completion_tokens == 6
    assert by_index(chunks, lambda c: c.text) == dict(enumerate(texts))


def test_n_choices_share_the_prompt_blocks(server: str) -> None:
    """The second choice takes the prompt's full blocks from the prefix cache.

    The hits metric grows by them, while the request's own usage reports no cached prompt.
    """
    prompt = " ".join(f"w{i}" for i in range(40))
    before = metric(server, "fleetserve_prefix_cache_hits_total")
    with client(server) as api:
        answer = api.completions.create(
            model="test",
            prompt=prompt,
            max_tokens=2,
            n=2,
            extra_body={"cache_salt": "n-sharing"},
        )
    assert answer.usage is not None
    shared = answer.usage.prompt_tokens // BLOCK_SIZE * BLOCK_SIZE
    assert shared >= 2 * BLOCK_SIZE
    assert metric(server, "fleetserve_prefix_cache_hits_total") - before == shared
    details = answer.usage.prompt_tokens_details
    assert details is not None
    assert details.cached_tokens == 0


def test_best_of_stays_refused(server: str) -> None:
    """`best_of` asks for a ranking by log-probability, which this server does not do."""
    with client(server) as api, pytest.raises(openai.BadRequestError) as caught:
        api.completions.create(model="test", prompt="x", best_of=2, n=1)
    assert caught.value.param == "best_of"


def test_oip_generate_takes_the_same_controls(server: str) -> None:
    """The OIP generate `parameters` share the fields (and their bounds) with OpenAI's."""
    url = f"{server}/v2/models/test/generate"
    parameters: dict[str, Any] = {"temperature": 0, "max_tokens": 4, "logit_bias": STEER}
    steered = httpx.post(url, json={"text_input": "x", "parameters": parameters}, timeout=20)
    assert steered.status_code == 200
    assert steered.json()["text_output"].split() == ["in"] * 4
    parameters["frequency_penalty"] = 2
    penalised = httpx.post(url, json={"text_input": "x", "parameters": parameters}, timeout=20)
    assert penalised.json()["text_output"].split() == ["in", "wind", "in", "wind"]
    parameters["min_p"] = 2
    refused = httpx.post(url, json={"text_input": "x", "parameters": parameters}, timeout=20)
    assert refused.status_code == 400
