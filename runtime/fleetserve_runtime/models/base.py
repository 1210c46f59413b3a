"""The model handler protocol: what the executor calls, and what a plug-in model implements.

The encoder engine calls a handler in two places. `preprocess` runs at the door
(`EncoderEngine.infer`, on the API path, before queueing) so the request's length is known
to the batcher and over-long inputs are refused before they cost anything. `collate`,
`forward` and `postprocess` run on the executor's worker thread, one batch at a time;
`collate` may run while the previous batch's `forward` is still in flight, so it must not
touch state that `forward` mutates. What `collate` needs besides the items (the layout, the
buffers, the device) comes in one `CollateContext`, so the call stays the same when it grows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

__all__ = [
    "BatchLayout",
    "CollateContext",
    "DeclaresWeights",
    "ItemError",
    "ItemResult",
    "ModelHandler",
    "ModelMetadata",
    "PreparedInput",
    "TensorAllocator",
    "TensorSpec",
    "embedding_output",
    "text_encoder_metadata",
]


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One named input or output of a model, as the Open Inference Protocol describes it."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    """-1 marks a dynamic dimension."""


@dataclass(frozen=True, slots=True)
class ModelMetadata:
    """What a model says about itself; served by `GET /v2/models/{name}`."""

    name: str
    version: str
    platform: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_sequence_length: int
    """Longest input (in tokens) the model accepts."""
    precision: str = "fp32"
    """Numeric precision the model is served in (`fp32`, `bf16`, `int8`)."""
    min_cosine: float | None = None
    """Smallest cosine to fp32 torch on the accuracy guard's texts; None when nothing was
    guarded (a model served as its own fp32 weights)."""
    speedup: float | None = None
    """How many times as fast as fp32 the reduced precision ran the guard texts at load;
    None in fp32."""


def embedding_output(width: int) -> TensorSpec:
    """A text encoder's output: one FP32 `embedding` row of `width` per text (-1: unknown yet)."""
    return TensorSpec("embedding", "FP32", (-1, width))


def text_encoder_metadata(
    name: str, version: str, *, platform: str, width: int, max_sequence_length: int
) -> ModelMetadata:
    """The metadata of a text encoder: `text` (BYTES) in, `embedding_output(width)` out.

    Every encoder backend serves these two tensors; only its platform and width differ.
    """
    return ModelMetadata(
        name=name,
        version=version,
        platform=platform,
        inputs=(TensorSpec("text", "BYTES", (-1,)),),
        outputs=(embedding_output(width),),
        max_sequence_length=max_sequence_length,
    )


@dataclass(frozen=True, slots=True)
class PreparedInput:
    """One instance after `preprocess`: its batch cost and the handler's private payload."""

    length: int
    """Tokens this item occupies in a batch (≥ 1); the batcher buckets and budgets by it."""
    data: Any
    """Handler-private payload (e.g. token ids); the runtime never looks inside."""
    truncated: bool = False


@dataclass(frozen=True, slots=True)
class ItemError:
    """A per-item failure returned by `postprocess`; fails that item's request only."""

    message: str


ItemResult = Any
"""A per-item result: a numpy array or any JSON-serialisable value, or an `ItemError`."""


@dataclass(frozen=True, slots=True)
class BatchLayout:
    """How the executor wants a batch laid out in memory.

    `pad_to` is the padded length of every row when `packed` is false. When `packed` is
    true the handler may lay the real tokens out back to back (no padding in the dense
    layers); `pad_to` is then the longest member, for whatever still needs a rectangle.
    """

    pad_to: int
    packed: bool = True
    extras: dict[str, Any] = field(default_factory=dict)


class TensorAllocator(Protocol):
    """Hands out reusable tensors for one batch; they return to the pool when the batch ends."""

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """Return an uninitialised tensor of `shape` and `dtype` valid until the batch ends."""


@dataclass(frozen=True, slots=True)
class CollateContext:
    """Everything `collate` is given besides the items: one batch's layout, buffers and device."""

    layout: BatchLayout
    alloc: TensorAllocator
    """Use it for every input buffer: the executor pools and reuses them across batches."""
    device: torch.device
    """Where `forward` runs; the batch goes there (on CUDA, on the prepare thread's stream)."""


@runtime_checkable
class DeclaresWeights(Protocol):
    """A handler whose weights live outside torch's allocator (e.g. ONNX Runtime's arena).

    The runtime's memory measurement sees torch allocations only; such a handler says how
    many bytes its weights take, and the larger of the two counts against the budget.
    """

    def weights_bytes(self) -> int:
        """Bytes the loaded weights occupy."""


@runtime_checkable
class ModelHandler(Protocol):
    """A loadable model: metadata plus the four stages of the inference pipeline."""

    @property
    def metadata(self) -> ModelMetadata:
        """Name, version, shapes and limits."""

    def load(self, device: torch.device) -> None:
        """Load weights onto `device`; called once, off the event loop."""

    def preprocess(self, instance: object, *, truncate: bool) -> PreparedInput:
        """Validate and encode one instance; raise `InvalidInput` or `InputTooLong`."""

    def sample_instance(self, length: int) -> object:
        """Return a synthetic instance of about `length` tokens, for warmup and calibration."""

    def collate(self, items: Sequence[PreparedInput], ctx: CollateContext) -> Any:
        """Build the device-side batch laid out as `ctx.layout`, in buffers from `ctx.alloc`."""

    def forward(self, batch: Any) -> Any:
        """Run the model on a collated batch (inside `torch.inference_mode`)."""

    def postprocess(self, output: Any, count: int) -> list[ItemResult]:
        """Split `output` into `count` per-item results, in batch order."""
