"""What one request, one connection and the engine may take: :class:`Limits`, the request body's bound
(:class:`BodyLimit`, before anything parses it) and the checks a request passes before the engine sees it.

Every bound answers at once with OpenAI's error body naming it: 413 for a body too large, 408 for one
too slow, 400 for too many messages or a prompt that cannot fit the context.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.server.errors import ApiError


@dataclass(frozen=True)
class Limits:
    """The server's bounds. The defaults take any request a context of 128k tokens can hold."""

    #: request body, in bytes (413 beyond; a 128k-token prompt is about 0.5 MB, 3 MB as JSON-escaped CJK)
    max_body_bytes: int = 8 * 1024 * 1024
    #: chat messages in one request (400 beyond); a message costs a few tokens of the template at least
    max_messages: int = 4096
    #: a prompt of more characters than the context's tokens times this is refused before it is
    #: tokenized (no vocabulary averages 32 characters a token on text it can fit)
    chars_per_token: int = 32
    #: stop strings per request, and characters in each (the engine holds every prefix of each)
    max_stop: int = 16
    max_stop_chars: int = 512
    #: seconds a request's body may take to arrive once its head has (408 beyond)
    body_timeout_s: float = 30.0
    #: seconds a connection may take to send a request's head: from when it opens, or from the first
    #: byte of a later request on it (closed beyond: slow-header clients, idle connections)
    header_timeout_s: float = 10.0
    #: seconds an idle keep-alive connection stays open between requests
    keep_alive_s: float = 5.0
    #: connections open at once (each carries one request at a time); one more is answered 503
    max_connections: int = 128
    #: seconds the engine may go without reporting progress on a request before the watchdog restarts
    #: it (a prompt at the longest evaluates well within it on a CPU)
    stall_timeout_s: float = 600.0
    #: an idle engine is asked every ``ping_interval_s`` whether it answers, and restarted after
    #: ``ping_timeout_s`` without an answer
    ping_interval_s: float = 10.0
    ping_timeout_s: float = 15.0

    def max_prompt_chars(self, n_ctx: int) -> int:
        return max(1, n_ctx) * self.chars_per_token


def too_large(size: int, limit: int) -> ApiError:
    return ApiError(
        413,
        f"the request body is {size} bytes; this server takes at most {limit} bytes",
        code="request_too_large",
        headers={"Connection": "close"},
    )


class BodyLimit:
    """Reads a request's whole body before the app does, refusing one beyond ``max_body_bytes`` (by
    its Content-Length, before reading it, or as it arrives) and one slower than ``body_timeout_s``."""

    def __init__(self, app: ASGIApp, limits: Limits):
        self.app = app
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        limit = self.limits.max_body_bytes
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            await too_large(declared, limit).response()(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.limits.body_timeout_s
        while True:
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                err = ApiError(
                    408,
                    f"the request body did not arrive within {self.limits.body_timeout_s:g} s",
                    code="request_timeout",
                    headers={"Connection": "close"},
                )
                await err.response()(scope, receive, send)
                return
            if message["type"] == "http.disconnect":
                return  # the client has gone: nothing to answer
            body = message.get("body", b"")
            size += len(body)
            if size > limit:
                await too_large(size, limit).response()(scope, receive, send)
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        whole: Message | None = {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        async def replay() -> Message:
            nonlocal whole
            if whole is not None:
                message, whole = whole, None
                return message
            return await receive()  # after the body: the disconnect, when it comes

        await self.app(scope, replay, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def check_messages(count: int, chars: int, limits: Limits, n_ctx: int) -> None:
    """A chat's message count and length, before the engine renders it."""
    if count > limits.max_messages:
        raise ApiError(
            400,
            f"the request has {count} messages; this server takes at most {limits.max_messages}",
            param="messages",
            code="too_many_messages",
        )
    check_chars(chars, limits, n_ctx, "messages")


def check_chars(chars: int, limits: Limits, n_ctx: int, param: str) -> None:
    """A prompt too long to fit the context whatever its tokens, refused before it is tokenized."""
    most = limits.max_prompt_chars(n_ctx)
    if chars > most:
        raise ApiError(
            400,
            f"the prompt has {chars} characters: more than a {n_ctx}-token context can hold "
            f"(at most {most} characters are tokenized)",
            param=param,
            code="context_length_exceeded",
        )


def check_token_ids(tokens: Sequence[int], n_ctx: int, n_vocab: int | None) -> None:
    """A prompt of token ids: it fits the context, and each id is in the vocabulary."""
    if len(tokens) >= n_ctx:
        raise ApiError(
            400,
            f"the prompt has {len(tokens)} tokens but the context holds {n_ctx}",
            param="prompt",
            code="context_length_exceeded",
        )
    if n_vocab is None:
        return  # the engine checks them
    for i, t in enumerate(tokens):
        if not 0 <= t < n_vocab:
            raise ApiError(
                400,
                f"prompt[{i}] = {t} is not a token id: the vocabulary has ids 0 to {n_vocab - 1}",
                param=f"prompt[{i}]",
                code="invalid_token_id",
            )


def check_stop(stop: Sequence[str], limits: Limits) -> None:
    if len(stop) > limits.max_stop:
        raise ApiError(400, f"at most {limits.max_stop} stop strings are taken", param="stop")
    for i, s in enumerate(stop):
        if len(s) > limits.max_stop_chars:
            raise ApiError(
                400,
                f"stop[{i}] has {len(s)} characters; at most {limits.max_stop_chars} are taken",
                param="stop",
            )
