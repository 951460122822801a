"""The HTTP API: ``/v1/models``, ``/v1/chat/completions`` (with tool calls), ``/v1/completions`` (each
streamed or not), Anthropic's ``/v1/messages`` (:mod:`app.server.anthropic_api`), OpenAI's
``/v1/responses`` (:mod:`app.server.responses_api`) and ``/health``, with OpenAI's error bodies (and
Anthropic's on its route), an API key, a Host check and optional CORS; every request bounded
(:mod:`app.server.limits`) before the engine sees it, and the engine watched (:mod:`app.server.health`)."""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sse_starlette.sse import EventSourceResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from app.engine import Finished, Step
from app.server import anthropic_api, responses_api
from app.server import responses as R
from app.server.errors import ApiError
from app.server.health import Watchdog, health_response
from app.server.limits import BodyLimit, Limits, check_chars, check_messages, check_token_ids
from app.server.parsing import parse, validation_error
from app.server.replies import Ask, check_model, collect, engine_error, first_event, start
from app.server.schemas import ChatCompletionRequest, CompletionRequest, Sampling, unsupported
from app.server.served import Generation, Served
from app.server.toolcalls import CallParser, ParsedCall
from app.server.tools import Tools, call_id, chat_messages, chat_tools, one_constraint, response_format

log = logging.getLogger("tandem.server")


def create_app(
    served: Served,
    *,
    api_key: str | None = None,
    allowed_hosts: Iterable[str] | None = None,
    cors_origins: Iterable[str] = (),
    limits: Limits | None = None,
    watchdog: bool = True,
) -> FastAPI:
    """The API over ``served``. ``allowed_hosts``: the Host header values accepted (None: any).
    ``limits``: what a request, a connection and the engine may take (also read by
    :func:`app.server.connections.uvicorn_config` from ``app.state.limits``); ``watchdog``: restart a
    dead or stuck engine while the server runs."""
    limits = limits or Limits()
    dog = Watchdog(served, limits) if watchdog else None

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if dog is not None:
            dog.start()
        try:
            yield
        finally:
            if dog is not None:
                dog.stop()
            served.close()

    app = FastAPI(title="Tandem", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.limits = limits
    origins = list(cors_origins)
    if origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=origins,
            allow_methods=["GET", "POST", "OPTIONS"],
            allow_headers=[
                "Authorization",
                "Content-Type",
                "X-Api-Key",
                "Anthropic-Version",
                "Anthropic-Beta",
            ],
        )
    app.add_middleware(BodyLimit, limits=limits)
    app.add_middleware(_Guard, api_key=api_key, allowed_hosts=allowed_hosts)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, e: ApiError) -> JSONResponse:
        return _answer(request.url.path, e)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, e: RequestValidationError) -> JSONResponse:
        return _answer(request.url.path, validation_error(e.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, e: StarletteHTTPException) -> JSONResponse:
        path = request.url.path
        if e.status_code == 404:
            return _answer(path, ApiError(404, f"no route {path}", code="unknown_url"))
        if e.status_code == 405:
            return _answer(path, ApiError(405, f"{request.method} is not allowed on {path}"))
        if e.status_code == 400:  # FastAPI could not parse the body (nested too deep, not UTF-8, ...)
            return _answer(path, ApiError(400, "the request body is not valid JSON"))
        return _answer(path, ApiError(e.status_code, str(e.detail)))

    @app.exception_handler(Exception)
    async def _bug(request: Request, e: Exception) -> JSONResponse:  # still an API's body, and logged
        log.error("request failed: %s: %s", type(e).__name__, e)
        err = ApiError(500, f"internal error: {type(e).__name__}", "server_error")
        return _answer(request.url.path, err)

    @app.get("/health")
    async def health() -> JSONResponse:
        return health_response(served, dog)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {"id": served.model_id, "object": "model", "created": served.created, "owned_by": "tandem"}
            ],
        }

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(request: Request) -> Any:
        req = await parse(request, ChatCompletionRequest, limits)
        messages, chars = chat_messages(req)
        tools = chat_tools(req)
        check_messages(len(messages), chars + tools.chars(), limits, served.n_ctx)
        check_model(served, req.model)
        _supported(req)
        constraint = one_constraint(
            tools.constraint(), response_format(req.response_format), param="response_format"
        )
        ask = Ask.of(req, req.max_completion_tokens or req.max_tokens, constraint)
        gen = start(served, limits, ask, messages=tools.messages(messages))
        return await _respond(served, gen, request, req, chat=True, tools=tools)

    @app.post("/v1/completions", response_model=None)
    async def complete(request: Request) -> Any:
        req = await parse(request, CompletionRequest, limits)
        prompt = req.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not prompt:
            raise ApiError(400, "the prompt is empty", param="prompt")
        if isinstance(prompt, str):
            check_chars(len(prompt), limits, served.n_ctx, "prompt")
        else:
            check_token_ids(prompt, served.n_ctx, served.n_vocab)
        check_model(served, req.model)
        _supported(req)
        gen = start(served, limits, Ask.of(req, req.max_tokens), prompt=prompt)
        return await _respond(served, gen, request, req, chat=False)

    anthropic_api.add_routes(app, served, limits)
    responses_api.add_routes(app, served, limits)
    return app


def _supported(req: Sampling) -> None:
    bad = unsupported(req)
    if bad is not None:
        raise ApiError(400, bad[1], param=bad[0], code="unsupported_parameter")


def _answer(path: str, e: ApiError) -> JSONResponse:
    """The error in the body its route's clients read: Anthropic's on ``/v1/messages``, else OpenAI's."""
    return anthropic_api.error_response(e) if anthropic_api.is_route(path) else e.response()


async def _respond(
    served: Served,
    gen: Generation,
    request: Request,
    req: Sampling,
    *,
    chat: bool,
    tools: Tools | None = None,
) -> Any:
    rid = R.new_id("chatcmpl" if chat else "cmpl")
    model = served.model_id
    param = "messages" if chat else "prompt"
    events, first = await first_event(gen, request, param)
    parser = tools.parser() if tools is not None else None
    if not req.stream:
        fin = await collect(gen, request, events, first, param)
        if not chat:
            return JSONResponse(R.completion(rid, model, fin))
        if parser is None:
            return JSONResponse(R.chat_completion(rid, model, fin))
        pieces = parser.feed(fin.text) + parser.finish()
        text = "".join(p for p in pieces if isinstance(p, str))
        calls = [_call(p) for p in pieces if isinstance(p, ParsedCall)]
        return JSONResponse(R.chat_completion(rid, model, fin, text, calls))
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    return EventSourceResponse(
        _stream(gen, events, first, rid, model, chat, include_usage, parser),
        ping=15,
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


def _call(call: ParsedCall) -> dict[str, Any]:
    return {"id": call_id(), "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


async def _stream(
    gen: Generation,
    events: AsyncIterator[Any],
    first: Any,
    rid: str,
    model: str,
    chat: bool,
    include_usage: bool,
    parser: CallParser | None = None,
) -> AsyncIterator[str]:
    """Server-sent events: one chunk per round's text (and per tool call, as OpenAI streams them), the
    finish reason, the usage, ``[DONE]``."""
    created = R.now()
    n_calls = 0

    def chunk(text: str | None = None, finish: str | None = None, role: bool = False) -> str:
        if chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
            if text:
                delta["content"] = text
            return json.dumps(R.chat_chunk(rid, model, delta, finish, created), ensure_ascii=False)
        return json.dumps(R.completion_chunk(rid, model, text or "", finish, created), ensure_ascii=False)

    def pieces(items: list[str | ParsedCall]) -> list[str]:
        nonlocal n_calls
        out = []
        for p in items:
            if isinstance(p, str):
                out.append(chunk(p))
                continue
            call = {"index": n_calls, **_call(p)}
            n_calls += 1
            out.append(json.dumps(R.chat_chunk(rid, model, {"tool_calls": [call]}, None, created)))
        return out

    try:
        if chat:
            yield chunk(role=True)
        fin: Finished | None = None
        pending = [first]
        while True:
            if pending:
                ev = pending.pop()
            else:
                ev = await anext(events, None)
                if ev is None:
                    break
            if isinstance(ev, Step) and ev.text:
                for out in pieces(parser.feed(ev.text)) if parser is not None else [chunk(ev.text)]:
                    yield out
            elif isinstance(ev, Finished):
                fin = ev
        if fin is not None:
            for out in pieces(parser.finish()) if parser is not None else []:
                yield out
            yield chunk(finish="tool_calls" if n_calls else R.FINISH_REASONS.get(fin.reason, "stop"))
            if include_usage:
                obj = "chat.completion.chunk" if chat else "text_completion"
                yield json.dumps(R.usage_chunk(rid, model, obj, fin, created))
        yield "[DONE]"
    except Exception as e:  # the headers are sent: the error travels as an event, as OpenAI's does
        err = engine_error(e, "messages" if chat else "prompt")
        yield json.dumps(R.error_body(err.message, err.kind, err.param, err.code))
        yield "[DONE]"
    finally:
        gen.cancel()  # a client that went away stops the engine within one round


class _Guard:
    """Refuse a ``Host`` the server does not answer to (DNS rebinding) and a missing or wrong key."""

    def __init__(self, app: ASGIApp, api_key: str | None, allowed_hosts: Iterable[str] | None):
        self.app = app
        self.api_key = api_key
        self.allowed = {h.lower() for h in allowed_hosts} if allowed_hosts is not None else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        host = headers.get("host", "").lower()
        if self.allowed is not None and host not in self.allowed:
            err = ApiError(403, f"the Host header {host!r} is not served here", code="invalid_host")
            await _answer(scope.get("path", ""), err)(scope, receive, send)
            return
        path = scope.get("path", "")
        if self.api_key and path.startswith("/v1") and scope.get("method") != "OPTIONS":
            given = headers.get("authorization", "")
            token = given[7:].strip() if given.lower().startswith("bearer ") else ""
            token = token or headers.get("x-api-key", "").strip()  # Anthropic's clients send this
            if not hmac.compare_digest(token.encode(), self.api_key.encode()):
                what = (
                    "Incorrect API key provided"
                    if token
                    else "Missing API key (Authorization: Bearer ... or X-Api-Key: ...)"
                )
                err = ApiError(401, what, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
                await _answer(path, err)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def allowed_hosts(host: str, port: int) -> set[str] | None:
    """The Host headers a server bound to ``host:port`` answers: its loopback names when bound to
    loopback; the address itself otherwise (any for a wildcard bind, which needs an API key)."""
    if host in ("0.0.0.0", "::", ""):
        return None
    names = {f"[{host}]" if ":" in host else host}
    if is_loopback(host):
        names |= {"localhost", "127.0.0.1", "[::1]"}
    return {f"{n}:{port}" for n in names} | names


def is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
