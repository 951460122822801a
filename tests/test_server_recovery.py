"""The server always ends with a loaded engine or says why: a crash whose restart is killed too, a model
file moved away, an engine stuck mid-request or while idle, an engine that died while idle.

Tiny real GGUFs on 127.0.0.1; each test has its own engine (they kill it), bounded in time.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import openai
import psutil
import pytest
from test_server import LONG, Running, start

from app.engine import EngineClient, LoadSettings
from app.server.limits import Limits
from app.server.served import Served

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL and SIGSTOP"),
]

HI = [{"role": "user", "content": "hi"}]


@dataclass
class Setup:
    client: EngineClient
    running: Running

    @property
    def served(self) -> Served:
        return self.running.served

    def health(self) -> tuple[int, dict]:
        resp, body, conn = self.running.raw("GET", "/health")
        conn.close()
        return resp.status, json.loads(body)

    def wait_health(self, want: str, seconds: float = 60) -> list[tuple[int, dict]]:
        """Poll /health until its engine state is ``want``; every answer on the way."""
        seen = []
        deadline = time.monotonic() + seconds
        while True:
            status, got = self.health()
            seen.append((status, got))
            if got["engine"] == want:
                return seen
            assert time.monotonic() < deadline, seen[-5:]
            time.sleep(0.05)

    def works(self) -> None:
        r = self.running.api().chat.completions.create(model="tiny-target", messages=HI, max_tokens=4)
        assert r.choices[0].message.content is not None


def serve(target: str, draft: str, limits: Limits | None = None) -> Iterator[Setup]:
    client = EngineClient(auto_restart=True)
    client.start()
    client.load(LoadSettings(target=target, draft=draft, n_ctx=1024, n_threads=1))
    served = Served(client, mode="speculative", model_path=target, n_ctx=1024, backoff=(0.2, 1.0))
    running = start(served, limits)
    try:
        yield Setup(client, running)
    finally:
        running.stop()
        client.shutdown()


@pytest.fixture
def setup(tiny_pair) -> Iterator[Setup]:
    yield from serve(str(tiny_pair.target), str(tiny_pair.draft), Limits(ping_interval_s=0.3))


def engine_children(exclude: set[int]) -> list[psutil.Process]:
    """Engine processes this test process has started (spawned Python children), but ``exclude``."""
    out = []
    for p in psutil.Process().children():
        try:
            cmd = " ".join(p.cmdline())
        except psutil.Error:
            continue
        if p.pid not in exclude and "spawn_main" in cmd and "resource_tracker" not in cmd:
            out.append(p)
    return out


def test_a_crash_then_a_crash_of_its_replacement_while_it_starts_recovers(setup) -> None:
    api = setup.running.api()
    long = [{"role": "user", "content": LONG}]
    stream = iter(
        api.chat.completions.create(model="tiny-target", messages=long, max_tokens=900, stream=True)
    )
    next(stream)
    first = setup.client.pid
    os.kill(first, signal.SIGKILL)
    with pytest.raises(openai.APIError, match="engine"):
        for _ in stream:
            pass
    deadline = time.monotonic() + 30
    while not (replacement := engine_children({first})):  # the restart has spawned it: kill it too
        assert time.monotonic() < deadline, "no replacement engine was started"
        time.sleep(0.005)
    replacement[0].kill()
    seen = setup.wait_health("ready")
    states = [got["engine"] for _, got in seen]
    assert all(status == 503 for status, got in seen[:-1]), seen
    assert set(states[:-1]) <= {"restarting", "failed"}, states
    assert all(got.get("reason") for _, got in seen[:-1]), seen  # each says why
    assert setup.served.attempts >= 2 and setup.client.pid not in (first, replacement[0].pid)
    setup.works()


def test_a_model_file_moved_away_is_said_until_it_is_back(tiny_pair, tmp_path) -> None:
    target, draft = tmp_path / tiny_pair.target.name, tmp_path / tiny_pair.draft.name
    shutil.copy(tiny_pair.target, target)
    shutil.copy(tiny_pair.draft, draft)
    for s in serve(str(target), str(draft)):
        target.rename(tmp_path / "moved.gguf")
        os.kill(s.client.pid, signal.SIGKILL)
        seen = s.wait_health("failed", 30)
        status, got = seen[-1]
        assert status == 503 and "model file not found" in got["reason"] and got["retry_in_s"] >= 0, got
        api = s.running.api()
        for chat in (True, False):
            with pytest.raises(openai.InternalServerError) as e:
                if chat:
                    api.chat.completions.create(model="tiny-target", messages=HI, max_tokens=4)
                else:
                    api.completions.create(model="tiny-target", prompt="hi", max_tokens=4)
            assert e.value.status_code == 503 and e.value.response.headers["retry-after"]
            assert "could not be restarted" in e.value.body["message"], e.value.body
            assert "model file not found" in e.value.body["message"], e.value.body
        (tmp_path / "moved.gguf").rename(target)
        s.wait_health("ready", 30)
        s.works()


def test_an_engine_stuck_mid_request_is_restarted_by_the_watchdog(tiny_pair) -> None:
    limits = Limits(stall_timeout_s=1.5, ping_interval_s=0.3, ping_timeout_s=1.0)
    for s in serve(str(tiny_pair.target), str(tiny_pair.draft), limits):
        stream = iter(s.running.api().chat.completions.create(
            model="tiny-target", messages=[{"role": "user", "content": LONG}], max_tokens=900, stream=True
        ))  # fmt: skip
        next(stream)
        stuck = s.client.pid
        os.kill(stuck, signal.SIGSTOP)
        time.sleep(0.8)
        status, got = s.health()
        assert status == 200 and got["engine"] == "busy" and got["progress_s"] >= 0.5, got
        t0 = time.monotonic()
        with pytest.raises(openai.APIError, match="no progress"):
            for _ in stream:
                pass
        assert time.monotonic() - t0 < 5
        s.wait_health("ready", 30)
        assert s.client.pid != stuck
        s.works()


def test_an_engine_stuck_or_dead_while_idle_is_restarted(tiny_pair) -> None:
    limits = Limits(ping_interval_s=0.3, ping_timeout_s=1.0)
    for s in serve(str(tiny_pair.target), str(tiny_pair.draft), limits):
        stuck = s.client.pid
        os.kill(stuck, signal.SIGSTOP)
        seen = s.wait_health("restarting", 10)
        assert seen[-1][0] == 503 and "did not answer" in seen[-1][1]["reason"], seen[-1]
        s.wait_health("ready", 30)
        assert s.client.pid != stuck
        s.works()
        dead = s.client.pid
        os.kill(dead, signal.SIGKILL)  # no request comes: the watchdog notices by itself
        seen = s.wait_health("restarting", 10)
        assert seen[-1][0] == 503 and "SIGKILL" in seen[-1][1]["reason"], seen[-1]
        s.wait_health("ready", 30)
        assert s.client.pid != dead
        assert s.served.restarts == 2
        s.works()
