"""An OpenAI-compatible ``tandem serve`` in this process on 127.0.0.1 (a free port), for the tests of
the app's remote servers and local API."""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass

import uvicorn

from app.server.api import allowed_hosts, create_app
from app.server.served import Served


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Running:
    url: str  # the API's base URL (.../v1)
    port: int
    served: Served
    server: uvicorn.Server
    thread: threading.Thread

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def start(served: Served, **kw) -> Running:
    """Serve ``served`` (``create_app`` keyword arguments in ``kw``, e.g. ``api_key``)."""
    port = free_port()
    app = create_app(served, allowed_hosts=allowed_hosts("127.0.0.1", port), **kw)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="test-api-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    return Running(f"http://127.0.0.1:{port}/v1", port, served, server, thread)


def wait_idle(served: Served, seconds: float = 10.0) -> None:
    """Until no request holds or waits for the engine."""
    t0 = time.monotonic()
    while served.turns.busy or served.turns.waiting:
        assert time.monotonic() - t0 < seconds, "the engine is still busy"
        time.sleep(0.02)
