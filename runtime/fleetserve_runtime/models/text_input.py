"""Text instances for the tokenizer-backed encoders: tokenizer, validation, truncation, samples.

The torch MiniLM handler and the ONNX encoder both take one string per instance and tokenise
it with a Hugging Face tokenizer that adds special tokens. They reject and truncate through
this one place, so a model answers the same request the same way whichever way it is served.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

from fleetserve_runtime.core.errors import InputTooLong, InvalidInput

__all__ = ["open_tokenizer", "sample_text", "text_token_ids"]

# Single-token words in the MiniLM vocabulary, cycled to build synthetic inputs.
_SAMPLE_WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "and")


def open_tokenizer(path: Path) -> Tokenizer:
    """The `tokenizer.json` at `path`, its own padding and truncation off.

    Lengths are the runtime's business (`text_token_ids` fits a text to the model's limit, the
    executor pads a batch); MiniLM's shipped tokenizer, for one, pads and truncates to 128.
    """
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


def text_token_ids(
    instance: object,
    tokenizer: Tokenizer | None,
    *,
    handler: str,
    limit: int,
    truncate: bool,
    special_tokens: int,
    closing: int | None = None,
) -> tuple[list[int], bool]:
    """Tokenise one text and fit it to `limit` tokens; returns the ids and whether it was cut.

    A text that yields no more than `special_tokens` ids carries no content. A cut text keeps
    its closing special token (`closing`, else the tokenizer's own last id): BERT-style models
    are trained on sequences ending in [SEP].

    Raises:
        InvalidInput: the instance is not a non-empty string with tokens.
        InputTooLong: the text exceeds `limit` tokens and `truncate` is false.
        RuntimeError: `handler.load()` has not been called (no tokenizer yet).
    """
    if not isinstance(instance, str):
        raise InvalidInput(f"text must be a string, got {type(instance).__name__}")
    if not instance:
        raise InvalidInput("text must not be an empty string")
    if tokenizer is None:
        raise RuntimeError(f"{handler}.load() has not been called")
    ids: list[int] = tokenizer.encode(instance).ids
    count = len(ids)
    if count <= special_tokens:
        raise InvalidInput("text has no tokens (only whitespace or control characters)")
    if count <= limit:
        return ids, False
    if not truncate:
        raise InputTooLong(f"text of {count} tokens exceeds max_sequence_length {limit}")
    return [*ids[: limit - 1], ids[-1] if closing is None else closing], True


def sample_text(length: int, limit: int) -> str:
    """A text of about `length` tokens (two of them special), at most `limit`."""
    words = max(1, min(length, limit) - 2)
    return " ".join(_SAMPLE_WORDS[i % len(_SAMPLE_WORDS)] for i in range(words))
