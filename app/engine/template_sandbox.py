"""The sandbox chat templates render in: transformers' sandboxed Jinja environment with limits on render
time, loop iterations, repeated strings and powers, a request's cancel looked at as it renders, and the
globals and filters Hugging Face templates use (`app.engine.chat` renders with it)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from datetime import datetime
from types import TracebackType
from typing import Any

import jinja2
from jinja2.exceptions import SecurityError
from jinja2.runtime import Context, Undefined
from jinja2.sandbox import ImmutableSandboxedEnvironment

_TEMPLATE_FILENAME = "<template>"  # what Jinja names a template made with from_string()
_ITER_FILTER = "__tandem_budgeted_iter"  # filter wrapped around every {% for %} iterable
_MAX_REPEAT = 10_000_000  # longest str / list a template may build with `*`
_MAX_EXPONENT = 4096  # largest integer exponent a template may use with `**`
_CANCEL_EVERY = 256  # sandbox checks between two looks at a render's cancel


class Cancelled(Exception):
    """A render (or a prompt's tokenization) stopped because its request was cancelled."""


class _RenderBudget:
    """Limits of one render: a wall-clock deadline, a number of loop iterations, and a request's cancel
    (asked every ``_CANCEL_EVERY`` checks)."""

    __slots__ = ("cancel", "checks", "deadline", "iterations_left", "timeout")

    def __init__(self, timeout: float, max_iterations: int, cancel: Callable[[], bool] | None = None) -> None:
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout
        self.iterations_left = max_iterations
        self.cancel = cancel
        self.checks = 0

    def check(self) -> None:
        if time.monotonic() > self.deadline:
            raise SecurityError(f"chat template took longer than {self.timeout:g} s to render")
        if self.cancel is not None:
            self.checks += 1
            if self.checks % _CANCEL_EVERY == 0 and self.cancel():
                raise Cancelled("the request was cancelled while its chat was rendered")

    def iteration(self) -> None:
        self.iterations_left -= 1
        if self.iterations_left < 0:
            raise SecurityError("chat template looped too many times")
        self.check()


_BUDGET: ContextVar[_RenderBudget | None] = ContextVar("tandem_chat_render_budget", default=None)


def _check_budget() -> None:
    budget = _BUDGET.get()
    if budget is not None:
        budget.check()


class _BudgetedIterable:
    """Wraps a ``{% for %}`` iterable so every iteration is charged to the render budget."""

    __slots__ = ("_iterable",)

    def __init__(self, iterable: Iterable[Any]) -> None:
        self._iterable = iterable

    def __len__(self) -> int:
        return len(self._iterable)  # type: ignore[arg-type]  # TypeError is what Jinja expects

    def __iter__(self) -> Iterator[Any]:
        budget = _BUDGET.get()
        for item in self._iterable:
            if budget is not None:
                budget.iteration()
            yield item


class _ChatSandbox(ImmutableSandboxedEnvironment):
    """transformers' chat-template sandbox, plus time/iteration/size limits.

    Unsafe attribute access fails at once (transformers would yield an undefined value that
    only fails when used further).
    """

    intercepted_binops = frozenset({"*", "**"})

    def unsafe_undefined(self, obj: Any, attribute: str) -> Undefined:
        raise SecurityError(f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe")

    def call(self, __context: Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        _check_budget()
        return super().call(__context, __obj, *args, **kwargs)

    def getattr(self, obj: Any, attribute: str) -> Any:
        _check_budget()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        _check_budget()
        return super().getitem(obj, argument)

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        _check_budget()
        if operator == "*":
            for seq, count in ((left, right), (right, left)):
                if (
                    isinstance(seq, (str, list, tuple))
                    and isinstance(count, int)
                    and len(seq) * count > _MAX_REPEAT
                ):
                    raise SecurityError(f"chat template builds a sequence longer than {_MAX_REPEAT}")
        elif (
            operator == "**"
            and isinstance(left, int)
            and isinstance(right, int)
            and abs(left) > 1
            and right > _MAX_EXPONENT
        ):
            raise SecurityError(f"chat template raises to a power above {_MAX_EXPONENT}")
        return super().call_binop(context, operator, left, right)


def _raise_exception(message: str) -> None:
    """The ``raise_exception(msg)`` global of HF templates."""
    raise jinja2.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    """The ``strftime_now(fmt)`` global of HF templates: local time now."""
    return datetime.now().strftime(fmt)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | str | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    """transformers' ``tojson``: plain ``json.dumps``, no HTML escaping, non-ASCII kept."""
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _template_lineno(tb: TracebackType | None) -> int | None:
    """The template line of the innermost template frame of a render traceback."""
    lineno = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == _TEMPLATE_FILENAME:
            lineno = tb.tb_lineno
        tb = tb.tb_next
    return lineno


def _with_line(message: str, lineno: int | None) -> str:
    return f"{message} (template line {lineno})" if lineno is not None else message
