"""Structured output: an `OutputGrammar` compiled once, a matcher per sequence, a token mask.

llguidance does the grammar work. `GrammarCompiler` turns a grammar (a JSON schema or a
Lark grammar) into a matcher over the model's vocabulary; compiling is the costly part (up
to a second for a large schema, most of it with the GIL released), so the engine runs it on
a helper thread at `submit`, never on the event loop nor in a step, and keeps the last
`CACHE_SIZE` compiled grammars: a client sending the same schema again compiles nothing.
Grammars over `MAX_GRAMMAR_CHARS`, or that llguidance cannot compile (an unsupported JSON
schema keyword, a schema too complex for its limits), are refused naming the request field
they came from (`OutputGrammar.field`).

Each sequence gets its own `GrammarState`, a copy of the compiled matcher (cheap): the
choices of an `n` > 1 request each follow their own text. The sampler masks a state's row
before drawing (`mask_logits`: every token that would leave the language gets -inf), the
output processor advances it with the token drawn (`GrammarState.advance`), and the sequence
ends once the grammar does (`GrammarState.ended`: the grammar took end-of-sequence, or no
token can extend the text). Nothing else moves a state: chunked prefill samples no token
before the prompt's last chunk, and a preempted sequence keeps its generated tokens (it is
recomputed, not restarted), so its state stays in step with its text.

JSON schemas are compiled without free whitespace between tokens (`{"a":1}`): a small model
given room for whitespace may spend its whole `max_tokens` on it.

The vocabulary is the codec's `tokenizers.Tokenizer` where it has one (llguidance reads the
tokenizer's own description, byte-level or SentencePiece alike); any other codec (the
synthetic model's words) is described by each token's decoded text, which holds where its
tokens' texts concatenate.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING

import llguidance
import numpy as np
import torch

from fleetserve_runtime.core.errors import InvalidInput
from fleetserve_runtime.generate.contracts import GrammarKind, OutputGrammar
from fleetserve_runtime.models.causal_lm import TextCodec
from fleetserve_runtime.models.llama.tokenizer import TokenizerCodec

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

__all__ = [
    "CACHE_SIZE",
    "MAX_GRAMMAR_CHARS",
    "GrammarCompiler",
    "GrammarState",
    "mask_logits",
]

MAX_GRAMMAR_CHARS = 32_768
"""Longest grammar (a schema's JSON text) compiled; a longer one is refused before any work."""
CACHE_SIZE = 32
"""Compiled grammars kept, most recently used first."""
_JSON_OPTIONS: JsonCompileOptions = {"whitespace_flexible": False}
_LIMITS = llguidance.LLParserLimits(verbose_errors=False)
"""llguidance's default bounds on grammar size and per-token work; errors that do not
repeat the grammar back (it is the caller's, and may be large)."""
_ERROR_CHARS = 300
"""Longest stretch of llguidance's message a refusal repeats."""


class GrammarState:
    """One sequence's position in its grammar: what may come next, and whether it ended."""

    def __init__(self, matcher: llguidance.LLMatcher) -> None:
        self._matcher = matcher

    def fill_mask(self, row: torch.Tensor) -> None:
        """Write the allowed next tokens into `row`, int32 words of 32 bits, token i at bit i."""
        self._matcher.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * row.element_size())

    def advance(self, token: int) -> None:
        """Take the sampled `token`; `RuntimeError` when the grammar refuses it (a bug)."""
        if not self._matcher.consume_token(token):
            msg = f"token {token} breaks the output grammar: {self._matcher.get_error()}"
            raise RuntimeError(msg)

    @property
    def ended(self) -> bool:
        """The grammar is over: it took end-of-sequence, or no token can extend the text."""
        return bool(self._matcher.is_stopped())


class GrammarCompiler:
    """Compiles `OutputGrammar`s for one model's vocabulary and keeps the recent ones.

    Thread-safe: `submit` compiles on helper threads. The vocabulary's description is
    built on first use (about a second for a 50k vocabulary).
    """

    def __init__(self, codec: TextCodec, vocab_size: int, cache_size: int = CACHE_SIZE) -> None:
        self._codec = codec
        self._vocab_size = vocab_size
        self._cache_size = cache_size
        self._lock = threading.Lock()
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._compiled: OrderedDict[tuple[GrammarKind, str], llguidance.LLMatcher] = OrderedDict()

    def states(self, grammar: OutputGrammar, count: int) -> list[GrammarState]:
        """`count` fresh states of `grammar` (compiled, or from the cache); `InvalidInput`."""
        key = (grammar.kind, grammar.text)
        with self._lock:
            template = self._compiled.get(key)
            if template is not None:
                self._compiled.move_to_end(key)
        if template is None:
            template = self._compile(grammar)
            with self._lock:
                self._compiled[key] = template
                while len(self._compiled) > self._cache_size:
                    self._compiled.popitem(last=False)
        return [GrammarState(template.deep_copy()) for _ in range(count)]

    def _compile(self, grammar: OutputGrammar) -> llguidance.LLMatcher:
        if len(grammar.text) > MAX_GRAMMAR_CHARS:
            msg = (
                f"{grammar.field}: the grammar is {len(grammar.text)} characters, over this "
                f"server's limit of {MAX_GRAMMAR_CHARS}"
            )
            raise InvalidInput(msg, param=grammar.field)
        try:
            if grammar.kind is GrammarKind.JSON_SCHEMA:
                text = llguidance.LLMatcher.grammar_from_json_schema(
                    grammar.text, defaults=_JSON_OPTIONS
                )
            else:
                text = llguidance.LLMatcher.grammar_from_lark(grammar.text)
        except ValueError as error:
            raise _refusal(grammar, str(error)) from error
        matcher = llguidance.LLMatcher(
            self._ll_tokenizer(grammar), text, log_level=0, limits=_LIMITS
        )
        if matcher.is_error():
            raise _refusal(grammar, matcher.get_error())
        return matcher

    def _ll_tokenizer(self, grammar: OutputGrammar) -> llguidance.LLTokenizer:
        """The vocabulary's description; `InvalidInput` naming the field where it cannot be."""
        with self._lock:
            if self._tokenizer is None:
                try:
                    self._tokenizer = _ll_tokenizer(self._codec, self._vocab_size)
                except (ValueError, RuntimeError) as error:
                    # A vocabulary llguidance cannot read (a model's, not the request's
                    # fault): no grammar can be enforced on this model.
                    msg = f"{grammar.field}: structured output is unavailable for this model"
                    raise InvalidInput(msg, param=grammar.field) from error
            return self._tokenizer


def _refusal(grammar: OutputGrammar, reason: str) -> InvalidInput:
    shown = reason.strip().splitlines()[0][:_ERROR_CHARS] if reason.strip() else "invalid"
    msg = f"{grammar.field}: the {grammar.kind.value} cannot be enforced: {shown}"
    return InvalidInput(msg, param=grammar.field)


def _ll_tokenizer(codec: TextCodec, vocab_size: int) -> llguidance.LLTokenizer:
    eos = sorted(codec.eos_token_ids)
    if isinstance(codec, TokenizerCodec):
        return llguidance.LLTokenizer(codec.tokenizer.to_str(), n_vocab=vocab_size, eos_token=eos)
    return llguidance.LLTokenizer(
        llguidance.TokenizerWrapper(_DecodedVocabulary(codec, vocab_size)), n_vocab=vocab_size
    )


class _DecodedVocabulary:
    """A vocabulary llguidance reads (`TokenizerWrapper`'s), from each token's decoded text.

    Tokens that decode to nothing are special; text is tokenised greedily, longest token
    first (llguidance tokenises a grammar's literals with it).
    """

    def __init__(self, codec: TextCodec, vocab_size: int) -> None:
        texts = [codec.decode([token]) for token in range(vocab_size)]
        self.tokens = [text.encode() for text in texts]
        self.eos_token_id = min(codec.eos_token_ids)
        self.bos_token_id = codec.bos_token_id
        self.special_token_ids = [token for token, text in enumerate(texts) if not text]
        self._ids = {text: token for token, text in reversed(list(enumerate(texts))) if text}
        self._longest = max((len(text) for text in self._ids), default=1)

    def __call__(self, text: str | bytes) -> list[int]:
        """Greedy token ids of `text`.

        A `str` only: llguidance passes bytes to a callable that does not raise on them.
        """
        if not isinstance(text, str):
            msg = "text, not bytes"
            raise TypeError(msg)
        ids: list[int] = []
        start = 0
        while start < len(text):
            for end in range(min(len(text), start + self._longest), start, -1):
                token = self._ids.get(text[start:end])
                if token is not None:
                    ids.append(token)
                    start = end
                    break
            else:
                start += 1
        return ids


def mask_logits(
    logits: torch.Tensor, rows: Sequence[int], states: Collection[GrammarState]
) -> torch.Tensor:
    """`logits` with every token its row's grammar forbids at -inf (float32, new rows).

    `rows` are the rows of `logits` that have a grammar, `states` their states in order.
    """
    vocab = logits.shape[-1]
    bitmask = torch.zeros(len(rows), (vocab + 31) // 32, dtype=torch.int32)
    for n, state in enumerate(states):
        state.fill_mask(bitmask[n])
    # Token i is bit i % 32 of word i // 32: on a little-endian host, bit i % 8 of byte
    # i // 8. numpy unpacks the bits in tens of microseconds where shifting them out in
    # torch takes a millisecond for a batch over a 50k vocabulary.
    bits = np.unpackbits(bitmask.numpy().view(np.uint8), axis=-1, bitorder="little")
    forbidden = torch.from_numpy(bits[:, :vocab] == 0).to(logits.device)
    index = torch.tensor(list(rows), device=logits.device)
    masked = logits[index].float().masked_fill_(forbidden, float("-inf"))
    return logits.float().index_put((index,), masked)
