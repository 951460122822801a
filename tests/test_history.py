"""The drafting history: the index (against a brute-force reference), its file, and its drafter (the
last test over the tiny real models)."""

from __future__ import annotations

import logging
import struct

import numpy as np
import pytest

from app.engine.drafting.base import Outcome
from app.engine.events import Finished, Source
from app.engine.history import index as index_module
from app.engine.history.drafter import HistoryDrafter
from app.engine.history.index import HistoryIndex
from app.engine.history.layout import SEP
from app.engine.history.store import HistoryFileError, HistoryStore, file_name, load, save
from app.engine.history.timing import measure
from app.engine.sampling import SamplingParams

GREEDY = SamplingParams()
RNG = np.random.default_rng(0)


def reference_lookup(index: HistoryIndex, context: list[int], max_match: int = 64) -> tuple[int, set[int]]:
    """Brute force over the store: every position with a continuation whose preceding tokens match."""
    toks = index._buf[: index._n].tolist()
    k, best, found = index.k, 0, set()
    for p in range(k, len(toks)):
        if toks[p] < 0:
            continue
        m = 0
        while m < min(max_match, len(context)) and toks[p - 1 - m] == context[-1 - m] and p - 1 - m > 0:
            m += 1
        if m >= k and m >= best:
            found = {p} if m > best else found | {p}
            best = m
    return best, found


def check_lookup(index: HistoryIndex, context: list[int]) -> None:
    match, cands = index.lookup(context, max_candidates=10_000)
    want_match, want = reference_lookup(index, context)
    assert match == want_match
    assert set(cands.tolist()) == want


# -- the index ---------------------------------------------------------------------------------------


def test_lookup_finds_the_longest_match_and_counts_the_continuations() -> None:
    index = HistoryIndex()
    index.add("a", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    index.add("b", [0, 2, 3, 4, 5, 6, 7, 8, 1])
    index.add("c", [3, 4, 5, 6, 7, 8, 9, 9])
    match, cands = index.lookup([2, 3, 4, 5, 6, 7])
    assert match == 6 and len(cands) == 2  # a and b; c's occurrence matches only 5 tokens back
    assert index.continuation(cands, 5, 0.6) == ([8], [1.0])  # then 9 (a) and 1 (b): 0.5 each...
    toks, probs = index.continuation(cands, 5, 0.5)
    assert toks == [8, 1] and probs == [1.0, 0.5]  # ...a tie, to the most recent occurrence (b)
    match, cands = index.lookup([42, 3, 4, 5, 6, 7])
    assert match == 5 and len(cands) == 3
    toks, probs = index.continuation(cands, 5, 0.5)
    assert toks == [8, 9, 9] and probs == pytest.approx([1.0, 2 / 3, 0.5])  # a's separator, c's 9
    assert index.continuation(cands, 5, 0.7) == ([8], [1.0])  # 2/3 < 0.7
    assert index.continuation(cands, 1, 0.5) == ([8], [1.0])
    assert index.lookup([7, 7, 5, 6, 7]) == (0, pytest.approx(np.empty(0)))  # under K tokens of match
    assert index.lookup([6, 7])[0] == 0  # a context shorter than K


def test_a_continuation_stops_at_the_end_of_a_document() -> None:
    index = HistoryIndex()
    index.add("a", [1, 2, 3, 4, 5, 6])
    match, cands = index.lookup([1, 2, 3, 4])
    assert match == 4 and index.continuation(cands, 10, 0.5) == ([5, 6], [1.0, 1.0])
    assert index.lookup([3, 4, 5, 6])[0] == 0  # the document's end has no continuation to offer


def test_lookup_agrees_with_brute_force_through_adds_merges_removals_and_compaction(monkeypatch) -> None:
    monkeypatch.setattr(index_module, "MERGE_MIN", 50)  # merge often
    index = HistoryIndex(k=3)
    rng = np.random.default_rng(1)
    for step in range(60):
        doc = f"d{rng.integers(8)}"
        index.add(doc, rng.integers(0, 6, rng.integers(1, 40)).tolist())  # small vocabulary: many repeats
        if step % 7 == 6:
            index.remove(f"d{rng.integers(8)}")
        if step % 11 == 10:
            index.compact()
        store = [t for t in index._buf[: index._n].tolist() if t >= 0]
        for _ in range(5):
            if rng.random() < 0.5 and len(store) > 12:
                at = int(rng.integers(10, len(store)))
                context = store[at - 10 : at]
            else:
                context = rng.integers(0, 6, 10).tolist()
            check_lookup(index, context)
    assert len(index) == sum(len(index.tokens(d)) for d in index.documents())


def test_added_tokens_are_found_at_once_and_a_document_grows_in_place() -> None:
    index = HistoryIndex()
    index.add("a", [10, 11, 12])
    index.add("a", [13])  # grows the same run: the gram 10..13 spans the two adds
    index.add("a", [14, 15])
    assert index._docs["a"].runs == [[1, 7]]
    match, cands = index.lookup([9, 10, 11, 12, 13])
    assert match == 4 and index.continuation(cands, 5, 0.5) == ([14, 15], [1.0, 1.0])
    index.add("b", [1, 2])
    index.add("a", [16, 17])  # b came in between: a new run
    assert len(index._docs["a"].runs) == 2
    assert index.tokens("a").tolist() == [10, 11, 12, 13, 14, 15, 16, 17]
    assert len(index) == 10 and index.documents() == ["b", "a"]


def test_many_tokens_are_merged_into_the_sorted_entries() -> None:
    index = HistoryIndex()
    tokens = RNG.integers(0, 50_000, 20_000).tolist()
    index.add("big", tokens)
    assert index._pending.count == 0 and len(index._entries) == 20_000 - 4
    assert np.all(np.diff(index._entries) > 0)
    for at in (4, 5_000, 19_999):
        match, cands = index.lookup(tokens[:at])
        assert match == min(at, 64) and cands.tolist() == [at + 1]  # after the sentinel
        assert index.continuation(cands, 8, 0.5)[0] == tokens[at : at + 8]


def test_eviction_drops_the_least_recently_written_documents() -> None:
    index = HistoryIndex(max_bytes=2_000)
    for name in ("old", "mid", "new"):
        index.add(name, RNG.integers(0, 1000, 150).tolist())
    index.add("old", [1, 2, 3])  # written again: now the most recent
    index.add("big", RNG.integers(0, 1000, 200).tolist())
    assert index.nbytes <= 2_000
    assert index.documents() == ["old", "big"]  # mid went first, then new
    assert "mid" not in index and "new" not in index
    one = HistoryIndex(max_bytes=100)
    one.add("only", list(range(500)))  # alone over the bound: kept (the document being written)
    assert len(one) == 500


def test_removing_a_document_forgets_its_text() -> None:
    index = HistoryIndex()
    index.add("a", [1, 2, 3, 4, 5, 6])
    index.add("b", [7, 1, 2, 3, 4, 8])
    assert len(index.lookup([1, 2, 3, 4])[1]) == 2
    index.remove("a")
    _, cands = index.lookup([1, 2, 3, 4])
    assert index.continuation(cands, 3, 0.5) == ([8], [1.0])
    index.compact()
    assert index._buf[: index._n].tolist() == [SEP, 7, 1, 2, 3, 4, 8, SEP]
    _, cands = index.lookup([1, 2, 3, 4])
    assert index.continuation(cands, 3, 0.5) == ([8], [1.0])
    assert len(index) == 6 and index.documents() == ["b"]
    index.remove("missing")
    index.clear()
    assert len(index) == 0 and index.documents() == [] and index.lookup([7, 1, 2, 3])[0] == 0


def test_absorb_keeps_only_what_a_later_turn_adds() -> None:
    index = HistoryIndex()
    index.add("live", [1, 2, 3, 4, 5])
    assert index.absorb("live", "chat") == 5  # new: renamed
    index.add("live", [1, 2, 3, 4, 5, 6, 7, 8])  # the next turn repeats the first
    assert index.absorb("live", "chat") == 3
    assert index.tokens("chat").tolist() == [1, 2, 3, 4, 5, 6, 7, 8] and len(index) == 8
    index.add("live", [1, 2, 3, 9, 9, 9])  # an edited earlier message: the version parts at token 3
    assert index.absorb("live", "chat") == 3
    assert index.tokens("chat").tolist() == [1, 2, 3, 9, 9, 9] and len(index) == 11  # both versions kept
    index.compact()
    assert index.tokens("chat").tolist() == [1, 2, 3, 9, 9, 9]
    check_lookup(index, [1, 2, 3, 4, 5, 6])
    index.add("live", [1, 2, 3, 9, 9, 9, 5])
    assert index.absorb("live", "chat") == 1 and index.documents() == ["chat"]


# -- the file ----------------------------------------------------------------------------------------


def filled_index() -> HistoryIndex:
    index = HistoryIndex(fingerprint="abc123")
    for i in range(5):
        index.add(f"doc{i}", RNG.integers(0, 300, 400).tolist())
    index.add("doc0", [7, 7, 7, 7, 8])  # a second run
    index.remove("doc3")
    return index


def test_save_and_load_round_trip(tmp_path) -> None:
    index = filled_index()
    path = tmp_path / file_name("abc123")
    size = save(index, path)
    assert size == index.nbytes == path.stat().st_size
    assert not list(tmp_path.glob("*.tmp"))
    loaded = load(path, fingerprint="abc123", k=4)
    assert loaded.documents() == index.documents() and len(loaded) == len(index)
    for doc in index.documents():
        assert loaded.tokens(doc).tolist() == index.tokens(doc).tolist()
    index.compact()  # the file holds the store compacted: the same entries
    index._merge()
    np.testing.assert_array_equal(loaded._entries, index._entries)
    context = index.tokens("doc2")[:100].tolist()
    assert loaded.lookup(context)[0] == index.lookup(context)[0] == 64
    assert loaded.nbytes == size
    drafter = HistoryDrafter(loaded)
    drafter.begin([1, 2, 3, 4, 5])  # a request in progress is not saved
    assert loaded.documents() == index.documents() != loaded.documents(transient=True)
    assert save(loaded, path) == size
    assert load(path).documents() == index.documents()


def test_a_damaged_file_raises_history_file_error(tmp_path) -> None:
    path = tmp_path / "history-abc123.bin"
    save(filled_index(), path)
    data = path.read_bytes()
    bad = tmp_path / "bad.bin"
    for cut in (0, 10, 39, 40, 100, len(data) // 2, len(data) - 1):
        bad.write_bytes(data[:cut])
        with pytest.raises(HistoryFileError):
            load(bad)
    for at in (0, 9, 60, len(data) // 2, len(data) - 20):  # any flipped byte: magic, header, tokens, table
        garbled = bytearray(data)
        garbled[at] ^= 0x5A
        bad.write_bytes(bytes(garbled))
        with pytest.raises(HistoryFileError):
            load(bad)
    bad.write_bytes(data[:8] + struct.pack("<I", 99) + data[12:])
    with pytest.raises(HistoryFileError, match="version 99"):
        load(bad)
    with pytest.raises(HistoryFileError, match="vocabulary"):
        load(path, fingerprint="other")
    with pytest.raises(HistoryFileError, match="3-grams"):
        load(path, k=3)


def test_the_store_loads_in_the_background_and_keeps_what_came_meanwhile(tmp_path) -> None:
    save(filled_index(), tmp_path / file_name("abc123"))
    store = HistoryStore(tmp_path, "abc123")
    store.index.add("meanwhile", [5, 6, 7, 8, 9])
    store.load_in_background().join(10)
    assert store.ready.is_set()
    assert store.index.documents()[-1] == "meanwhile" and len(store.index.documents()) == 5
    assert store.index.lookup([5, 6, 7, 8])[0] == 4
    assert store.save() == store.size_bytes() > 0
    store.forget()  # the file stays, empty, with the time of the forget (for another process's next save)
    assert len(store.index) == 0 and load(store.path).documents() == []
    assert 0 < store.size_bytes() < 100


def test_a_corrupt_or_missing_file_gives_an_empty_index_and_a_log_line(tmp_path, caplog) -> None:
    (tmp_path / file_name("abc123")).write_bytes(b"TANDHIST" + b"\0" * 50)
    store = HistoryStore(tmp_path, "abc123")
    with caplog.at_level(logging.INFO, logger="tandem.history"):
        store.load_in_background().join(10)
        missing = HistoryStore(tmp_path / "none", "abc123")
        missing.load_in_background().join(10)
    assert store.ready.is_set() and missing.ready.is_set()
    assert len(store.index) == 0 and len(missing.index) == 0
    assert "history not loaded" in caplog.text and "no history yet" in caplog.text
    with pytest.raises(ValueError):
        HistoryStore(tmp_path, "../x")


# -- the drafter -------------------------------------------------------------------------------------


def test_the_drafter_searches_the_live_request_and_commits_it() -> None:
    index = HistoryIndex()
    drafter = HistoryDrafter(index)
    assert drafter.name == "history" and drafter.wants_target_confidence == 0
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 50, 51, 1, 2, 3, 4]
    drafter.begin(prompt)
    p = drafter.propose(prompt, 8, GREEDY, RNG)
    # the prompt repeats itself: a 4-token match earns 4 tokens
    assert p.tokens == (5, 6, 7, 8) and p.match == 4 and p.source is Source.HISTORY
    assert p.q == (None,) * 4 and p.confidence == (1.0,) * 4
    reply = [5, 6, 7, 8, 9]
    drafter.observe(p, Outcome(Source.HISTORY, 4, 4, 5, 0.0))
    p = drafter.propose(prompt + reply, 8, GREEDY, RNG)
    assert p.match == 9 and p.tokens[:2] == (10, 50)  # the match grew: a longer draft
    assert drafter.commit("chat", prompt + reply + [11]) == len(prompt) + 6
    assert index.documents() == ["chat"]
    # the next request (another conversation) finds the committed text
    drafter.begin([70, 71, 8, 9, 10, 50])
    p = drafter.propose([70, 71, 8, 9, 10, 50], 3, GREEDY, RNG)
    assert p.tokens == (51, 1, 2) and p.match == 4
    assert drafter.propose([70, 71, 8, 9, 10, 50], 0, GREEDY, RNG).tokens == ()
    drafter.close()
    assert index.documents(transient=True) == ["chat"]  # the uncommitted request is gone
    assert HistoryDrafter(index, stops={1}).propose([8, 9, 10, 50], 3, GREEDY, RNG).tokens == (51,)
    assert HistoryDrafter(index, stops={51}).propose([8, 9, 10, 50], 3, GREEDY, RNG).tokens == ()
    drafter.begin([1, 2, 3])
    index.clear()  # the user forgot the history mid-request: the request is searched again whole
    drafter.learn([1, 2, 3, 4, 5])
    assert index.tokens(drafter.live_id).tolist() == [1, 2, 3, 4, 5]


def test_the_draft_length_follows_the_match_and_the_agreement() -> None:
    index = HistoryIndex()
    text = list(range(100, 200))
    index.add("a", text)
    index.add("b", [*text[:50], 7, 7, 7])
    drafter = HistoryDrafter(index, min_prob=0.6, spec_factor=1.0, max_draft=32)
    assert [drafter.max_len(m) for m in (4, 8, 40)] == [4, 8, 32]
    p = drafter.propose([1, *text[40:46]], 16, GREEDY, RNG)  # 6 tokens match: up to 6
    assert p.match == 6 and p.tokens == tuple(text[46:50])  # then a and b part: 0.5 each, under 0.6
    assert p.confidence == (1.0,) * 4
    even = HistoryDrafter(index, min_prob=0.5).propose([1, *text[40:46]], 16, GREEDY, RNG)
    assert even.tokens == (*text[46:50], 7, 7) and even.confidence == (1.0,) * 4 + (0.5, 1.0)
    assert HistoryDrafter(index).propose([1, *text[40:46]], 3, GREEDY, RNG).tokens == tuple(text[46:49])


def test_measure_returns_the_per_call_times() -> None:
    times = measure(20_000, calls=200)
    assert {"add", "lookup", "lookup_miss", "continuation", "rebuild_ms"} <= set(times)
    assert all(np.isfinite(v) and v > 0 for v in times.values())
    assert times["lookup"] + times["continuation"] < 5_000  # microseconds, with room for a busy machine


# -- over the tiny real models -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine(tiny_pair):
    from app.engine.engine import Engine, LoadSettings

    eng = Engine(LoadSettings(target=str(tiny_pair.target), n_ctx=512, n_threads=2))
    yield eng
    eng.close()


def run_with(engine, drafter: HistoryDrafter, prompt: list[int], params: SamplingParams) -> Finished:
    from app.engine.policy import FixedPolicy
    from app.engine.speculative import generate

    events = generate(
        engine._cache,
        drafter,
        FixedPolicy(8),
        prompt,
        params,
        piece=engine.target.piece,
        is_eog=engine.target.is_eog,
        max_tokens=40,
    )
    *_, fin = events
    assert isinstance(fin, Finished)
    return fin


def test_greedy_decoding_with_the_history_drafter_equals_plain_decoding(engine) -> None:
    from app.engine.engine import GenerationSettings

    prompt = engine.tokenize("def add(a, b):")
    plain = engine.run(prompt, GenerationSettings(mode="plain", max_tokens=40)).tokens
    index = HistoryIndex()
    index.add("earlier", [*prompt, *plain])  # the user asked this before
    drafter = HistoryDrafter(index)
    fin = run_with(engine, drafter, prompt, GREEDY)
    assert fin.tokens == plain
    assert fin.stats.n_drafted > 0 and fin.stats.acceptance_rate > 0.9
    assert fin.stats.n_generated - fin.stats.rounds >= len(plain) // 2  # most tokens came from drafts
    drafter.commit("earlier", [*prompt, *fin.tokens])
    assert index.tokens("earlier").tolist() == [*prompt, *plain] and len(index) == len(prompt) + len(plain)

    sampled = run_with(engine, HistoryDrafter(index), prompt, SamplingParams(temperature=0.8, seed=3))
    assert sampled.tokens and all(0 <= t < engine.target.n_vocab for t in sampled.tokens)
