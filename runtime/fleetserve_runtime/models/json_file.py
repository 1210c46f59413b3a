"""JSON object files a model directory holds (configurations, indexes), read as input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["read_json_object"]


def read_json_object(file: Path) -> dict[str, Any]:
    """A JSON object file's contents; `{}` when the file is absent, `ValueError` if malformed."""
    if not file.is_file():
        return {}
    try:
        loaded = json.loads(file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{file} is not valid JSON: {exc}") from exc
    if not isinstance(loaded, dict):
        raise ValueError(f"{file} is not a JSON object")
    return loaded
