"""Queuing a plain round's evaluation before the round is planned (app.engine.overlap), on tiny real
models through the real llama.cpp. On a CPU nothing is gained (llama_decode returns when it is done),
but every path is the one a GPU takes: a queued token read, a queued token wasted by a draft, a reply
that ends, is cancelled or stops at a stop string with a token queued."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pytest

from app.engine.auto import AutoDrafter
from app.engine.drafting import LookupDrafter, ModelDrafter
from app.engine.events import Finished, Step
from app.engine.llama import Context, Model
from app.engine.overlap import Overlap
from app.engine.policy import FixedPolicy, PassPolicy, PlainPolicy
from app.engine.sampling import SamplingParams
from app.engine.speculative import TargetCache, generate

PROMPTS = ["def add(a, b):", "One, two, three, one, two, three, one, two,", "The quick brown fox"]
TIE = 1e-3  # F32 weights: a batch and a single token agree to ~1e-5; only a near-tie may flip a choice


@pytest.fixture(scope="module")
def pair(tiny_pair) -> Iterator[tuple[Model, TargetCache, ModelDrafter]]:
    target, draft = Model(tiny_pair.target), Model(tiny_pair.draft)
    cache = TargetCache(Context(target, n_ctx=512, n_threads=2))
    drafter = ModelDrafter(Context(draft, n_ctx=512, n_threads=2))
    yield target, cache, drafter
    cache.ctx.close()
    drafter.ctx.close()
    draft.close()
    target.close()


def run(pair, mode: str, prompt: list[int], overlap: Overlap | None, **kw) -> Finished:
    target, cache, model = pair
    drafter, policy = {
        "plain": (None, PlainPolicy()),
        "lookup": (LookupDrafter(), FixedPolicy(8)),
        "speculative": (model, FixedPolicy(3)),
        "auto": (AutoDrafter(model, LookupDrafter(), n_max=4), PassPolicy()),
    }[mode]
    events = generate(
        cache,
        drafter,
        policy,
        prompt,
        SamplingParams(**kw.pop("sampling", {})),
        piece=target.piece,
        is_eog=target.is_eog,
        max_tokens=kw.pop("max_tokens", 40),
        overlap=overlap,
        **kw,
    )
    fin = [e for e in events if isinstance(e, Finished)]
    return fin[0]


def top2_gap(pair, context: list[int]) -> float:
    _, cache, _ = pair
    cache.sync(context, logits="last", last_again=True)
    row = np.sort(cache.ctx.logits(0))
    return float(row[-1] - row[-2])


def same_or_tie(pair, prompt: list[int], want: tuple[int, ...], got: tuple[int, ...]) -> None:
    if want == got:
        return
    i = next((j for j, (a, b) in enumerate(zip(want, got, strict=False)) if a != b), min(len(want), len(got)))
    assert top2_gap(pair, prompt + list(want[:i])) < TIE, f"differ at token {i}, not a tie: {want} / {got}"


def holds_reply(pair, prompt: list[int], fin: Finished) -> None:
    """The target's memory holds the prompt and the reply but its last token, as without queuing."""
    _, cache, _ = pair
    text = [*prompt, *fin.tokens]
    assert cache.tokens == text[: len(cache.tokens)]
    assert len(cache.tokens) >= len(text) - 2  # (an end-of-turn token is not among fin.tokens)


@pytest.mark.parametrize("mode", ["plain", "lookup", "speculative", "auto"])
def test_queued_rounds_write_what_plain_decoding_writes(pair, mode: str) -> None:
    target = pair[0]
    for text in PROMPTS:
        prompt = target.tokenize(text, add_special=True, parse_special=False)
        plain = run(pair, "plain", prompt, None)
        fin = run(pair, mode, prompt, Overlap(always=True))
        same_or_tie(pair, prompt, plain.tokens, fin.tokens)
        holds_reply(pair, prompt, fin)
        assert fin.stats.n_queued >= fin.stats.rounds - 1  # every round that went on queued the next
        if mode == "plain":
            assert fin.stats.n_wasted == 0
        if mode == "speculative":  # every round drafts (but one near the end, with no room): wasted
            assert fin.stats.n_queued - 1 <= fin.stats.n_wasted <= fin.stats.n_queued


def test_sampling_with_queued_rounds_is_the_same_draw(pair) -> None:
    """At a temperature the same seed draws the same reply: queuing changes when, not what."""
    prompt = pair[0].tokenize(PROMPTS[2], add_special=True, parse_special=False)
    sampling = {"temperature": 0.9, "top_p": 0.95, "seed": 7}
    a = run(pair, "plain", prompt, None, sampling=sampling)
    b = run(pair, "plain", prompt, Overlap(always=True), sampling=sampling)
    same_or_tie(pair, prompt, a.tokens, b.tokens)


@pytest.mark.parametrize("end", ["cancel", "stop", "length"])
def test_a_reply_that_ends_with_a_token_queued_leaves_the_memory_exact(pair, end: str) -> None:
    target = pair[0]
    prompt = target.tokenize(PROMPTS[1], add_special=True, parse_special=False)
    plain = run(pair, "plain", prompt, None, max_tokens=30)
    text = target.detokenize(list(plain.tokens)).decode(errors="replace")
    steps = 0

    def cancel() -> bool:
        return end == "cancel" and steps >= 4

    kw: dict = {"max_tokens": 30 if end != "length" else 5}
    if end == "stop":
        kw["stop"] = (text[8:11],)
    _, cache, _ = pair
    events = generate(
        cache, None, PlainPolicy(), prompt, SamplingParams(), piece=target.piece, is_eog=target.is_eog,
        overlap=Overlap(always=True), cancel=cancel, **kw,
    )  # fmt: skip
    for ev in events:
        if isinstance(ev, Step):
            steps += 1
        if isinstance(ev, Finished):
            fin = ev
    assert fin.reason == {"cancel": "cancelled", "stop": "stop", "length": "length"}[end]
    assert len(cache.tokens) == len(prompt) + len(fin.tokens) - 1 if end != "stop" else True
    assert cache.tokens == [*prompt, *fin.tokens][: len(cache.tokens)]
    again = run(pair, "plain", prompt, None, max_tokens=30)  # the memory it left is exact
    same_or_tie(pair, prompt, plain.tokens, again.tokens)


class ConfidenceLookup(LookupDrafter):
    """Prompt lookup that asks for the target's confidence in each round's last tokens, as auto mode
    does, and records what the loop reports."""

    wants_target_confidence = 3
    target_confidence_floor = 0.0

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[float, ...]] = []

    def observe(self, proposal, outcome) -> None:  # type: ignore[no-untyped-def]
        self.seen.append(outcome.confidence)
        super().observe(proposal, outcome)


def test_a_queued_round_reports_the_same_confidence_of_the_target(pair) -> None:
    """Where the next token is queued, the target's confidence is read from a copy of its rows after
    the queue (the GPU evaluates while the softmax runs): the drafter is told what it is told
    without queuing, round for round."""
    target, cache, _ = pair
    prompt = target.tokenize(PROMPTS[1], add_special=True, parse_special=False)
    seen = []
    for overlap in (None, Overlap(always=True)):
        drafter = ConfidenceLookup()
        *_, fin = generate(
            cache, drafter, FixedPolicy(8), prompt, SamplingParams(), piece=target.piece,
            is_eog=target.is_eog, max_tokens=40, overlap=overlap,
        )  # fmt: skip
        assert isinstance(fin, Finished)
        seen.append((fin.tokens, drafter.seen, fin.stats.n_queued))
    (tokens, plain, _), (queued_tokens, queued, n_queued) = seen
    assert n_queued > 0 and queued_tokens == tokens
    assert [len(c) for c in queued] == [len(c) for c in plain]
    for a, b in zip(plain, queued, strict=True):
        assert b == pytest.approx(a, abs=1e-5)
        assert all(0.0 < x <= 1.0 for x in a)


def odds(overlap: Overlap, drafted: Callable[[int], bool], n: int) -> None:
    last = None
    for i in range(n):
        overlap.observe(last, drafted(i))
        last = drafted(i)


def test_it_queues_where_the_hidden_time_outweighs_the_wasted_steps() -> None:
    """(1 - p) * gap > p * step, p how often a round drafts after one like the last."""
    plain = Overlap()
    assert plain.should_queue(False, drafts=False)  # no drafter: every round is plain
    o = Overlap()
    assert not o.should_queue(False, drafts=True)  # nothing measured yet
    o.gap.add(0.0004)
    o.step.add(0.004)  # a GPU's 4 ms step, 0.4 ms of Python between batches: worth it below p = 1/11
    odds(o, lambda i: False, 40)  # a draft that never drafts: p = 1/34 after 32 rounds
    assert o.drafting_odds(False) == pytest.approx(1 / 34)
    assert o.should_queue(False, drafts=True)
    odds(o, lambda i: i % 4 == 0, 64)  # copies in a quarter of the rounds: p about 1/4
    assert not o.should_queue(False, drafts=True)
    assert o.should_queue(True, drafts=True)  # but a copy is never followed by another here
    o.gap.clear()
    o.gap.add(0.1)  # a CPU step the Python equals: p below 1/2 pays
    o.step.clear()
    o.step.add(0.1)
    assert o.should_queue(False, drafts=True)
