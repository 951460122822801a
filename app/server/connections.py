"""Connections the server holds are bounded in time and number, so idle or slow clients cannot use up
its file handles: :func:`uvicorn_config` builds the uvicorn configuration that ``tandem serve`` and the
app's local server run.

uvicorn closes a keep-alive connection idle ``timeout_keep_alive`` seconds after a response, but waits
forever for a request's head (h11 has no header timeout): a connection that sends nothing, or sends its
headers a byte at a time (slowloris), was held for good. :class:`GuardedH11Protocol` closes one whose
head has not arrived ``header_timeout_s`` seconds after it opened, or after the first byte of a later
request on it. A head larger than 16 KiB is a 400 (h11's bound on an incomplete event), a body beyond
the limits or too slow is refused by :class:`~app.server.limits.BodyLimit`, and a connection beyond
``max_connections`` open is answered 503 (OpenAI's error body) and closed at once.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from app.server.limits import Limits
from app.server.responses import error_body

log = logging.getLogger("tandem.server")

MAX_HEAD_BYTES = 16 * 1024  # a request line and headers larger than this are a 400
_BUSY = json.dumps(
    error_body(
        "too many connections are open; try again shortly", "server_error", code="too_many_connections"
    )
).encode()
#: the answer to a connection beyond ``max_connections`` (then it is closed)
TOO_MANY = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(_BUSY), _BUSY)
)


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline for each request's head."""

    header_timeout: float = Limits.header_timeout_s
    max_connections: int = Limits.max_connections

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._head_timer: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            log.warning("refused a connection from %s: %d open", self.client, len(self.connections) - 1)
            transport.write(TOO_MANY)
            transport.close()
            return
        self._arm()  # a new connection must send a request head in time

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._awaiting_head():
            if self._head_timer is None:
                self._arm()  # the first byte of a request: its head must complete in time
        else:
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._disarm()  # idle between requests: uvicorn's keep-alive timeout applies

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _awaiting_head(self) -> bool:
        """The client is sending a request's head (or has yet to): no request of its is in progress."""
        return self.conn.their_state is h11.IDLE and (self.cycle is None or self.cycle.response_complete)

    def _arm(self) -> None:
        self._disarm()
        self._head_timer = self.loop.call_later(self.header_timeout, self._head_timeout)

    def _disarm(self) -> None:
        timer, self._head_timer = getattr(self, "_head_timer", None), None
        if timer is not None:
            timer.cancel()

    def _head_timeout(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or not self._awaiting_head():
            return
        log.info(
            "closing a connection from %s: no request head within %g s", self.client, self.header_timeout
        )
        if self.conn.their_state is h11.IDLE and self.conn.our_state is h11.IDLE:
            self.transport.write(
                b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
            )
        self.transport.close()


def protocol_class(limits: Limits) -> type[GuardedH11Protocol]:
    """:class:`GuardedH11Protocol` with ``limits``' head timeout and connection bound."""
    attrs = {"header_timeout": limits.header_timeout_s, "max_connections": limits.max_connections}
    return type("GuardedH11Protocol", (GuardedH11Protocol,), attrs)


def uvicorn_config(app: Any, host: str, port: int, limits: Limits | None = None, **kw: Any) -> uvicorn.Config:
    """uvicorn's configuration for the API ``app`` on ``host:port`` with the connection bounds of
    ``limits`` (the ``limits`` given to :func:`~app.server.api.create_app`); ``kw`` goes to
    ``uvicorn.Config`` as is (``log_level``, ``log_config``, ``timeout_graceful_shutdown``, ...)."""
    limits = limits or getattr(app.state, "limits", None) or Limits()
    options: dict[str, Any] = {
        "http": protocol_class(limits),
        "timeout_keep_alive": limits.keep_alive_s,
        "h11_max_incomplete_event_size": MAX_HEAD_BYTES,
        "log_level": "warning",
    }
    options.update(kw)
    return uvicorn.Config(app, host=host, port=port, **options)
