"""OpenAI's Responses API, ``POST /v1/responses``, on the same engine, queue, limits and checks as the
other routes: ``input`` (a text, or items: messages, ``function_call`` and ``function_call_output``),
``instructions``, function tools and ``tool_choice``, ``text.format`` (structured output), and the
reply's output items (a message's ``output_text``, ``function_call``), streamed as the API's events
(``response.created``, ``response.output_item.added``, ``response.output_text.delta``, ...,
``response.completed``).

Nothing is stored: ``previous_response_id``, ``conversation`` and ``background`` are a 400 naming the
field (send the whole conversation, as agents do with ``store: false``), and so are images and files,
hosted tools (web search, file search, computer use, MCP, ...) and log probabilities. ``reasoning``,
``include``, ``truncation``, ``store`` and ``metadata`` are accepted; reasoning items of earlier turns
are not shown to the model again.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from sse_starlette.sse import EventSourceResponse

from app.engine import Finished, Step
from app.server import responses as R
from app.server.errors import ApiError
from app.server.limits import Limits, check_messages
from app.server.parsing import parse
from app.server.replies import Ask, check_model, collect, engine_error, first_event, replay, start
from app.server.schemas import Bool, Count, Float, Int, Text
from app.server.served import Generation, Served
from app.server.toolcalls import ParsedCall, TextOnly
from app.server.tools import (
    Function,
    Tools,
    call_id,
    calls_chars,
    one_constraint,
    response_format,
    template_call,
)

ROUTE = "/v1/responses"
TEXT_PARTS = ("input_text", "output_text", "text")
SKIPPED_ITEMS = ("reasoning",)


class Part(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Text
    text: Text | None = None


class Item(BaseModel):
    """An input item: a message (``type`` "message" or absent), a function call or its output."""

    model_config = ConfigDict(extra="ignore")
    type: Text | None = None
    role: Literal["user", "assistant", "system", "developer"] | None = None
    content: Text | list[Part] | None = None
    call_id: Text | None = None
    name: Text | None = None
    arguments: Text | None = None
    output: Text | list[Part] | None = None


class Tool(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Text
    name: Text | None = None
    description: Text | None = None
    parameters: dict[str, Any] | None = None
    strict: Bool | None = None


class NamedTool(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Text
    name: Text | None = None


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: Text | None = None
    input: Text | list[Item]
    instructions: Text | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedTool | None = None
    parallel_tool_calls: Bool | None = None
    max_output_tokens: Count | None = None
    temperature: Float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: Float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: Int | None = Field(default=None, ge=0, lt=2**31)  # llama.cpp's extension
    seed: Int | None = Field(default=None, ge=-(2**63), lt=2**64)  # llama.cpp's extension
    stream: Bool | None = False
    text: dict[str, Any] | None = None
    previous_response_id: Text | None = None
    conversation: Any = None
    background: Bool | None = None
    prompt: Any = None
    top_logprobs: Int | None = None
    store: Bool | None = None
    metadata: dict[str, Any] | None = None
    user: Text | None = None


def add_routes(app: FastAPI, served: Served, limits: Limits) -> None:
    @app.post(ROUTE, response_model=None)
    async def responses(request: Request) -> Any:
        req = await parse(request, ResponsesRequest, limits, items="input")
        _refuse(req)
        chat, chars = _chat(req)
        tools = _tools(req)
        try:
            check_messages(len(chat), chars + tools.chars(), limits, served.n_ctx)
        except ApiError as e:
            e.param = "input"
            raise
        check_model(served, req.model)
        fmt = (req.text or {}).get("format")
        if fmt is not None and not isinstance(fmt, dict):
            raise ApiError(400, "text.format must be an object", param="text.format")
        constraint = one_constraint(
            tools.constraint(), response_format(fmt, "text.format"), param="text.format"
        )
        ask = Ask(
            model=req.model,
            max_tokens=req.max_output_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
            top_k=req.top_k,
            seed=req.seed,
            constraint=constraint,
        )
        gen = start(served, limits, ask, messages=tools.messages(chat))
        events, first = await first_event(gen, request, "input")
        base = _base(req, served.model_id)
        if req.stream:
            return EventSourceResponse(
                _stream(gen, replay(events, first), base, tools),
                ping=15,
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        fin = await collect(gen, request, events, first, "input")
        parser = tools.parser() or TextOnly()
        output: list[dict[str, Any]] = []
        for p in parser.feed(fin.text) + parser.finish():
            if isinstance(p, ParsedCall):
                output.append(_function_call(p, "completed"))
            elif output and output[-1]["type"] == "message":
                output[-1]["content"][0]["text"] += p
            else:
                output.append(_message_item(p, "completed"))
        return JSONResponse(_finished(base, fin, output))


# -- the request ---------------------------------------------------------------------------------------
def _refuse(req: ResponsesRequest) -> None:
    """The first field Tandem cannot honour, as a 400 naming it."""
    if req.previous_response_id:
        raise ApiError(
            400,
            "responses are not stored: send the whole conversation in input",
            param="previous_response_id",
        )
    if req.conversation is not None:
        raise ApiError(400, "conversations are not stored: send the whole conversation", param="conversation")
    if req.background:
        raise ApiError(400, "background responses are not supported", param="background")
    if req.prompt is not None:
        raise ApiError(400, "stored prompts are not supported", param="prompt")
    if req.top_logprobs:
        raise ApiError(400, "log probabilities are not supported", param="top_logprobs")


def _text(parts: str | list[Part] | None, where: str) -> str:
    if parts is None or isinstance(parts, str):
        return parts or ""
    out = []
    for j, p in enumerate(parts):
        if p.type not in TEXT_PARTS:
            raise ApiError(
                400, f"{p.type!r} content is not supported (text only)", param=f"{where}[{j}].type"
            )
        out.append(p.text or "")
    return "".join(out)


def _chat(req: ResponsesRequest) -> tuple[list[dict[str, Any]], int]:
    """The conversation as the template reads it, and its characters."""
    out: list[dict[str, Any]] = []
    if req.instructions:
        out.append({"role": "system", "content": req.instructions})
    items = [Item(role="user", content=req.input)] if isinstance(req.input, str) else req.input
    for i, item in enumerate(items):
        kind = item.type or "message"
        where = f"input[{i}]"
        if kind == "message":
            if item.role is None:
                raise ApiError(400, "a message needs a role", param=f"{where}.role")
            role = "system" if item.role == "developer" else item.role
            out.append({"role": role, "content": _text(item.content, f"{where}.content")})
        elif kind == "function_call":
            if not item.name:
                raise ApiError(400, "a function_call needs a name", param=f"{where}.name")
            call = template_call(item.call_id, item.name, item.arguments or "{}")
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":  # calls of one turn, after its text
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = _text(item.output, f"{where}.output")
            out.append({"role": "tool", "content": output, "tool_call_id": item.call_id or ""})
        elif kind not in SKIPPED_ITEMS:
            raise ApiError(400, f"input items of type {kind!r} are not supported", param=f"{where}.type")
    if not out or all(m["role"] == "system" for m in out):
        raise ApiError(400, "the input is empty", param="input")
    chars = sum(len(m["content"]) + calls_chars(m.get("tool_calls", ())) for m in out)
    return out, chars


def _tools(req: ResponsesRequest) -> Tools:
    functions = []
    for i, t in enumerate(req.tools or ()):
        if t.type != "function":
            raise ApiError(
                400, f"{t.type!r} tools are not supported (functions only)", param=f"tools[{i}].type"
            )
        if not t.name:
            raise ApiError(400, "a function tool needs a name", param=f"tools[{i}].name")
        functions.append(Function(t.name, t.description, t.parameters, bool(t.strict)))
    choice = req.tool_choice
    if isinstance(choice, NamedTool):
        if choice.type != "function" or not choice.name:
            raise ApiError(
                400, "tool_choice names a function: {'type': 'function', 'name': ...}", param="tool_choice"
            )
        choice = choice.name
    return Tools(tuple(functions), choice or "auto", req.parallel_tool_calls is not False)


# -- the reply -----------------------------------------------------------------------------------------
def _base(req: ResponsesRequest, model: str) -> dict[str, Any]:
    """The response object before its output: what was asked, echoed as the API does."""
    return {
        "id": R.new_id("resp").replace("-", "_"),
        "object": "response",
        "created_at": R.now(),
        "status": "in_progress",
        "error": None,
        "incomplete_details": None,
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "model": model,
        "output": [],
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None},
        "store": False,
        "temperature": req.temperature,
        "text": req.text or {"format": {"type": "text"}},
        "tool_choice": req.tool_choice.model_dump()
        if isinstance(req.tool_choice, NamedTool)
        else (req.tool_choice or "auto"),
        "tools": [t.model_dump(exclude_none=True) for t in req.tools or ()],
        "top_p": req.top_p,
        "truncation": "disabled",
        "usage": None,
        "user": req.user,
        "metadata": req.metadata or {},
    }


def _finished(base: dict[str, Any], fin: Finished, output: list[dict[str, Any]]) -> dict[str, Any]:
    s = fin.stats
    cut = fin.reason in R.CUT_SHORT and not any(o["type"] == "function_call" for o in output)
    return {
        **base,
        "status": "incomplete" if cut else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "output": output,
        "usage": {
            "input_tokens": s.n_prompt_tokens,
            "input_tokens_details": {"cached_tokens": s.n_prompt_cached, "cache_write_tokens": 0},
            "output_tokens": s.n_generated,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": s.n_prompt_tokens + s.n_generated,
        },
    }


def _message_item(text: str, status: str, item_id: str | None = None) -> dict[str, Any]:
    return {
        "type": "message",
        "id": item_id or R.new_id("msg").replace("-", "_"),
        "status": status,
        "role": "assistant",
        "content": [_text_part(text)] if status == "completed" else [],
    }


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _function_call(call: ParsedCall, status: str) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": R.new_id("fc").replace("-", "_"),
        "call_id": call_id(),
        "name": call.name,
        "arguments": call.arguments if status == "completed" else "",
        "status": status,
    }


async def _stream(
    gen: Generation, events: AsyncIterator[Any], base: dict[str, Any], tools: Tools
) -> AsyncIterator[dict[str, str]]:
    """The API's events: the response created, each output item added, its text or arguments in
    deltas, done; the response completed (or incomplete) with its usage."""
    parser = tools.parser() or TextOnly()
    output: list[dict[str, Any]] = []
    seq = 0
    open_text: dict[str, Any] | None = None  # the message item whose text streams now

    def event(kind: str, **fields: Any) -> dict[str, str]:
        nonlocal seq
        seq += 1
        data = {"type": kind, "sequence_number": seq - 1, **fields}
        return {"event": kind, "data": json.dumps(data, ensure_ascii=False)}

    def text(piece: str) -> list[dict[str, str]]:
        nonlocal open_text
        out = []
        if open_text is None:
            open_text = _message_item("", "in_progress")
            output.append(open_text)
            at = len(output) - 1
            out.append(event("response.output_item.added", output_index=at, item=open_text))
            out.append(
                event(
                    "response.content_part.added",
                    item_id=open_text["id"],
                    output_index=at,
                    content_index=0,
                    part=_text_part(""),
                )
            )
            open_text = {**open_text, "text": ""}
        open_text["text"] += piece
        at = len(output) - 1
        out.append(
            event(
                "response.output_text.delta",
                item_id=open_text["id"],
                output_index=at,
                content_index=0,
                delta=piece,
                logprobs=[],
            )
        )
        return out

    def close() -> list[dict[str, str]]:
        nonlocal open_text
        if open_text is None:
            return []
        item, open_text = open_text, None
        at = len(output) - 1
        done = _message_item(item["text"], "completed", item["id"])
        output[at] = done
        common = {"item_id": item["id"], "output_index": at, "content_index": 0}
        return [
            event("response.output_text.done", **common, text=item["text"], logprobs=[]),
            event("response.content_part.done", **common, part=_text_part(item["text"])),
            event("response.output_item.done", output_index=at, item=done),
        ]

    def call(p: ParsedCall) -> list[dict[str, str]]:
        out = close()
        done = _function_call(p, "completed")
        added = {**done, "arguments": "", "status": "in_progress"}
        output.append(done)
        at = len(output) - 1
        common = {"item_id": done["id"], "output_index": at}
        out.append(event("response.output_item.added", output_index=at, item=added))
        out.append(event("response.function_call_arguments.delta", **common, delta=p.arguments))
        out.append(
            event("response.function_call_arguments.done", **common, name=p.name, arguments=p.arguments)
        )
        out.append(event("response.output_item.done", output_index=at, item=done))
        return out

    def pieces(items: list[str | ParsedCall]) -> list[dict[str, str]]:
        out = []
        for p in items:
            out += call(p) if isinstance(p, ParsedCall) else text(p)
        return out

    try:
        yield event("response.created", response=base)
        yield event("response.in_progress", response=base)
        fin: Finished | None = None
        async for ev in events:
            if isinstance(ev, Step) and ev.text:
                for out in pieces(parser.feed(ev.text)):
                    yield out
            elif isinstance(ev, Finished):
                fin = ev
        if fin is None:
            return
        for out in pieces(parser.finish()) + close():
            yield out
        final = _finished(base, fin, output)
        kind = "response.completed" if final["status"] == "completed" else "response.incomplete"
        yield event(kind, response=final)
    except Exception as e:  # the headers are sent: the failure travels as the API's event
        err = engine_error(e, "input")
        failed = {
            **base,
            "status": "failed",
            "output": output,
            "error": {"code": err.code or err.kind, "message": err.message},
        }
        yield event("response.failed", response=failed)
    finally:
        gen.cancel()  # a client that went away stops the engine within one round
