"""A BERT encoder in plain torch, with a packed (padding-free) path for serving.

The packed path keeps every real token of a batch back to back in one `[T, hidden]` matrix,
so the dense layers (fused QKV projection, attention output, feed-forward, LayerNorms), which
are nearly all of the work, never compute on padding. Only the attention itself needs a
rectangle: sequences are packed in groups of similar length, and each group's queries, keys
and values are scattered into its own `[B_g, L_g]` grid, attended with a key mask, and the
real rows gathered back out, so short sequences do not pay for the longest one's attention.

Weights load from a Hugging Face `BertModel` state dict (safetensors), renamed and fused here,
so the runtime needs neither `transformers` nor network access. The last hidden state is
pooled into one sentence embedding as `Pooling` says: the mean of the real tokens or the
first ([CLS]) token's, L2-normalised or not, as sentence-transformers' modules do.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F  # noqa: N812 - the name every torch codebase uses
from torch import nn

__all__ = [
    "AttentionGroup",
    "BertConfig",
    "BertEncoder",
    "GroupPadding",
    "PackedBatch",
    "PaddedBatch",
    "Pooling",
]


@dataclass(frozen=True, slots=True)
class Pooling:
    """How the last hidden state becomes one embedding per sequence."""

    mode: Literal["mean", "cls"] = "mean"
    """`mean` over the real tokens, or the first token's ([CLS]) hidden state."""
    normalize: bool = True
    """L2-normalise the pooled embedding (sentence-transformers' `Normalize` module)."""


@dataclass(frozen=True, slots=True)
class BertConfig:
    """The shape of a BERT encoder, as its Hugging Face `config.json` gives it."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    layer_norm_eps: float

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> BertConfig:
        """Build a config from a parsed `config.json`, refusing variants this encoder lacks.

        Raises:
            ValueError: the config asks for an activation or position scheme not implemented.
        """
        if raw.get("hidden_act", "gelu") != "gelu":
            raise ValueError(f"unsupported hidden_act {raw['hidden_act']!r}; only 'gelu'")
        if raw.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError("only absolute position embeddings are supported")
        return cls(
            vocab_size=int(raw["vocab_size"]),
            hidden_size=int(raw["hidden_size"]),
            num_hidden_layers=int(raw["num_hidden_layers"]),
            num_attention_heads=int(raw["num_attention_heads"]),
            intermediate_size=int(raw["intermediate_size"]),
            max_position_embeddings=int(raw["max_position_embeddings"]),
            layer_norm_eps=float(raw["layer_norm_eps"]),
        )

    @property
    def dense_flops_per_token(self) -> int:
        """Multiply-add FLOPs (2 per MAC) of the dense layers for one token.

        Per layer: the QKV and output projections are four `hidden²` GEMMs and the
        feed-forward two `hidden × intermediate` ones. Attention scores and the weighted sum
        grow with sequence length and are not counted, nor are embeddings, LayerNorms and
        GELU, which are not multiply-adds; the number is therefore the useful work any
        layout must do, whatever it pads.
        """
        h, i = self.hidden_size, self.intermediate_size
        return self.num_hidden_layers * 2 * (4 * h * h + 2 * h * i)


@dataclass(frozen=True, slots=True)
class GroupPadding:
    """Where a group's tokens sit in its padded `[B_g, L_g]` attention grid."""

    grid_index: torch.Tensor
    """`[stop - start]` int64 row of each token in the flattened grid (`slot * L_g + position`)."""
    key_mask: torch.Tensor
    """`[B_g, 1, 1, L_g]` bool, true for real keys."""
    grid: torch.Tensor
    """`[B_g * L_g, 3 * hidden]` scratch, zero-filled so masked keys and values stay finite;
    every layer overwrites the real rows and leaves the padding rows at zero."""


@dataclass(frozen=True, slots=True)
class AttentionGroup:
    """Consecutive packed sequences of similar length that attend in one rectangle."""

    start: int
    """First packed token row of the group."""
    stop: int
    """One past its last packed token row."""
    batch_size: int
    length: int
    """The group's longest sequence, i.e. its grid width `L_g`."""
    padding: GroupPadding | None
    """None when every sequence is `length` long, so the packed rows are the grid."""


@dataclass(frozen=True, slots=True)
class PackedBatch:
    """Real tokens back to back, grouped by length for attention, with pooling indices."""

    input_ids: torch.Tensor
    """`[T]` int64 token ids, sequence after sequence (ordered by group, not batch order)."""
    position_ids: torch.Tensor
    """`[T]` int64 position of each token inside its own sequence."""
    sequence_index: torch.Tensor
    """`[T]` int64 batch slot each token belongs to, so pooling restores batch order."""
    lengths: torch.Tensor
    """`[B, 1]` float32 real length of each sequence in batch order, for mean pooling."""
    groups: tuple[AttentionGroup, ...]


@dataclass(frozen=True, slots=True)
class PaddedBatch:
    """The classic `[B, L]` rectangle with an attention mask."""

    input_ids: torch.Tensor
    """`[B, L]` int64 token ids, padded with the pad id."""
    attention_mask: torch.Tensor
    """`[B, L]` bool, true for real tokens."""


class BertLayer(nn.Module):
    """One post-LayerNorm transformer block with a fused QKV projection."""

    def __init__(self, config: BertConfig) -> None:
        """Create the block with uninitialised weights; `BertEncoder` loads them."""
        super().__init__()
        h = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.head_dim = h // config.num_attention_heads
        self.qkv = nn.Linear(h, 3 * h)
        self.attention_out = nn.Linear(h, h)
        self.attention_norm = nn.LayerNorm(h, eps=config.layer_norm_eps)
        self.ffn_in = nn.Linear(h, config.intermediate_size)
        self.ffn_out = nn.Linear(config.intermediate_size, h)
        self.output_norm = nn.LayerNorm(h, eps=config.layer_norm_eps)

    def _heads(self, qkv: torch.Tensor, batch: int, length: int) -> list[torch.Tensor]:
        """View `[B * L, 3 * hidden]` as three `[B, heads, L, head_dim]` tensors, no copy."""
        return list(
            qkv.view(batch, length, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        )

    def _dense_tail(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        """Attention output projection, feed-forward and both residual LayerNorms."""
        x = self.attention_norm(torch.add(x, self.attention_out(context)))
        hidden = F.gelu(self.ffn_in(x))
        out: torch.Tensor = self.output_norm(torch.add(x, self.ffn_out(hidden)))
        return out

    def _attend(self, rows: torch.Tensor, group: AttentionGroup) -> torch.Tensor:
        """Attend within a group's `[B_g * L_g, 3 * hidden]` rows; returns `[B_g * L_g, hidden]`."""
        q, k, v = self._heads(rows, group.batch_size, group.length)
        mask = None if group.padding is None else group.padding.key_mask
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        # The flash kernels (CPU, CUDA) return a [B, heads, L, d] view of a [B, L, heads, d]
        # buffer, so this reshape is free; after other kernels it is the one copy needed.
        return attended.transpose(1, 2).reshape(group.batch_size * group.length, -1)

    def forward_packed(self, x: torch.Tensor, groups: Sequence[AttentionGroup]) -> torch.Tensor:
        """Run the block on packed `[T, hidden]` tokens; attention runs group by group."""
        qkv = self.qkv(x)
        if len(groups) == 1 and groups[0].padding is None:
            return self._dense_tail(x, self._attend(qkv, groups[0]))
        context = torch.empty_like(x)
        for group in groups:
            rows, out = qkv[group.start : group.stop], context[group.start : group.stop]
            if group.padding is None:
                out.copy_(self._attend(rows, group))
                continue
            padding = group.padding
            padding.grid.index_copy_(0, padding.grid_index, rows)
            torch.index_select(self._attend(padding.grid, group), 0, padding.grid_index, out=out)
        return self._dense_tail(x, context)

    def forward_padded(self, x: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        """Run the block on a padded `[B, L, hidden]` rectangle with a `[B, 1, 1, L]` key mask."""
        batch, length, hidden = x.shape
        q, k, v = self._heads(self.qkv(x), batch, length)
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask)
        context = attended.transpose(1, 2).reshape(batch, length, hidden)
        return self._dense_tail(x, context)


class BertEncoder(nn.Module):
    """BERT embeddings and encoder layers, returning embeddings pooled as `pooling` says."""

    def __init__(self, config: BertConfig, pooling: Pooling = Pooling()) -> None:
        """Create the encoder with uninitialised weights; call `load_hf_state_dict` next."""
        super().__init__()
        self.config = config
        self.pooling = pooling
        h = config.hidden_size
        self.word_embeddings = nn.Embedding(config.vocab_size, h)
        # Every input is a single segment, so token type 0's embedding is folded in here.
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, h)
        self.embedding_norm = nn.LayerNorm(h, eps=config.layer_norm_eps)
        # A typed list to iterate, and a ModuleList so `.to()` and `state_dict()` see them.
        self.blocks = [BertLayer(config) for _ in range(config.num_hidden_layers)]
        self.layers = nn.ModuleList(self.blocks)

    def _embed(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        summed = torch.add(self.word_embeddings(input_ids), self.position_embeddings(position_ids))
        out: torch.Tensor = self.embedding_norm(summed)
        return out

    def forward_packed(self, batch: PackedBatch) -> torch.Tensor:
        """Encode a packed batch; returns `[B, hidden]` sentence embeddings in batch order."""
        x = self._embed(batch.input_ids, batch.position_ids)
        for layer in self.blocks:
            x = layer.forward_packed(x, batch.groups)
        if self.pooling.mode == "cls":
            # Every row but each sequence's first is zeroed, so the sum is that first row:
            # no boolean indexing, which would wait for the device to count the rows.
            x = x * (batch.position_ids == 0).unsqueeze(-1).to(x.dtype)
        pooled = x.new_zeros(batch.lengths.shape[0], x.shape[-1])
        pooled.index_add_(0, batch.sequence_index, x)
        if self.pooling.mode == "mean":
            pooled = pooled / batch.lengths
        return self._finish(pooled)

    def hidden_padded(self, batch: PaddedBatch) -> torch.Tensor:
        """The last hidden state `[B, L, hidden]` of a padded batch, before pooling."""
        input_ids, mask = batch.input_ids, batch.attention_mask
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self._embed(input_ids, positions)
        key_mask = mask[:, None, None, :]
        for layer in self.blocks:
            x = layer.forward_padded(x, key_mask)
        return x

    def forward_padded(self, batch: PaddedBatch) -> torch.Tensor:
        """Encode a padded batch; returns `[B, hidden]` sentence embeddings."""
        x = self.hidden_padded(batch)
        if self.pooling.mode == "cls":
            return self._finish(x[:, 0])
        weights = batch.attention_mask.to(x.dtype).unsqueeze(-1)
        summed = (x * weights).sum(dim=1)
        return self._finish(summed / weights.sum(dim=1))

    def _finish(self, pooled: torch.Tensor) -> torch.Tensor:
        return F.normalize(pooled, dim=-1) if self.pooling.normalize else pooled

    @torch.no_grad()
    def load_hf_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        """Copy weights from a Hugging Face `BertModel` state dict, fusing Q, K and V.

        Raises:
            KeyError: a tensor this encoder needs is missing from `state`.
        """

        def get(name: str) -> torch.Tensor:
            # Checkpoints saved from `BertForX` prefix every key with "bert.".
            return state[name] if name in state else state[f"bert.{name}"]

        self.word_embeddings.weight.copy_(get("embeddings.word_embeddings.weight"))
        self.position_embeddings.weight.copy_(
            get("embeddings.position_embeddings.weight")
            + get("embeddings.token_type_embeddings.weight")[0]
        )
        _copy_affine(self.embedding_norm, get, "embeddings.LayerNorm")
        for index, layer in enumerate(self.blocks):
            prefix = f"encoder.layer.{index}"
            attention = f"{prefix}.attention.self"
            parts = ("query", "key", "value")
            layer.qkv.weight.copy_(torch.cat([get(f"{attention}.{p}.weight") for p in parts]))
            layer.qkv.bias.copy_(torch.cat([get(f"{attention}.{p}.bias") for p in parts]))
            _copy_affine(layer.attention_out, get, f"{prefix}.attention.output.dense")
            _copy_affine(layer.attention_norm, get, f"{prefix}.attention.output.LayerNorm")
            _copy_affine(layer.ffn_in, get, f"{prefix}.intermediate.dense")
            _copy_affine(layer.ffn_out, get, f"{prefix}.output.dense")
            _copy_affine(layer.output_norm, get, f"{prefix}.output.LayerNorm")


def _copy_affine(
    target: nn.Linear | nn.LayerNorm, get: Callable[[str], torch.Tensor], name: str
) -> None:
    target.weight.copy_(get(f"{name}.weight"))
    target.bias.copy_(get(f"{name}.bias"))
