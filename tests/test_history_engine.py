"""The drafting history in the engine: learned per document, drafted from in auto mode (lossless),
kept across a restart, forgotten, a deleted chat removed; through the engine process too; a FIFO, a device
or ids outside the vocabulary in place of its file refused; two engines sharing one folder."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from app.engine import EngineClient, GenerationSettings, LoadSettings, Source
from app.engine.engine import Engine
from app.engine.history.fileformat import file_name, save
from app.engine.history.fileformat import load as load_file
from app.engine.history.index import HistoryIndex
from app.gguf import compat
from app.gguf.meta import read_metadata_file

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
    (file,) = list(tmp_path.glob("history-*.bin"))
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


# -- a history file that is not what it should be, and two engines on one folder ------------------------


def history_file(tiny_pair, folder) -> Path:
    fingerprint = compat.vocab_fingerprint(read_metadata_file(tiny_pair.target))[:16]
    return Path(folder) / file_name(fingerprint)


def ready_soon(engine: Engine) -> None:
    deadline = time.monotonic() + 5  # a FIFO or a device must not hold the load up
    while not engine.history_info().ready:
        assert time.monotonic() < deadline, "the history's load hung"
        time.sleep(0.01)


@pytest.mark.parametrize("kind", ["fifo", "device", "vocabulary"])
def test_a_fifo_a_device_link_or_ids_outside_the_vocabulary_are_refused_at_load(
    tiny_pair, tmp_path, caplog, kind
) -> None:
    path = history_file(tiny_pair, tmp_path)
    with Engine(load(tiny_pair, tmp_path)) as eng:
        prompt = eng.tokenize(PROMPT)
        n_vocab = eng.target.n_vocab
    if kind == "fifo":
        if not hasattr(os, "mkfifo"):
            pytest.skip("FIFOs are POSIX")
        path.unlink(missing_ok=True)
        os.mkfifo(path)
        why = "not a regular file (a FIFO)"
    elif kind == "device":
        path.unlink(missing_ok=True)
        path.symlink_to("/dev/zero" if os.path.exists("/dev/zero") else os.devnull)
        why = "symbolic link"
    else:  # a valid file whose document continues the prompt with ids the model does not have
        index = HistoryIndex(fingerprint=path.name[len("history-") : -len(".bin")])
        index.add("bad", [*prompt, *range(n_vocab, n_vocab + 40)])
        save(index, path)
        why = f"outside the vocabulary ({n_vocab} tokens)"
    with caplog.at_level("WARNING"):
        eng = Engine(load(tiny_pair, tmp_path))
        try:
            ready_soon(eng)
            assert eng.history_info().tokens == 0
            out = eng.run(prompt, GenerationSettings(mode="auto", max_tokens=20, history_doc="chat"))
            assert out.tokens
        finally:
            closing = threading.Thread(target=eng.close, daemon=True)  # saves: must not hang either
            closing.start()
            closing.join(10)
            assert not closing.is_alive(), "closing the engine hung"
    (line,) = [r.getMessage() for r in caplog.records if "history not loaded" in r.getMessage()]
    assert why in line
    assert path.is_file() and not path.is_symlink() and load_file(path).documents() == ["chat"]


def test_two_engines_on_one_folder_keep_both_sets_and_a_forget_holds(tiny_pair, tmp_path) -> None:
    one, two = Engine(load(tiny_pair, tmp_path)), Engine(load(tiny_pair, tmp_path))
    try:
        for eng, doc in ((one, "one"), (two, "two")):
            ready(eng)
            eng.run(eng.tokenize(PROMPT), GenerationSettings(mode="plain", max_tokens=12, history_doc=doc))
    finally:
        one.close()
        two.close()  # saved last: it used to overwrite what the first saved
    with Engine(load(tiny_pair, tmp_path)) as eng, Engine(load(tiny_pair, tmp_path)) as other:
        ready(eng)
        ready(other)
        assert eng.history_info().documents == 2
        assert eng.forget_history().tokens == 0
        other.run(other.tokenize("x = 1"), GenerationSettings(mode="plain", max_tokens=8, history_doc="new"))
    # the other engine held both documents: its save on close did not bring them back
    assert load_file(history_file(tiny_pair, tmp_path)).documents() == ["new"]
