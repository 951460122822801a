"""One way to serve the API: ``tandem serve`` (`app.server.cli`) and the app's local API
(`app.ui.server.local_server`) both build their server here.

:func:`api_server` makes the :class:`~app.server.served.Served` over an engine client, the API
(:func:`~app.server.api.create_app`, accepting the Host headers of its address) and the uvicorn server
with the connection bounds (:func:`~app.server.connections.uvicorn_config`), ready to ``run`` on a socket
already bound. The server installs no signal handlers: the caller stops it (``should_exit``,
``handle_exit``) from its own handlers or thread.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import uvicorn

from app.engine import EngineClient, Mode, TurnQueue
from app.server.api import allowed_hosts, create_app
from app.server.connections import uvicorn_config
from app.server.served import Served

__all__ = ["ApiServer", "api_server"]


class _Server(uvicorn.Server):
    """uvicorn's server without its signal handlers (the caller's own stop them)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@dataclass
class ApiServer:
    """The served engine and the uvicorn server that answers for it."""

    served: Served
    server: uvicorn.Server

    def run(self, sock: Any) -> None:
        """Serve on the bound, listening ``sock`` until stopped (blocks)."""
        self.server.run(sockets=[sock])


def api_server(
    client: EngineClient,
    host: str,
    port: int,
    *,
    mode: Mode = Mode.AUTO,
    ready: Callable[[], bool] = lambda: True,
    model_path: str = "",
    n_ctx: int = 4096,
    history: bool = False,
    n_max: int = 8,
    adaptive: bool = True,
    turns: TurnQueue | None = None,
    max_waiting: int | None = None,
    api_key: str | None = None,
    cors_origins: Iterable[str] = (),
    graceful_s: int = 3,
    **uvicorn_options: Any,
) -> ApiServer:
    """The OpenAI-compatible API over ``client`` on ``host:port``: requests take ``turns`` at the engine
    (a queue of its own when None; ``max_waiting`` requests may wait, then 429), get 503 until
    ``ready()``; replies are drafted in ``mode`` (at most ``n_max`` tokens a round; not ``adaptive``:
    always ``n_max``), from and into the drafting history when ``history``.
    ``uvicorn_options`` go to ``uvicorn.Config`` (``log_config``, ...)."""
    served = Served(
        client,
        mode=mode,
        ready=ready,
        model_path=model_path,
        n_ctx=n_ctx,
        created=int(time.time()),
        history=history,
        n_max=n_max,
        adaptive=adaptive,
        **({"turns": turns} if turns is not None else {}),
    )
    if max_waiting is not None:
        served.turns.max_waiting = max(0, max_waiting)
    app = create_app(
        served, api_key=api_key, allowed_hosts=allowed_hosts(host, port), cors_origins=list(cors_origins)
    )
    options: dict[str, Any] = {"log_level": "warning", "timeout_graceful_shutdown": graceful_s}
    options.update(uvicorn_options)
    config = uvicorn_config(app, host, port, **options)
    return ApiServer(served, _Server(config))
