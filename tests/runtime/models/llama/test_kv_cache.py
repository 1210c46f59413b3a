"""The paged KV pool stores rows by slot and gathers a sequence's pages back in position order.

No model here: the pool and the step plan are checked with small hand-made tensors.
"""

from __future__ import annotations

import pytest
import torch

from fleetserve_runtime.models.causal_lm import KVLayout, SeqChunk, StepInput
from fleetserve_runtime.models.llama.kv_cache import PagedKVCache, group_by_length, plan_step

CPU = torch.device("cpu")


def make_cache(num_blocks: int = 8, block_size: int = 4) -> PagedKVCache:
    return PagedKVCache(
        num_layers=2,
        num_blocks=num_blocks,
        block_size=block_size,
        num_kv_heads=2,
        head_dim=3,
        dtype=torch.float32,
        device=CPU,
    )


def rows(count: int, offset: float = 0.0) -> torch.Tensor:
    """`[count, 2, 3]` rows whose values name their position: row p is all p + offset."""
    return (torch.arange(count, dtype=torch.float32) + offset)[:, None, None].expand(count, 2, 3)


def test_written_positions_come_back_in_order_from_shuffled_blocks() -> None:
    """Positions written through a non-contiguous block table gather back in position order."""
    cache = make_cache()
    table = [5, 2, 7]
    chunk = SeqChunk(token_ids=list(range(10)), start_pos=0, block_table=table)
    plan = plan_step(StepInput(chunks=[chunk]), cache, CPU)
    cache.write(1, plan.slots, rows(10), rows(10, offset=100.0))

    keys, values = cache.gather(1, torch.tensor([table]))

    assert keys.shape == (1, 2, 12, 3)
    assert torch.equal(keys[0, :, :10], rows(10).transpose(0, 1))
    assert torch.equal(values[0, :, :10], rows(10, offset=100.0).transpose(0, 1))
    assert cache.keys[1][5, 0, 0, 0].item() == 0.0
    assert cache.keys[1][2, 0, 0, 0].item() == 4.0
    assert cache.keys[1][7, 1, 0, 0].item() == 9.0
    assert torch.count_nonzero(cache.keys[0]) == 0, "another layer's pages were touched"


def test_gather_bytes_bounds_the_scratch_a_decode_batch_allocates() -> None:
    """The layout's `gather_bytes` is what gathering that many padded contexts allocates."""
    cache = make_cache(num_blocks=16, block_size=4)
    layout = KVLayout(num_layers=2, num_kv_heads=2, head_dim=3, dtype_bytes=4)
    assert layout.gather_bytes(4, 3, 10) == 2 * 3 * 3 * (4 * 2 * 3) * 4
    assert cache.scratch_bytes == 0
    cache.gather(0, torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 9]]))
    assert cache.scratch_bytes == layout.gather_bytes(4, 3, 10)
    cache.gather(1, torch.tensor([[1], [4]]))
    assert cache.scratch_bytes == layout.gather_bytes(4, 3, 10), "a smaller gather reuses it"


def test_a_later_chunk_continues_the_same_pages() -> None:
    """A chunk at start_pos > 0 writes after the cached positions, into the right slots."""
    cache = make_cache()
    first = SeqChunk(token_ids=[1, 2, 3], start_pos=0, block_table=[6, 1])
    second = SeqChunk(token_ids=[4, 5, 6], start_pos=3, block_table=[6, 1])
    cache.write(0, plan_step(StepInput([first]), cache, CPU).slots, rows(3), rows(3))
    cache.write(0, plan_step(StepInput([second]), cache, CPU).slots, rows(3, 3.0), rows(3, 3.0))

    keys, _ = cache.gather(0, torch.tensor([[6, 1]]))

    assert torch.equal(keys[0, :, :6], rows(6).transpose(0, 1))


def test_plan_puts_decode_rows_first_and_keeps_logit_rows_in_chunk_order() -> None:
    """Decode chunks become rows 0..B-1; logit_rows still follow the step's chunk order."""
    cache = make_cache(num_blocks=16)
    chunks = [
        SeqChunk(token_ids=[10, 11, 12], start_pos=0, block_table=[3]),
        SeqChunk(token_ids=[20], start_pos=5, block_table=[4, 9]),
        SeqChunk(token_ids=[30, 31], start_pos=2, block_table=[8]),
        SeqChunk(token_ids=[40], start_pos=0, block_table=[1]),
    ]
    plan = plan_step(StepInput(chunks), cache, CPU)

    assert plan.token_ids.tolist() == [40, 20, 10, 11, 12, 30, 31]
    assert plan.positions.tolist() == [0, 5, 0, 1, 2, 2, 3]
    assert plan.slots.tolist() == [1 * 4, 9 * 4 + 1, 12, 13, 14, 8 * 4 + 2, 8 * 4 + 3]
    assert plan.logit_rows.tolist() == [4, 1, 6, 0]
    (decode,) = plan.decodes
    assert (decode.row, decode.size) == (0, 2)
    assert decode.blocks.tolist() == [[1, 0], [4, 9]]
    allowed = decode.key_mask[:, 0, 0, :] == 0
    assert allowed.tolist() == [[True] + [False] * 7, [True] * 6 + [False] * 2]
    first, second = plan.prefills
    assert (first.row, first.length, first.causal_mask) == (2, 3, None)
    assert (second.row, second.length, second.start_pos) == (5, 2, 2)
    assert second.causal_mask is not None
    assert second.causal_mask.tolist() == [
        [True, True, True, False],
        [True, True, True, True],
    ]


@pytest.mark.parametrize(
    ("lengths", "overhead", "ends"),
    [
        ([16, 16, 16, 320, 320], 100, [3, 5]),
        ([16, 16, 16, 320, 320], 10_000, [5]),
        ([16, 32, 48], 0, [1, 2, 3]),
        ([16, 16], 0, [2]),
        ([], 0, []),
    ],
)
def test_decode_rows_split_where_padding_costs_more_than_a_group(
    lengths: list[int], overhead: int, ends: list[int]
) -> None:
    """Groups minimise padded key positions plus a per-group overhead."""
    assert group_by_length(lengths, overhead) == ends


def test_all_logits_chunks_return_every_row_in_chunk_order() -> None:
    """A chunk asking for all its logits (prompt log-probabilities) gets each token's row."""
    cache = make_cache(num_blocks=16)
    chunks = [
        SeqChunk(token_ids=[10, 11, 12], start_pos=0, block_table=[3], all_logits=True),
        SeqChunk(token_ids=[20], start_pos=5, block_table=[4, 9]),
        SeqChunk(token_ids=[30, 31], start_pos=2, block_table=[8]),
        SeqChunk(token_ids=[40], start_pos=0, block_table=[1], all_logits=True),
    ]
    plan = plan_step(StepInput(chunks), cache, CPU)

    assert plan.logit_rows.tolist() == [2, 3, 4, 1, 6, 0]


def test_plan_groups_decode_rows_by_context_length() -> None:
    """Short and long decode rows attend in separate padded batches, shortest first."""
    cache = make_cache(num_blocks=64, block_size=4)
    long_table, short_table = list(range(10, 50)), [3]
    chunks = [
        SeqChunk(token_ids=[1], start_pos=150, block_table=long_table),
        SeqChunk(token_ids=[2], start_pos=1, block_table=short_table),
        SeqChunk(token_ids=[3], start_pos=2, block_table=short_table),
    ]
    plan = plan_step(StepInput(chunks), cache, CPU, decode_group_overhead=16)

    assert plan.token_ids.tolist() == [2, 3, 1]
    assert plan.logit_rows.tolist() == [2, 0, 1]
    short, long = plan.decodes
    assert (short.row, short.size, short.blocks.tolist()) == (0, 2, [[3], [3]])
    assert (long.row, long.size, long.blocks.shape) == (2, 1, (1, 38))
    single = plan_step(StepInput(chunks), cache, CPU, decode_group_overhead=1_000)
    assert [d.size for d in single.decodes] == [3]


@pytest.mark.parametrize(
    ("chunk", "message"),
    [
        (SeqChunk(token_ids=[], start_pos=0, block_table=[0]), "at least one token"),
        (SeqChunk(token_ids=[1, 2], start_pos=3, block_table=[0]), "need 2 of 4 slots"),
        (SeqChunk(token_ids=[1], start_pos=0, block_table=[8]), r"block ids must lie in 0\.\.7"),
        (SeqChunk(token_ids=[1], start_pos=-1, block_table=[0]), "start_pos must be >= 0"),
    ],
)
def test_malformed_chunks_are_refused_with_a_reason(chunk: SeqChunk, message: str) -> None:
    """Bad chunks raise ValueError naming the problem instead of corrupting the pool."""
    with pytest.raises(ValueError, match=message):
        plan_step(StepInput([chunk]), make_cache(), CPU)


def test_an_empty_step_and_an_empty_pool_are_refused() -> None:
    """A step needs a chunk; a pool needs a block."""
    with pytest.raises(ValueError, match="at least one chunk"):
        plan_step(StepInput([]), make_cache(), CPU)
    with pytest.raises(ValueError, match="at least one block"):
        make_cache(num_blocks=0)
