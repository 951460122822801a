"""``tandem generate --compare-plain``: where a reply leaves plain decoding's text, and how close the
target's call was there."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(180)


def generate(pair, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "app", "generate", "--target", str(pair.target), "--draft", str(pair.draft)]
    cmd += ["--prompt", "def fibonacci(n):", "--max-tokens", "32", "--compare-plain", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=150)


def test_a_greedy_reply_equal_to_plain_decoding_says_so(tiny_pair) -> None:
    res = generate(tiny_pair, "--mode", "speculative", "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    cmp = out["plain_comparison"]
    assert cmp["identical"] and cmp["greedy"] and cmp["plain_tokens"] == out["tokens"]
    text = generate(tiny_pair, "--mode", "lookup")
    assert text.returncode == 0 and "[the same tokens as plain decoding]" in text.stderr


def test_a_reply_that_parts_from_plain_decoding_names_the_token_and_the_gap(tiny_pair) -> None:
    """Sampled replies part by chance: the first difference and the target's top-two gap there."""
    res = generate(tiny_pair, "--mode", "speculative", "--temperature", "1.5", "--seed", "3", "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    cmp = out["plain_comparison"]
    assert not cmp["identical"] and not cmp["greedy"]
    j = cmp["first_difference"]
    assert out["tokens"][:j] == cmp["plain_tokens"][:j]
    assert cmp["top2_gap"] >= 0 and cmp["tie"] == (cmp["top2_gap"] < 0.5)
    words = generate(tiny_pair, "--mode", "speculative", "--temperature", "1.5", "--seed", "3")
    assert f"left plain decoding's text at token {j + 1}, top-two logit gap" in words.stderr
    assert "sampled" in words.stderr
