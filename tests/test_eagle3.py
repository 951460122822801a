"""EAGLE-3 drafting: a tiny EAGLE-3 head for the tiny llama target, both loaded by the real llama.cpp."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import NamedTuple

import pytest
from sampled_law import assert_same_first_tokens_law, assert_stays_in_step

from app.engine.engine import Engine
from app.engine.errors import IncompatibleDraftError
from app.engine.events import Source, Step
from app.engine.llama_mtp import EAGLE3_CALLS
from app.engine.settings import GenerationSettings, LoadSettings
from app.gguf import compat
from app.gguf.drafts import DraftKind, draft_facts
from app.gguf.meta import read_metadata_file
from app.tiny_eagle3 import write_tiny_eagle3
from app.tiny_gguf import write_tiny_llama

PROMPTS = (
    "Once upon a time there was a cat who",
    "def fib(n):\n    return",
    "The list of colours: red, green, blue, red, green,",
)


class HeadPair(NamedTuple):
    target: Path
    head: Path


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> HeadPair:
    d = tmp_path_factory.mktemp("eagle3")
    return HeadPair(
        write_tiny_llama(d / "tiny-target.gguf", name="tiny-target"), write_tiny_eagle3(d / "head.gguf")
    )


@pytest.fixture(scope="module")
def engine(pair: HeadPair):
    with Engine(LoadSettings(target=str(pair.target), draft=str(pair.head), n_ctx=1024, n_threads=1)) as eng:
        yield eng


def _settings(mode: str, **kw) -> GenerationSettings:
    return GenerationSettings(mode=mode, max_tokens=kw.pop("max_tokens", 40), **kw)


def test_the_calls_eagle3_drafting_binds_itself_exist() -> None:
    """llama-cpp-python does not bind these; an upgrade of llama.cpp that drops one fails here."""
    assert all(f is not None for f in EAGLE3_CALLS.values()), [
        k for k, f in EAGLE3_CALLS.items() if f is None
    ]


def test_check_knows_the_head_and_that_it_fits(pair: HeadPair) -> None:
    facts = draft_facts(read_metadata_file(pair.head))
    assert facts.kind is DraftKind.EAGLE3 and facts.target_layers == (0, 1, 1) and facts.target_width == 64
    verdict = compat.check_files(pair.target, pair.head)
    assert verdict.ok and "EAGLE-3 head" in verdict.reason


def test_a_head_made_for_another_target_is_refused_with_the_reason(pair: HeadPair, tmp_path: Path) -> None:
    other = write_tiny_eagle3(tmp_path / "other.gguf", target_width=32, n_embd=64)
    with pytest.raises(IncompatibleDraftError, match="trained for a target of width 32, not 64"):
        Engine(LoadSettings(target=str(pair.target), draft=str(other), n_ctx=256, n_threads=1))
    deep = write_tiny_eagle3(tmp_path / "deep.gguf", target_layers=(0, 1, 7))
    with pytest.raises(IncompatibleDraftError, match="reads layer 7, the target has 2 layers"):
        Engine(LoadSettings(target=str(pair.target), draft=str(deep), n_ctx=256, n_threads=1))


def test_greedy_output_with_the_head_equals_plain_in_every_mode(engine: Engine) -> None:
    drafted = accepted = 0
    sources: Counter = Counter()
    for text in PROMPTS:
        prompt = engine.tokenize(text)
        plain = engine.run(prompt, _settings("plain"))
        for mode, kw in (
            ("speculative", {"n_max": 1, "adaptive": False}),
            ("speculative", {"n_max": 4, "adaptive": False}),
            ("speculative", {"n_max": 8}),
            ("auto", {}),
        ):
            events = list(engine.generate(prompt, _settings(mode, **kw)))
            fin = events[-1]
            assert fin.tokens == plain.tokens, (text, mode, kw)
            drafted += fin.stats.n_drafted
            accepted += fin.stats.n_accepted
            sources.update(e.drafter for e in events if isinstance(e, Step) and e.n_drafted)
    # the random head drafts tokens the tiny target does not write (its rejections, rollbacks and
    # catch-ups are what this exercises; accepted pairs go through the same bookkeeping as the MTP
    # head's, whose tests accept drafts)
    assert drafted > 0 and accepted <= drafted
    assert sources[Source.EAGLE3] > 0 and Source.MODEL not in sources  # the head drafted, said as data


def test_sampled_output_with_the_head_follows_plain_sampling(engine: Engine) -> None:
    """At temperature 1 the joint law of the first three tokens is the same with and without the head
    (its draft is a draw from its own distribution, which verification gets: exact rejection sampling)."""
    assert_same_first_tokens_law(engine, engine.tokenize(PROMPTS[2]), "speculative")


def test_the_head_stays_in_step_across_rejections_cancels_and_new_requests(pair: HeadPair) -> None:
    """After replies with rejections, a cancelled reply and a regenerated one, the head drafts a new
    turn exactly as a freshly loaded engine does: its memory held only confirmed pairs."""
    load = LoadSettings(target=str(pair.target), draft=str(pair.head), n_ctx=1024, n_threads=1)
    assert_stays_in_step(load, _settings("speculative", max_tokens=32, n_max=4, adaptive=False), PROMPTS)
