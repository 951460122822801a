"""The remote client (app.remote_client) against a real ``tandem serve`` on 127.0.0.1 over tiny GGUFs."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from api_server import Running, free_port, start, wait_idle
from app.engine import EngineClient, Finished, GenerationSettings, LoadSettings, Started, Step
from app.remote_client import RemoteClient, RemoteServerError, normalize_base_url
from app.server.served import Served

pytestmark = pytest.mark.timeout(120)

KEY = "sekret"
PROMPT = [{"role": "user", "content": "Tell me about the fox"}]
LONG = [{"role": "user", "content": "Write a long story"}]
GREEDY = GenerationSettings.from_options("speculative", temperature=0.0, max_tokens=40)


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
    running = start(served, api_key=KEY)
    yield running
    running.stop()


def test_base_urls_as_users_type_them() -> None:
    assert normalize_base_url("192.168.1.20:8080") == "http://192.168.1.20:8080/v1"
    assert normalize_base_url(" http://host:8080/ ") == "http://host:8080/v1"
    assert normalize_base_url("https://host/api/v1/") == "https://host/api/v1"
    for bad in ("", "ftp://host", "http://"):
        with pytest.raises(RemoteServerError):
            normalize_base_url(bad)


def test_the_request_carries_the_settings_and_asks_for_the_usage() -> None:
    client = RemoteClient("host:1", model="m")
    plain = client.request(PROMPT, GenerationSettings.from_options("auto", temperature=0.0, max_tokens=9))
    assert plain["stream"] and plain["stream_options"] == {"include_usage": True}
    assert plain["model"] == "m" and plain["max_tokens"] == 9 and plain["temperature"] == 0.0
    assert "extra_body" not in plain and "top_p" not in plain and "seed" not in plain
    s = GenerationSettings.from_options(
        "auto", temperature=0.7, top_k=20, top_p=0.9, min_p=0.1, repeat_penalty=1.1, seed=5, stop=("END",)
    )
    args = client.request(PROMPT, s)
    assert args["top_p"] == 0.9 and args["seed"] == 5 and args["stop"] == ["END"]
    assert args["extra_body"] == {"top_k": 20, "min_p": 0.1, "repeat_penalty": 1.1}


def test_connect_lists_the_models_and_checks_the_choice(srv) -> None:
    info = RemoteClient(srv.url, KEY, name="box").connect()
    assert info.model == "tiny-target" and info.models == ("tiny-target",)
    assert info.label == "tiny-target on box" and info.host == f"127.0.0.1:{srv.port}"
    with pytest.raises(RemoteServerError, match="does not offer 'other'"):
        RemoteClient(srv.url, KEY, "other", name="box").connect()


def test_a_reply_streams_as_engine_events_with_the_servers_figures(srv, engine_client) -> None:
    client = RemoteClient(srv.url, KEY, "tiny-target")
    with client.generate(messages=PROMPT, settings=GREEDY) as stream:
        events = list(stream)
    assert isinstance(events[0], Started) and isinstance(events[-1], Finished)
    steps = [e for e in events[1:-1] if isinstance(e, Step)]
    assert len(steps) > 1 and all(s.text and s.tokens == () for s in steps), "one Step per chunk of text"
    fin = events[-1]
    assert fin.text == "".join(s.text for s in steps) and fin.reason in ("eog", "length")
    # greedy: the same words the engine gives in this process
    with engine_client.generate(messages=PROMPT, settings=GREEDY) as local:
        assert fin.text == next(e for e in local if isinstance(e, Finished)).text
    s = fin.stats
    assert s.mode == "remote" and s.n_generated > len(steps) * 0.5 and s.n_prompt_tokens > 0
    assert s.n_drafted > 0 and 0 <= s.n_accepted <= s.n_drafted, "draft counts from the timings"
    assert s.acceptance_rate == pytest.approx(s.n_accepted / s.n_drafted)
    assert s.decode_tokens_per_second > 0 and s.ttft_s > 0 and s.t_decode_s > 0
    assert sum(n for _, _, n, _ in s.drafted_by) == s.n_drafted, "which source drafted, from the timings"


def test_cancel_ends_the_stream_at_once_and_frees_the_server(srv) -> None:
    client = RemoteClient(srv.url, KEY, "tiny-target")
    settings = GenerationSettings.from_options("speculative", temperature=0.0, max_tokens=2000)
    stream = client.generate(messages=LONG, settings=settings)
    seen = 0
    for ev in stream:
        if isinstance(ev, Step):
            seen += 1
            if seen == 3:
                t0 = time.monotonic()
                client.cancel()
        if isinstance(ev, Finished):
            break
    assert ev.reason == "cancelled" and time.monotonic() - t0 < 1.0 and ev.text
    wait_idle(srv.served)  # the connection closed: the server stopped the reply


def test_errors_are_readable(srv) -> None:
    with pytest.raises(RemoteServerError, match=r"refused the API key \(401"):
        RemoteClient(srv.url, "wrong", name="box").connect()
    with pytest.raises(RemoteServerError, match="refused the API key"):
        list(RemoteClient(srv.url, None, "tiny-target").generate(messages=PROMPT, settings=GREEDY))
    closed = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(RemoteServerError, match=f"Cannot reach {closed}"):
        RemoteClient(closed).list_models()
    with pytest.raises(RemoteServerError, match="404"):
        RemoteClient(srv.url.removesuffix("/v1") + "/nope", KEY).list_models()
