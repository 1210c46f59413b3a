"""A model's chat template, rendered the way the Hugging Face ecosystem renders it.

Chat templates are Jinja programs shipped with a checkpoint (a GGUF file's
`tokenizer.chat_template`, a directory's `tokenizer_config.json` or `chat_template.jinja`), so
they are untrusted code: they run in jinja2's `ImmutableSandboxedEnvironment`, which refuses
underscore attributes (`__class__`, `__globals__`) and mutation of the values passed in.

A template is a program, so the sandbox also bounds what one render may cost: CPU time
(`MAX_CHAT_TEMPLATE_CPU_SECONDS`, checked at every loop iteration, call, operator and write)
and size (`MAX_CHAT_TEMPLATE_OUTPUT_CHARS`, for everything the template writes, in macros and
`set` blocks too, and for any one value it builds). The source is rewritten before it is
compiled so that loops, writes and `~` pass through the budget; `*`, `+`, `%` and `**`, calls
and filters are checked by the environment.

The environment matches what transformers' `apply_chat_template` gives a template (the same
whitespace options, the `raise_exception`, `strftime_now`, `namespace` and `dict` helpers, the
`tojson` filter without HTML escaping, a no-op `{% generation %}` block), because the prompt a
model sees must be byte-for-byte the one it was trained on.
"""

from __future__ import annotations

import functools
import inspect
import json
import re
import secrets
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from datetime import datetime
from typing import Any, NoReturn

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
import jinja2.utils
from jinja2.runtime import Context
from jinja2.sandbox import ImmutableSandboxedEnvironment

from fleetserve_runtime.models.causal_lm import ChatMessage

__all__ = ["MAX_CHAT_TEMPLATE_CPU_SECONDS", "MAX_CHAT_TEMPLATE_OUTPUT_CHARS", "ChatTemplate"]

MAX_CHAT_TEMPLATE_CPU_SECONDS = 0.5
"""CPU time (of the rendering thread) one render may take; real templates take about 1 ms."""
MAX_CHAT_TEMPLATE_OUTPUT_CHARS = 1 << 24
"""Characters one render may write in all (a macro's text counts where it is written and again
where it is used), and the largest string or list it may build. 16 Mi: four times the default
`max_body_bytes`."""

_CLOCK_EVERY = 64
"""Steps between CPU-clock reads; a step is cheap, the clock is a system call."""
_FORMAT_WIDTH = re.compile(r"%[-#0 +]*\d*\.?\d{8,}|\{[^{}]*:[^{}]*\d{8,}[^{}]*\}")
"""A `%` or `{:}` width or precision of eight digits or more: alone it builds 10 MB or more."""


class ChatTemplate:
    """A compiled chat template and the special-token strings it may refer to."""

    def __init__(self, source: str, *, special_tokens: Mapping[str, str]) -> None:
        try:
            env = _environment()
            self._template = env.from_string(_budgeted(env.parse(source)))
        except jinja2.TemplateError as exc:
            raise ValueError(f"the chat template does not compile: {exc}") from exc
        self._special_tokens = dict(special_tokens)
        self.source = source

    def content_spans(
        self, messages: Sequence[ChatMessage], text: str
    ) -> tuple[tuple[int, int], ...] | None:
        """Where each message's content lies in `text`, the template's rendering of `messages`.

        The template renders again with every content replaced by a unique marker; if putting
        the contents back where the markers landed gives `text`, those are the spans. None
        when the template transforms content (trims it, branches on it) so it cannot be
        located.
        """
        nonce = secrets.token_hex(8)
        marked = [ChatMessage(m.role, f"\x00{nonce}:{i}\x00") for i, m in enumerate(messages)]
        try:
            skeleton = self.render(marked)
        except ValueError:
            return None  # a template that branches on content may refuse the markers
        pieces = re.split(f"\x00{nonce}:(\\d+)\x00", skeleton)
        spans: list[tuple[int, int]] = []
        position = 0
        for index, piece in enumerate(pieces):
            if index % 2 == 0:
                if not text.startswith(piece, position):
                    return None
                position += len(piece)
                continue
            content = messages[int(piece)].content
            if not text.startswith(content, position):
                return None
            spans.append((position, position + len(content)))
            position += len(content)
        return tuple(spans) if position == len(text) else None

    def render(self, messages: Sequence[ChatMessage]) -> str:
        """The prompt for `messages`, ending where the assistant's reply begins.

        Raises `ValueError` with the template's own message when it refuses the conversation
        (`raise_exception`), or when it breaks the sandbox's rules.
        """
        token = _BUDGET.set(_Budget())
        try:
            return self._template.render(
                messages=[{"role": m.role, "content": m.content} for m in messages],
                tools=None,
                documents=None,
                add_generation_prompt=True,
                **self._special_tokens,
            )
        except _OverBudget as exc:
            raise ValueError(f"the chat template {exc}") from None
        except jinja2.TemplateError as exc:
            raise ValueError(f"the chat template refused the conversation: {exc}") from exc
        except RecursionError:
            raise ValueError("the chat template failed: it recursed too deeply") from None
        except (TypeError, LookupError, ArithmeticError, ValueError) as exc:
            # A template bug (indexing an empty list, adding str to int) must reach the caller
            # as bad input for this model, not as a server error.
            raise ValueError(f"the chat template failed: {exc!r}") from exc
        finally:
            _BUDGET.reset(token)


class _OverBudget(jinja2.TemplateError):
    """A render went past one of the sandbox's bounds; the message names it."""


class _Budget:
    """What one render has spent: CPU time, and characters written."""

    def __init__(self) -> None:
        self._deadline = time.thread_time() + MAX_CHAT_TEMPLATE_CPU_SECONDS
        self._steps = 0
        self._written = 0

    def step(self) -> None:
        self._steps += 1
        if self._steps % _CLOCK_EVERY == 0 and time.thread_time() > self._deadline:
            raise _OverBudget(
                f"ran longer than MAX_CHAT_TEMPLATE_CPU_SECONDS ({MAX_CHAT_TEMPLATE_CPU_SECONDS} s "
                "of CPU time)"
            )

    def write(self, text: str) -> str:
        self.step()
        self._written += len(text)
        if self._written > MAX_CHAT_TEMPLATE_OUTPUT_CHARS:
            raise _OverBudget(
                "wrote more than MAX_CHAT_TEMPLATE_OUTPUT_CHARS "
                f"({MAX_CHAT_TEMPLATE_OUTPUT_CHARS}) characters"
            )
        return text


_BUDGET: ContextVar[_Budget] = ContextVar("chat_template_budget")


def _sized(value: Any) -> Any:
    """`value`, unless it is a string or collection longer than the output bound."""
    if isinstance(value, str | list | tuple | dict) and len(value) > MAX_CHAT_TEMPLATE_OUTPUT_CHARS:
        raise _OverBudget(
            f"built a value of {len(value)} items, over MAX_CHAT_TEMPLATE_OUTPUT_CHARS "
            f"({MAX_CHAT_TEMPLATE_OUTPUT_CHARS})"
        )
    return value


def _check_arguments(args: Iterable[Any]) -> None:
    """Refuse a size that builds a huge value in one C call, as in `center(10**9)`."""
    for arg in args:
        if isinstance(arg, int) and abs(arg) > MAX_CHAT_TEMPLATE_OUTPUT_CHARS:
            raise _OverBudget(
                f"passed {arg} to a call or operator, over MAX_CHAT_TEMPLATE_OUTPUT_CHARS "
                f"({MAX_CHAT_TEMPLATE_OUTPUT_CHARS})"
            )


def _check_format(text: object) -> None:
    """Refuse a format string whose width alone builds a huge string (`'%999999999s' % x`)."""
    if isinstance(text, str) and _FORMAT_WIDTH.search(text):
        raise _OverBudget(
            f"used a format width over MAX_CHAT_TEMPLATE_OUTPUT_CHARS "
            f"({MAX_CHAT_TEMPLATE_OUTPUT_CHARS})"
        )


def _budgeted_filter(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """A filter whose arguments and result are checked like a call's."""

    @functools.wraps(function)  # keeps jinja's pass_context marks
    def checked(*args: Any, **kwargs: Any) -> Any:
        _BUDGET.get().step()
        _check_arguments([*args, *kwargs.values()])
        if name == "format" and args:
            _check_format(args[0])
        return _sized(function(*args, **kwargs))

    return checked


class _BudgetedSandbox(ImmutableSandboxedEnvironment):
    """The sandbox, with every call, operator, loop step and write charged to the budget."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def call(
        __self,  # noqa: N805 - jinja's own signature: keyword arguments may be called "self"
        __context: Context,
        __obj: Any,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        _BUDGET.get().step()
        if getattr(__obj, "__self__", None) is __self:
            # The rewrite's own `budget_*` hooks: they charge what they are given themselves.
            return __context.call(__obj, *args, **kwargs)
        _check_arguments([*args, *kwargs.values()])
        if getattr(__obj, "__name__", None) in {"format", "format_map"}:
            # The sandbox hands templates `str.format` wrapped; the string is the bound self.
            _check_format(getattr(inspect.unwrap(__obj), "__self__", None))
        return _sized(super().call(__context, __obj, *args, **kwargs))

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        _BUDGET.get().step()
        if operator == "*":
            _check_arguments([left, right])
            count, item = (left, right) if isinstance(left, int) else (right, left)
            sized = isinstance(count, int) and isinstance(item, str | list | tuple)
            if sized and len(item) * count > MAX_CHAT_TEMPLATE_OUTPUT_CHARS:
                raise _OverBudget(
                    f"repeated {len(item)} items {count} times, over "
                    f"MAX_CHAT_TEMPLATE_OUTPUT_CHARS ({MAX_CHAT_TEMPLATE_OUTPUT_CHARS})"
                )
        elif operator == "**":
            if isinstance(left, int) and isinstance(right, int) and right > 64 and abs(left) > 1:
                raise _OverBudget(f"raised {left} to the power {right}; at most 64 is allowed")
        elif operator == "%":
            _check_format(left)
        return _sized(super().call_binop(context, operator, left, right))

    def budget_iter(self, iterable: Iterable[Any]) -> Iterator[Any]:
        """A loop's items, each iteration charged (the rewrite of `{% for %}` calls this)."""
        budget = _BUDGET.get()
        for item in iterable:
            budget.step()
            yield item

    def budget_write(self, value: Any) -> Any:
        """A value written to the output, charged by its length."""
        _BUDGET.get().write(str(value))
        return value

    def budget_join(self, *parts: Any) -> str:
        """`a ~ b`: jinja's own join, sized."""
        _BUDGET.get().step()
        joined: str = _sized("".join(map(str, parts)))
        return joined


def _budgeted(template: jinja2.nodes.Template) -> jinja2.nodes.Template:
    """Route loops, writes and `~` through the budget (the environment checks the rest)."""

    def through(method: str, *args: jinja2.nodes.Node) -> jinja2.nodes.Call:
        return jinja2.nodes.Call(
            jinja2.nodes.EnvironmentAttribute(method), list(args), [], None, None
        )

    for loop in template.find_all(jinja2.nodes.For):
        loop.iter = through("budget_iter", loop.iter)
    for output in template.find_all(jinja2.nodes.Output):
        output.nodes = [through("budget_write", node) for node in output.nodes]
    for concat in template.find_all(jinja2.nodes.Concat):
        concat.nodes = [through("budget_join", *concat.nodes)]
    return template


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


def _environment() -> _BudgetedSandbox:
    env = _BudgetedSandbox(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationBlock, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _Namespace
    env.filters = {name: _budgeted_filter(name, f) for name, f in env.filters.items()}
    return env
