"""The paged KV pool and the per-step plan of where every token's keys and values live.

The pool is allocated once: per layer one key and one value tensor
`[num_blocks, block_size, kv_heads, head_dim]`. A sequence owns a list of block ids (its block
table, chosen by the engine); position `p` lives in block `block_table[p // block_size]`, slot
`p % block_size`. Blocks need not be contiguous or in order, and two sequences may list the
same block (a shared prompt prefix), so nothing here assumes who owns what.

Writing uses the pool as a flat `[num_blocks * block_size, kv_heads, head_dim]` matrix and one
`index_copy_` of all the step's new rows (slot = block * block_size + offset). Reading gathers
whole blocks: one `index_select` over the block dimension copies `block_size * kv_heads *
head_dim` contiguous elements per block, and the result `[batch, blocks, block_size, ...]`
views as `[batch, blocks * block_size, kv_heads, head_dim]` without another copy, then as the
`[batch, kv_heads, length, head_dim]` that attention wants by a transpose (strides only).
Keeping the token axis outside the head axis is what makes both of those free; a
`[blocks, kv_heads, block_size, head_dim]` layout would need a copy after every gather.

`plan_step` turns a `StepInput` into index tensors once per step, so the 30-odd layers reuse
them: decode rows (one new token each) are put first, sorted by context length, and attend
in as few padded batches as pays (one, unless lengths differ widely); each prefill chunk
follows as its own contiguous run of rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from fleetserve_runtime.models.causal_lm import SeqChunk, StepInput

__all__ = [
    "DECODE_GROUP_OVERHEAD",
    "DecodeBatch",
    "PagedKVCache",
    "PrefillChunk",
    "ForwardBatch",
    "group_by_length",
    "plan_step",
]


class PagedKVCache:
    """Preallocated per-layer key and value pages; the model reads and writes them by slot."""

    def __init__(
        self,
        *,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(
                f"a KV pool needs at least one block of one slot "
                f"(num_blocks={num_blocks}, block_size={block_size})"
            )
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.dtype = dtype
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        # Zero-filled so padded (masked) key positions hold finite numbers: a masked score is
        # dropped by the softmax, but a NaN in a value row would still poison the sum.
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self._block_elements = block_size * num_kv_heads * head_dim
        self._gathered_keys = torch.empty(0, self._block_elements, dtype=dtype, device=device)
        self._gathered_values = torch.empty_like(self._gathered_keys)

    def write(
        self, layer: int, slots: torch.Tensor, keys: torch.Tensor, values: torch.Tensor
    ) -> None:
        """Store `[n, kv_heads, head_dim]` keys and values at `n` flat slot indices."""
        flat_shape = (-1, *self.keys[layer].shape[2:])
        self.keys[layer].view(flat_shape).index_copy_(0, slots, keys)
        self.values[layer].view(flat_shape).index_copy_(0, slots, values)

    @property
    def scratch_bytes(self) -> int:
        """Bytes the gather scratch buffer holds now (it only grows, to the largest gather)."""
        scratch = (self._gathered_keys, self._gathered_values)
        return sum(t.numel() * t.element_size() for t in scratch)

    def gather(self, layer: int, blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values `[batch, kv_heads, n * block_size, head_dim]` of `[batch, n]` blocks.

        Rows past a sequence's length hold whatever the block holds; the caller masks them.
        The result views a scratch buffer that the next `gather` overwrites: it is reused
        because a fresh multi-megabyte tensor per layer costs more in page faults than the
        copy itself.
        """
        batch, count = blocks.shape
        flat = blocks.reshape(-1)
        length = count * self.block_size
        keys, values = self.keys[layer], self.values[layer]
        if self._gathered_keys.shape[0] < flat.shape[0]:
            self._gathered_keys = keys.new_empty(flat.shape[0], self._block_elements)
            self._gathered_values = values.new_empty(flat.shape[0], self._block_elements)
        k_out = self._gathered_keys[: flat.shape[0]]
        v_out = self._gathered_values[: flat.shape[0]]
        # Rows of a 2-D view are copied as one run per block; on the 4-D tensor the CPU kernel
        # walks them element by element, about ten times slower.
        torch.index_select(keys.view(self.num_blocks, -1), 0, flat, out=k_out)
        torch.index_select(values.view(self.num_blocks, -1), 0, flat, out=v_out)
        head_shape = keys.shape[2:]
        k = k_out.view(batch, length, *head_shape).transpose(1, 2)
        v = v_out.view(batch, length, *head_shape).transpose(1, 2)
        return k, v


@dataclass(frozen=True, slots=True)
class DecodeBatch:
    """Single-token chunks of similar length, which attend together as one padded batch."""

    row: int
    """First row of the batch in the step's token matrix."""
    size: int
    """Number of decode rows: rows `row .. row + size - 1`."""
    blocks: torch.Tensor
    """`[size, max_blocks]` int64 block ids per row, padded with block 0."""
    key_mask: torch.Tensor
    """`[size, 1, 1, max_blocks * block_size]` additive mask in the pool's dtype: 0 where the
    row may attend, -inf past its length (the CPU attention kernel is faster with it than
    with a bool mask)."""


@dataclass(frozen=True, slots=True)
class PrefillChunk:
    """A multi-token chunk: rows `row .. row + length - 1` of the step's token matrix."""

    row: int
    length: int
    start_pos: int
    """Cached positions before the chunk; 0 means the chunk attends only to itself."""
    blocks: torch.Tensor
    """`[1, n]` int64 blocks covering positions `0 .. start_pos + length - 1`."""
    causal_mask: torch.Tensor | None
    """`[length, n * block_size]` bool when `start_pos > 0`; None when plain causal suffices."""


@dataclass(frozen=True, slots=True)
class ForwardBatch:
    """Index tensors for one step, computed once and shared by every layer."""

    token_ids: torch.Tensor
    """`[T]` int64, decode rows first, then each prefill chunk's tokens in order."""
    positions: torch.Tensor
    """`[T]` int64 position of each token in its sequence."""
    slots: torch.Tensor
    """`[T]` int64 flat pool slot each token's key and value are written to."""
    decodes: tuple[DecodeBatch, ...]
    """The decode rows, shortest context first, in groups of similar length."""
    prefills: tuple[PrefillChunk, ...]
    logit_rows: torch.Tensor
    """int64 rows whose logits the step returns, in the step's chunk order: each chunk's
    last token's, or every token's of a chunk with `all_logits`."""


def _check_chunk(chunk: SeqChunk, block_size: int, num_blocks: int) -> int:
    """Validate one chunk and return how many blocks its attention spans."""
    if not chunk.token_ids:
        raise ValueError("a step chunk needs at least one token")
    if chunk.start_pos < 0:
        raise ValueError(f"start_pos must be >= 0, got {chunk.start_pos}")
    needed = -(-(chunk.start_pos + len(chunk.token_ids)) // block_size)
    if len(chunk.block_table) < needed:
        raise ValueError(
            f"block_table has {len(chunk.block_table)} blocks, but positions up to "
            f"{chunk.start_pos + len(chunk.token_ids)} need {needed} of {block_size} slots"
        )
    used = chunk.block_table[:needed]
    if min(used) < 0 or max(used) >= num_blocks:
        raise ValueError(f"block ids must lie in 0..{num_blocks - 1}, got {list(used)}")
    return needed


def _slots(chunk: SeqChunk, block_size: int) -> list[int]:
    table = chunk.block_table
    return [
        table[p // block_size] * block_size + p % block_size
        for p in range(chunk.start_pos, chunk.start_pos + len(chunk.token_ids))
    ]


def group_by_length(lengths: Sequence[int], overhead: int) -> list[int]:
    """Where to cut ascending `lengths` into padded groups so attention does least work.

    A group costs `size * longest` padded key positions plus `overhead` (the fixed price of
    one more gather and attention call, in key positions); returns each group's end index.
    Exact by dynamic programming over the sorted lengths, O(n²) for n decode rows.
    """
    best = [0] + [0] * len(lengths)
    cut = [0] * (len(lengths) + 1)
    for end in range(1, len(lengths) + 1):
        options = (
            (best[start] + (end - start) * lengths[end - 1] + overhead, start)
            for start in range(end)
        )
        best[end], cut[end] = min(options)
    ends = []
    end = len(lengths)
    while end:
        ends.append(end)
        end = cut[end]
    return ends[::-1]


def _decode_batch(
    chunks: Sequence[SeqChunk],
    spans: Sequence[int],
    row: int,
    cache: PagedKVCache,
    device: torch.device,
) -> DecodeBatch:
    width = max(spans)
    table = [
        list(c.block_table[:n]) + [0] * (width - n) for c, n in zip(chunks, spans, strict=True)
    ]
    lengths = torch.tensor([c.start_pos + 1 for c in chunks], device=device)
    padding = torch.arange(width * cache.block_size, device=device) >= lengths[:, None]
    key_mask = torch.zeros(padding.shape, dtype=cache.dtype, device=device)
    key_mask.masked_fill_(padding, float("-inf"))
    return DecodeBatch(
        row=row,
        size=len(chunks),
        blocks=torch.tensor(table, dtype=torch.int64, device=device),
        key_mask=key_mask[:, None, None, :],
    )


def _prefill_chunk(
    chunk: SeqChunk, row: int, span: int, block_size: int, device: torch.device
) -> PrefillChunk:
    length = len(chunk.token_ids)
    mask = None
    if chunk.start_pos > 0:
        # Query i sits at position start_pos + i and may see every key up to that position.
        keys = torch.arange(span * block_size, device=device)
        queries = torch.arange(chunk.start_pos, chunk.start_pos + length, device=device)
        mask = keys[None, :] <= queries[:, None]
    return PrefillChunk(
        row=row,
        length=length,
        start_pos=chunk.start_pos,
        blocks=torch.tensor([list(chunk.block_table[:span])], dtype=torch.int64, device=device),
        causal_mask=mask,
    )


DECODE_GROUP_OVERHEAD = 128
"""Key positions one more decode group must save to pay for itself. Measured on one CPU core
with SmolLM2 and 32 decode rows of contexts 20-650: one padded batch took 313 ms a step, any
overhead from 0 to 256 about 205 ms; the middle of that flat range is taken."""


def plan_step(
    step: StepInput,
    cache: PagedKVCache,
    device: torch.device,
    *,
    decode_group_overhead: int = DECODE_GROUP_OVERHEAD,
) -> ForwardBatch:
    """Lay out a step's tokens (decode rows first) and the pool indices every layer uses.

    Decode rows are sorted by context length and split into padded groups where that saves
    attention work (`group_by_length`), so one long context does not make every short one
    attend over its padding.

    Raises:
        ValueError: a chunk is empty, or its block table does not cover its positions or
            names a block outside the pool.
    """
    if not step.chunks:
        raise ValueError("a step needs at least one chunk")
    bs = cache.block_size
    spans = [_check_chunk(c, bs, cache.num_blocks) for c in step.chunks]
    decode_ids = sorted(
        (i for i, c in enumerate(step.chunks) if len(c.token_ids) == 1), key=spans.__getitem__
    )
    prefill_ids = [i for i, c in enumerate(step.chunks) if len(c.token_ids) > 1]
    tokens: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    rows_of: list[range] = [range(0)] * len(step.chunks)
    prefills: list[PrefillChunk] = []
    for i in decode_ids + prefill_ids:
        chunk = step.chunks[i]
        row = len(tokens)
        if len(chunk.token_ids) > 1:
            prefills.append(_prefill_chunk(chunk, row, spans[i], bs, device))
        tokens.extend(chunk.token_ids)
        positions.extend(range(chunk.start_pos, chunk.start_pos + len(chunk.token_ids)))
        slots.extend(_slots(chunk, bs))
        rows_of[i] = range(row if chunk.all_logits else len(tokens) - 1, len(tokens))
    decode_spans = [spans[i] for i in decode_ids]
    decodes = []
    start = 0
    for end in group_by_length([n * bs for n in decode_spans], decode_group_overhead):
        chunks = [step.chunks[i] for i in decode_ids[start:end]]
        decodes.append(_decode_batch(chunks, decode_spans[start:end], start, cache, device))
        start = end
    return ForwardBatch(
        token_ids=torch.tensor(tokens, dtype=torch.int64, device=device),
        positions=torch.tensor(positions, dtype=torch.int64, device=device),
        slots=torch.tensor(slots, dtype=torch.int64, device=device),
        decodes=tuple(decodes),
        prefills=tuple(prefills),
        logit_rows=torch.tensor(
            [row for rows in rows_of for row in rows], dtype=torch.int64, device=device
        ),
    )
