"""Input processing: a request's prompt (text, chat messages or token ids) to checked token ids.

Runs at the door (`engine.GenerationEngine.submit`), before a request is queued: it refuses
what cannot fit the model's context, or the KV pool, with `InputTooLong`, and a malformed
prompt with `InvalidInput`. A text that cannot fit is refused from its size before the
tokenizer spends time on it. Long prompts are tokenised off the event loop
(`INLINE_PROMPT_CHARS`), which is the engine's choice; this module only computes.
"""

from __future__ import annotations

from fleetserve_runtime.core.errors import InputTooLong, InvalidInput
from fleetserve_runtime.core.limits import MAX_CHARS_PER_TOKEN
from fleetserve_runtime.generate.contracts import GenerationRequest
from fleetserve_runtime.models.causal_lm import TextCodec

__all__ = ["INLINE_PROMPT_CHARS", "PromptProcessor", "prompt_chars"]

INLINE_PROMPT_CHARS = 4096
"""Prompts up to this many characters are tokenised on the event loop (well under a
millisecond); longer ones on a helper thread, which the tokenizer's GIL-free encoding lets
run beside the loop. A hop for every request would cost more than short prompts do."""

_CONTROL_TOKEN_BYTES = 32
"""Floor of `_longest_token_bytes`: a chat template's control tokens (`<|im_start|>`) are
single tokens of up to this many bytes of rendered text, and decode to nothing."""


def prompt_chars(request: GenerationRequest) -> int:
    """Characters of the request's text prompt or messages (0 for token ids)."""
    if request.messages is not None:
        return sum(len(message.content) for message in request.messages)
    return len(request.prompt or "")


class PromptProcessor:
    """Tokenises and bounds prompts for one model (its codec, vocabulary and context)."""

    def __init__(
        self, *, codec: TextCodec, vocab_size: int, context_length: int, kv_capacity: int
    ) -> None:
        self._codec = codec
        self._vocab_size = vocab_size
        self._context_length = context_length
        self._kv_capacity = kv_capacity
        """Token slots of the whole KV pool: no sequence can grow past them."""
        self._token_bytes = _longest_token_bytes(codec, vocab_size)

    def tokenise(self, request: GenerationRequest) -> list[int]:
        """The prompt's token ids; raises `InvalidInput` or `InputTooLong`."""
        given = [
            x for x in (request.prompt, request.messages, request.prompt_token_ids) if x is not None
        ]
        if len(given) != 1:
            msg = "give exactly one of prompt, messages or prompt token ids"
            raise InvalidInput(msg)
        if request.prompt_token_ids is not None:
            if len(request.prompt_token_ids) > self._context_length:
                msg = (
                    f"prompt of {len(request.prompt_token_ids)} token ids cannot fit the "
                    f"model's context of {self._context_length} tokens"
                )
                raise InputTooLong(msg)
            ids = list(request.prompt_token_ids)
            vocab = self._vocab_size
            if any(not 0 <= token < vocab for token in ids):
                msg = f"prompt token ids must be between 0 and {vocab - 1}"
                # Token ids come only from the completions API's `prompt`.
                raise InvalidInput(msg, param="prompt")
        elif request.messages is not None:
            # The template only adds to the messages' text: bound it before rendering too.
            self._bounded("".join(message.content for message in request.messages))
            try:
                text = self._codec.render_chat(request.messages)
            except ValueError as exc:
                msg = f"the chat template refused the messages: {exc}"
                raise InvalidInput(msg) from None
            try:
                ids = self._codec.encode_chat(request.messages, self._bounded(text))
            except ValueError as exc:
                raise InvalidInput(str(exc)) from None
        else:
            ids = self._codec.encode(self._bounded(request.prompt or ""), add_special=True)
        if not ids:
            msg = "the prompt is empty"
            raise InvalidInput(msg)
        return ids

    def default_max_tokens(self, prompt_tokens: int, default: int) -> int:
        """Output tokens of a request that sets none: `default`, at most the room left."""
        room = min(self._context_length, self._kv_capacity)
        return max(1, min(default, room - prompt_tokens))

    def check_fits(self, prompt_tokens: int, max_tokens: int) -> None:
        """Raise `InputTooLong` when the prompt and its output cannot fit the context or pool."""
        total = prompt_tokens + max_tokens
        if total > self._context_length:
            msg = (
                f"prompt of {prompt_tokens} tokens plus max_tokens {max_tokens} is "
                f"{total} tokens, over the model's context of {self._context_length} tokens"
            )
            raise InputTooLong(msg)
        if total > self._kv_capacity:
            msg = (
                f"prompt of {prompt_tokens} tokens plus max_tokens {max_tokens} is "
                f"{total} tokens, over the KV cache's {self._kv_capacity} tokens"
            )
            raise InputTooLong(msg)

    def _bounded(self, text: str) -> str:
        """Refuse a text that cannot fit before the tokenizer spends the event loop on it.

        Two sound bounds, both cheaper than tokenising: characters against
        `MAX_CHARS_PER_TOKEN`, and UTF-8 bytes against the most bytes one token stands for
        (`_longest_token_bytes`), which catches text of many-byte characters (emoji) that
        passes the first.
        """
        size = len(text)
        if size <= self._context_length * MAX_CHARS_PER_TOKEN:
            size = len(text.encode("utf-8", "surrogatepass"))
            if size <= self._context_length * self._token_bytes:
                return text
            unit = f"bytes (a token of this model stands for at most {self._token_bytes})"
        else:
            unit = "characters"
        msg = (
            f"prompt of {size} {unit} cannot fit the model's context of "
            f"{self._context_length} tokens"
        )
        raise InputTooLong(msg)


def _longest_token_bytes(codec: TextCodec, vocab_size: int) -> int:
    """Most UTF-8 bytes of prompt text one token can stand for, so more cannot fit.

    Each vocabulary entry is decoded alone. That shows a partial UTF-8 sequence as U+FFFD
    (3 bytes, more than it stands for) and may drop SentencePiece's leading space, hence one
    byte more; control tokens decode to nothing, and every one of them a chat template adds
    stands for at least `_CONTROL_TOKEN_BYTES`. Sound for the byte-level and byte-fallback
    BPE tokenizers served here, which never shrink text while normalising it.
    """
    longest = max(len(codec.decode([token]).encode("utf-8")) for token in range(vocab_size))
    return max(longest + 1, _CONTROL_TOKEN_BYTES)
