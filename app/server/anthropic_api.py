"""Anthropic's Messages API, ``POST /v1/messages``, on the same engine, queue, limits and checks as the
OpenAI routes: ``system``, content blocks (``text``, ``tool_use``, ``tool_result``), tools and
``tool_choice``, streamed as Anthropic's events (``message_start``, ``content_block_start`` /
``_delta`` / ``_stop``, ``message_delta``, ``message_stop``), ``usage``, and Anthropic's error body.
The key may come as ``x-api-key`` (Anthropic's clients) or ``Authorization: Bearer``.

What it cannot honour is a 400 naming the field: images and documents, server tools (web search, code
execution, ...), MCP servers, containers, and a final assistant message to continue (a prefill).
``thinking`` is accepted and ignored (no thinking blocks come back), and so are thinking blocks of
earlier turns; ``cache_control`` is ignored (the engine reuses the prompt's cache by itself).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from sse_starlette.sse import EventSourceResponse

from app.engine import Finished, FinishReason, QueueFull, Started, Step
from app.server import responses as R
from app.server.errors import ApiError, unavailable
from app.server.limits import Limits, check_messages
from app.server.parsing import parse
from app.server.replies import Ask, check_model, collect, engine_error, first_event, replay, start
from app.server.schemas import Bool, Count, Float, Int, Text
from app.server.served import Generation, Served
from app.server.toolcalls import ParsedCall, TextOnly
from app.server.tools import Function, Tools, call_id, calls_chars, make_constraint, template_call

ROUTE = "/v1/messages"

STOP_REASONS = {
    FinishReason.EOG: "end_turn",
    FinishReason.CANCELLED: "end_turn",
    FinishReason.STOP: "stop_sequence",
    FinishReason.LENGTH: "max_tokens",
    FinishReason.CONTEXT: "max_tokens",
}

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    415: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded_error",
}


class Block(BaseModel):
    """A content block (the fields of the kinds Tandem reads; others are refused by type)."""

    model_config = ConfigDict(extra="ignore")
    type: Text
    text: Text | None = None
    id: Text | None = None  # tool_use
    name: Text | None = None  # tool_use
    input: dict[str, Any] | None = None  # tool_use
    tool_use_id: Text | None = None  # tool_result
    content: Text | list[Block] | None = None  # tool_result
    is_error: Bool | None = None  # tool_result


class AnthropicMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["user", "assistant"]
    content: Text | list[Block]


class AnthropicTool(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Text | None = None  # "custom" or absent; server tools name their own type
    name: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    description: Text | None = None
    input_schema: dict[str, Any] | None = None


class AnthropicToolChoice(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["auto", "any", "tool", "none"]
    name: Text | None = None
    disable_parallel_tool_use: Bool | None = None


class MessagesRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: Text | None = None
    max_tokens: Count
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: Text | list[Block] | None = None
    stop_sequences: list[Text] | None = None
    stream: Bool | None = False
    temperature: Float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: Float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: Int | None = Field(default=None, ge=0, lt=2**31)
    tools: list[AnthropicTool] | None = None
    tool_choice: AnthropicToolChoice | None = None
    output_config: dict[str, Any] | None = None  # its "format": structured output; "effort": ignored
    output_format: dict[str, Any] | None = None  # the beta's name for output_config.format
    mcp_servers: list[Any] | None = None
    container: Any = None
    thinking: Any = None  # accepted, ignored
    metadata: Any = None


class CountRequest(MessagesRequest):
    max_tokens: Count | None = None  # type: ignore[assignment]  # count_tokens takes none


def is_route(path: str) -> bool:
    return path == ROUTE or path.startswith(ROUTE + "/")


def error_response(e: ApiError) -> JSONResponse:
    """Anthropic's error body (the field named in the message)."""
    return JSONResponse(error_body(e), status_code=e.status, headers=e.headers)


def error_body(e: ApiError) -> dict[str, Any]:
    message = e.message if not e.param or e.message.startswith(e.param) else f"{e.param}: {e.message}"
    kind = ERROR_TYPES.get(e.status, "api_error" if e.status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def add_routes(app: FastAPI, served: Served, limits: Limits) -> None:
    def checked(req: MessagesRequest) -> tuple[list[dict[str, Any]], Tools]:
        chat, chars = _chat(req)
        tools = _tools(req)
        check_messages(len(chat), chars + tools.chars(), limits, served.n_ctx)
        check_model(served, req.model)
        return tools.messages(chat), tools

    @app.post(ROUTE + "/count_tokens", response_model=None)
    async def count_tokens(request: Request) -> Any:
        """The prompt's tokens, as the engine makes them (in its turn: the queue and its 429 apply)."""
        chat, _ = checked(await parse(request, CountRequest, limits))
        problem = served.unavailable()
        if problem is not None:
            raise unavailable(str(problem), problem.retry_after)
        try:
            ticket = served.turns.enter()
        except QueueFull as e:
            raise ApiError(429, f"{e}; try again later", "rate_limit_error", code="queue_full") from None

        def count() -> int | None:
            try:
                return len(served.client.tokenize(messages=chat)) if ticket.wait() else None
            finally:
                ticket.release()

        try:
            n = await asyncio.to_thread(count)
        except Exception as e:
            raise engine_error(e) from None
        if n is None:
            raise ApiError(503, "the engine is not taking requests", "server_error")
        return JSONResponse({"input_tokens": n})

    @app.post(ROUTE, response_model=None)
    async def messages(request: Request) -> Any:
        req = await parse(request, MessagesRequest, limits)
        chat, tools = checked(req)
        constraint = tools.constraint()
        fmt, where = (req.output_config or {}).get("format"), "output_config.format"
        if fmt is None and req.output_format is not None:
            fmt, where = req.output_format, "output_format"
        if fmt is not None:
            if constraint is not None:
                raise ApiError(400, "cannot be combined with a forced tool call", param=where)
            constraint = _output_format(fmt, where)
        ask = Ask(
            model=req.model,
            max_tokens=req.max_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
            top_k=req.top_k,
            stop=tuple(s for s in req.stop_sequences or () if s),
            constraint=constraint,
        )
        gen = start(served, limits, ask, messages=chat)
        events, first = await first_event(gen, request, "messages")
        mid, model = R.new_id("msg").replace("-", "_"), served.model_id
        if req.stream:
            return EventSourceResponse(
                _stream(gen, replay(events, first), mid, model, tools, ask.stop),
                ping=15,
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        fin = await collect(gen, request, events, first)
        parser = tools.parser() or TextOnly()
        pieces = parser.feed(fin.text) + parser.finish()
        content: list[dict[str, Any]] = []
        for p in pieces:
            if isinstance(p, ParsedCall):
                content.append(_tool_use(p))
            elif content and content[-1]["type"] == "text":
                content[-1]["text"] += p
            else:
                content.append({"type": "text", "text": p})
        body = _message(mid, model, content or [{"type": "text", "text": ""}])
        body.update(_stop(fin, parser.n_calls > 0, ask.stop))
        body["usage"] = _usage(fin.stats.n_prompt_tokens, fin.stats.n_prompt_cached, fin.stats.n_generated)
        return JSONResponse(body)


# -- the request ---------------------------------------------------------------------------------------
def _text(blocks: list[Block], where: str) -> str:
    out = []
    for j, b in enumerate(blocks):
        if b.type == "text":
            out.append(b.text or "")
        else:
            raise ApiError(400, f"{b.type!r} blocks are not supported here", param=f"{where}[{j}].type")
    return "".join(out)


def _chat(req: MessagesRequest) -> tuple[list[dict[str, Any]], int]:
    """The conversation as the template reads it: the system prompt, then each message (tool results
    as tool messages, calls as the assistant's tool calls), and its characters."""
    out: list[dict[str, Any]] = []
    if req.system:
        system = req.system if isinstance(req.system, str) else _text(req.system, "system")
        out.append({"role": "system", "content": system})
    if req.messages[-1].role == "assistant":
        raise ApiError(
            400,
            "a final assistant message (a prefill to continue) is not supported",
            param=f"messages[{len(req.messages) - 1}]",
        )
    for i, m in enumerate(req.messages):
        if isinstance(m.content, str):
            out.append({"role": m.role, "content": m.content})
            continue
        texts: list[str] = []
        calls: list[dict[str, Any]] = []
        for j, b in enumerate(m.content):
            where = f"messages[{i}].content[{j}]"
            if b.type == "text":
                texts.append(b.text or "")
            elif b.type in ("thinking", "redacted_thinking"):
                continue  # an earlier turn's thinking: not shown to the model again
            elif b.type == "tool_use" and m.role == "assistant":
                if not b.name:
                    raise ApiError(400, "a tool_use block needs a name", param=f"{where}.name")
                args = json.dumps(b.input or {}, ensure_ascii=False)
                calls.append(template_call(b.id, b.name, args))
            elif b.type == "tool_result" and m.role == "user":
                if isinstance(b.content, list):
                    text = _text(b.content, f"{where}.content")
                else:
                    text = b.content or ""
                out.append(
                    {
                        "role": "tool",
                        "content": f"Error: {text}" if b.is_error else text,
                        "tool_call_id": b.tool_use_id or "",
                    }
                )
            else:
                raise ApiError(400, f"{b.type!r} blocks are not supported here", param=f"{where}.type")
        if texts or calls:
            msg: dict[str, Any] = {"role": m.role, "content": "".join(texts)}
            if calls:
                msg["tool_calls"] = calls
            out.append(msg)
    if all(m["role"] == "system" for m in out):
        raise ApiError(400, "the messages have no content", param="messages")
    chars = sum(len(m["content"]) + calls_chars(m.get("tool_calls", ())) for m in out)
    return out, chars


def _tools(req: MessagesRequest) -> Tools:
    functions = []
    if req.mcp_servers:
        raise ApiError(400, "MCP servers are not supported", param="mcp_servers")
    if req.container is not None:
        raise ApiError(400, "containers are not supported", param="container")
    for i, t in enumerate(req.tools or ()):
        if t.type not in (None, "custom"):
            raise ApiError(400, f"server tools ({t.type!r}) are not supported", param=f"tools[{i}].type")
        if not t.name:
            raise ApiError(400, "a tool needs a name", param=f"tools[{i}].name")
        functions.append(Function(t.name, t.description, t.input_schema))
    tc = req.tool_choice
    choice = {"auto": "auto", "any": "required", "none": "none", "tool": tc.name if tc else ""}
    name = choice[tc.type] if tc else "auto"
    if tc and tc.type == "tool" and not tc.name:
        raise ApiError(400, "tool_choice of type 'tool' needs the tool's name", param="tool_choice.name")
    parallel = not (tc and tc.disable_parallel_tool_use)
    return Tools(tuple(functions), name or "auto", parallel)


def _output_format(fmt: Any, where: str) -> Any:
    """Structured output: ``{"type": "json_schema", "schema": {...}}``, enforced whole (as Anthropic's)."""
    if (
        not isinstance(fmt, dict)
        or fmt.get("type") != "json_schema"
        or not isinstance(fmt.get("schema"), dict)
    ):
        raise ApiError(400, "only {'type': 'json_schema', 'schema': {...}} is supported", param=where)
    return make_constraint("json_schema", json.dumps(fmt["schema"]), True, where)


# -- the reply -----------------------------------------------------------------------------------------
def _message(mid: str, model: str, content: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": mid,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": None,
        "stop_sequence": None,
    }


def _tool_use(call: ParsedCall) -> dict[str, Any]:
    return {
        "type": "tool_use",
        "id": call_id("toolu"),
        "name": call.name,
        "input": json.loads(call.arguments),
    }


def _stop(fin: Finished, called: bool, stops: tuple[str, ...]) -> dict[str, Any]:
    reason = "tool_use" if called else STOP_REASONS.get(fin.reason, "end_turn")
    # which stop string ended the reply is not reported by the engine: named where there is one
    sequence = stops[0] if reason == "stop_sequence" and len(stops) == 1 else None
    return {"stop_reason": reason, "stop_sequence": sequence}


def _usage(n_prompt: int, n_cached: int, n_out: int) -> dict[str, int]:
    """Anthropic counts the prompt's tokens read from the cache apart from the rest."""
    return {
        "input_tokens": max(0, n_prompt - n_cached),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": n_cached,
        "output_tokens": n_out,
    }


def _event(data: dict[str, Any]) -> dict[str, str]:
    return {"event": data["type"], "data": json.dumps(data, ensure_ascii=False)}


async def _stream(
    gen: Generation,
    events: AsyncIterator[Any],
    mid: str,
    model: str,
    tools: Tools,
    stops: tuple[str, ...],
) -> AsyncIterator[dict[str, str]]:
    parser = tools.parser() or TextOnly()
    index = -1  # the content block open now (or last closed)
    text_open = False
    n_blocks = 0

    def text(piece: str) -> list[dict[str, str]]:
        nonlocal index, text_open, n_blocks
        out = []
        if not text_open:
            index, text_open, n_blocks = index + 1, True, n_blocks + 1
            block = {"type": "text", "text": ""}
            out.append(_event({"type": "content_block_start", "index": index, "content_block": block}))
        delta = {"type": "text_delta", "text": piece}
        out.append(_event({"type": "content_block_delta", "index": index, "delta": delta}))
        return out

    def close() -> list[dict[str, str]]:
        nonlocal text_open
        if not text_open:
            return []
        text_open = False
        return [_event({"type": "content_block_stop", "index": index})]

    def call(p: ParsedCall) -> list[dict[str, str]]:
        nonlocal index, n_blocks
        out = close()
        index, n_blocks = index + 1, n_blocks + 1
        block = {"type": "tool_use", "id": call_id("toolu"), "name": p.name, "input": {}}
        delta = {"type": "input_json_delta", "partial_json": p.arguments}
        out.append(_event({"type": "content_block_start", "index": index, "content_block": block}))
        out.append(_event({"type": "content_block_delta", "index": index, "delta": delta}))
        out.append(_event({"type": "content_block_stop", "index": index}))
        return out

    def pieces(items: list[str | ParsedCall]) -> list[dict[str, str]]:
        out = []
        for p in items:
            out += call(p) if isinstance(p, ParsedCall) else text(p)
        return out

    try:
        fin: Finished | None = None
        started = False
        async for ev in events:
            if not started:
                started = True
                n_prompt = ev.n_prompt_tokens if isinstance(ev, Started) else 0
                n_cached = ev.n_prompt_cached if isinstance(ev, Started) else 0
                message = _message(mid, model, [])
                message["usage"] = _usage(n_prompt, n_cached, 0)
                yield _event({"type": "message_start", "message": message})
            if isinstance(ev, Step) and ev.text:
                for out in pieces(parser.feed(ev.text)):
                    yield out
            elif isinstance(ev, Finished):
                fin = ev
        if fin is None:
            return
        for out in pieces(parser.finish()):
            yield out
        if not n_blocks:
            for out in text(""):
                yield out
        for out in close():
            yield out
        delta = _stop(fin, parser.n_calls > 0, stops)
        usage = _usage(fin.stats.n_prompt_tokens, fin.stats.n_prompt_cached, fin.stats.n_generated)
        yield _event({"type": "message_delta", "delta": delta, "usage": usage})
        yield _event({"type": "message_stop"})
    except Exception as e:  # the headers are sent: the error travels as an event, as Anthropic's does
        yield _event(error_body(engine_error(e)))
    finally:
        gen.cancel()  # a client that went away stops the engine within one round
