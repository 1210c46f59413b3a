"""A Llama-architecture decoder in plain torch, stepping a flat batch over a paged KV pool.

Each step (`forward`) takes every running sequence's chunk (a prefill chunk of many tokens, or
one decode token) and runs the dense work (fused QKV projection, RoPE, output projection,
fused gate/up SwiGLU MLP, RMSNorms) once over all of the step's tokens as one `[T, hidden]`
matrix, so 32 decoding sequences cost one batched GEMM per weight instead of 32 skinny ones.
Only attention is per sequence, and even there the decode rows (the common case) attend as
padded batches: their pages are gathered into `[B, kv_heads, L, head_dim]` and one
`scaled_dot_product_attention` call with a key-length mask covers a whole batch (rows are
split by context length only where padding would cost more than another call). Grouped-query
attention needs no repeated keys for decode: the `num_heads / kv_heads` query heads that share
a key head are laid along the query axis of that head. Each prefill chunk attends causally to
itself and, when it continues a cached prefix, to the prefix's pages.

The vocabulary projection is computed only for each chunk's last token, since the engine
samples nothing else; for a 512-token prefill chunk that skips 511 rows of the largest GEMM.
A chunk marked `all_logits` (a prompt whose log-probabilities were asked for) gets every row.

Weights come by their reference parameter names (see `config.Checkpoint`); Q/K/V and
gate/up are concatenated here so each layer makes two GEMMs fewer per step. fp32 on CPU
(bf16 is slow there), bf16 on CUDA; the KV pool takes the model's dtype. Logits are fp32.
`with_int8_weights` derives a copy (CPU, fp32 activations) whose projections and vocabulary
head are int8 per output channel and multiply through `models.int8_matmul`; a tied head's
int8 rows double as the embedding table, dequantised row by row.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F  # noqa: N812 - the name every torch codebase uses

from fleetserve_runtime.models.causal_lm import KVLayout, StepInput
from fleetserve_runtime.models.int8_matmul import Int8Weight, int8_matmul, quantize_weight
from fleetserve_runtime.models.llama.config import LlamaConfig
from fleetserve_runtime.models.llama.kv_cache import (
    DECODE_GROUP_OVERHEAD,
    ForwardBatch,
    PagedKVCache,
    plan_step,
)

__all__ = ["LlamaModel", "default_dtype", "rope_inverse_frequencies"]


def default_dtype(device: torch.device) -> torch.dtype:
    """bf16 where the hardware has fast bf16 GEMMs (CUDA), fp32 elsewhere."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def rope_inverse_frequencies(config: LlamaConfig) -> torch.Tensor:
    """`[head_dim / 2]` fp32 rotary frequencies, with Llama 3 scaling when configured.

    Raises:
        ValueError: `rope_scaling` names a scheme other than Llama 3's.
    """
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    scaling = config.rope_scaling
    if scaling is None:
        return inv_freq
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type == "default":
        return inv_freq
    if rope_type != "llama3":
        raise ValueError(f"unsupported rope_scaling type {rope_type!r}; only 'llama3'")
    factor = float(scaling["factor"])
    low_freq_factor = float(scaling["low_freq_factor"])
    high_freq_factor = float(scaling["high_freq_factor"])
    old_context = float(scaling["original_max_position_embeddings"])
    low_freq_wavelen = old_context / low_freq_factor
    high_freq_wavelen = old_context / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    # Long wavelengths are slowed by `factor`, short ones kept, the band between blended.
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(medium, smoothed, scaled)


Projection = torch.Tensor | Int8Weight
"""A projection's weight, input-major: dense in the model's dtype, or int8 with its scales."""


@dataclass(frozen=True, slots=True)
class _Layer:
    input_norm: torch.Tensor
    qkv: Projection
    """`[hidden, q_dim + 2 * kv_dim]`: Q, K and V projections side by side."""
    o: Projection
    """`[q_dim, hidden]`, like every projection here stored transposed (input-major)."""
    post_norm: torch.Tensor
    gate_up: Projection
    """`[hidden, 2 * intermediate]`: gate and up projections side by side."""
    down: Projection


class LlamaModel:
    """A Llama decoder that owns its paged KV pool; implements `models.causal_lm.CausalLM`."""

    def __init__(
        self,
        config: LlamaConfig,
        weights: Mapping[str, torch.Tensor],
        *,
        device: torch.device,
        dtype: torch.dtype,
        decode_group_overhead: int = DECODE_GROUP_OVERHEAD,
    ) -> None:
        """Copy `weights` (reference names) to `device` in `dtype`, fused per layer.

        `decode_group_overhead` tunes how readily decode rows of different context lengths
        attend in separate padded groups (see `kv_cache.group_by_length`).

        Raises:
            KeyError: a tensor the architecture needs is missing.
            ValueError: the config is inconsistent (heads do not divide) or its RoPE
                scaling is unsupported.
        """
        if config.num_heads % config.num_kv_heads:
            raise ValueError(
                f"num_heads ({config.num_heads}) must be a multiple of "
                f"num_kv_heads ({config.num_kv_heads})"
            )
        self.config = config
        self.device = device
        self.dtype = dtype
        self.decode_group_overhead = decode_group_overhead

        def get(name: str) -> torch.Tensor:
            return weights[name].to(device=device, dtype=dtype)

        def cat(*names: str) -> torch.Tensor:
            # Stored input-major (`[in, out]`): `x @ w` on that layout ran 10-40% faster on
            # one CPU core than `linear` on the reference's `[out, in]` (most for one row).
            return torch.cat([get(n) for n in names]).t().contiguous()

        embed = "model.embed_tokens.weight"
        self._lm_head: Projection = cat(embed if config.tie_word_embeddings else "lm_head.weight")
        # A tied head doubles as the embedding table (read by column), so it is held once.
        self._embed = None if config.tie_word_embeddings else get(embed)
        self._norm = get("model.norm.weight")
        self._observer: Callable[[Projection, torch.Tensor], None] | None = None
        self._layers = []
        for i in range(config.num_layers):
            p = f"model.layers.{i}"
            attn, mlp = f"{p}.self_attn", f"{p}.mlp"
            self._layers.append(
                _Layer(
                    input_norm=get(f"{p}.input_layernorm.weight"),
                    qkv=cat(
                        f"{attn}.q_proj.weight", f"{attn}.k_proj.weight", f"{attn}.v_proj.weight"
                    ),
                    o=cat(f"{attn}.o_proj.weight"),
                    post_norm=get(f"{p}.post_attention_layernorm.weight"),
                    gate_up=cat(f"{mlp}.gate_proj.weight", f"{mlp}.up_proj.weight"),
                    down=cat(f"{mlp}.down_proj.weight"),
                )
            )
        # cos/sin for every position, computed in fp32 as the reference does, then cast.
        freqs = torch.outer(
            torch.arange(config.max_position_embeddings, dtype=torch.float32),
            rope_inverse_frequencies(config),
        )
        angles = torch.cat([freqs, freqs], dim=-1)
        self._cos = angles.cos().to(device=device, dtype=dtype)
        self._sin = angles.sin().to(device=device, dtype=dtype)
        self._cache: PagedKVCache | None = None

    def with_int8_weights(
        self, smooth: Callable[[torch.Tensor], torch.Tensor | None]
    ) -> LlamaModel:
        """A copy whose projections and head are int8, sharing the rest; it has no KV pool.

        `smooth(weight)` is the SmoothQuant factor of a projection's input channels (None:
        none). The head is never smoothed: its int8 rows must stay the embedding rows.

        Raises:
            ValueError: this model is not fp32 (int8 products take fp32 activations) or is
                int8 already.
        """
        if self.dtype != torch.float32:
            raise ValueError(f"int8 weights take fp32 activations, not {self.dtype}")

        def dense(weight: Projection) -> torch.Tensor:
            if isinstance(weight, Int8Weight):
                raise ValueError("the model's weights are int8 already")
            return weight

        def quantize(weight: Projection) -> Int8Weight:
            values = dense(weight)
            return quantize_weight(values, smooth(values))

        derived = copy.copy(self)
        derived._cache = None
        derived._observer = None
        derived._layers = [
            dataclasses.replace(
                layer,
                qkv=quantize(layer.qkv),
                o=quantize(layer.o),
                gate_up=quantize(layer.gate_up),
                down=quantize(layer.down),
            )
            for layer in self._layers
        ]
        derived._lm_head = quantize_weight(dense(self._lm_head))
        return derived

    def release_cache(self) -> None:
        """Drop the KV pool (a probe's); `allocate_cache` makes the next one."""
        self._cache = None

    def observe(self, observer: Callable[[Projection, torch.Tensor], None] | None) -> None:
        """Call `observer(weight, x)` with every projection's input rows (None: stop)."""
        self._observer = observer

    @property
    def kv_layout(self) -> KVLayout:
        """Per-block cost of the pool in the model's dtype."""
        return KVLayout(
            num_layers=self.config.num_layers,
            num_kv_heads=self.config.num_kv_heads,
            head_dim=self.config.head_dim,
            dtype_bytes=torch.empty((), dtype=self.dtype).element_size(),
        )

    @property
    def vocab_size(self) -> int:
        """Width of the returned logits."""
        return self.config.vocab_size

    @property
    def cache(self) -> PagedKVCache:
        """The KV pool; `allocate_cache` must have been called.

        Raises:
            RuntimeError: no pool has been allocated yet.
        """
        if self._cache is None:
            raise RuntimeError("allocate_cache() must be called before the first step")
        return self._cache

    def allocate_cache(self, num_blocks: int, block_size: int) -> None:
        """(Re)allocate the pool of `num_blocks` blocks of `block_size` slots; forgets all."""
        self._cache = None  # free the old pool before the new one is allocated
        self._cache = PagedKVCache(
            num_layers=self.config.num_layers,
            num_blocks=num_blocks,
            block_size=block_size,
            num_kv_heads=self.config.num_kv_heads,
            head_dim=self.config.head_dim,
            dtype=self.dtype,
            device=self.device,
        )

    def forward(self, step: StepInput) -> torch.Tensor:
        """Run one step; fp32 logits of each chunk's last token, in chunk order.

        A chunk with `all_logits` gets one row per token instead (`StepInput`'s contract).

        Raises:
            RuntimeError: no pool has been allocated yet.
            ValueError: a chunk is malformed (see `kv_cache.plan_step`) or runs past the
                model's maximum position.
        """
        cache = self.cache
        with torch.inference_mode():
            plan = plan_step(
                step, cache, self.device, decode_group_overhead=self.decode_group_overhead
            )
            last_position = max(c.start_pos + len(c.token_ids) for c in step.chunks)
            if last_position > self.config.max_position_embeddings:
                raise ValueError(
                    f"position {last_position - 1} is past the model's maximum "
                    f"({self.config.max_position_embeddings} positions)"
                )
            x = self._embedding(plan.token_ids)
            cos = self._cos.index_select(0, plan.positions)[:, None, :]
            sin = self._sin.index_select(0, plan.positions)[:, None, :]
            for index, layer in enumerate(self._layers):
                x = self._layer(index, layer, x, plan, cos, sin)
            rows = x.index_select(0, plan.logit_rows)
            logits = self._project(self._rms_norm(rows, self._norm), self._lm_head)
            return logits.float()

    def _embedding(self, token_ids: torch.Tensor) -> torch.Tensor:
        if self._embed is not None:
            return F.embedding(token_ids, self._embed)
        if isinstance(self._lm_head, Int8Weight):
            columns = self._lm_head.values.index_select(1, token_ids).t().to(self.dtype)
            return columns * self._lm_head.scale.index_select(0, token_ids)[:, None]
        return self._lm_head.index_select(1, token_ids).t()

    def _rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        # In fp32 the variance as the reference computes it; bf16 inputs are upcast first.
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.config.rms_norm_eps)
        return weight * h.to(x.dtype)

    def _layer(
        self,
        index: int,
        layer: _Layer,
        x: torch.Tensor,
        plan: ForwardBatch,
        cos: torch.Tensor,
        sin: torch.Tensor,
    ) -> torch.Tensor:
        cfg = self.config
        tokens = x.shape[0]
        q_dim, kv_dim = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        qkv = self._project(self._rms_norm(x, layer.input_norm), layer.qkv)
        q, k, v = torch.split(qkv, [q_dim, kv_dim, kv_dim], dim=-1)
        q = _rotate(q.view(tokens, cfg.num_heads, cfg.head_dim), cos, sin)
        k = _rotate(k.view(tokens, cfg.num_kv_heads, cfg.head_dim), cos, sin)
        v = v.view(tokens, cfg.num_kv_heads, cfg.head_dim)
        self.cache.write(index, plan.slots, k, v)
        context = self._attend(index, plan, q, k, v)
        x = x + self._project(context, layer.o)
        gate, up = self._project(self._rms_norm(x, layer.post_norm), layer.gate_up).chunk(2, -1)
        return x + self._project(F.silu(gate) * up, layer.down)

    def _project(self, x: torch.Tensor, weight: Projection) -> torch.Tensor:
        """`x @ weight` for `[rows, in]` activations, dense or int8, shown to the observer."""
        if self._observer is not None:
            self._observer(weight, x)
        if isinstance(weight, Int8Weight):
            return int8_matmul(x, weight)
        return x @ weight

    def _attend(
        self, index: int, plan: ForwardBatch, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        """Attention of every row of the step; returns `[T, num_heads * head_dim]`."""
        cfg = self.config
        group = cfg.num_heads // cfg.num_kv_heads
        context = q.new_empty(q.shape[0], cfg.num_heads * cfg.head_dim)
        for decode in plan.decodes:
            rows = slice(decode.row, decode.row + decode.size)
            keys, values = self.cache.gather(index, decode.blocks)
            # The `group` query heads of one KV head (heads are laid out KV-head major) form
            # that head's query rows; they share one position, so one key mask covers them.
            queries = q[rows].view(decode.size, cfg.num_kv_heads, group, cfg.head_dim)
            out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=decode.key_mask)
            context[rows] = out.reshape(decode.size, -1)
        for chunk in plan.prefills:
            rows = slice(chunk.row, chunk.row + chunk.length)
            queries = q[rows].transpose(0, 1).unsqueeze(0)
            if chunk.causal_mask is None:
                keys = k[rows].transpose(0, 1).unsqueeze(0)
                values = v[rows].transpose(0, 1).unsqueeze(0)
            else:
                keys, values = self.cache.gather(index, chunk.blocks)
            out = F.scaled_dot_product_attention(
                queries,
                keys,
                values,
                attn_mask=chunk.causal_mask,
                is_causal=chunk.causal_mask is None,
                enable_gqa=group > 1,
            )
            context[rows] = out[0].transpose(0, 1).reshape(chunk.length, -1)
        return context


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE in the reference's half-split layout: `x * cos + rotate_half(x) * sin`."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin
