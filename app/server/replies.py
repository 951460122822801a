"""One reply from the engine, whatever API shape asked for it (chat completions, completions, Anthropic
Messages, OpenAI Responses): the request checked against the model and the limits, its settings, its
place in the queue (429 when full), the first event awaited while watching the client, the whole reply
collected (cancelled if the client goes away), and engine failures as API errors."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

from fastapi import Request

from app.engine import (
    EngineCrashedError,
    EngineError,
    Finished,
    GenerationSettings,
    PromptTooLongError,
    QueueFull,
    SamplingError,
)
from app.server import responses as R
from app.server.errors import ApiError, unavailable
from app.server.limits import Limits, check_stop
from app.server.schemas import Sampling, stop_strings
from app.server.served import Generation, Served, Stalled, Unavailable

log = logging.getLogger("tandem.server")

POLL_DISCONNECT = 0.1  # seconds between checks that a waiting client is still there


@dataclass(frozen=True)
class Ask:
    """What a request asks of the engine, in any API shape (None: the server's default)."""

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    constraint: Any = None  # app.engine.Constraint: structured output

    @classmethod
    def of(cls, req: Sampling, max_tokens: int | None, constraint: Any = None) -> Ask:
        """From an OpenAI request (chat or completions)."""
        return cls(
            model=req.model,
            max_tokens=max_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
            top_k=req.top_k,
            min_p=req.min_p,
            repeat_penalty=req.repeat_penalty,
            presence_penalty=req.presence_penalty,
            frequency_penalty=req.frequency_penalty,
            seed=req.seed,
            stop=stop_strings(req.stop),
            constraint=constraint,
        )


def check_model(served: Served, model: str | None) -> None:
    if not served.knows(model):
        raise ApiError(404, f"the model {model!r} does not exist", param="model", code="model_not_found")


def start(
    served: Served,
    limits: Limits,
    ask: Ask,
    *,
    messages: list[dict[str, Any]] | None = None,
    prompt: str | list[int] | None = None,
) -> Generation:
    """Check the request, build its settings and take a place in the queue (429 when it is full)."""
    check_model(served, ask.model)
    check_stop(ask.stop, limits)
    problem = served.unavailable()
    if problem is not None:
        raise unavailable(str(problem), problem.retry_after)
    d = served.defaults
    try:
        settings = GenerationSettings.from_options(
            served.mode,
            temperature=d.temperature if ask.temperature is None else ask.temperature,
            top_k=d.top_k if ask.top_k is None else ask.top_k,
            top_p=d.top_p if ask.top_p is None else ask.top_p,
            min_p=d.min_p if ask.min_p is None else ask.min_p,
            repeat_penalty=1.0 if ask.repeat_penalty is None else ask.repeat_penalty,
            presence_penalty=ask.presence_penalty or 0.0,
            frequency_penalty=ask.frequency_penalty or 0.0,
            seed=ask.seed,
            max_tokens=min(ask.max_tokens or served.n_ctx, served.n_ctx),
            n_max=served.n_max,
            adaptive=served.adaptive,
            stop=ask.stop,
        )
        if ask.constraint is not None:
            settings = replace(settings, constraint=ask.constraint)
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


async def first_event(gen: Generation, request: Request, param: str) -> tuple[AsyncIterator[Any], Any]:
    """The reply's events and its first one, awaited while watching that the client is still there
    (``param``: the field a prompt too long is blamed on)."""
    events = gen.events()
    nxt = asyncio.ensure_future(anext(events, None))
    try:
        while True:
            done, _ = await asyncio.wait({nxt}, timeout=POLL_DISCONNECT)
            if done:
                break
            if await request.is_disconnected():
                gen.cancel()
    except BaseException:
        gen.cancel()
        raise
    try:
        first = nxt.result()
    except Exception as e:
        raise engine_error(e, param) from None
    if first is None:  # cancelled before it began
        raise ApiError(499, "the client went away", code="client_closed_request")
    return events, first


def engine_error(e: BaseException, param: str = "messages") -> ApiError:
    """An engine failure as the API answers it."""
    if isinstance(e, ApiError):
        return e
    if isinstance(e, Unavailable):
        return unavailable(str(e), e.retry_after)
    if isinstance(e, Stalled):
        return ApiError(500, f"{e}; the engine is restarting", "server_error", code="engine_stalled")
    if isinstance(e, PromptTooLongError):
        return ApiError(400, str(e), param=param, code="context_length_exceeded")
    if isinstance(e, (EngineError, SamplingError, ValueError)):
        return ApiError(400, str(e))
    if isinstance(e, EngineCrashedError):
        return ApiError(500, f"{e.what}; the engine is restarting", "server_error", code="engine_crashed")
    log.error("request failed: %s: %s", type(e).__name__, e)
    return ApiError(500, f"{type(e).__name__}: {e}", "server_error")


async def collect(
    gen: Generation, request: Request, events: AsyncIterator[Any], first: Any, param: str = "messages"
) -> Finished:
    """The whole reply (cancelled if the client goes away while it is generated)."""
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
        raise engine_error(e, param) from None
    finally:
        watcher.cancel()
    if fin is None:
        raise ApiError(500, "the reply ended without finishing", "server_error")
    return fin


async def replay(events: AsyncIterator[Any], first: Any) -> AsyncIterator[Any]:
    """The reply's events, its first one again first."""
    yield first
    async for ev in events:
        yield ev
