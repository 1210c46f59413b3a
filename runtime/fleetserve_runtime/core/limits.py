"""Bounds that both request paths (the encoder and the generative engine) apply to their input.

It sits low in the layers (beside `config`), so both engines import the one definition
without importing each other: the two engines are independent layers.
"""

from __future__ import annotations

__all__ = ["MAX_CHARS_PER_TOKEN"]

MAX_CHARS_PER_TOKEN = 64
"""A text longer than this many characters per allowed token cannot fit, whatever the
tokenizer: such inputs are refused (or cut, when truncation was asked) before tokenising,
which runs on the event loop and would stall every other request for a huge input."""
