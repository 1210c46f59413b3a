"""Our Llama forward over the paged KV pool agrees with transformers' reference implementation.

Two tiers. A tiny random Llama (built here through transformers, so every variant is cheap)
checks the architecture pieces against the reference logits: RoPE plain and Llama 3 scaled,
grouped-query attention, tied and untied heads, chunked prefill over shuffled pages, and the
errors. The `smollm2` tests load the real SmolLM2-135M checkpoint (once per session, through
our own loader) and check the user's requirement: greedy decoding is token-for-token
transformers' `generate(do_sample=False)` for 22 prompts of 5 to 200 tokens, at batch 1, in
a continuous batch (sequences joining and leaving, prompts prefilled in 7- and 32-token
chunks next to decoding ones) over 4-slot blocks handed out in shuffled order, and when a
second sequence reuses the first one's prefix blocks instead of computing them. The reference
tokens are kept across runs, keyed by their inputs (`tests.runtime.reference_cache`).
"""

from __future__ import annotations

import dataclasses
import inspect
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pytest
import torch
import transformers

from fleetserve_runtime.models.causal_lm import ChatMessage, SeqChunk, StepInput
from fleetserve_runtime.models.llama.config import Checkpoint, LlamaConfig
from fleetserve_runtime.models.llama.kv_cache import DECODE_GROUP_OVERHEAD
from fleetserve_runtime.models.llama.model import (
    LlamaModel,
    default_dtype,
    rope_inverse_frequencies,
)
from tests.runtime.reference_cache import cached_reference, state_dict_sha256

CPU = torch.device("cpu")
NEW_TOKENS = 24

LLAMA3_SCALING: Mapping[str, float | str] = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32.0,
}


pytestmark = pytest.mark.usefixtures("one_thread")


def reference_model(config: LlamaConfig) -> transformers.LlamaForCausalLM:
    """The reference Llama with the same architecture (random weights until loaded)."""
    rope: dict[str, float | str] = {"rope_type": "default", "rope_theta": config.rope_theta}
    if config.rope_scaling is not None:
        rope = {**config.rope_scaling, "rope_theta": config.rope_theta}
    hf_config = transformers.LlamaConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        max_position_embeddings=config.max_position_embeddings,
        rms_norm_eps=config.rms_norm_eps,
        tie_word_embeddings=config.tie_word_embeddings,
        rope_parameters=rope,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    model = transformers.LlamaForCausalLM(hf_config)
    model.train(False)
    return model


def tiny_config(
    *, rope_scaling: Mapping[str, float | str] | None = None, tied: bool = True
) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=96,
        hidden_size=48,
        intermediate_size=80,
        num_layers=2,
        num_heads=6,
        num_kv_heads=2,
        head_dim=8,
        max_position_embeddings=128,
        rms_norm_eps=1e-6,
        # A small base spreads 4 frequencies over all three Llama 3 bands (kept, blended,
        # slowed) for `LLAMA3_SCALING`'s 32-position original context.
        rope_theta=100.0,
        tie_word_embeddings=tied,
        rope_scaling=rope_scaling,
    )


def tiny_pair(
    config: LlamaConfig, *, decode_group_overhead: int = DECODE_GROUP_OVERHEAD
) -> tuple[LlamaModel, transformers.LlamaForCausalLM]:
    torch.manual_seed(0)
    reference = reference_model(config)
    weights = dict(reference.state_dict())
    model = LlamaModel(
        config,
        weights,
        device=CPU,
        dtype=torch.float32,
        decode_group_overhead=decode_group_overhead,
    )
    return model, reference


def reference_logits(
    reference: transformers.LlamaForCausalLM, tokens: Sequence[int]
) -> torch.Tensor:
    with torch.inference_mode():
        logits: torch.Tensor = reference(torch.tensor([list(tokens)])).logits[0]
    return logits


class BlockPool:
    """A free list of block ids, optionally handed out in shuffled order."""

    def __init__(self, num_blocks: int, rng: random.Random | None) -> None:
        self.free = list(range(num_blocks))
        self.rng = rng
        if rng is not None:
            rng.shuffle(self.free)

    def take(self, count: int) -> list[int]:
        """The next `count` free blocks."""
        taken, self.free = self.free[:count], self.free[count:]
        assert len(taken) == count, "the test's pool is too small"
        return taken

    def give_back(self, blocks: Sequence[int]) -> None:
        """Return a finished sequence's blocks to the free list."""
        self.free.extend(blocks)
        if self.rng is not None:
            self.rng.shuffle(self.free)


@dataclass
class Stream:
    """One sequence in the test driver: greedy, `new_tokens` long."""

    prompt: Sequence[int]
    chunk_size: int
    new_tokens: int = NEW_TOKENS
    table: list[int] = field(default_factory=list)
    cached: int = 0
    output: list[int] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)

    @property
    def done(self) -> bool:
        """All `new_tokens` have been sampled."""
        return len(self.output) >= self.new_tokens

    def next_tokens(self) -> Sequence[int]:
        """The next prefill chunk, or the last sampled token once the prompt is cached."""
        if self.cached < len(self.prompt):
            return self.prompt[self.cached : self.cached + self.chunk_size]
        return self.output[-1:]


def step(model: LlamaModel, pool: BlockPool, block_size: int, streams: Sequence[Stream]) -> None:
    """One model step over every stream's next chunk, then greedy sampling where due."""
    chunks = []
    for stream in streams:
        tokens = stream.next_tokens()
        needed = -(-(stream.cached + len(tokens)) // block_size)
        stream.table.extend(pool.take(needed - len(stream.table)))
        chunks.append(SeqChunk(token_ids=tokens, start_pos=stream.cached, block_table=stream.table))
    logits = model.forward(StepInput(chunks=chunks))
    assert logits.shape == (len(streams), model.vocab_size)
    assert logits.dtype == torch.float32
    for stream, chunk, row in zip(streams, chunks, logits, strict=True):
        stream.cached += len(chunk.token_ids)
        stream.logits.append(row)
        if stream.cached >= len(stream.prompt):
            stream.output.append(int(row.argmax()))


def drive(
    model: LlamaModel,
    streams: Sequence[Stream],
    *,
    block_size: int,
    num_blocks: int,
    max_running: int,
    joins_per_step: int,
    rng: random.Random | None,
) -> None:
    """A tiny continuous batcher: join up to `joins_per_step` a step, leave when done."""
    model.allocate_cache(num_blocks, block_size)
    pool = BlockPool(num_blocks, rng)
    waiting, running = list(streams), list[Stream]()
    while waiting or running:
        joining = min(joins_per_step, max_running - len(running), len(waiting))
        running += waiting[:joining]
        waiting = waiting[joining:]
        step(model, pool, block_size, running)
        for stream in [s for s in running if s.done]:
            pool.give_back(stream.table)
            running.remove(stream)


@pytest.mark.parametrize(
    ("rope_scaling", "tied"),
    [(None, True), (LLAMA3_SCALING, True), (None, False)],
    ids=["plain-rope", "llama3-rope", "untied-head"],
)
def test_tiny_model_logits_match_reference_prefill_and_decode(
    rope_scaling: Mapping[str, float | str] | None, tied: bool
) -> None:
    """Chunked prefill over shuffled 4-slot pages, then decode, gives the reference's logits."""
    model, reference = tiny_pair(tiny_config(rope_scaling=rope_scaling, tied=tied))
    tokens = [
        int(t) for t in torch.randint(0, 96, (90,), generator=torch.Generator().manual_seed(1))
    ]
    expected = reference_logits(reference, tokens)
    model.allocate_cache(64, 4)
    table = BlockPool(64, random.Random(3)).take(23)
    start = 0
    for end in [*range(9, 70, 9), 70, *range(71, 91)]:
        chunk = SeqChunk(token_ids=tokens[start:end], start_pos=start, block_table=table)
        (logits,) = model.forward(StepInput(chunks=[chunk]))
        torch.testing.assert_close(logits, expected[end - 1], atol=1e-4, rtol=1e-4)
        start = end


def test_tiny_all_logits_chunks_give_the_reference_logits_of_every_position() -> None:
    """A chunk asking for all its rows (prompt log-probabilities) gets every position's.

    Over two steps of chunked prefill, beside another sequence's prefill and decode: its
    rows come in chunk order, and the other's single row is unchanged.
    """
    model, reference = tiny_pair(tiny_config())
    gen = torch.Generator().manual_seed(4)
    first, second = ([int(t) for t in torch.randint(0, 96, (n,), generator=gen)] for n in (30, 9))
    expected_first = reference_logits(reference, first)
    expected_second = reference_logits(reference, second)
    model.allocate_cache(32, 4)
    table_first, table_second = list(range(8)), list(range(8, 11))
    rows = model.forward(
        StepInput(
            [
                SeqChunk(second[:8], 0, table_second),
                SeqChunk(first[:12], 0, table_first, all_logits=True),
            ]
        )
    )
    assert rows.shape[0] == 1 + 12
    torch.testing.assert_close(rows[0], expected_second[7], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(rows[1:], expected_first[:12], atol=1e-4, rtol=1e-4)
    rows = model.forward(
        StepInput(
            [
                SeqChunk(first[12:], 12, table_first, all_logits=True),
                SeqChunk(second[8:], 8, table_second),
            ]
        )
    )
    assert rows.shape[0] == 18 + 1
    torch.testing.assert_close(rows[:18], expected_first[12:], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(rows[18], expected_second[8], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    "overhead", [0, 1_000_000], ids=["decode-group-per-length", "one-decode-batch"]
)
def test_tiny_mixed_step_matches_reference_per_sequence(overhead: int) -> None:
    """Prefill chunks (fresh and continuing) and decodes of many lengths share steps safely.

    A zero group overhead makes every distinct decode length its own padded batch; a huge
    one keeps all decode rows in one.
    """
    model, reference = tiny_pair(tiny_config(), decode_group_overhead=overhead)
    gen = torch.Generator().manual_seed(2)
    prompts = [
        [int(t) for t in torch.randint(0, 96, (n,), generator=gen)] for n in (1, 3, 17, 40, 5, 64)
    ]
    streams = [
        Stream(prompt=p, chunk_size=size, new_tokens=6)
        for p, size in zip(prompts, (1, 2, 7, 16, 32, 5), strict=True)
    ]
    drive(
        model,
        streams,
        block_size=4,
        num_blocks=80,
        max_running=4,
        joins_per_step=1,
        rng=random.Random(5),
    )
    for stream in streams:
        full = [*stream.prompt, *stream.output[:-1]]
        expected = reference_logits(reference, full)
        torch.testing.assert_close(stream.logits[-1], expected[-1], atol=1e-4, rtol=1e-4)
        assert stream.output == [int(row.argmax()) for row in expected[len(stream.prompt) - 1 :]]


def test_llama3_scaling_changes_only_the_long_wavelengths() -> None:
    """Llama 3 keeps short wavelengths, slows long ones by `factor`, blends those between."""
    plain = rope_inverse_frequencies(tiny_config())
    scaled = rope_inverse_frequencies(tiny_config(rope_scaling=LLAMA3_SCALING))
    assert scaled[0] == plain[0]
    assert torch.allclose(scaled[2:], plain[2:] / 8.0)
    assert plain[1] / 8.0 < scaled[1] < plain[1]


def test_kv_layout_is_what_the_pool_allocates() -> None:
    """`kv_layout.block_bytes` is exactly the pool's bytes per block, for memory sizing."""
    model, _ = tiny_pair(tiny_config())
    model.allocate_cache(10, 4)
    pool_bytes = sum(t.numel() * t.element_size() for t in model.cache.keys + model.cache.values)
    assert pool_bytes == 10 * model.kv_layout.block_bytes(4)
    assert model.kv_layout.dtype_bytes == 4
    assert model.vocab_size == 96


def test_bad_configs_and_steps_are_refused() -> None:
    """Errors name the problem: no pool yet, past the context, heads, RoPE type, weights."""
    model, reference = tiny_pair(tiny_config())
    with pytest.raises(RuntimeError, match="allocate_cache"):
        model.forward(StepInput([SeqChunk(token_ids=[1], start_pos=0, block_table=[0])]))
    model.allocate_cache(40, 4)
    with pytest.raises(ValueError, match="past the model's maximum"):
        model.forward(
            StepInput([SeqChunk(token_ids=[1, 2], start_pos=127, block_table=list(range(33)))])
        )
    weights = dict(reference.state_dict())
    config = tiny_config()
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        LlamaModel(
            dataclasses.replace(config, num_kv_heads=4), weights, device=CPU, dtype=torch.float32
        )
    yarn = dataclasses.replace(config, rope_scaling={"rope_type": "yarn"})
    with pytest.raises(ValueError, match="'yarn'"):
        LlamaModel(yarn, weights, device=CPU, dtype=torch.float32)
    del weights["model.layers.1.mlp.down_proj.weight"]
    with pytest.raises(KeyError, match="down_proj"):
        LlamaModel(config, weights, device=CPU, dtype=torch.float32)


def teacher_forced_logits(model: LlamaModel, sequences: Sequence[Sequence[int]]) -> torch.Tensor:
    """Every step's logits when the sequences are fed, not sampled.

    Each sequence's first half is prefilled in one mixed step, then the rest is decoded one
    known token per step, all sequences together.
    """
    model.allocate_cache(64, 4)
    tables = [list(range(16 * i, 16 * i + 16)) for i in range(len(sequences))]
    halves = [len(s) // 2 for s in sequences]
    chunks = [
        SeqChunk(token_ids=s[:h], start_pos=0, block_table=t)
        for s, h, t in zip(sequences, halves, tables, strict=True)
    ]
    rows = [model.forward(StepInput(chunks))]
    for offset in range(min(len(s) - h for s, h in zip(sequences, halves, strict=True))):
        chunks = [
            SeqChunk(token_ids=[s[h + offset]], start_pos=h + offset, block_table=t)
            for s, h, t in zip(sequences, halves, tables, strict=True)
        ]
        rows.append(model.forward(StepInput(chunks)))
    return torch.cat(rows).cpu()


@pytest.mark.parametrize(
    "device",
    [torch.device("cpu"), pytest.param(torch.device("cuda"), marks=pytest.mark.gpu)],
    ids=["cpu", "cuda"],
)
def test_bf16_model_and_pool_agree_with_fp32(device: torch.device) -> None:
    """In bf16 (CUDA's default; optional on CPU) the pool is bf16 and logits stay close."""
    config = tiny_config()
    fp32_model, reference = tiny_pair(config)
    bf16_model = LlamaModel(
        config, dict(reference.state_dict()), device=device, dtype=torch.bfloat16
    )
    bf16_model.allocate_cache(64, 4)
    assert bf16_model.cache.keys[0].dtype == torch.bfloat16
    assert bf16_model.cache.keys[0].device.type == device.type
    assert bf16_model.kv_layout.dtype_bytes == 2
    gen = torch.Generator().manual_seed(4)
    sequences = [[int(t) for t in torch.randint(0, 96, (n,), generator=gen)] for n in (9, 40, 23)]
    expected = teacher_forced_logits(fp32_model, sequences)
    actual = teacher_forced_logits(bf16_model, sequences)
    assert actual.dtype == torch.float32
    assert actual.shape == expected.shape == (3 * 6, 96)  # the prefill step and 5 decodes
    similarity = torch.nn.functional.cosine_similarity(actual, expected, dim=-1)
    assert similarity.min() > 0.99


def test_default_dtype_is_bf16_on_cuda_only() -> None:
    """fp32 on CPU keeps outputs identical to the fp32 reference; CUDA gets bf16."""
    assert default_dtype(torch.device("cpu")) == torch.float32
    assert default_dtype(torch.device("cuda")) == torch.bfloat16


# --- SmolLM2-135M: the user's token-for-token requirement --------------------------------

CORPUS = (
    "The lighthouse keeper climbed the spiral stairs every evening at dusk, counting the steps "
    "as his father had taught him. There were one hundred and twelve of them, worn smooth in "
    "the middle by a century of boots. At the top he trimmed the wick, polished the great lens "
    "and watched the fishing boats come home across the bay. In winter the storms arrived from "
    "the north without warning, and the beam was the only thing that stood between the sailors "
    "and the rocks. Photosynthesis converts light energy into chemical energy: chlorophyll "
    "absorbs photons, water is split, oxygen is released, and the Calvin cycle fixes carbon "
    "dioxide into sugars that feed almost every food chain on Earth. def fibonacci(n):\n"
    "    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n"
    "The treaty was signed in 1648 after thirty years of war, redrawing the map of central "
    "Europe and establishing the principle that each state governs its own territory. Markets "
    "opened again, roads were repaired, and the universities that had closed during the "
    "fighting welcomed students from every corner of the continent. To bake bread, mix flour, "
    "water, salt and yeast, knead the dough for ten minutes, let it rise until doubled, shape "
    "it, let it rise again and bake it in a hot oven until the crust sounds hollow."
)
WINDOW_LENGTHS = (5, 8, 12, 17, 23, 30, 38, 47, 57, 68, 80, 93, 107, 122, 138, 173, 200)
DOCUMENT_TOKENS = 150
DOCUMENT_QUESTIONS = (
    " Question: what did the keeper count?",
    " Question: what does chlorophyll do?",
)
QUESTIONS = (
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain in one sentence why the sky is blue.",
)


@pytest.fixture(scope="module")
def prompts(smollm2_checkpoint: Checkpoint) -> list[list[int]]:
    """22 prompts of 5 to 200 tokens: corpus windows, document questions and chat turns.

    The two questions about one document share a long prefix, for the prefix-sharing test.
    """
    codec = smollm2_checkpoint.codec
    corpus = codec.encode(CORPUS, add_special=True)
    assert len(corpus) >= max(WINDOW_LENGTHS)
    offsets = [7 * i % (len(corpus) - n + 1) for i, n in enumerate(WINDOW_LENGTHS)]
    windows = [corpus[o : o + n] for o, n in zip(offsets, WINDOW_LENGTHS, strict=True)]
    document = corpus[:DOCUMENT_TOKENS]
    questions = [document + codec.encode(q, add_special=False) for q in DOCUMENT_QUESTIONS]
    chats = [
        codec.encode(codec.render_chat([ChatMessage(role="user", content=q)]), add_special=True)
        for q in QUESTIONS
    ]
    return windows + questions + chats


@pytest.fixture(scope="module")
def smollm2(smollm2_checkpoint: Checkpoint) -> LlamaModel:
    return LlamaModel(
        smollm2_checkpoint.config, smollm2_checkpoint.weights, device=CPU, dtype=torch.float32
    )


def reference_greedy(checkpoint: Checkpoint, prompts: Sequence[Sequence[int]]) -> list[list[int]]:
    """The reference's greedy `generate`, one prompt at a time, on the checkpoint's weights."""
    reference = reference_model(checkpoint.config)
    reference.load_state_dict(dict(checkpoint.weights), strict=False)
    outputs = []
    with torch.inference_mode():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            generated = reference.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=NEW_TOKENS,
                do_sample=False,
                pad_token_id=0,
            )
            outputs.append(generated[0, len(prompt) :].tolist())
    return outputs


@pytest.fixture(scope="module")
def expected_tokens(smollm2_checkpoint: Checkpoint, prompts: list[list[int]]) -> list[list[int]]:
    """`reference_greedy` on the same fp32 weights, computed once and kept across runs.

    The key holds the weights' bytes, the architecture, the prompts and the recipe's source, so
    any change to what the reference is computed from computes it again.
    """
    inputs = {
        "weights": state_dict_sha256(smollm2_checkpoint.weights),
        "config": repr(smollm2_checkpoint.config),
        "prompts": prompts,
        "new_tokens": NEW_TOKENS,
        "recipe": inspect.getsource(reference_model) + inspect.getsource(reference_greedy),
    }
    outputs: list[list[int]] = cached_reference(
        "smollm2-greedy", inputs, lambda: reference_greedy(smollm2_checkpoint, prompts)
    )
    assert all(len(o) == NEW_TOKENS for o in outputs)
    return outputs


@pytest.mark.timeout(600)
def test_smollm2_greedy_matches_transformers_at_batch_1(
    smollm2: LlamaModel, prompts: list[list[int]], expected_tokens: list[list[int]]
) -> None:
    """One sequence at a time, whole-prompt prefill then decode: identical tokens."""
    assert len(prompts) >= 20
    assert min(map(len, prompts)) <= 5
    assert max(map(len, prompts)) == 200
    streams = [Stream(prompt=p, chunk_size=len(p)) for p in prompts]
    drive(smollm2, streams, block_size=16, num_blocks=16, max_running=1, joins_per_step=1, rng=None)
    assert [s.output for s in streams] == expected_tokens


@pytest.mark.timeout(600)
def test_smollm2_continuous_batch_on_shuffled_tiny_blocks_matches_transformers(
    smollm2: LlamaModel, prompts: list[list[int]], expected_tokens: list[list[int]]
) -> None:
    """Joining, chunk-prefilling (7 or 32 tokens), decoding and leaving together: same tokens."""
    streams = [Stream(prompt=p, chunk_size=(7, 32)[i % 2]) for i, p in enumerate(prompts)]
    drive(
        smollm2,
        streams,
        block_size=4,
        num_blocks=600,
        max_running=10,
        joins_per_step=2,
        rng=random.Random(7),
    )
    assert [s.output for s in streams] == expected_tokens


@pytest.mark.timeout(600)
def test_smollm2_shared_prefix_blocks_give_the_same_tokens(
    smollm2: LlamaModel, prompts: list[list[int]], expected_tokens: list[list[int]]
) -> None:
    """A sequence that starts after another's cached prefix blocks decodes as if it had its own."""
    block_size = 16
    first_index, second_index = len(WINDOW_LENGTHS), len(WINDOW_LENGTHS) + 1
    first, second = prompts[first_index], prompts[second_index]
    shared = 0
    while first[shared] == second[shared]:
        shared += 1
    shared_blocks = shared // block_size
    assert shared_blocks >= 8, "the two prompts were chosen to share a long prefix"
    smollm2.allocate_cache(64, block_size)
    pool = BlockPool(64, random.Random(8))
    leader = Stream(prompt=first, chunk_size=len(first))
    step(smollm2, pool, block_size, [leader])
    follower = Stream(
        prompt=second,
        chunk_size=len(second),
        table=leader.table[:shared_blocks],
        cached=shared_blocks * block_size,
    )
    while not (leader.done and follower.done):
        step(smollm2, pool, block_size, [s for s in (leader, follower) if not s.done])
    assert leader.output == expected_tokens[first_index]
    assert follower.output == expected_tokens[second_index]
