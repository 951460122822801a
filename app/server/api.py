"""The HTTP API: ``/v1/models``, ``/v1/chat/completions``, ``/v1/completions`` (each streamed or not)
and ``/health``, with OpenAI's error bodies, an API key, a Host check and optional CORS; every request
bounded (:mod:`app.server.limits`) before the engine sees it, and the engine watched
(:mod:`app.server.health`)."""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sse_starlette.sse import EventSourceResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from app.engine import (
    EngineCrashedError,
    EngineError,
    Finished,
    GenerationSettings,
    PromptTooLongError,
    QueueFull,
    SamplingError,
    Step,
)
from app.server import responses as R
from app.server.errors import ApiError, unavailable
from app.server.health import Watchdog, health_response
from app.server.limits import (
    BodyLimit,
    Limits,
    check_chars,
    check_messages,
    check_stop,
    check_token_ids,
)
from app.server.parsing import parse, validation_error
from app.server.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    Sampling,
    message_text,
    stop_strings,
    unsupported,
)
from app.server.served import Generation, Served, Stalled, Unavailable

log = logging.getLogger("tandem.server")

POLL_DISCONNECT = 0.1  # seconds between checks that a waiting client is still there


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
            allow_headers=["Authorization", "Content-Type"],
        )
    app.add_middleware(BodyLimit, limits=limits)
    app.add_middleware(_Guard, api_key=api_key, allowed_hosts=allowed_hosts)

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, e: ApiError) -> JSONResponse:
        return e.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, e: RequestValidationError) -> JSONResponse:
        return validation_error(e.errors()).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, e: StarletteHTTPException) -> JSONResponse:
        if e.status_code == 404:
            return ApiError(404, f"no route {request.url.path}", code="unknown_url").response()
        if e.status_code == 405:
            return ApiError(405, f"{request.method} is not allowed on {request.url.path}").response()
        if e.status_code == 400:  # FastAPI could not parse the body (nested too deep, not UTF-8, ...)
            return ApiError(400, "the request body is not valid JSON").response()
        return ApiError(e.status_code, str(e.detail)).response()

    @app.exception_handler(Exception)
    async def _bug(_: Request, e: Exception) -> JSONResponse:  # still OpenAI's body, and logged
        log.error("request failed: %s: %s", type(e).__name__, e)
        return ApiError(500, f"internal error: {type(e).__name__}", "server_error").response()

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
        if any(m.role == "tool" for m in req.messages):
            raise ApiError(400, "tool messages are not supported", param="messages")
        messages = [{"role": _role(m.role), "content": message_text(m)} for m in req.messages]
        chars = sum(len(m["content"]) for m in messages)
        check_messages(len(messages), chars, limits, served.n_ctx)
        max_tokens = req.max_completion_tokens or req.max_tokens
        gen = _generation(served, limits, req, max_tokens, messages=messages)
        return await _respond(served, gen, request, req, chat=True)

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
        gen = _generation(served, limits, req, req.max_tokens, prompt=prompt)
        return await _respond(served, gen, request, req, chat=False)

    return app


def _role(role: str) -> str:
    return "system" if role == "developer" else role


def _generation(
    served: Served,
    limits: Limits,
    req: Sampling,
    max_tokens: int | None,
    *,
    messages: list[dict[str, str]] | None = None,
    prompt: str | list[int] | None = None,
) -> Generation:
    """Check the request, build its settings and take a place in the queue (429 when it is full)."""
    if not served.knows(req.model):
        raise ApiError(404, f"the model {req.model!r} does not exist", param="model", code="model_not_found")
    bad = unsupported(req)
    if bad is not None:
        raise ApiError(400, bad[1], param=bad[0], code="unsupported_parameter")
    stop = stop_strings(req.stop)
    check_stop(stop, limits)
    problem = served.unavailable()
    if problem is not None:
        raise unavailable(str(problem), problem.retry_after)
    d = served.defaults
    try:
        settings = GenerationSettings.from_options(
            served.mode,
            temperature=d.temperature if req.temperature is None else req.temperature,
            top_k=d.top_k if req.top_k is None else req.top_k,
            top_p=d.top_p if req.top_p is None else req.top_p,
            min_p=d.min_p if req.min_p is None else req.min_p,
            repeat_penalty=1.0 if req.repeat_penalty is None else req.repeat_penalty,
            presence_penalty=req.presence_penalty or 0.0,
            frequency_penalty=req.frequency_penalty or 0.0,
            seed=req.seed,
            max_tokens=min(max_tokens or served.n_ctx, served.n_ctx),
            stop=stop,
        )
        if served.history:
            settings = replace(settings, history_doc=R.new_id("api"))
    except (EngineError, SamplingError) as e:
        raise ApiError(400, str(e)) from None
    try:
        ticket = served.turns.enter()
    except QueueFull as e:
        retry = max(1, e.waiting)
        raise ApiError(
            429,
            f"{e}; try again later",
            "rate_limit_error",
            code="queue_full",
            headers={"Retry-After": str(retry)},
        ) from None
    return Generation(served, ticket, settings, messages=messages, prompt=prompt).start()


async def _first(gen: Generation, request: Request) -> tuple[AsyncIterator[Any], Any]:
    """Wait for the reply's first event while watching that the client is still there."""
    events = gen.events()
    nxt = asyncio.ensure_future(anext(events, None))
    try:
        while True:
            done, _ = await asyncio.wait({nxt}, timeout=POLL_DISCONNECT)
            if done:
                return events, nxt.result()
            if await request.is_disconnected():
                gen.cancel()
    except BaseException:
        gen.cancel()
        raise


def _engine_error(e: BaseException, chat: bool) -> ApiError:
    if isinstance(e, Unavailable):
        return unavailable(str(e), e.retry_after)
    if isinstance(e, Stalled):
        return ApiError(500, f"{e}; the engine is restarting", "server_error", code="engine_stalled")
    if isinstance(e, PromptTooLongError):
        return ApiError(400, str(e), param="messages" if chat else "prompt", code="context_length_exceeded")
    if isinstance(e, (EngineError, SamplingError, ValueError)):
        return ApiError(400, str(e))
    if isinstance(e, EngineCrashedError):
        return ApiError(500, f"{e.what}; the engine is restarting", "server_error", code="engine_crashed")
    log.error("request failed: %s: %s", type(e).__name__, e)
    return ApiError(500, f"{type(e).__name__}: {e}", "server_error")


async def _respond(served: Served, gen: Generation, request: Request, req: Sampling, *, chat: bool) -> Any:
    rid = R.new_id("chatcmpl" if chat else "cmpl")
    model = served.model_id
    try:
        events, first = await _first(gen, request)
    except (Exception, asyncio.CancelledError) as e:
        if isinstance(e, asyncio.CancelledError):
            raise
        raise _engine_error(e, chat) from None
    if first is None:  # cancelled before it began
        raise ApiError(499, "the client went away", code="client_closed_request")
    if not req.stream:
        return await _collect(gen, request, events, first, rid, model, chat)
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    return EventSourceResponse(
        _stream(gen, events, first, rid, model, chat, include_usage),
        ping=15,
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def _collect(
    gen: Generation,
    request: Request,
    events: AsyncIterator[Any],
    first: Any,
    rid: str,
    model: str,
    chat: bool,
) -> JSONResponse:
    """A whole reply (cancelled if the client goes away while it is generated)."""
    fin: Finished | None = first if isinstance(first, Finished) else None

    async def watch() -> None:
        while True:
            await asyncio.sleep(POLL_DISCONNECT * 2)
            if await request.is_disconnected():
                gen.cancel()
                return

    watcher = asyncio.ensure_future(watch())
    try:
        async for ev in events:
            if isinstance(ev, Finished):
                fin = ev
    except Exception as e:
        raise _engine_error(e, chat) from None
    finally:
        watcher.cancel()
    if fin is None:
        raise ApiError(500, "the reply ended without finishing", "server_error")
    body = R.chat_completion(rid, model, fin) if chat else R.completion(rid, model, fin)
    return JSONResponse(body)


async def _stream(
    gen: Generation,
    events: AsyncIterator[Any],
    first: Any,
    rid: str,
    model: str,
    chat: bool,
    include_usage: bool,
) -> AsyncIterator[str]:
    """Server-sent events: one chunk per round's text, the finish reason, the usage, ``[DONE]``."""
    created = R.now()

    def chunk(text: str | None = None, finish: str | None = None, role: bool = False) -> str:
        if chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
            if text:
                delta["content"] = text
            return json.dumps(R.chat_chunk(rid, model, delta, finish, created), ensure_ascii=False)
        return json.dumps(R.completion_chunk(rid, model, text or "", finish, created), ensure_ascii=False)

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
                yield chunk(ev.text)
            elif isinstance(ev, Finished):
                fin = ev
        if fin is not None:
            yield chunk(finish=R.FINISH_REASONS.get(fin.reason, "stop"))
            if include_usage:
                obj = "chat.completion.chunk" if chat else "text_completion"
                yield json.dumps(R.usage_chunk(rid, model, obj, fin, created))
        yield "[DONE]"
    except Exception as e:  # the headers are sent: the error travels as an event, as OpenAI's does
        err = _engine_error(e, chat)
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
            await err.response()(scope, receive, send)
            return
        path = scope.get("path", "")
        if self.api_key and path.startswith("/v1") and scope.get("method") != "OPTIONS":
            given = headers.get("authorization", "")
            token = given[7:].strip() if given.lower().startswith("bearer ") else ""
            if not hmac.compare_digest(token.encode(), self.api_key.encode()):
                what = (
                    "Incorrect API key provided" if token else "Missing API key (Authorization: Bearer ...)"
                )
                err = ApiError(401, what, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
                await err.response()(scope, receive, send)
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
