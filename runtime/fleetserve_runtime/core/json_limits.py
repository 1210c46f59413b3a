"""How deeply a request body's JSON may nest, checked before any schema sees it.

A 2 KB body of nested arrays parses (orjson allows 1024 levels), but whatever walks it
recursively afterwards (`repr` in an error message, a schema's validator) can hit Python's
recursion limit and answer a 500, counted as the server's fault. No request shape of this
server nests more than a dozen levels: tensor data nests at most `max_tensor_rank` (at most 64)
deep, inside three levels of envelope. The walk is iterative and stops at the limit.
"""

from __future__ import annotations

from fleetserve_runtime.core.errors import InvalidInput

__all__ = ["MAX_JSON_DEPTH", "check_depth"]

MAX_JSON_DEPTH = 96
"""Most levels of arrays and objects in a request body: above the deepest legal OIP body
(64 tensor dimensions in three levels of envelope), far below the recursion limit."""


def check_depth(data: object, limit: int = MAX_JSON_DEPTH) -> None:
    """`InvalidInput` naming the limit when `data` nests arrays and objects deeper than it."""
    level = [data]
    depth = 0
    while level:
        containers = [value for value in level if isinstance(value, list | dict)]
        if not containers:
            return
        depth += 1
        if depth > limit:
            msg = f"request body nests arrays and objects deeper than {limit} levels"
            raise InvalidInput(msg)
        level = [
            child
            for container in containers
            for child in (container.values() if isinstance(container, dict) else container)
        ]
