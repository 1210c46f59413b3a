"""The `semantic_cache` section: off by default, and refused where it cannot work."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from fleetserve_runtime.core.config import load_config

SMOLLM2 = "builtin://smollm2-135m"


def test_off_by_default() -> None:
    assert not load_config({"model": SMOLLM2}).semantic_cache.enabled


def test_on_with_an_encoder_and_read_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FLEETSERVE_SEMANTIC_CACHE_MIN_SIMILARITY", "0.9")
    config = load_config(
        {"model": SMOLLM2, "semantic_cache": {"max_entries": 8, "encoder": "builtin://minilm-l6"}}
    )
    assert config.semantic_cache.enabled
    assert config.semantic_cache.min_similarity == 0.9


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        pytest.param(
            {"model": "builtin://minilm-l6"},
            r"semantic_cache\.max_entries \(8\) applies to generative models only",
            id="encoder-model",
        ),
        pytest.param(
            {"model": "file:///models/x", "task": "embed"},
            r"semantic_cache\.max_entries \(8\) applies to generative models only",
            id="embed-task",
        ),
        pytest.param(
            {"model": SMOLLM2, "semantic_cache": {"max_entries": 8}},
            r"semantic_cache\.encoder is required",
            id="no-encoder",
        ),
        pytest.param(
            {
                "model": SMOLLM2,
                "semantic_cache": {"max_entries": 8, "encoder": "e", "min_similarity": 0},
            },
            "min_similarity",
            id="similarity-zero",
        ),
        pytest.param(
            {
                "model": SMOLLM2,
                "semantic_cache": {"max_entries": 8, "encoder": "e", "min_similarity": 1.01},
            },
            "min_similarity",
            id="similarity-over-one",
        ),
    ],
)
def test_refused_with_the_field_named(overrides: dict[str, object], message: str) -> None:
    merged = {"semantic_cache": {"max_entries": 8, "encoder": "builtin://minilm-l6"}, **overrides}
    with pytest.raises(ValidationError, match=message):
        load_config(merged)


def test_the_synthetic_generative_model_may_have_it() -> None:
    config = load_config(
        {
            "model": "builtin://synthetic-generate?output_tokens=4",
            "semantic_cache": {"max_entries": 8, "encoder": "builtin://minilm-l6"},
        }
    )
    assert config.semantic_cache.enabled
