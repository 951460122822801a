"""Incremental UTF-8 decoding and stop strings (app.engine.textstream)."""

from __future__ import annotations

import itertools
import time

import pytest

from app.engine.textstream import StopMatcher, Utf8Stream

# --------------------------------------------------------------------------- UTF-8


def test_utf8_byte_by_byte() -> None:
    text = "héllo € 😀 中文 Ωmega"
    stream = Utf8Stream()
    pieces = [stream.feed(bytes([b])) for b in text.encode("utf-8")]
    pieces.append(stream.flush())
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
    # Every emitted piece is whole characters: each is itself valid when re-encoded.
    assert [p for p in pieces if p] == [c for c in text]


def test_utf8_every_split_point() -> None:
    data = "a€😀b中".encode()
    for i, j in itertools.combinations(range(len(data) + 1), 2):
        stream = Utf8Stream()
        out = stream.feed(data[:i]) + stream.feed(data[i:j]) + stream.feed(data[j:]) + stream.flush()
        assert out == data.decode("utf-8")


def test_utf8_holds_incomplete_tail() -> None:
    stream = Utf8Stream()
    assert stream.feed(b"ok\xf0\x9f") == "ok"
    assert stream.pending == b"\xf0\x9f"
    assert stream.feed(b"\x98") == ""
    assert stream.feed(bytearray(b"\x80!")) == "😀!"
    assert stream.pending == b""


def test_utf8_invalid_bytes_become_replacement_and_continue() -> None:
    stream = Utf8Stream()
    assert stream.feed(b"a\xffb") == "a\ufffdb"
    assert stream.feed(b"\xe2\x82") == ""
    assert stream.feed(b"X") == "\ufffdX"  # truncated sequence interrupted by ASCII
    assert stream.feed(b"\x80\x80") == "\ufffd\ufffd"  # lone continuation bytes
    assert stream.feed("é".encode()) == "é"
    assert stream.feed(b"\xe4\xb8") == ""
    assert stream.flush() == "\ufffd"  # dangling at the end
    assert stream.feed(b"z") == "z"  # usable again after flush


# --------------------------------------------------------------------------- stop strings


def reference_stop(text: str, stops: list[str]) -> tuple[str, bool]:
    """One-shot answer: cut at the stop string that completes first (ties: starts first)."""
    hits = [(text.find(s) + len(s), text.find(s)) for s in stops if s in text]
    if not hits:
        return text, False
    return text[: min(hits)[1]], True


def run_stream(stops: list[str], feeds: list[str]) -> tuple[str, bool]:
    matcher = StopMatcher(stops)
    out: list[str] = []
    hit = False
    for piece in feeds:
        emitted, hit = matcher.feed(piece)
        out.append(emitted)
        if hit:
            break
    if not hit:
        out.append(matcher.flush())
    return "".join(out), hit


def all_splits(text: str) -> list[list[str]]:
    splits = []
    for mask in range(1 << max(len(text) - 1, 0)):
        pieces, start = [], 0
        for i in range(1, len(text)):
            if mask >> (i - 1) & 1:
                pieces.append(text[start:i])
                start = i
        pieces.append(text[start:])
        splits.append(pieces)
    return splits


STOP_CASES = [
    ("Hi!\n\nUser: x", ["\n\nUser:"]),
    ("abababc", ["abc"]),
    ("aaab", ["aab"]),
    ("xabcdy", ["abcd", "bc"]),
    ("xabcdy", ["bcd", "abcd"]),
    ("the end.", ["ends", "endz"]),
    ("<|im_end|>z", ["<|im_end|>", "<|im"]),
    ("no stop here", ["STOP", "\n\n"]),
    ("a\nb\n\nc", ["\n\n", "\nb\nX"]),
    ("😀é😀", ["é😀", "😀😀"]),
    ("", ["x"]),
]


@pytest.mark.parametrize(("text", "stops"), STOP_CASES)
def test_stop_matcher_every_split_matches_one_shot(text: str, stops: list[str]) -> None:
    expected = reference_stop(text, stops)
    assert run_stream(stops, [text]) == expected
    for feeds in all_splits(text):
        assert run_stream(stops, feeds) == expected, feeds
    # Also with empty feeds sprinkled in.
    assert run_stream(stops, [""] + [c for ch in text for c in (ch, "")]) == expected


def test_stop_split_over_tokens() -> None:
    matcher = StopMatcher(["\n\nUser:"])
    assert matcher.feed("Sure, done.") == ("Sure, done.", False)
    assert matcher.feed("\n") == ("", False)
    assert matcher.held == "\n"
    assert matcher.feed("\nUs") == ("", False)
    assert matcher.feed("er:") == ("", True)
    assert matcher.stopped
    assert matcher.feed("more") == ("", True)
    assert matcher.flush() == ""


def test_stop_false_start_is_released() -> None:
    matcher = StopMatcher(["\n\nUser:"])
    assert matcher.feed("a\n\nUs") == ("a", False)
    assert matcher.feed("ually") == ("\n\nUsually", False)
    assert matcher.feed("\n") == ("", False)
    assert matcher.flush() == "\n"


def test_stop_holds_only_shortest_possible_prefix() -> None:
    matcher = StopMatcher(["abcab"])
    assert matcher.feed("xxabca") == ("xx", False)
    assert matcher.held == "abca"
    assert matcher.feed("x") == ("abcax", False)
    assert matcher.feed("zabcab") == ("z", True)


def test_multiple_stops_first_completed_wins() -> None:
    # "bc" completes before "abcd" does, so it wins although "abcd" starts earlier.
    assert run_stream(["abcd", "bc"], ["xa", "b", "cd"]) == ("xa", True)
    # Same end: the longer (earlier-starting) one cuts.
    assert run_stream(["cd", "abcd"], ["xab", "cd"]) == ("x", True)


def test_no_stops_passes_through() -> None:
    matcher = StopMatcher([])
    assert matcher.feed("anything") == ("anything", False)
    assert matcher.flush() == ""


def test_stop_validation() -> None:
    with pytest.raises(ValueError, match="empty"):
        StopMatcher(["ok", ""])
    with pytest.raises(TypeError):
        StopMatcher("abc")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        StopMatcher([b"x"])  # type: ignore[list-item]


def test_stop_reset() -> None:
    matcher = StopMatcher(["END"])
    assert matcher.feed("aEN") == ("a", False)
    assert matcher.feed("D") == ("", True)
    matcher.reset()
    assert not matcher.stopped
    assert matcher.feed("b") == ("b", False)


def test_stop_long_output_is_linear() -> None:
    matcher = StopMatcher(["\n\nUser:", "<|im_end|>", "###"])
    chunk = "word \n\nUs #" * 3
    start = time.monotonic()
    out = [matcher.feed(chunk)[0] for _ in range(20_000)]
    out.append(matcher.flush())
    assert "".join(out) == chunk * 20_000
    assert time.monotonic() - start < 1.0
