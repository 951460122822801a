"""The requests the API accepts (pydantic), as OpenAI's API defines them; unknown fields are ignored,
fields Tandem cannot honour are refused by name (see :func:`unsupported`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None


class Sampling(BaseModel):
    """What both endpoints share."""

    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)  # llama.cpp's extension
    min_p: float | None = Field(default=None, ge=0.0, lt=1.0)  # llama.cpp's extension
    repeat_penalty: float | None = Field(default=None, gt=0.0)  # llama.cpp's extension
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int | None = Field(default=None, ge=1)
    logprobs: bool | int | None = None
    user: str | None = None


class ChatCompletionRequest(Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    tools: list[Any] | None = None
    tool_choice: Any = None
    functions: list[Any] | None = None
    function_call: Any = None
    response_format: dict[str, Any] | None = None
    top_logprobs: int | None = None


class CompletionRequest(Sampling):
    prompt: str | list[str] | list[int]
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None


def unsupported(req: Sampling) -> tuple[str, str] | None:
    """The first field of ``req`` that Tandem cannot honour: (field, why), or None."""
    if req.n is not None and req.n > 1:
        return "n", "only one choice per request is supported (n must be 1)"
    if req.logprobs:
        return "logprobs", "log probabilities are not supported"
    if isinstance(req, ChatCompletionRequest):
        if req.tools or req.functions:
            return ("tools" if req.tools else "functions"), "tool and function calling are not supported"
        if req.tool_choice not in (None, "none") or req.function_call not in (None, "none"):
            return "tool_choice", "tool and function calling are not supported"
        fmt = (req.response_format or {}).get("type", "text")
        if fmt != "text":
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
