"""A checkpoint's tokenizer as a `TextCodec`: ids, text, streaming text, chat prompts.

Two sources build the same `TokenizerCodec` around a `tokenizers.Tokenizer`:

- a directory's `tokenizer.json` (+ `tokenizer_config.json`), read by `tokenizers` itself;
- a GGUF file's `tokenizer.ggml.*` metadata, from which `gguf_tokenizer` rebuilds what
  llama.cpp describes: a byte-level BPE ("gpt2": vocabulary, merges, pre-tokenizer regex) or
  a SentencePiece BPE ("llama": pieces with scores, byte fallback, `▁` for spaces).

Both follow transformers' rules for what the reference tokenizer of the same files does, so
token ids match it exactly: control tokens are special (kept whole, skipped when decoding),
user-defined tokens are kept whole but decoded, and `add_bos_token`/`add_eos_token`, when the
configuration states them, decide what `encode(..., add_special=True)` adds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

from fleetserve_runtime.models.causal_lm import ChatMessage
from fleetserve_runtime.models.json_file import read_json_object
from fleetserve_runtime.models.llama.chat_template import ChatTemplate

__all__ = [
    "GgufVocabulary",
    "StreamDecoder",
    "TokenizerCodec",
    "directory_tokenizer",
    "gguf_tokenizer",
    "set_special_tokens_added",
]

_CONTROL = 3
_USER_DEFINED = 4
"""llama.cpp's token types (`tokenizer.ggml.token_type`) that are added tokens."""

_REPLACEMENT = "\ufffd"
_MAX_HELD_TOKENS = 8
"""Most tokens a `StreamDecoder` holds back. A character has at most 4 UTF-8 bytes and every
token carries at least one, so a longer run ending in U+FFFD is bytes that never form a
character (or a real U+FFFD): released as `decode` shows them, not held to the end, and
each step's decode window stays short instead of growing with the run."""

_MAX_OPEN_TOKENS = 3
"""Most tokens an unfinished character can be spread over: it has at most 3 of its 4 bytes,
and every token carries at least one (the vocabularies built here, byte-level BPE and byte
fallback, have no token that ends one character and starts the next)."""

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_SPLITS: Mapping[str, str | None] = {
    "default": None,
    "gpt2": None,
    "smollm": None,
    "llama3": _LLAMA3_SPLIT,
    "llama-v3": _LLAMA3_SPLIT,
    "llama-bpe": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT,
}
"""`tokenizer.ggml.pre` to the split regex the merges were learned on; None: GPT-2's own.

Only the Llama-family names: a vocabulary split the wrong way still tokenises, just not as the
model was trained, so an unknown name is refused rather than guessed.
"""


@dataclass(frozen=True, slots=True)
class GgufVocabulary:
    """The `tokenizer.ggml.*` metadata of a GGUF file."""

    model: str
    pre: str | None
    tokens: Sequence[str]
    token_types: Sequence[int]
    merges: Sequence[str]
    scores: Sequence[float]
    """SentencePiece piece scores; they order the merges when the file lists none."""
    bos_token_id: int | None
    eos_token_id: int | None
    extra_eos_token_ids: frozenset[int]
    """End-of-turn and end-of-message ids (`eot_token_id`, `eom_token_id`) where stated."""
    unk_token_id: int | None
    pad_token_id: int | None
    add_bos: bool
    add_eos: bool
    chat_template: str | None


def gguf_tokenizer(vocab: GgufVocabulary) -> TokenizerCodec:
    """The codec a GGUF file's tokenizer metadata describes; `ValueError` if we cannot build it."""
    if vocab.model == "gpt2":
        pre = vocab.pre or "default"
        if pre not in _SPLITS:
            raise ValueError(
                f"GGUF pre-tokenizer {pre!r} is not supported; supported: {sorted(_SPLITS)}"
            )
        tokenizer = _byte_level_bpe(vocab, _SPLITS[pre])
    elif vocab.model == "llama":
        tokenizer = _sentencepiece_bpe(vocab)
    else:
        raise ValueError(
            f"GGUF tokenizer model {vocab.model!r} is not supported; supported: "
            "'gpt2' (byte-level BPE: SmolLM2, Llama 3), 'llama' (SentencePiece: Llama 2, Mistral)"
        )
    set_special_tokens_added(
        tokenizer,
        bos=_token(vocab, vocab.bos_token_id) if vocab.add_bos else None,
        eos=_token(vocab, vocab.eos_token_id) if vocab.add_eos else None,
    )
    special_tokens = {
        name: text
        for name, token_id in (
            ("bos_token", vocab.bos_token_id),
            ("eos_token", vocab.eos_token_id),
            ("unk_token", vocab.unk_token_id),
            ("pad_token", vocab.pad_token_id),
        )
        if (text := _token(vocab, token_id)) is not None
    }
    eos_ids = set(vocab.extra_eos_token_ids)
    if vocab.eos_token_id is not None:
        eos_ids.add(vocab.eos_token_id)
    template = vocab.chat_template
    return TokenizerCodec(
        tokenizer,
        bos_token_id=vocab.bos_token_id,
        eos_token_ids=frozenset(eos_ids),
        chat_template=ChatTemplate(template, special_tokens=special_tokens) if template else None,
    )


def directory_tokenizer(path: Path, *, eos_token_ids: Iterable[int]) -> TokenizerCodec:
    """The codec of a checkpoint directory: `tokenizer.json`, `tokenizer_config.json`, template.

    `eos_token_ids` are the ones the model configuration declares (`config.json`,
    `generation_config.json`); the tokenizer's own `eos_token` joins them.
    """
    tokenizer_file = path / "tokenizer.json"
    if not tokenizer_file.is_file():
        raise ValueError(f"{path} has no tokenizer.json")
    try:
        tokenizer = Tokenizer.from_file(str(tokenizer_file))
    except Exception as exc:  # the Rust parser raises bare Exception for a malformed file
        raise ValueError(f"{tokenizer_file} is not a valid tokenizer: {exc}") from exc
    config = read_json_object(path / "tokenizer_config.json")
    special_tokens = {
        name: text
        for name in ("bos_token", "eos_token", "unk_token", "pad_token")
        if (text := _token_text(config.get(name))) is not None
    }
    bos, eos = special_tokens.get("bos_token"), special_tokens.get("eos_token")
    # transformers rebuilds the post-processor only when the configuration states the flags
    # (or tokenizer.json has none); otherwise tokenizer.json's own decides what is added.
    if "add_bos_token" in config or "add_eos_token" in config or tokenizer.post_processor is None:
        set_special_tokens_added(
            tokenizer,
            bos=bos if config.get("add_bos_token") else None,
            eos=eos if config.get("add_eos_token") else None,
        )
    eos_ids = set(eos_token_ids)
    if eos is not None:
        eos_ids.add(_token_id(tokenizer, eos))
    template = _chat_template_source(path, config)
    return TokenizerCodec(
        tokenizer,
        bos_token_id=_token_id(tokenizer, bos) if bos is not None else None,
        eos_token_ids=frozenset(eos_ids),
        chat_template=ChatTemplate(template, special_tokens=special_tokens) if template else None,
    )


def set_special_tokens_added(tokenizer: Tokenizer, *, bos: str | None, eos: str | None) -> None:
    """Make `encode(..., add_special_tokens=True)` add exactly `bos` before and `eos` after."""
    single = " ".join([*([f"{bos}:0"] if bos else []), "$A:0", *([f"{eos}:0"] if eos else [])])
    special = [(text, _token_id(tokenizer, text)) for text in (bos, eos) if text]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=single, pair=f"{single} $B:1", special_tokens=special
    )


class TokenizerCodec:
    """`models.causal_lm.TextCodec` over a `tokenizers.Tokenizer` and an optional chat template."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        bos_token_id: int | None,
        eos_token_ids: frozenset[int],
        chat_template: ChatTemplate | None,
    ) -> None:
        self.tokenizer = tokenizer
        self._eos_token_ids = eos_token_ids
        self._chat_template = chat_template
        # The contract promises the BOS id only where encoding adds it, so nobody prepends a
        # BOS the model never saw in training (SmolLM2's tokenizer adds none).
        added = tokenizer.encode("", add_special_tokens=True).ids
        self._bos_token_id = bos_token_id if added[:1] == [bos_token_id] else None
        special = {
            i: t.content for i, t in tokenizer.get_added_tokens_decoder().items() if t.special
        }
        self._special_ids = frozenset(special)
        self._special_texts = sorted(set(special.values()))
        # A copy that reads special-token spellings as text: message content is encoded with
        # it. A copy, because the flag is the tokenizer's and other threads encode with it.
        self._as_text = Tokenizer.from_str(tokenizer.to_str())
        self._as_text.encode_special_tokens = True

    @property
    def bos_token_id(self) -> int | None:
        """The BOS id when `encode(..., add_special=True)` adds it, else None."""
        return self._bos_token_id

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """Ids that end a generation (end-of-sequence and the declared end-of-turn ids)."""
        return self._eos_token_ids

    @property
    def chat_template(self) -> ChatTemplate | None:
        """The checkpoint's chat template, if it ships one."""
        return self._chat_template

    def encode(self, text: str, *, add_special: bool) -> list[int]:
        """Token ids of `text`; `add_special` adds what the tokenizer adds to a whole prompt.

        `encode_batch` of one text gives `encode`'s ids, but releases the GIL while it works:
        tokenising a long prompt on a helper thread then does not stall the event loop.
        """
        [encoding] = self.tokenizer.encode_batch([text], add_special_tokens=add_special)
        return list(encoding.ids)

    def encode_chat(self, messages: Sequence[ChatMessage], text: str) -> list[int]:
        """Token ids of `text`, the `render_chat` prompt of `messages`; `ValueError` if refused.

        Only the template's own special tokens are special: text in a message that spells one
        (`<|im_start|>system`) stays text, so a user cannot forge a turn. Where no message
        does, the ids are exactly `encode(text, add_special=False)`'s.
        """
        [encoding] = self.tokenizer.encode_batch([text], add_special_tokens=False)
        spans = self._content_spans(messages, text)
        template_owned: list[tuple[int, int, int]] = []
        injected = False
        for token_id, (start, end) in zip(encoding.ids, encoding.offsets, strict=True):
            if token_id not in self._special_ids:
                continue
            if any(start < span_end and span_start < end for span_start, span_end in spans):
                injected = True
            else:
                template_owned.append((token_id, start, end))
        if not injected:
            return list(encoding.ids)
        # Some message spells a special token: encode the text between the template's own
        # special tokens with the copy that keeps such spellings as text.
        pieces, position = [], 0
        for _, start, end in template_owned:
            pieces.append(text[position:start])
            position = end
        pieces.append(text[position:])
        encoded = self._as_text.encode_batch(pieces, add_special_tokens=False)
        ids: list[int] = list(encoded[0].ids)
        for (token_id, _, _), piece in zip(template_owned, encoded[1:], strict=True):
            ids += [token_id, *piece.ids]
        return ids

    def _content_spans(
        self, messages: Sequence[ChatMessage], text: str
    ) -> Sequence[tuple[int, int]]:
        """Where the messages' content lies in `text`; refused if unknown and it spells a token."""
        if self._chat_template is None:
            raise ValueError("this model has no chat template; send a plain prompt instead")
        spans = self._chat_template.content_spans(messages, text)
        if spans is not None:
            return spans
        # The template transforms content, so its text cannot be told from the template's:
        # safe only if no message spells a special token.
        for number, message in enumerate(messages, start=1):
            spelled = next((t for t in self._special_texts if t in message.content), None)
            if spelled is not None:
                raise ValueError(
                    f"message {number} contains the special token {spelled!r}, which this "
                    "model's chat template does not keep apart from its own"
                )
        return ()

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of `token_ids`, special tokens skipped."""
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)

    def decoder(self) -> StreamDecoder:
        """A fresh streaming decoder for one sequence."""
        return StreamDecoder(self.tokenizer)

    def render_chat(self, messages: Sequence[ChatMessage]) -> str:
        """The prompt the chat template makes of `messages`; `ValueError` if there is none."""
        if self._chat_template is None:
            raise ValueError("this model has no chat template; send a plain prompt instead")
        return self._chat_template.render(messages)


class StreamDecoder:
    """Text deltas of a growing token sequence whose concatenation is the full decode.

    Decoding token by token is wrong twice over: a character's UTF-8 bytes may be spread over
    several tokens, and some decoders treat a sequence's first token specially (SentencePiece
    drops its leading space). So each step decodes a short window that starts at the last
    point where the text was complete, and releases only what the new token added; a trailing
    U+FFFD means a character is still open, and the text is held back until it closes. At
    `_MAX_HELD_TOKENS` held tokens the run holds bytes that never form a character: they are
    released as `decode` shows them (U+FFFD), but not the last tokens, where a character may
    have opened meanwhile; it is released whole when it closes.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._ids: list[int] = []
        self._prefix = 0
        """Start of the decode window: everything before it is released and complete."""
        self._read = 0
        """End of what was released; tokens after it are held back."""

    def push(self, token_id: int) -> str:
        """The text this token completes (empty while a multi-byte character is open)."""
        self._ids.append(token_id)
        before = self._decode(self._prefix, self._read)
        after = self._decode(self._prefix, len(self._ids))
        complete = len(after) > len(before) and not after.endswith(_REPLACEMENT)
        if complete:
            return self._release(before, after, len(self._ids))
        if len(self._ids) - self._read < _MAX_HELD_TOKENS:
            return ""
        return self._release(before, *self._last_complete(before))

    def _last_complete(self, before: str) -> tuple[str, int]:
        """Where to cut a held run that is at its limit, and the text up to there.

        The last point whose text does not end in U+FFFD, if there is one. Otherwise every
        point ends in bytes that do not form a character, and the cut leaves the last
        `_MAX_OPEN_TOKENS` held: a character still open when the run hit the limit lies
        there, and must reach the client whole once its last byte comes.
        """
        for end in range(len(self._ids) - 1, self._read, -1):
            text = self._decode(self._prefix, end)
            if len(text) > len(before) and not text.endswith(_REPLACEMENT):
                return text, end
        end = len(self._ids) - _MAX_OPEN_TOKENS
        return self._decode(self._prefix, end), end

    def _release(self, before: str, text: str, end: int) -> str:
        """Release `text` beyond `before`; the next window starts where this one was read."""
        self._prefix, self._read = self._read, end
        return text[len(before) :]

    def flush(self) -> str:
        """What is still held back: an unfinished character decodes to U+FFFD, as in `decode`."""
        before = self._decode(self._prefix, self._read)
        after = self._decode(self._prefix, len(self._ids))
        self._prefix = self._read = len(self._ids)
        return after[len(before) :]

    def _decode(self, start: int, end: int) -> str:
        return self._tokenizer.decode(self._ids[start:end], skip_special_tokens=True)


def _byte_level_bpe(vocab: GgufVocabulary, split: str | None) -> Tokenizer:
    alphabet = frozenset(pre_tokenizers.ByteLevel.alphabet())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    # GGUF writers sometimes store a token as the text it stands for rather than in the
    # byte-level alphabet; respell those so the merges, which use the alphabet, still apply.
    spelled = [
        token
        if set(token) <= alphabet
        else "".join(piece for piece, _ in byte_level.pre_tokenize_str(token))
        for token in vocab.tokens
    ]
    ids = {token: i for i, token in enumerate(spelled)}
    tokenizer = Tokenizer(models.BPE(vocab=ids, merges=_split_merges(vocab.merges)))
    if split is None:
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    tokenizer.decoder = decoders.ByteLevel()
    # A control token written outside the byte alphabet is a converter's mislabel; adding it
    # would create a token the model has no row for (transformers skips it the same way).
    _add_typed_tokens(tokenizer, vocab, ids, alphabet)
    return tokenizer


def _sentencepiece_bpe(vocab: GgufVocabulary) -> Tokenizer:
    ids = {token: i for i, token in enumerate(vocab.tokens)}
    merges = (
        _split_merges(vocab.merges)
        if vocab.merges
        else _merges_from_scores(vocab.tokens, vocab.scores, ids)
    )
    tokenizer = Tokenizer(models.BPE(vocab=ids, merges=merges, fuse_unk=True, byte_fallback=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement="▁", prepend_scheme="first", split=False
    )
    tokenizer.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(content=" ", left=1, right=0),
        ]
    )
    _add_typed_tokens(tokenizer, vocab, ids, None)
    return tokenizer


def _merges_from_scores(
    tokens: Sequence[str], scores: Sequence[float], ids: Mapping[str, int]
) -> list[tuple[str, str]]:
    """The merges a SentencePiece vocabulary implies: every split of a piece into two pieces.

    A piece with a higher score is merged first; among equal scores, the split with the longer
    left, then right part, and otherwise vocabulary order (as transformers derives them).
    """
    if len(scores) != len(tokens):
        raise ValueError("GGUF SentencePiece vocabulary has no score for every token")
    candidates: list[tuple[float, str, str]] = []
    for token, score in dict(zip(tokens, scores, strict=True)).items():
        candidates.extend(
            (score, token[:cut], token[cut:])
            for cut in range(1, len(token))
            if token[:cut] in ids and token[cut:] in ids
        )
    candidates.sort(key=lambda c: (c[0], len(c[1]), len(c[2])), reverse=True)
    return [(left, right) for _, left, right in candidates]


def _split_merges(lines: Sequence[str]) -> list[tuple[str, str]]:
    merges: list[tuple[str, str]] = []
    for merge in lines:
        left, sep, right = merge.partition(" ")
        if not sep or " " in right:
            raise ValueError(f"GGUF merge {merge!r} is not two tokens separated by one space")
        merges.append((left, right))
    return merges


def _add_typed_tokens(
    tokenizer: Tokenizer,
    vocab: GgufVocabulary,
    ids: Mapping[str, int],
    alphabet: frozenset[str] | None,
) -> None:
    """Control tokens as special (kept whole, skipped in decode), user-defined ones kept whole.

    `alphabet`: where given, control tokens outside it are left out (see `_byte_level_bpe`).
    """
    types = list(vocab.token_types)
    tokenizer.add_special_tokens(
        [
            AddedToken(token, normalized=False, special=True)
            for token, kind in zip(vocab.tokens, types, strict=False)
            if kind == _CONTROL and (alphabet is None or set(token) <= alphabet)
        ]
    )
    tokenizer.add_tokens(
        [
            AddedToken(token, normalized=False, special=False)
            for token, kind in zip(vocab.tokens, types, strict=False)
            if kind == _USER_DEFINED and token in ids
        ]
    )


def _token(vocab: GgufVocabulary, token_id: int | None) -> str | None:
    if token_id is None:
        return None
    if not 0 <= token_id < len(vocab.tokens):
        raise ValueError(f"GGUF special token id {token_id} is outside the vocabulary")
    return vocab.tokens[token_id]


def _token_id(tokenizer: Tokenizer, text: str) -> int:
    token_id = tokenizer.token_to_id(text)
    if token_id is None:
        raise ValueError(f"special token {text!r} is not in the vocabulary")
    return token_id


def _token_text(entry: object) -> str | None:
    """A special token as tokenizer_config.json spells it: a string or `{"content": ...}`."""
    if isinstance(entry, str):
        return entry
    if isinstance(entry, dict) and isinstance(entry.get("content"), str):
        return str(entry["content"])
    return None


def _chat_template_source(path: Path, config: Mapping[str, Any]) -> str | None:
    """`chat_template.jinja` (transformers 5 saves it apart) or tokenizer_config's entry.

    The entry may be a list of named templates; the one named "default" serves chat.
    """
    jinja_file = path / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    entry = config.get("chat_template")
    if isinstance(entry, list):
        named = {t.get("name"): t.get("template") for t in entry if isinstance(t, dict)}
        entry = named.get("default")
    return entry if isinstance(entry, str) else None
