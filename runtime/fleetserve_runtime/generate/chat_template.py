"""A model's chat template, rendered the way the Hugging Face ecosystem renders it.

Chat templates are Jinja programs shipped with a checkpoint (a GGUF file's
`tokenizer.chat_template`, a directory's `tokenizer_config.json` or `chat_template.jinja`), so
they are untrusted code: they run in jinja2's `ImmutableSandboxedEnvironment`, which refuses
underscore attributes (`__class__`, `__globals__`) and mutation of the values passed in.

The environment matches what transformers' `apply_chat_template` gives a template (the same
whitespace options, the `raise_exception`, `strftime_now`, `namespace` and `dict` helpers, the
`tojson` filter without HTML escaping, a no-op `{% generation %}` block), because the prompt a
model sees must be byte-for-byte the one it was trained on.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, NoReturn

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

from fleetserve_runtime.generate.contracts import ChatMessage

__all__ = ["ChatTemplate"]


class ChatTemplate:
    """A compiled chat template and the special-token strings it may refer to."""

    def __init__(self, source: str, *, special_tokens: Mapping[str, str]) -> None:
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateError as exc:
            raise ValueError(f"the chat template does not compile: {exc}") from exc
        self._special_tokens = dict(special_tokens)
        self.source = source

    def render(self, messages: Sequence[ChatMessage]) -> str:
        """The prompt for `messages`, ending where the assistant's reply begins.

        Raises `ValueError` with the template's own message when it refuses the conversation
        (`raise_exception`), or when it breaks the sandbox's rules.
        """
        try:
            return self._template.render(
                messages=[{"role": m.role, "content": m.content} for m in messages],
                tools=None,
                documents=None,
                add_generation_prompt=True,
                **self._special_tokens,
            )
        except jinja2.TemplateError as exc:
            raise ValueError(f"the chat template refused the conversation: {exc}") from exc
        except (TypeError, LookupError, ArithmeticError, ValueError) as exc:
            # A template bug (indexing an empty list, adding str to int) must reach the caller
            # as bad input for this model, not as a server error.
            raise ValueError(f"the chat template failed: {exc!r}") from exc


def _raise_exception(message: str) -> NoReturn:
    raise jinja2.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own `tojson` escapes <, >, & and ' for HTML, which would change the prompt.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(date_format: str) -> str:
    return datetime.now().strftime(date_format)


class _TemplateDict:
    """`dict(...)` and `dict.fromkeys(...)` for templates, without handing them the type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, keys: Any, value: Any = None) -> dict[Any, Any]:
        """A dict of `keys`, each mapped to `value`."""
        return dict.fromkeys(keys, value)


class _Namespace(jinja2.utils.Namespace):
    """`namespace()` that refuses underscore names, so a template cannot plant dunders on it."""

    # No `self` parameter: like jinja's own Namespace, so `namespace(self=...)` still works.
    def __init__(*args: Any, **kwargs: Any) -> None:
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)


def _check_name(name: object) -> None:
    if isinstance(name, str) and name.startswith("_"):
        raise jinja2.exceptions.SecurityError(
            f"a chat template may not set the underscore attribute {name!r}"
        )


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant text for training masks only."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> list[jinja2.nodes.Node]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationBlock, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _Namespace
    return env
