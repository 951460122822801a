"""The drafting history in the engine: learned per document, drafted from in auto mode (lossless),
kept across a restart, forgotten, a deleted chat removed; through the engine process too."""

from __future__ import annotations

import time

import pytest

from app.engine import EngineClient, GenerationSettings, LoadSettings, Source
from app.engine.engine import Engine

pytestmark = pytest.mark.timeout(120)

PROMPT = "class Counter:\n    def __init__(self):"


def load(tiny_pair, folder, **kw) -> LoadSettings:
    return LoadSettings(
        target=str(tiny_pair.target),
        draft=str(tiny_pair.draft),
        n_ctx=512,
        n_threads=1,
        history_dir=str(folder),
        **kw,
    )


def ready(engine: Engine) -> None:
    deadline = time.monotonic() + 30
    while not engine.history_info().ready:
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_auto_mode_drafts_from_the_history_and_stays_lossless(tiny_pair, tmp_path) -> None:
    with Engine(load(tiny_pair, tmp_path)) as eng:
        ready(eng)
        # a copy from the history ends before a turn marker, as prompt lookup's does
        assert eng._keeper is not None and eng._keeper.drafter.stops == eng.target.control_tokens
        prompt = eng.tokenize(PROMPT)
        plain = eng.run(prompt, GenerationSettings(mode="plain", max_tokens=60, history_doc="chat-1"))
        info = eng.history_info()
        assert info.enabled and info.documents == 1 and info.tokens >= len(prompt) + len(plain.tokens)
        # the same request again: the history holds the reply, so auto mode copies it, and the text
        # is still plain decoding's
        events = list(
            eng.generate(prompt, GenerationSettings(mode="auto", max_tokens=60, history_doc="chat-2"))
        )
        steps = [e for e in events if type(e).__name__ == "Step"]
        assert events[-1].tokens == plain.tokens
        from_history = [s for s in steps if s.drafter is Source.HISTORY]
        assert from_history and sum(s.n_accepted for s in from_history) >= len(plain.tokens) // 2
        assert all(s.decision.source is Source.HISTORY and s.decision.match >= 4 for s in from_history)
    # saved on unload, loaded again by the next engine on the same folder
    with Engine(load(tiny_pair, tmp_path)) as eng:
        ready(eng)
        info = eng.history_info()
        assert info.documents == 2 and info.size_bytes > 0
        assert eng.remove_history(["chat-1"]).documents == 1
        assert eng.forget_history().tokens == 0
    with Engine(load(tiny_pair, tmp_path)) as eng:
        ready(eng)
        assert eng.history_info().tokens == 0


def test_a_corrupt_history_file_starts_empty_with_a_log_line(tiny_pair, tmp_path, caplog) -> None:
    with Engine(load(tiny_pair, tmp_path)) as eng:
        ready(eng)
        eng.run(eng.tokenize(PROMPT), GenerationSettings(mode="plain", max_tokens=20, history_doc="chat-1"))
    (file,) = list(tmp_path.iterdir())
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])
    with caplog.at_level("WARNING"), Engine(load(tiny_pair, tmp_path)) as eng:
        ready(eng)
        assert eng.history_info().tokens == 0
        out = eng.run(eng.tokenize(PROMPT), GenerationSettings(mode="auto", max_tokens=20, history_doc="x"))
        assert out.tokens
    assert any("history" in r.getMessage().lower() for r in caplog.records)


def test_the_client_asks_forgets_and_removes(tiny_pair, tmp_path) -> None:
    with EngineClient() as client:
        assert client.load(load(tiny_pair, tmp_path)).target.n_layer > 0
        deadline = time.monotonic() + 30
        while not client.history().ready:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        for doc in ("chat-1", "chat-2"):
            settings = GenerationSettings(mode="auto", max_tokens=16, history_doc=doc)
            list(client.generate(messages=[{"role": "user", "content": PROMPT}], settings=settings))
        assert client.history().documents == 2
        assert client.history("remove", ["chat-2"]).documents == 1
        assert client.history("forget").tokens == 0
    with EngineClient() as client:
        client.load(LoadSettings(target=str(tiny_pair.target), n_ctx=256, n_threads=1))
        assert not client.history().enabled  # loaded without a history folder
