"""A request's tools, the choice of calls and structured output, as every API shape takes them: the
functions the template is given (OpenAI's ``{"type": "function", "function": ...}``, as
``transformers`` and llama.cpp's ``--jinja`` give them), whether and how a call is forced (a JSON-schema
:class:`app.engine.Constraint` for one valid call), and ids for the calls the model makes."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from app.server.errors import ApiError
from app.server.schemas import CONSTRAINED, ChatCompletionRequest, Constraint, message_text
from app.server.toolcalls import CallParser

CHOICES = ("auto", "none", "required")
#: the role of the leading pseudo-message that carries tools to the template: the engine's
#: ``app.engine.chat.TOOLS_ROLE`` (the server imports only the engine's public API; a test checks both)
TOOLS_ROLE = "tandem.tools"


@dataclass(frozen=True)
class Function:
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool = False

    def template(self) -> dict[str, Any]:
        """As a chat template reads a tool."""
        fn: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            fn["description"] = self.description
        fn["parameters"] = (
            self.parameters if self.parameters is not None else {"type": "object", "properties": {}}
        )
        return {"type": "function", "function": fn}


@dataclass(frozen=True)
class Tools:
    """The functions a request offers and what it asks of them: ``choice`` is "auto", "none",
    "required" or the name of the one function to call; ``parallel``: several calls in one reply."""

    functions: tuple[Function, ...] = ()
    choice: str = "auto"
    parallel: bool = True
    param: str = "tool_choice"  # the request's field for tool_choice, named in errors
    names: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "names", frozenset(f.name for f in self.functions))
        if self.choice not in CHOICES and self.choice not in self.names:
            raise ApiError(
                400,
                f"{self.param} names the function {self.choice!r}, which tools do not offer",
                param=self.param,
            )
        if self.choice == "required" and not self.functions:
            raise ApiError(400, f"{self.param} 'required' needs tools", param=self.param)

    @property
    def active(self) -> bool:
        """The template is given the tools and the reply is read for calls."""
        return bool(self.functions) and self.choice != "none"

    @property
    def forced(self) -> bool:
        return self.active and self.choice != "auto"

    def chars(self) -> int:
        """Characters the tools add to the prompt (for the prompt's length bound)."""
        return (
            sum(len(json.dumps(f.template(), ensure_ascii=False)) for f in self.functions)
            if self.active
            else 0
        )

    def messages(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The chat with the tools carried to the template (:data:`app.engine.chat.TOOLS_ROLE`)."""
        if not self.active:
            return messages
        return [{"role": TOOLS_ROLE, "tools": [f.template() for f in self.functions]}, *messages]

    def parser(self) -> CallParser | None:
        return CallParser(self.names, first_only=not self.parallel) if self.active else None

    def constraint(self) -> Any:
        """A constraint that makes the reply one valid call (``required`` or a named function)."""
        if not self.forced:
            return None
        if not CONSTRAINED:
            raise ApiError(400, f"{self.param} {self.choice!r} is not supported", param=self.param)
        wanted = [f for f in self.functions if self.choice == "required" or f.name == self.choice]
        options = [
            {
                "type": "object",
                "properties": {
                    "name": {"const": f.name},
                    "arguments": f.parameters or {"type": "object"},
                },
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for f in wanted
        ]
        schema = options[0] if len(options) == 1 else {"anyOf": options}
        return make_constraint("json_schema", json.dumps(schema), any(f.strict for f in wanted), "tools")


def make_constraint(kind: str, schema: str | None, strict: bool, param: str) -> Any:
    """An engine constraint, or a 400 naming ``param`` when the engine cannot enforce it."""
    if not CONSTRAINED:
        raise ApiError(400, f"{param}: structured output is not supported", param=param)
    try:
        return Constraint(kind, schema=schema, strict=strict)  # type: ignore[misc]
    except ValueError as e:  # ConstraintError: one line, fit for a 400
        raise ApiError(400, f"{param}: {e}", param=param) from None


def response_format(fmt: dict[str, Any] | None, param: str = "response_format") -> Any:
    """OpenAI's ``response_format`` (or the Responses API's ``text.format``) as a constraint (None: text)."""
    if not fmt:
        return None
    kind = fmt.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return make_constraint("json_object", None, False, param)
    if kind != "json_schema":
        raise ApiError(400, f"{param} {kind!r} is not supported", param=param)
    spec = fmt.get("json_schema", fmt)  # chat completions nest it; the Responses API does not
    if not isinstance(spec, dict):
        raise ApiError(400, f"{param}: json_schema must be an object", param=param)
    schema = spec.get("schema")
    if schema is None:
        schema = {}  # any JSON value that is an object: as OpenAI reads a missing schema
    if not isinstance(schema, dict):
        raise ApiError(400, f"{param}: the schema must be a JSON object", param=param)
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise ApiError(400, f"{param}: strict must be true or false", param=param)
    if not schema:
        return make_constraint("json_object", None, False, param)
    return make_constraint("json_schema", json.dumps(schema), bool(strict), param)


def one_constraint(*constraints: Any, param: str) -> Any:
    """The one constraint of a reply (a forced call and a response format cannot both hold)."""
    given = [c for c in constraints if c is not None]
    if len(given) > 1:
        raise ApiError(400, f"{param} cannot be combined with a forced tool call", param=param)
    return given[0] if given else None


def call_id(prefix: str = "call") -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def template_call(call_id_: str | None, name: str, arguments: str) -> dict[str, Any]:
    """An earlier call as the chat template reads it (the arguments as JSON text; the template turns them
    into an object where it wants one)."""
    call: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": arguments}}
    if call_id_:
        call["id"] = call_id_
    return call


def calls_chars(calls: Sequence[dict[str, Any]]) -> int:
    return sum(len(c["function"]["name"]) + len(c["function"]["arguments"]) for c in calls)


# -- OpenAI's chat completions ---------------------------------------------------------------------------
def chat_tools(req: ChatCompletionRequest) -> Tools:
    choice = req.tool_choice
    name = choice if isinstance(choice, str) or choice is None else choice.function.name
    functions = tuple(
        Function(t.function.name, t.function.description, t.function.parameters, bool(t.function.strict))
        for t in req.tools or ()
    )
    return Tools(functions, name or "auto", req.parallel_tool_calls is not False)


def chat_messages(req: ChatCompletionRequest) -> tuple[list[dict[str, Any]], int]:
    """The chat as the template reads it (assistant calls and tool results with their ids), and its
    characters."""
    out: list[dict[str, Any]] = []
    chars = 0
    for m in req.messages:
        text = message_text(m)
        msg: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": text}
        chars += len(text)
        if m.role == "assistant" and m.tool_calls:
            msg["tool_calls"] = [
                template_call(c.id, c.function.name, c.function.arguments) for c in m.tool_calls
            ]
            chars += calls_chars(msg["tool_calls"])
        elif m.role == "tool":
            if m.tool_call_id:
                msg["tool_call_id"] = m.tool_call_id
            if m.name:
                msg["name"] = m.name
        out.append(msg)
    return out, chars
