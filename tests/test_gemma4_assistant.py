"""Gemma 4's assistant as a draft: a tiny Gemma 4 and its assistant, both loaded by the real llama.cpp.

The assistant's weights are random, so its drafts are almost always rejected: these tests exercise the
rejections and the bookkeeping (and the losslessness), not the acceptance, which needs a trained one."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
from sampled_law import assert_same_first_tokens_law, assert_stays_in_step

from app.engine.engine import Engine
from app.engine.errors import IncompatibleDraftError
from app.engine.events import Source, Step
from app.engine.llama import Context, Model
from app.engine.llama_mtp import SYMBOLS, AssistantContext
from app.engine.settings import GenerationSettings, LoadSettings
from app.gguf import compat
from app.gguf.drafts import DraftKind, draft_facts
from app.gguf.meta import read_metadata_file
from app.tiny_gemma4 import write_tiny_gemma4, write_tiny_gemma4_assistant
from app.tiny_gguf import write_tiny_llama

PROMPTS = (
    "Once upon a time there was a cat who",
    "def fib(n):\n    return",
    "The list of colours: red, green, blue, red, green,",
)


class AssistantPair(NamedTuple):
    target: Path
    assistant: Path


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> AssistantPair:
    d = tmp_path_factory.mktemp("gemma4")
    return AssistantPair(
        write_tiny_gemma4(d / "tiny-gemma4.gguf"), write_tiny_gemma4_assistant(d / "asst.gguf")
    )


def _load(pair: AssistantPair, n_ctx: int = 1024) -> LoadSettings:
    return LoadSettings(target=str(pair.target), draft=str(pair.assistant), n_ctx=n_ctx, n_threads=1)


@pytest.fixture(scope="module")
def engine(pair: AssistantPair):
    with Engine(_load(pair)) as eng:
        yield eng


def _settings(mode: str, **kw) -> GenerationSettings:
    return GenerationSettings(mode=mode, max_tokens=kw.pop("max_tokens", 40), **kw)


def test_the_context_binding_it_needs_is_bound() -> None:
    assert "llama_get_ctx_other" in SYMBOLS["llama_cpp_ext"]


def test_the_assistant_attends_over_the_targets_cache_and_writes_nothing(pair: AssistantPair) -> None:
    """The same (token, hidden state) at the same position drafts differently over another text in the
    target's cache, and the same again over the same text: the assistant reads the target's cells and
    leaves them as they were."""
    target = Model(pair.target)
    ctx = Context(target, n_ctx=256, n_batch=64, n_threads=1)
    assistant = Model(pair.assistant)
    head = AssistantContext(ctx, assistant, n_batch=64, n_threads=1)
    try:
        a = target.tokenize(PROMPTS[0], add_special=True, parse_special=False)
        b = target.tokenize(PROMPTS[2], add_special=True, parse_special=False)[: len(a) - 1] + a[-1:]
        n, h = len(a), np.zeros((1, head.n_embd), dtype=np.float32)
        assert len(b) == n and b != a

        def draft_logits(text: list[int]) -> np.ndarray:
            ctx.trim(0)
            ctx.decode(text[:-1], 0)
            head.decode([text[-1]], n - 1, h)
            first = head.logits().copy()
            head.decode([text[-1]], n - 1, h)  # the same position again: nothing was written
            assert ctx.n_cached() == n - 1 and np.array_equal(head.logits(), first)
            return first

        over_a = draft_logits(a)
        assert not np.allclose(draft_logits(b), over_a)
        assert np.array_equal(draft_logits(a), over_a)
        head.clear()  # a no-op: clearing the shared cells would empty the target's cache
        assert ctx.n_cached() == n - 1
    finally:
        head.close()
        ctx.close()
        assistant.close()
        target.close()


def test_check_knows_the_assistant_and_that_it_fits(pair: AssistantPair) -> None:
    facts = draft_facts(read_metadata_file(pair.assistant))
    assert facts.kind is DraftKind.GEMMA4_ASSISTANT and facts.target_width == 64
    verdict = compat.check_files(pair.target, pair.assistant)
    assert verdict.ok and "Gemma 4 assistant" in verdict.reason and "fits this target" in verdict.reason
    res = subprocess.run(
        [sys.executable, "-m", "app", "check", str(pair.target), str(pair.assistant)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0 and "a Gemma 4 assistant for a Gemma 4 of width 64" in res.stdout, res.stdout
    drafting = next(line for line in res.stdout.splitlines() if "drafting" in line)
    assert "Gemma 4 assistant" in drafting and "draft model" not in drafting, res.stdout


def test_an_assistant_for_another_target_is_refused_with_the_reason(
    pair: AssistantPair, tmp_path: Path
) -> None:
    other = write_tiny_gemma4_assistant(tmp_path / "other.gguf", target_width=96)
    assert not compat.check_files(pair.target, other).ok
    with pytest.raises(IncompatibleDraftError, match="made for a Gemma 4 of width 96, this one's is 64"):
        Engine(LoadSettings(target=str(pair.target), draft=str(other), n_ctx=256, n_threads=1))
    llama = write_tiny_llama(tmp_path / "llama.gguf")
    with pytest.raises(IncompatibleDraftError, match="drafts for a Gemma 4"):
        Engine(LoadSettings(target=str(llama), draft=str(pair.assistant), n_ctx=256, n_threads=1))


def test_greedy_output_with_the_assistant_equals_plain_in_every_mode(engine: Engine) -> None:
    drafted = accepted = 0
    sources: Counter = Counter()
    for text in PROMPTS:
        prompt = engine.tokenize(text)
        plain = engine.run(prompt, _settings("plain"))
        for mode, kw in (
            ("speculative", {"n_max": 1, "adaptive": False}),
            ("speculative", {"n_max": 4, "adaptive": False}),
            ("speculative", {"n_max": 8, "adaptive": False}),
            ("auto", {}),
        ):
            events = list(engine.generate(prompt, _settings(mode, **kw)))
            fin = events[-1]
            assert fin.tokens == plain.tokens, (text, mode, kw)
            drafted += fin.stats.n_drafted
            accepted += fin.stats.n_accepted
            sources.update(e.drafter for e in events if isinstance(e, Step) and e.n_drafted)
    # the random assistant drafts tokens the tiny target does not write: rejections at every position
    assert drafted > 0 and accepted <= drafted
    assert sources[Source.ASSISTANT] > 0 and Source.MODEL not in sources  # it drafted, said as data


def test_an_assistant_over_a_target_whose_last_layers_share_their_kv(tmp_path: Path) -> None:
    """Gemma 4 E2B/E4B's last layers reuse earlier layers' KV cache; the assistant then reads those
    (llama.cpp maps them): greedy output still equals plain, and the assistant drafts."""
    target = write_tiny_gemma4(tmp_path / "shared-kv.gguf", n_layer=6, shared_kv_layers=2)
    assistant = write_tiny_gemma4_assistant(tmp_path / "a.gguf")
    with Engine(LoadSettings(target=str(target), draft=str(assistant), n_ctx=512, n_threads=1)) as eng:
        prompt = eng.tokenize(PROMPTS[1])
        plain = eng.run(prompt, _settings("plain"))
        fin = eng.run(prompt, _settings("speculative", n_max=4, adaptive=False))
        assert fin.tokens == plain.tokens and fin.stats.n_drafted > 0


def test_sampled_output_with_the_assistant_follows_plain_sampling(engine: Engine) -> None:
    """At temperature 1 the joint law of the first three tokens is the same with and without the
    assistant (its draft is a draw from its own distribution, which verification gets)."""
    assert_same_first_tokens_law(engine, engine.tokenize(PROMPTS[2]), "speculative")


def test_the_assistant_stays_in_step_across_rejections_cancels_and_new_requests(pair: AssistantPair) -> None:
    """After replies with rejections, a cancelled reply and a regenerated one, the assistant drafts a
    new turn exactly as a freshly loaded engine does: it read only the accepted text of the target's
    cache, and wrote nothing there."""
    assert_stays_in_step(
        _load(pair), _settings("speculative", max_tokens=32, n_max=4, adaptive=False), PROMPTS
    )


def test_the_engine_reports_the_assistant_as_its_draft(pair: AssistantPair) -> None:
    """The app and the server read a loaded draft from the engine's info: a head is one."""
    with Engine(
        LoadSettings(target=str(pair.target), draft=str(pair.assistant), n_ctx=256, n_threads=1)
    ) as eng:
        info = eng.info()
    assert info.draft is not None and info.draft.architecture == "gemma4-assistant"
    assert info.size_bytes == info.target.size_bytes + info.draft.size_bytes
