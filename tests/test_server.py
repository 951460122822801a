"""The OpenAI-compatible server on 127.0.0.1 over tiny real GGUFs, driven by the official client."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import openai
import pytest
import uvicorn

from app.engine import EngineClient, LoadSettings
from app.engine.events import Source
from app.server.api import allowed_hosts, create_app
from app.server.cli import check_exposure
from app.server.connections import uvicorn_config
from app.server.limits import Limits
from app.server.served import Served

pytestmark = pytest.mark.timeout(120)

PROMPT = "Tell me about the fox"
LONG = "Write a long story"  # the tiny target writes hundreds of tokens: time to cut it off


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Running:
    url: str
    port: int
    served: Served
    server: uvicorn.Server
    thread: threading.Thread
    ready: threading.Event

    def api(self, key: str = "none", **kw) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0, timeout=60, **kw)

    def raw(self, method: str, path: str, body: dict | bytes | None = None, headers: dict | None = None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        return resp, resp.read(), conn

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def start(served: Served, limits: Limits | None = None, **kw) -> Running:
    port = free_port()
    ready = threading.Event()
    ready.set()
    served.ready = ready.is_set
    app = create_app(served, allowed_hosts=allowed_hosts("127.0.0.1", port), limits=limits, **kw)
    server = uvicorn.Server(uvicorn_config(app, "127.0.0.1", port))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    return Running(f"http://127.0.0.1:{port}", port, served, server, thread, ready)


@pytest.fixture(scope="module")
def engine_client(tiny_pair) -> Iterator[EngineClient]:
    with EngineClient(auto_restart=True) as c:
        c.load(
            LoadSettings(target=str(tiny_pair.target), draft=str(tiny_pair.draft), n_ctx=1024, n_threads=1)
        )
        yield c


@pytest.fixture(scope="module")
def srv(engine_client, tiny_pair) -> Iterator[Running]:
    served = Served(engine_client, mode="speculative", model_path=str(tiny_pair.target), n_ctx=1024)
    running = start(served)
    yield running
    running.stop()


def wait_idle(served: Served, seconds: float = 10.0) -> float:
    t0 = time.monotonic()
    while served.turns.busy or served.turns.waiting:
        assert time.monotonic() - t0 < seconds, "the engine is still busy"
        time.sleep(0.02)
    return time.monotonic() - t0


def test_models_and_health(srv) -> None:
    models = srv.api().models.list()
    assert [m.id for m in models.data] == ["tiny-target"]
    resp, body, _ = srv.raw("GET", "/health")
    assert resp.status == 200 and json.loads(body)["status"] == "ok"


def test_chat_equals_tandem_generate_and_carries_usage_and_timings(srv, tiny_pair) -> None:
    api = srv.api()
    r = api.chat.completions.create(
        model="tiny-target", messages=[{"role": "user", "content": PROMPT}], temperature=0, max_tokens=40
    )
    text = r.choices[0].message.content
    assert text and r.choices[0].finish_reason in ("stop", "length") and r.object == "chat.completion"
    assert (
        r.usage.completion_tokens > 0
        and r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    )
    timings = r.model_extra["timings"]
    for key in ("prompt_n", "prompt_ms", "predicted_n", "predicted_ms", "predicted_per_second", "draft_n"):
        assert key in timings
    assert (
        timings["predicted_n"] == r.usage.completion_tokens
        and timings["draft_n_accepted"] <= timings["draft_n"]
    )
    # which source drafted, as data: the per-source counts add up to the totals
    sources = timings["draft_sources"]
    assert timings["draft_n"] > 0 and set(sources) <= {s.value for s in Source}
    assert sum(v["draft_n"] for v in sources.values()) == timings["draft_n"]
    assert sum(v["draft_n_accepted"] for v in sources.values()) == timings["draft_n_accepted"]
    cli = subprocess.run(
        [sys.executable, "-m", "app", "generate", "--target", str(tiny_pair.target),
         "--draft", str(tiny_pair.draft), "--mode", "speculative", "--chat", "--prompt", PROMPT,
         "--max-tokens", "40", "--ctx", "1024", "--threads", "1", "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert cli.returncode == 0, cli.stderr
    assert json.loads(cli.stdout)["text"] == text  # greedy: the same words as tandem generate


def test_a_fixed_draft_length_drafts_it_every_round(engine_client, tiny_pair) -> None:
    """``tandem serve --mode speculative --n-max 2 --no-adaptive``: every drafted round drafts 2 tokens,
    and the reply has the same words as with the adaptive default."""
    texts, rounds = [], []
    for n_max, adaptive in ((2, False), (8, True)):
        served = Served(
            engine_client, mode="speculative", model_path=str(tiny_pair.target), n_ctx=1024,
            n_max=n_max, adaptive=adaptive,
        )  # fmt: skip
        running = start(served)
        try:
            r = running.api().chat.completions.create(
                model="tiny-target",
                messages=[{"role": "user", "content": PROMPT}],
                temperature=0,
                max_tokens=40,
            )
        finally:
            running.stop()
        texts.append(r.choices[0].message.content)
        rounds.append(r.model_extra["timings"]["draft_sources"]["model"])
    fixed = rounds[0]  # (the last round may have room for one token only)
    assert fixed["rounds"] > 0 and 2 * fixed["rounds"] - 1 <= fixed["draft_n"] <= 2 * fixed["rounds"]
    assert rounds[1]["draft_n"] > 0 and texts[0] == texts[1]


def test_streamed_chat_is_the_same_text_and_ends_with_usage_and_done(srv) -> None:
    api = srv.api()
    messages = [{"role": "user", "content": PROMPT}]
    whole = api.chat.completions.create(model="tiny-target", messages=messages, temperature=0, max_tokens=40)
    chunks = list(
        api.chat.completions.create(
            model="tiny-target",
            messages=messages,
            temperature=0,
            max_tokens=40,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    assert "timings" in chunks[-1].model_extra
    resp, body, _ = srv.raw(
        "POST",
        "/v1/chat/completions",
        {"messages": messages, "stream": True, "max_tokens": 8, "temperature": 0},
    )
    lines = [ln for ln in body.decode().splitlines() if ln.startswith("data:")]
    assert resp.status == 200 and resp.getheader("content-type").startswith("text/event-stream")
    assert lines[-1] == "data: [DONE]"


def test_completions_stream_and_not(srv) -> None:
    api = srv.api()
    whole = api.completions.create(
        model="tiny-target", prompt="The quick brown fox", temperature=0, max_tokens=24
    )
    assert whole.object == "text_completion" and whole.choices[0].text and whole.usage.completion_tokens > 0
    parts = api.completions.create(
        model="tiny-target", prompt="The quick brown fox", temperature=0, max_tokens=24, stream=True
    )
    assert "".join(c.choices[0].text for c in parts if c.choices) == whole.choices[0].text


def test_stop_strings_end_the_reply_and_are_never_sent(srv) -> None:
    api = srv.api()
    msgs = [{"role": "user", "content": PROMPT}]
    text = api.chat.completions.create(model="tiny-target", messages=msgs, temperature=0, max_tokens=40)
    full = text.choices[0].message.content
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    assert stop.strip(), full
    for stream in (False, True):
        r = api.chat.completions.create(
            model="tiny-target",
            messages=msgs,
            temperature=0,
            max_tokens=40,
            stop=[stop, "\x00never"],
            stream=stream,
        )
        got = (
            "".join(c.choices[0].delta.content or "" for c in r if c.choices)
            if stream
            else r.choices[0].message.content
        )
        assert got == full[: full.index(stop)] and stop not in got


def test_requests_tandem_cannot_honour_are_400_with_the_field(srv) -> None:
    api = srv.api()
    msgs = [{"role": "user", "content": "hi"}]
    cases = [
        ({"n": 2}, "n"),
        ({"functions": [{"name": "f", "parameters": {}}]}, "functions"),  # tools: test_server_tools.py
        ({"tools": [{"type": "custom", "custom": {"name": "f"}}]}, "tools[0].type"),
        ({"logprobs": True}, "logprobs"),
        ({"response_format": {"type": "regex", "regex": "x"}}, "response_format"),
        ({"temperature": 5}, "temperature"),
    ]
    for extra, param in cases:
        with pytest.raises(openai.BadRequestError) as e:
            api.chat.completions.create(model="tiny-target", messages=msgs, **extra)
        assert e.value.status_code == 400 and e.value.body["param"] == param, e.value.body
    with pytest.raises(openai.BadRequestError) as e:
        api.chat.completions.create(
            model="tiny-target", messages=[{"role": "user", "content": "fox " * 2000}]
        )
    assert e.value.body["code"] == "context_length_exceeded" and e.value.body["param"] == "messages"
    resp, body, _ = srv.raw("POST", "/v1/chat/completions", b'{"messages": [')
    assert resp.status == 400 and json.loads(body)["error"]["type"] == "invalid_request_error"
    with pytest.raises(openai.NotFoundError) as nf:
        api.chat.completions.create(model="gpt-4o", messages=msgs)
    assert nf.value.body["code"] == "model_not_found"
    resp, body, _ = srv.raw("GET", "/v1/nothing")
    assert resp.status == 404 and "error" in json.loads(body)
    assert wait_idle(srv.served) < 5  # nothing a client sends leaves the engine busy


def test_503_while_loading(srv) -> None:
    srv.ready.clear()
    try:
        with pytest.raises(openai.InternalServerError) as e:
            srv.api().chat.completions.create(
                model="tiny-target", messages=[{"role": "user", "content": "hi"}]
            )
        assert e.value.status_code == 503
        resp, _, _ = srv.raw("GET", "/health")
        assert resp.status == 503 and resp.getheader("retry-after")
    finally:
        srv.ready.set()


def test_a_client_that_disconnects_mid_stream_frees_the_engine(srv) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
    body = {
        "messages": [{"role": "user", "content": LONG}],
        "stream": True,
        "max_tokens": 900,
        "temperature": 0,
    }
    conn.request(
        "POST", "/v1/chat/completions", body=json.dumps(body), headers={"Content-Type": "application/json"}
    )
    resp = conn.getresponse()
    assert resp.status == 200
    resp.fp.readline()  # the first event has arrived: the engine is generating
    assert srv.served.turns.busy
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    assert wait_idle(srv.served, 10) < 10
    r = srv.api().chat.completions.create(
        model="tiny-target", messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    assert r.choices[0].message.content is not None


def test_a_full_queue_answers_429_with_retry_after(srv) -> None:
    srv.served.turns.max_waiting = 0
    stream = srv.api().chat.completions.create(
        model="tiny-target",
        messages=[{"role": "user", "content": LONG}],
        max_tokens=900,
        temperature=0,
        stream=True,
    )
    try:
        next(iter(stream))
        with pytest.raises(openai.RateLimitError) as e:
            srv.api().chat.completions.create(
                model="tiny-target", messages=[{"role": "user", "content": "hi"}]
            )
        assert e.value.status_code == 429 and int(e.value.response.headers["retry-after"]) >= 1
    finally:
        stream.close()
        srv.served.turns.max_waiting = 16
    wait_idle(srv.served)


def test_the_host_header_must_name_this_server(srv) -> None:
    resp, body, _ = srv.raw("GET", "/v1/models", headers={"Host": f"evil.example:{srv.port}"})
    assert resp.status == 403 and json.loads(body)["error"]["code"] == "invalid_host"
    resp, _, _ = srv.raw("GET", "/v1/models", headers={"Host": f"localhost:{srv.port}"})
    assert resp.status == 200
    resp, _, _ = srv.raw("GET", "/v1/models", headers={"Origin": "https://evil.example"})
    assert resp.getheader("access-control-allow-origin") is None  # no CORS unless asked


def test_api_key_and_cors(engine_client, tiny_pair) -> None:
    served = Served(engine_client, model_path=str(tiny_pair.target), n_ctx=1024)
    running = start(served, api_key="s3cret", cors_origins=["https://app.example"])
    try:
        with pytest.raises(openai.AuthenticationError) as e:
            running.api("wrong").models.list()
        assert e.value.status_code == 401 and e.value.body["code"] == "invalid_api_key"
        resp, _, _ = running.raw("GET", "/v1/models")
        assert resp.status == 401
        assert running.api("s3cret").models.list().data[0].id == "tiny-target"
        resp, _, _ = running.raw(
            "OPTIONS",
            "/v1/chat/completions",
            headers={"Origin": "https://app.example", "Access-Control-Request-Method": "POST"},
        )
        assert resp.getheader("access-control-allow-origin") == "https://app.example"
    finally:
        running.stop()
    check_exposure("127.0.0.1", None)
    with pytest.raises(ValueError, match="--api-key"):
        check_exposure("0.0.0.0", None)
    check_exposure("0.0.0.0", "key")


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")
def test_an_engine_killed_mid_request_fails_that_request_only(tiny_pair) -> None:
    load = LoadSettings(target=str(tiny_pair.target), draft=str(tiny_pair.draft), n_ctx=1024, n_threads=1)
    with EngineClient(auto_restart=True) as client:
        client.load(load)
        running = start(Served(client, mode="speculative", model_path=str(tiny_pair.target), n_ctx=1024))
        try:
            api = running.api()
            msgs = [{"role": "user", "content": LONG}]
            # streamed: the error arrives as an event after the first chunks
            stream = api.chat.completions.create(
                model="tiny-target", messages=msgs, max_tokens=900, stream=True
            )
            chunks = iter(stream)
            next(chunks)
            os.kill(client.pid, signal.SIGKILL)
            with pytest.raises(openai.APIError, match="engine"):
                for _ in chunks:
                    pass
            healthy(running)
            # not streamed: a 500 naming the crash
            pid = client.pid
            killer = threading.Timer(0.3, lambda: os.kill(pid, signal.SIGKILL))
            killer.start()
            with pytest.raises(openai.InternalServerError) as e:
                api.chat.completions.create(model="tiny-target", messages=msgs, max_tokens=900, temperature=0)
            killer.join()
            assert e.value.status_code == 500 and e.value.body["code"] == "engine_crashed"
            healthy(running)
            r = api.chat.completions.create(
                model="tiny-target", messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
            assert r.choices[0].message.content is not None
        finally:
            running.stop()


def healthy(running: Running, seconds: float = 60) -> None:
    """503 while the engine restarts, then 200."""
    deadline = time.monotonic() + seconds
    while True:
        resp, _, _ = running.raw("GET", "/health")
        if resp.status == 200:
            return
        assert resp.status == 503 and time.monotonic() < deadline
        time.sleep(0.1)


def test_tandem_serve_end_to_end(tiny_pair, tmp_path) -> None:
    port = free_port()
    env = {**os.environ, "TANDEM_DATA_DIR": str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "app", "serve", "--model", str(tiny_pair.target),
         "--draft", str(tiny_pair.draft), "--port", str(port), "--ctx", "512", "--threads", "1"],
        stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        api = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=30)
        deadline = time.monotonic() + 60
        while True:
            try:
                r = api.chat.completions.create(
                    model="tiny-target", messages=[{"role": "user", "content": "hi"}], max_tokens=4
                )
                break
            except (openai.APIConnectionError, openai.InternalServerError):
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.2)
        assert r.choices[0].message.content is not None
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert "tiny-target (auto) at http://127.0.0.1:" in err
    refused = subprocess.run(
        [sys.executable, "-m", "app", "serve", "--model", str(tiny_pair.target), "--host", "0.0.0.0"],
        capture_output=True, text=True, timeout=60, env={**os.environ, "TANDEM_API_KEY": ""},
    )  # fmt: skip
    assert refused.returncode == 2 and "--api-key" in refused.stderr
