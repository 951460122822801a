"""``/health`` as the engine really is, and the watchdog that restarts a dead or stuck engine.

``/health`` answers 200 while the engine can serve (``ready``, or ``busy`` with a request: for how long,
and how long since its last progress) and 503 with ``Retry-After`` while it cannot (``loading``,
``restarting`` with the cause, ``failed`` with the reason a restart failed and when it is tried again).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from fastapi.responses import JSONResponse

from app.server.limits import Limits
from app.server.served import Served

log = logging.getLogger("tandem.server")

TICK = 0.25  # seconds between the watchdog's looks
DEAD_GRACE = 0.5  # seconds a dead engine is left to its owner before the watchdog restarts it
PING_WAIT = 2.0  # seconds one ping waits for an answer (unanswered pings add up to the timeouts)


def engine_state(served: Served, watchdog: Watchdog | None = None) -> tuple[str, dict[str, Any]]:
    """The engine's state ("ready", "busy", "loading", "restarting", "failed") and what goes with it."""
    now = time.monotonic()
    if served.restarting:
        failed = f"could not be restarted: {served.failure}; trying again now"
        why = failed if served.failure else served.cause
        return "restarting", {"reason": why, "attempt": served.attempts}
    if served.failure:
        return "failed", {
            "reason": served.failure,
            "cause": served.cause,
            "attempts": served.attempts,
            "retry_in_s": round(max(0.0, served.retry_at - now), 1),
        }
    if not served.ready():
        return "loading", {}
    client_state = served.client.state
    if served.recovering or client_state in ("dead", "starting", "stopped"):
        return "restarting", {"reason": served.cause if served.recovering else _down(served, client_state)}
    if client_state == "loading":
        return "loading", {}
    if served.client.settings is None:
        return "restarting", {"reason": "the engine has no model loaded"}
    extra: dict[str, Any] = {"waiting": served.turns.waiting, "restarts": served.restarts}
    busy_since = served.busy_since
    if busy_since is None and watchdog is not None and served.turns.busy:
        busy_since = watchdog.busy_since  # a turn of the app's own chat: as the watchdog saw it begin
    if not served.turns.busy and busy_since is None:
        return "ready", extra
    extra["busy_s"] = round(now - busy_since, 1) if busy_since is not None else None
    if served.progress_at is not None:
        extra["progress_s"] = round(now - served.progress_at, 1)
    return "busy", extra


def _down(served: Served, state: str) -> str:
    """Why the engine process is not running, in one line."""
    err = served.client.exit_error
    what = getattr(err, "what", "") or (str(err).splitlines()[0] if err is not None else "")
    return what or f"the engine process is {state}"


def health_response(served: Served, watchdog: Watchdog | None = None) -> JSONResponse:
    state, extra = engine_state(served, watchdog)
    if state in ("ready", "busy"):
        return JSONResponse({"status": "ok", "engine": state, "model": served.model_id, **extra})
    retry = max(1, round(extra.get("retry_in_s", 2)))
    return JSONResponse(
        {"status": state, "engine": state, **extra}, status_code=503, headers={"Retry-After": str(retry)}
    )


class Watchdog:
    """A thread that restarts the engine when its process has died, when it is busy with a request
    but has reported no progress for ``stall_timeout_s``, or when it does not answer pings (within
    ``ping_timeout_s`` while idle, ``stall_timeout_s`` while another caller's turn holds it)."""

    def __init__(self, served: Served, limits: Limits):
        self.served = served
        self.limits = limits
        self.busy_since: float | None = None  # when the turn now held began, as seen here
        self._unanswered_since: float | None = None
        self._dead_since: float | None = None
        self._last_ping = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Watchdog:
        self._thread = threading.Thread(target=self._run, name="tandem-server-watchdog", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(PING_WAIT + 1)

    def _run(self) -> None:
        while not self._stop.wait(TICK):
            try:
                self.check()
            except Exception:
                log.exception("the engine watchdog failed a check")

    def check(self) -> None:
        served, now = self.served, time.monotonic()
        busy = served.turns.busy
        if busy != (self.busy_since is not None):  # a turn began or ended: pings count afresh
            self.busy_since = now if busy else None
            self._unanswered_since = None
        if not served.ready() or served.recovering:
            self._unanswered_since = None
            return
        state = served.client.state
        lost = state == "running" and served.client.settings is None and served.client.wanted is not None
        if state != "dead" and not lost:  # lost: alive, but the model it should hold is not loaded
            self._dead_since = None
        elif self._dead_since is None:
            self._dead_since = now  # its owner (the app's worker) may be restarting it already
        elif now - self._dead_since >= DEAD_GRACE:
            served.restart_after_crash("the engine lost its model" if lost else _down(served, state))
            return
        if state != "running":
            return
        stall = self.limits.stall_timeout_s
        progress = served.progress_at
        if busy and progress is not None and now - progress > stall:
            served.kill_stuck(f"the engine made no progress on a request for {now - progress:.0f} s")
            return
        if now - self._last_ping < self.limits.ping_interval_s and self._unanswered_since is None:
            return
        self._last_ping = now
        answered = served.client.ping(PING_WAIT)
        if answered is None:  # no process: the next look sees it dead
            return
        now = time.monotonic()
        if answered:
            self._unanswered_since = None
            return
        if self._unanswered_since is None:
            self._unanswered_since = now - PING_WAIT
        silent = now - self._unanswered_since
        if served.turns.busy:
            if served.busy_since is None and silent > stall:  # another caller's turn (the app's chat)
                served.kill_stuck(f"the engine did not answer for {silent:.0f} s")
        elif silent > self.limits.ping_timeout_s:
            served.kill_stuck(f"the engine did not answer for {silent:.0f} s while idle")
