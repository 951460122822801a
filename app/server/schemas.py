"""The requests the API accepts (pydantic), as OpenAI's API defines them; unknown fields are ignored,
fields Tandem cannot honour are refused by name (see :func:`unsupported`).

Types are strict: ``"stream": "yes"``, ``"temperature": true`` or ``"max_tokens": "5"`` are 400s, not
guesses; numbers are finite; every string must be valid UTF-8 (a lone surrogate such as ``"\\ud800"``
is refused here, not deep in the engine); token ids are non-negative 32-bit integers.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    AllowInfNan,
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    field_validator,
)

try:  # structured output (grammar-constrained sampling), where the engine has it
    from app.engine import Constraint
except ImportError:  # pragma: no cover - an engine without it
    Constraint = None  # type: ignore[assignment,misc]

TOKEN_ID_LIMIT = 2**31  # llama.cpp's token ids are int32
#: the engine constrains sampling (response_format json_object/json_schema, tool_choice required/named)
CONSTRAINED = Constraint is not None


def _utf8(s: str) -> str:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = s[e.start : e.end]
        raise ValueError(
            f"the text is not valid Unicode: {bad!r} at character {e.start} is a lone surrogate"
        ) from None
    return s


Text = Annotated[str, Strict(), AfterValidator(_utf8)]
Bool = Annotated[bool, Strict()]
Int = Annotated[int, Strict()]
Float = Annotated[float, Strict(), AllowInfNan(False)]
Count = Annotated[int, Strict(), Field(ge=1, lt=TOKEN_ID_LIMIT)]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: Bool | None = False


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Text
    text: Text | None = None


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: Text
    arguments: Text = ""  # JSON text of an object, as the model wrote it


class ToolCallIn(BaseModel):
    """A call an earlier assistant message made, as the client sends it back."""

    model_config = ConfigDict(extra="ignore")
    id: Text | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | list[ContentPart] | None = None
    name: Text | None = None
    tool_calls: list[ToolCallIn] | None = None  # assistant
    tool_call_id: Text | None = None  # tool


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: Annotated[str, Strict(), Field(min_length=1, max_length=256), AfterValidator(_utf8)]
    description: Text | None = None
    parameters: dict[str, Any] | None = None
    strict: Bool | None = None


class ToolDef(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: Text


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["function"]
    function: NamedFunction


class Sampling(BaseModel):
    """What both endpoints share."""

    model_config = ConfigDict(extra="ignore")
    model: Text | None = None
    stream: Bool | None = False
    stream_options: StreamOptions | None = None
    max_tokens: Count | None = None
    temperature: Float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: Float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: Int | None = Field(default=None, ge=0, lt=TOKEN_ID_LIMIT)  # llama.cpp's extension
    min_p: Float | None = Field(default=None, ge=0.0, lt=1.0)  # llama.cpp's extension
    repeat_penalty: Float | None = Field(default=None, gt=0.0, le=100.0)  # llama.cpp's extension
    presence_penalty: Float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: Float | None = Field(default=None, ge=-2.0, le=2.0)
    seed: Int | None = Field(default=None, ge=-(2**63), lt=2**64)
    stop: Text | list[Text] | None = None
    n: Int | None = Field(default=None, ge=1)
    logprobs: Bool | Int | None = None
    user: Text | None = None


class ChatCompletionRequest(Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Count | None = None
    tools: list[ToolDef] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: Bool | None = None
    functions: list[Any] | None = None
    function_call: Any = None
    response_format: dict[str, Any] | None = None
    top_logprobs: Int | None = None


class CompletionRequest(Sampling):
    prompt: Any
    echo: Bool | None = False
    suffix: Text | None = None
    best_of: Int | None = Field(default=None, ge=1)

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v: Any) -> str | list[str] | list[int]:
        """A string, a list of strings, or a list of token ids (non-negative 32-bit integers)."""
        if isinstance(v, str):
            return _utf8(v)
        if isinstance(v, list) and v and all(isinstance(x, str) for x in v):
            return [_utf8(x) for x in v]
        if isinstance(v, list) and all(type(x) is int for x in v):
            for i, t in enumerate(v):
                if not 0 <= t < TOKEN_ID_LIMIT:
                    raise ValueError(
                        f"prompt[{i}] = {t} is not a token id (ids are 0 to {TOKEN_ID_LIMIT - 1})"
                    )
            return v
        raise ValueError("the prompt must be a string, a list of strings or a list of token ids (integers)")


def unsupported(req: Sampling) -> tuple[str, str] | None:
    """The first field of ``req`` that Tandem cannot honour: (field, why), or None."""
    if req.n is not None and req.n > 1:
        return "n", "only one choice per request is supported (n must be 1)"
    if req.logprobs:
        return "logprobs", "log probabilities are not supported"
    if isinstance(req, ChatCompletionRequest):
        if req.functions or req.function_call not in (None, "none"):
            what = "functions" if req.functions else "function_call"
            return what, "the deprecated functions and function_call are not supported: use tools"
        if req.tool_choice not in (None, "none", "auto") and not req.tools:
            return "tool_choice", "tool_choice needs tools"
        if req.tool_choice not in (None, "none", "auto") and not CONSTRAINED:
            return "tool_choice", "tool_choice 'required' or a named function is not supported"
        fmt = (req.response_format or {}).get("type", "text")
        if fmt != "text" and (fmt not in ("json_object", "json_schema") or not CONSTRAINED):
            return "response_format", f"response_format {fmt!r} is not supported (only 'text')"
        for i, m in enumerate(req.messages):
            if isinstance(m.content, list) and any(p.type != "text" for p in m.content):
                return f"messages[{i}].content", "only text content is supported"
    if isinstance(req, CompletionRequest):
        if req.echo:
            return "echo", "echo is not supported"
        if req.suffix:
            return "suffix", "suffix (fill in the middle) is not supported"
        if req.best_of is not None and req.best_of > 1:
            return "best_of", "best_of must be 1"
        if (
            isinstance(req.prompt, list)
            and req.prompt
            and isinstance(req.prompt[0], str)
            and len(req.prompt) > 1
        ):
            return "prompt", "one prompt per request is supported"
    return None


def message_text(m: ChatMessage) -> str:
    """A message's text (text parts joined)."""
    if m.content is None:
        return ""
    if isinstance(m.content, str):
        return m.content
    return "".join(p.text or "" for p in m.content)


def stop_strings(stop: str | list[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    items = [stop] if isinstance(stop, str) else stop
    return tuple(s for s in items if s)
