"""What is served: the model, its task, and what the runtime knows of its builtins."""

from __future__ import annotations

import re
from typing import Literal
from urllib.parse import parse_qs, urlsplit

from pydantic import ConfigDict, Field, model_validator

from fleetserve_operator.spec.base import (
    GPU_RESOURCE,
    Wire,
    cel,
)
from fleetserve_operator.spec.scaling import (
    Backend,
)

__all__ = [
    "BUILTIN_TASKS",
    "GENERATIVE_CEL",
    "MINILM_URI",
    "ONNXRUNTIME_ON_GPU",
    "ONNX_FILE_URI",
    "SMOLLM2_CONTEXT",
    "SMOLLM2_KV_BYTES_PER_TOKEN",
    "SMOLLM2_MIN_WEIGHTS_BYTES",
    "SMOLLM2_URI",
    "ModelSpec",
    "Task",
    "backend_contradicts",
    "builtin_context_length",
    "builtin_task",
    "gpu_requested_cel",
    "onnxruntime_bf16",
]

Task = Literal["embed", "generate"]
"""What a model does: `embed` answers `/v2/.../infer`, `generate` streams text."""
BUILTIN_TASKS: dict[str, Task] = {
    "minilm-l6": "embed",
    "synthetic": "embed",
    "smollm2-135m": "generate",
    "synthetic-generate": "generate",
}
"""The task of each `builtin://` model, known without loading it."""


def _builtin_pattern(task: Task) -> str:
    names = "|".join(sorted(name for name, kind in BUILTIN_TASKS.items() if kind == task))
    return f"^builtin://({names})([?].*)?$"


def builtin_task(uri: str | None) -> Task | None:
    """The task of a `builtin://` model's URI; None for any other URI."""
    if uri is None:
        return None
    for task in ("embed", "generate"):
        if re.fullmatch(_builtin_pattern(task), uri):
            return task
    return None


GENERATIVE_CEL = (
    "(has(self.model.task) ? self.model.task == 'generate' : "
    f"has(self.model.uri) && self.model.uri.matches('{_builtin_pattern('generate')}'))"
)
"""CEL, on the spec: true when the service generates text (`ModelSpec.effective_task`)."""

# What the runtime serves on ONNX Runtime: MiniLM (either backend) and `.onnx` files (only
# it); everything else runs on torch. A `pvc://` model becomes a file of the same name.
MINILM_URI = r"^builtin://minilm-l6([?].*)?$"
ONNX_FILE_URI = r"^(file|pvc)://[^?#]*[.]onnx([?#].*)?$"


def gpu_requested_cel(section: str) -> str:
    """CEL: the `resources` of `section` (`self`, `self.runtime`) ask for a GPU (`has_gpu`)."""
    resources = f"{section}.resources"
    return (
        f"has({resources}) && ((has({resources}.limits) && '{GPU_RESOURCE}' in "
        f"{resources}.limits) || (has({resources}.requests) && '{GPU_RESOURCE}' in "
        f"{resources}.requests))"
    )


def onnxruntime_bf16(track: str) -> str:
    """Why `track` cannot run bf16 on ONNX Runtime."""
    return (
        f"{track}.backend onnxruntime serves fp32 or int8, not bf16: set {track}.backend to "
        f"torch or auto, or {track}.precision to fp32 or int8"
    )


ONNXRUNTIME_ON_GPU = (
    "runtime.backend onnxruntime runs on the CPU only, but runtime.device is cuda, or auto "
    f"with {GPU_RESOURCE} in runtime.resources (auto picks CUDA when the pod has a GPU): set "
    "runtime.backend to torch or auto, or runtime.device to cpu"
)


def backend_contradicts(track: str, backend: Backend) -> str:
    """Why `backend` on `track` cannot serve the model (an .onnx file, or not one)."""
    if backend == "torch":
        return (
            f"{track}.backend torch does not apply to an .onnx model, which only ONNX Runtime "
            f"serves: set {track}.backend to auto or onnxruntime"
        )
    return (
        f"{track}.backend onnxruntime applies to builtin://minilm-l6 and .onnx models only; "
        f"torch serves this one: set {track}.backend to auto or torch"
    )


class ModelSpec(Wire):
    """What to serve: the model's name, version and where its weights or handler come from."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "has(self.uri) != has(self.handler)",
                    "exactly one of model.uri and model.handler must be set",
                ),
                *(
                    cel(
                        f"!has(self.task) || !has(self.uri) || "
                        f"!self.uri.matches('{_builtin_pattern(task)}') || self.task == '{task}'",
                        f"model.task must be {task} for "
                        + " and ".join(
                            f"builtin://{name}"
                            for name, kind in sorted(BUILTIN_TASKS.items())
                            if kind == task
                        ),
                        ".task",
                    )
                    for task in ("embed", "generate")
                ),
            ]
        }
    )

    name: str = Field(pattern=r"^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$", max_length=63)
    """Name the model is served under (`/v2/models/{name}`) and its `model` metric label."""
    # The version is also a label value of the track's Deployment and pods, so it takes that
    # grammar: no `+`, and a letter or digit at both ends.
    version: str = Field(pattern=r"^[a-zA-Z0-9]([a-zA-Z0-9_.-]{0,61}[a-zA-Z0-9])?$", max_length=63)
    """Version label; changing it rolls the new version out."""
    uri: str | None = Field(
        None,
        pattern=r"^(builtin://[a-z0-9-]+(\?.*)?|file:///.+|pvc://[a-z0-9][a-z0-9.-]{0,252}/.+)$",
        max_length=2048,
    )
    """`builtin://minilm-l6`, `builtin://synthetic?latency_ms=5`, `file:///path` (in the image)
    or `pvc://<claim>/<path>` (the claim is mounted read-only at /models)."""
    handler: str | None = Field(None, pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$", max_length=512)
    """Entry point `package.module:factory` building the model handler (instead of `uri`)."""
    task: Task | None = None
    """`embed` or `generate`. Unset: `generate` for `builtin://smollm2-135m` and
    `builtin://synthetic-generate`, otherwise `embed`; set it to `generate` for a Llama
    checkpoint (`file://`, `pvc://`). It is declared rather than read from the loaded model
    so that the API server can refuse generation settings on an encoder, and the operator
    can render the routes and size the memory before any pod has run; the builtins' task is
    known, so for them a contradicting value is refused."""

    @model_validator(mode="after")
    def _one_source(self) -> ModelSpec:
        if (self.uri is None) == (self.handler is None):
            msg = "exactly one of model.uri and model.handler must be set"
            raise ValueError(msg)
        known = builtin_task(self.uri)
        if self.task is not None and known is not None and self.task != known:
            msg = f"model.task must be {known} for {self.uri}"
            raise ValueError(msg)
        return self

    @property
    def effective_task(self) -> Task:
        """`task`, or for an unset one the builtin's task, else `embed`."""
        return self.task or builtin_task(self.uri) or "embed"

    @property
    def generates(self) -> bool:
        """True when the model generates text (the OpenAI and generate routes)."""
        return self.effective_task == "generate"


# SmolLM2-135M's floor, in its smallest serving dtype (bf16 on a GPU; CPU doubles both): 30
# layers x 3 KV heads x 64 dims x keys and values x 2 bytes per token, and 134.5M parameters.
# tests/contract/ checks them against the loaded model.
SMOLLM2_URI = r"^builtin://smollm2-135m([?].*)?$"
SMOLLM2_CONTEXT = 8192
"""SmolLM2-135M's own context, in tokens."""
SMOLLM2_KV_BYTES_PER_TOKEN = 23_040
"""KV-cache bytes of one SmolLM2 token in bf16."""
SMOLLM2_MIN_WEIGHTS_BYTES = 256 * 2**20
"""Less than SmolLM2's weights take in bf16."""


_SYNTHETIC_CONTEXT = 4096
"""`builtin://synthetic-generate`'s context without a `context_length` parameter."""


def builtin_context_length(model: ModelSpec) -> int | None:
    """The context, in tokens, of a generative builtin; None for any other model."""
    if model.uri is None:
        return None
    if re.fullmatch(SMOLLM2_URI, model.uri):
        return SMOLLM2_CONTEXT
    if builtin_task(model.uri) != "generate":
        return None
    query = parse_qs(urlsplit(model.uri).query)
    given = query.get("context_length", [])
    return int(given[-1]) if given and given[-1].isdigit() else _SYNTHETIC_CONTEXT
