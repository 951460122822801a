"""The engine in its own process: streaming, cancellation, crashes and restarts, on real tiny GGUF models."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
import time

import psutil
import pytest

from app.engine import EngineClient, EngineCrashedError
from app.engine.engine import Engine, EngineError, GenerationSettings, IncompatibleDraftError, LoadSettings
from app.engine.events import Action, Finished, Started, Step
from app.engine.llama import ModelLoadError
from app.engine.speculative import PromptTooLongError

pytestmark = pytest.mark.timeout(60)
WINDOWS = sys.platform == "win32"
SEGFAULT = "ACCESS_VIOLATION" if WINDOWS else "SIGSEGV"

PROMPT = "def add(a, b):"
CHAT = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi there"}]
GREEDY = GenerationSettings(mode="speculative", max_tokens=40)
# long, slow rounds (16 drafted tokens each): a cancel or a kill lands well inside the reply
SLOW = GenerationSettings(mode="speculative", max_tokens=400, n_max=16, adaptive=False)


def load_settings(pair, **kw) -> LoadSettings:
    # one thread: on small shared CI machines ggml's spinning worker threads only add noise
    return LoadSettings(target=str(pair.target), draft=str(pair.draft), n_ctx=512, n_threads=1, **kw)


@pytest.fixture(scope="module")
def engine(tiny_pair) -> Engine:
    """The in-process reference."""
    with Engine(load_settings(tiny_pair)) as eng:
        yield eng


@pytest.fixture(scope="module")
def expected(engine: Engine) -> dict[str, tuple[int, ...]]:
    return {
        "prompt": engine.run(engine.tokenize(PROMPT), GREEDY).tokens,
        "chat": engine.run(engine.chat_prompt(CHAT), GREEDY).tokens,
    }


@pytest.fixture(scope="module")
def progress_calls() -> list[tuple[str, float]]:
    return []


@pytest.fixture(scope="module")
def client(tiny_pair, progress_calls) -> EngineClient:
    c = EngineClient()
    c.start()
    c.load(load_settings(tiny_pair), progress=lambda stage, f: progress_calls.append((stage, f)))
    yield c
    c.shutdown()


def run(client: EngineClient, **kw) -> tuple[list[Started | Step | Finished], Finished]:
    events = list(client.generate(**kw))
    assert isinstance(events[-1], Finished)
    return events, events[-1]


def assert_reaped(pid: int) -> None:
    assert pid not in {p.pid for p in multiprocessing.active_children()}
    assert not psutil.pid_exists(pid), "the engine process is still there (a zombie?)"


# -- streaming ------------------------------------------------------------------------------------


def test_generate_streams_the_same_tokens_as_in_process(client, engine, expected) -> None:
    prompt = client.tokenize(PROMPT)
    assert prompt == engine.tokenize(PROMPT)
    events, fin = run(client, prompt=prompt, settings=GREEDY)
    assert fin.tokens == expected["prompt"] and fin.reason == "length"
    assert isinstance(events[0], Started)
    steps = [e for e in events if isinstance(e, Step)]
    assert len(steps) > 1, "events should be streamed round by round"
    assert "".join(s.text for s in steps) == fin.text
    # chat messages are rendered by the host with the model's template
    assert client.tokenize(messages=CHAT) == engine.chat_prompt(CHAT)
    assert client.tokenize("Hi", chat=True) == engine.chat_prompt([{"role": "user", "content": "Hi"}])
    _, fin = run(client, messages=CHAT, settings=GREEDY)
    assert fin.tokens == expected["chat"]


def test_load_progress_increases_to_one(client, progress_calls) -> None:
    assert progress_calls[0][0] == "target" and progress_calls[-1] == ("draft", 1.0)
    for stage in ("target", "draft"):
        fractions = [f for s, f in progress_calls if s == stage]
        assert fractions == sorted(fractions) and fractions[-1] == 1.0 and len(fractions) > 2
    info = client.info()
    assert info.loaded and info.pid == client.pid and info.engine is not None and info.engine.n_ctx >= 512
    assert any(d.kind == "CPU" for d in info.devices)  # listed by the engine process, for the fit


def test_requests_during_a_generation_are_answered(client) -> None:
    prompt = client.tokenize(PROMPT)
    with client.generate(prompt=prompt, settings=SLOW) as stream:
        assert isinstance(next(stream), Started)
        assert client.info().generating is True
        assert client.tokenize(PROMPT) == prompt
        with pytest.raises(EngineError, match="already running"):
            client.generate(prompt=prompt, settings=GREEDY)
        with pytest.raises(EngineError, match="cancel it first"):
            client.load(client.settings)
    assert client.info().generating is False


# -- cancellation ---------------------------------------------------------------------------------


def test_cancel_from_another_thread_ends_within_one_round(client, expected) -> None:
    prompt = client.tokenize(PROMPT)
    steps: list[Step] = []
    third = threading.Event()
    at_cancel: list[float] = []

    def canceller() -> None:
        third.wait(10)
        at_cancel.append(time.monotonic())
        client.cancel()

    thread = threading.Thread(target=canceller)
    thread.start()
    fin = None
    for event in client.generate(prompt=prompt, settings=SLOW):
        if isinstance(event, Step):
            steps.append(event)
            if len(steps) == 3:
                third.set()
        elif isinstance(event, Finished):
            fin = event
    thread.join()
    assert fin is not None and fin.reason == "cancelled"
    # every step a round but the first token, read with the prompt's batch
    assert steps[0].decision.action is Action.PROMPT
    assert fin.stats.rounds == len(steps) - 1 < SLOW.max_tokens
    # Rounds the host had already sent may still be on their way (the host does not wait for the
    # reader), so what counts is when each round began, by the host's clock (a system-wide one): at
    # most the round whose cancel check came just before cancel() may begin after it.
    began_after = [s for s in steps if s.began > at_cancel[0]]
    assert len(began_after) <= 1, f"{len(began_after)} rounds began after cancel()"
    assert all(s.began > 0 for s in steps)
    _, fin = run(client, prompt=prompt, settings=GREEDY)
    assert fin.tokens == expected["prompt"]


def test_closing_a_stream_early_cancels_it(client, expected) -> None:
    prompt = client.tokenize(PROMPT)
    stream = client.generate(prompt=prompt, settings=SLOW)
    next(stream), next(stream)
    stream.close()
    assert stream.done
    for _ in client.generate(prompt=prompt, settings=SLOW):
        break  # an abandoned (garbage) stream closes itself too
    _, fin = run(client, prompt=prompt, settings=GREEDY)
    assert fin.tokens == expected["prompt"]


# -- errors ---------------------------------------------------------------------------------------


def test_engine_errors_cross_the_process_boundary(
    client, tiny_pair, tiny_incompatible_draft, tmp_path
) -> None:
    with pytest.raises(PromptTooLongError, match="context"):
        run(client, prompt=client.tokenize("word " * 2000), settings=GREEDY)
    with EngineClient() as bare:
        pid = bare.pid
        with pytest.raises(EngineError, match="no model is loaded"):
            bare.tokenize("hi")
        missing = tmp_path / "missing.gguf"
        with pytest.raises(ModelLoadError, match="not found") as err:
            bare.load(LoadSettings(target=str(missing)))
        assert str(missing) in str(err.value)
        with pytest.raises(IncompatibleDraftError, match="token"):
            bare.load(LoadSettings(target=str(tiny_pair.target), draft=str(tiny_incompatible_draft)))
        with pytest.raises(EngineError, match="unknown crash kind"):
            bare.crash("meteor")
        assert bare.alive and bare.pid == pid  # errors do not take the host down
    assert_reaped(pid)


# -- crashes --------------------------------------------------------------------------------------


@pytest.mark.skipif(WINDOWS, reason="POSIX signals")
def test_sigkill_mid_generation_then_restart(client, expected) -> None:
    prompt = client.tokenize(PROMPT)
    pid = client.pid
    steps = 0
    with pytest.raises(EngineCrashedError, match="killed by SIGKILL during generation") as err:
        for event in client.generate(prompt=prompt, settings=SLOW):
            if isinstance(event, Step):
                steps += 1
                if steps == 3:
                    os.kill(pid, signal.SIGKILL)
    assert err.value.signal_name == "SIGKILL" and "out of memory" in str(err.value)
    assert not client.alive
    with pytest.raises(EngineCrashedError, match="not running"):  # no auto_restart: stays down
        client.info()
    client.restart()
    assert client.alive and client.pid != pid
    assert_reaped(pid)
    _, fin = run(client, prompt=prompt, settings=GREEDY)
    assert fin.tokens == expected["prompt"]


def test_abort_and_segfault_are_reported_and_auto_restarted(tiny_pair, expected) -> None:
    with EngineClient(auto_restart=True) as c:
        c.load(load_settings(tiny_pair))
        prompt = c.tokenize(PROMPT)
        pids = [c.pid]
        with pytest.raises(EngineCrashedError, match=r"aborted \(SIGABRT\) inside llama.cpp") as err:
            c.crash("abort")
        assert err.value.signal_name == "SIGABRT"
        assert any("forced abort" in line for line in err.value.log_tail), err.value.log_tail
        # what happened, in one line for the app's status bar (the log lines travel as a field)
        assert "aborted (SIGABRT)" in err.value.what and "forced abort" not in err.value.what
        assert not c.alive
        _, fin = run(c, prompt=prompt, settings=GREEDY)  # restarted and re-loaded transparently
        assert fin.tokens == expected["prompt"]
        pids.append(c.pid)
        with pytest.raises(EngineCrashedError, match=rf"crashed \({SEGFAULT}\)") as err:
            c.crash("segfault")
        assert err.value.signal_name == SEGFAULT and c.last_crash is not None
        assert c.info().loaded and c.settings == load_settings(tiny_pair)
        pids.append(c.pid)
        assert len(set(pids)) == 3
    for pid in pids:
        assert_reaped(pid)


def test_shutdown_of_a_dead_host_does_not_hang_and_leaves_no_process() -> None:
    c = EngineClient()
    c.start()
    pid = c.pid
    with pytest.raises(EngineCrashedError, match="exited unexpectedly with code 7"):
        c.crash("exit")
    t0 = time.monotonic()
    c.shutdown()
    c.shutdown()  # idempotent
    assert time.monotonic() - t0 < 2
    assert_reaped(pid)
    # a live, idle host exits on Shutdown
    c.start()
    pid = c.pid
    c.shutdown()
    assert_reaped(pid)
    assert not c.alive


def test_the_client_side_never_loads_llama_cpp() -> None:
    """The UI/CLI process talks to the engine process without importing llama.cpp itself."""
    import subprocess
    import sys

    code = (
        "import sys; import app.engine, app.engine.process.client, app.engine.info; "
        "print('llama_cpp' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_ui_never_loads_llama_cpp() -> None:
    """The app's window process imports no llama.cpp: only the engine process does."""
    import subprocess
    import sys

    code = (
        "import sys; import app.ui.app, app.ui.main_window, app.ui.models.models_panel; "
        "print('llama_cpp' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True,
        env={**__import__("os").environ, "QT_QPA_PLATFORM": "offscreen"},
    )  # fmt: skip
    assert out.stdout.strip() == "False"
