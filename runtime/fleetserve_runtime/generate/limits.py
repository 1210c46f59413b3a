"""The generative engine's knobs, as the runtime builds them from the model's configuration.

How they interact is the scheduler's docstring (`scheduler`); the engine checks each at the
door (`engine.GenerationEngine.submit`) or hands it to the part it bounds.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetserve_runtime.generate.scheduler import Policy

__all__ = ["EngineLimits"]


@dataclass(frozen=True, slots=True)
class EngineLimits:
    """The engine's knobs; see the scheduler's docstring for how they interact."""

    block_size: int = 16
    num_blocks: int = 1024
    max_running_sequences: int = 32
    max_step_tokens: int = 512
    """Tokens per model step (decodes first, then prefill chunks): the TTFT / inter-token
    latency knob. Larger prefills prompts in fewer steps; smaller keeps steps short."""
    max_queue_size: int = 256
    default_max_tokens: int = 512
    """Output tokens of a request that sets none, fewer where the context leaves less room:
    running to the full context would let one caller hold a sequence slot for minutes."""
    default_timeout_s: float = 60.0
    max_timeout_s: float = 600.0
    priority_aging_s: float = 5.0
    retry_after_s: float = 1.0
    prefix_caching: bool = True
    policy: Policy = "continuous"

    def __post_init__(self) -> None:
        positive = {
            "block_size": self.block_size,
            "num_blocks": self.num_blocks,
            "max_running_sequences": self.max_running_sequences,
            "max_step_tokens": self.max_step_tokens,
            "max_queue_size": self.max_queue_size,
            "default_max_tokens": self.default_max_tokens,
        }
        for name, value in positive.items():
            if value < 1:
                msg = f"{name} must be at least 1, got {value}"
                raise ValueError(msg)
        if self.max_step_tokens < self.max_running_sequences:
            # Every running stream decodes one token per step: the budget must cover them.
            msg = (
                f"max_step_tokens ({self.max_step_tokens}) must be at least "
                f"max_running_sequences ({self.max_running_sequences})"
            )
            raise ValueError(msg)
        if not 0 < self.default_timeout_s <= self.max_timeout_s:
            msg = "default_timeout_s must be positive and at most max_timeout_s"
            raise ValueError(msg)
        if self.policy not in ("continuous", "static"):
            msg = f"policy must be 'continuous' or 'static', got {self.policy!r}"
            raise ValueError(msg)
