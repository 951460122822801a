"""The speculative engine on tiny real GGUF models, through the real llama.cpp (no mocks)."""

from __future__ import annotations

import itertools
import threading
from collections import Counter

import numpy as np
import pytest

from app.engine.engine import Engine, EngineError, GenerationSettings, IncompatibleDraftError, LoadSettings
from app.engine.events import Action, Finished, Policy, Source, Started, Step
from app.engine.llama import Context, ModelLoadError
from app.engine.sampling import SamplingParams
from app.engine.speculative import PromptTooLongError

PROMPTS = [
    "def add(a, b):",
    "Hello world, this is",
    "The quick brown fox",
    "class Counter:\n    def __init__(self):",
    "for i in range(10):\n    print(i)\nfor i in range(10):\n    print(",
    "One, two, three, one, two, three, one, two,",
    "é€ 中文 😀",
    "import os\nimport sys\n\ndef main(argv=None):\n    return",
]
N_TOKENS = 40
# F32 weights: batched and single-token evaluation agree to ~1e-5; only a near-tie may flip a choice.
TIE_TOLERANCE = 1e-3


@pytest.fixture(scope="module")
def engine(tiny_pair) -> Engine:
    eng = Engine(
        LoadSettings(target=str(tiny_pair.target), draft=str(tiny_pair.draft), n_ctx=512, n_threads=2)
    )
    yield eng
    eng.close()


def settings(mode: str, **kw) -> GenerationSettings:
    return GenerationSettings(mode=mode, max_tokens=kw.pop("max_tokens", N_TOKENS), **kw)


def assert_same_or_tie(
    engine: Engine, prompt: list[int], want: tuple[int, ...], got: tuple[int, ...]
) -> bool:
    """Equal token for token, or the first difference is a numerical tie of the target. True if equal."""
    if want == got:
        return True
    i = next((j for j, (a, b) in enumerate(zip(want, got, strict=False)) if a != b), min(len(want), len(got)))
    gap = engine.top2_gap(prompt + list(want[:i]))
    assert gap < TIE_TOLERANCE, (
        f"outputs differ at token {i} but the target's top-2 logits differ by {gap:.4f}: not a tie\n"
        f"plain: {want}\nspec:  {got}"
    )
    return False


@pytest.fixture(scope="module")
def plain_outputs(engine: Engine) -> dict[str, tuple[int, ...]]:
    return {p: engine.run(engine.tokenize(p), settings("plain")).tokens for p in PROMPTS}


def test_plain_generation_produces_varied_text(engine: Engine, plain_outputs) -> None:
    outs = list(plain_outputs.values())
    assert all(len(o) > 5 for o in outs)
    assert len(set(outs)) == len(outs), "different prompts should give different continuations"


@pytest.mark.parametrize("adaptive", [False, True], ids=["fixed", "adaptive"])
def test_greedy_speculative_equals_plain(engine: Engine, plain_outputs, adaptive: bool) -> None:
    """Over many prompts and every n_max from 1 to 16: lossless, or a reported numerical tie."""
    ties = 0
    runs = 0
    acceptance = []
    for n_max, prompt in itertools.product(range(1, 17), PROMPTS):
        fin = engine.run(engine.tokenize(prompt), settings("speculative", n_max=n_max, adaptive=adaptive))
        runs += 1
        ties += not assert_same_or_tie(engine, engine.tokenize(prompt), plain_outputs[prompt], fin.tokens)
        acceptance.append(fin.stats.acceptance_rate)
    print(f"\n{runs} runs, {ties} differed at a numerical tie, mean acceptance {np.mean(acceptance):.2f}")
    assert ties <= runs // 10
    assert 0.2 < np.mean(acceptance) < 0.95, "the fixture draft should agree on some tokens, not all"


def test_greedy_speculative_equals_plain_with_penalties(engine: Engine) -> None:
    """Presence, frequency and repetition penalties look at the same window in every mode."""
    pen = SamplingParams(repeat_penalty=1.1, presence_penalty=1.5, frequency_penalty=1.0, repeat_last_n=32)
    changed = 0
    for prompt in PROMPTS:
        ids = engine.tokenize(prompt)
        plain = engine.run(ids, settings("plain", sampling=pen)).tokens
        for mode in ("speculative", "lookup", "auto"):
            got = engine.run(ids, settings(mode, sampling=pen, n_max=4)).tokens
            assert_same_or_tie(engine, ids, plain, got)
        changed += plain != engine.run(ids, settings("plain")).tokens
    assert changed, "the penalties should change some replies"


def test_greedy_lookup_equals_plain(engine: Engine, plain_outputs) -> None:
    ties, drafted = 0, 0
    for n_max, prompt in itertools.product((1, 3, 8, 16), PROMPTS):
        fin = engine.run(engine.tokenize(prompt), settings("lookup", n_max=n_max))
        ties += not assert_same_or_tie(engine, engine.tokenize(prompt), plain_outputs[prompt], fin.tokens)
        drafted += fin.stats.n_drafted
    assert drafted > 0, "prompt lookup should find n-gram matches in repetitive text"
    assert ties <= 3


def test_events_carry_statistics(engine: Engine) -> None:
    events = list(
        engine.generate(engine.tokenize(PROMPTS[0]), settings("speculative", n_max=4, adaptive=False))
    )
    assert isinstance(events[0], Started) and isinstance(events[-1], Finished)
    steps = [e for e in events if isinstance(e, Step)]
    fin = events[-1]
    assert "".join(s.text for s in steps) == fin.text
    assert sum(len(s.tokens) for s in steps) == len(fin.tokens) == fin.stats.n_generated
    for s in steps:
        assert len(s.from_draft) == len(s.tokens)
        assert s.n_accepted <= s.n_drafted <= 4
        assert sum(s.from_draft) == min(s.n_accepted, len(s.tokens))
    st = fin.stats
    # the first token comes with the prompt's batch, before the first round: no round of its own
    first, rounds = steps[0], steps[1:]
    assert first.decision.action is Action.PROMPT and len(first.tokens) == 1 and not first.n_drafted
    assert (
        first.decision.policy is Policy.FIXED
        and fin.stats.ttft_s <= fin.stats.t_prompt_s + first.t_round + 0.05
    )
    assert all(s.decision.action is not Action.PROMPT for s in rounds)
    assert st.n_drafted == sum(s.n_drafted for s in steps) and st.rounds == len(rounds)
    assert st.tokens_per_round == pytest.approx((st.n_generated - 1) / st.rounds)
    assert st.acceptance_rate == pytest.approx(st.n_accepted / st.n_drafted)
    assert sum(st.accepted_length_histogram) == st.rounds_drafted
    assert st.decode_tokens_per_second > 0 and st.ttft_s > 0 and st.prompt_tokens_per_second >= 0
    assert 0 <= st.python_share <= 1
    with pytest.raises(Exception):  # noqa: B017 -- events are frozen
        steps[0].text = "x"


def test_each_round_reports_its_decision_as_data(engine: Engine) -> None:
    prompt = engine.tokenize(PROMPTS[4])

    def decisions(mode: str, **kw) -> list[Step]:
        steps = [e for e in engine.generate(prompt, settings(mode, **kw)) if isinstance(e, Step)]
        # a first token read with the prompt's batch is no round: it has no draft, in any mode
        first = [s for s in steps if s.decision.action is Action.PROMPT]
        assert first in ([], steps[:1])
        assert all(s.n_drafted == 0 and s.k == 0 and s.drafter is Source.NONE for s in first)
        return steps[len(first) :]

    plain = decisions("plain")
    assert all(s.decision.action is Action.PLAIN and s.drafter is Source.NONE and s.k == 0 for s in plain)
    fixed = decisions("speculative", n_max=3, adaptive=False, max_tokens=12)
    for s in fixed:
        d = s.decision
        assert d.policy is Policy.FIXED and d.n_max == 3 and d.k == s.k <= 3
        assert d.capped == (d.k < 3) and (d.action is Action.DRAFT) == (d.k > 0)
    assert any(s.drafter is Source.MODEL for s in fixed)
    assert all(s.decision.source is s.drafter for s in fixed)
    adaptive = decisions("speculative", n_max=4, n_min=1, adaptive=True)
    assert all(
        s.decision.policy is Policy.ADAPTIVE and s.decision.recent_acceptance is not None for s in adaptive
    )
    auto = decisions("auto", n_max=4)
    assert all(s.decision.policy is Policy.AUTO and s.k == s.decision.k for s in auto)
    assert all(s.drafter is s.decision.source for s in auto if s.n_drafted)
    info = engine.info()
    assert info.target.n_layer > 0 and info.draft is not None and info.n_ctx == engine.n_ctx
    assert info.size_bytes == info.target.size_bytes + info.draft.size_bytes
    assert info.target.offload.layers_offloaded == 0 and info.target.offload.backend == "CPU"


def test_continuing_after_rejection_matches_fresh_evaluation(engine: Engine) -> None:
    """Trimming rejected positions leaves the KV cache as if they had never been evaluated."""
    prompt = engine.tokenize(PROMPTS[3])
    accepted = [*prompt, 40, 41]
    rejected = [7, 8, 9]
    ctx = Context(engine.target, n_ctx=256, n_threads=2)
    fresh = Context(engine.target, n_ctx=256, n_threads=2)
    try:
        ctx.decode(accepted + rejected, 0, logits="all")
        ctx.trim(len(accepted))
        ctx.decode([55, 56], len(accepted), logits="all")
        continued = np.array([ctx.logits(0), ctx.logits(1)])
        fresh.decode([*accepted, 55, 56], 0, logits="all")
        n = len(accepted) + 2
        scratch = np.array([fresh.logits(n - 2), fresh.logits(n - 1)])
        np.testing.assert_allclose(continued, scratch, atol=1e-4, rtol=1e-4)
    finally:
        ctx.close()
        fresh.close()


def test_prefix_reuse_and_rollback_keep_outputs_identical(engine: Engine, plain_outputs) -> None:
    """A second request sharing a prefix reuses the cache and still gives the same reply."""
    p = PROMPTS[1]
    first = engine.run(engine.tokenize(p), settings("speculative"))
    again = engine.run(engine.tokenize(p), settings("speculative"))
    assert again.stats.n_prompt_cached == len(engine.tokenize(p)) - 1
    assert first.tokens == again.tokens


def test_cancel_mid_generation_then_generate_again(engine: Engine, plain_outputs) -> None:
    cancel = threading.Event()
    prompt = engine.tokenize(PROMPTS[0])
    steps = 0
    fin = None
    for ev in engine.generate(prompt, settings("speculative", max_tokens=200), cancel=cancel):
        if isinstance(ev, Step):
            steps += 1
            if steps == 3:
                cancel.set()
        if isinstance(ev, Finished):
            fin = ev
    assert fin is not None and fin.reason == "cancelled"
    assert fin.stats.rounds == 2  # took effect before the next round (the first token came with the prompt)
    # an abandoned stream also leaves the engine usable
    gen = engine.generate(engine.tokenize(PROMPTS[2]), settings("speculative", max_tokens=200))
    next(gen), next(gen)
    gen.close()
    after = engine.run(engine.tokenize(PROMPTS[0]), settings("speculative"))
    assert_same_or_tie(engine, prompt, plain_outputs[PROMPTS[0]], after.tokens)


def test_chat_prompt_uses_template_and_stops_at_end_of_turn(engine: Engine) -> None:
    msgs = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Again"},
    ]
    ids = engine.chat_prompt(msgs)
    text = engine.target.detokenize(ids, special=True).decode()
    assert text.startswith("<|im_start|>system\nYou are terse.<|im_end|>\n")
    assert text.endswith("<|im_start|>user\nAgain<|im_end|>\n<|im_start|>assistant\n")
    im_start = engine.target.tokenize("<|im_start|>", add_special=False, parse_special=True)
    assert len(im_start) == 1 and ids.count(im_start[0]) == 5
    fin = engine.run(ids, settings("speculative", max_tokens=60))
    assert fin.reason in ("eog", "length")


def test_stop_strings_and_max_tokens(engine: Engine, plain_outputs) -> None:
    prompt = PROMPTS[4]
    full = engine.detokenize(list(plain_outputs[prompt]))
    stop = full[5:8]
    fin = engine.run(engine.tokenize(prompt), settings("speculative", stop=(stop,)))
    assert fin.reason == "stop" and stop not in fin.text and full.startswith(fin.text)
    assert full.find(stop) == len(fin.text)
    short = engine.run(engine.tokenize(prompt), settings("speculative", max_tokens=3))
    assert short.reason == "length" and len(short.tokens) == 3


def test_sampling_is_seeded_and_valid_utf8(engine: Engine) -> None:
    s = settings("speculative", sampling=SamplingParams(temperature=0.9, top_p=0.95, seed=42), max_tokens=30)
    a = engine.run(engine.tokenize(PROMPTS[6]), s)
    b = engine.run(engine.tokenize(PROMPTS[6]), s)
    assert a.tokens == b.tokens and a.text == b.text
    # streamed pieces decode exactly as the whole byte string does (random tiny models emit stray bytes)
    assert a.text == engine.target.detokenize(a.tokens).decode("utf-8", errors="replace")


def test_speculative_sampling_matches_plain_sampling_distribution(engine: Engine) -> None:
    """End to end at temperature > 0: the joint law of the first two tokens is the same."""
    prompt = engine.tokenize(PROMPTS[5])
    prm = dict(temperature=1.0, top_k=3)
    n = 500
    counts = {}
    for mode in ("plain", "speculative"):
        c: Counter = Counter()
        for i in range(n):
            s = settings(mode, sampling=SamplingParams(seed=i, **prm), max_tokens=2, n_max=2, adaptive=False)
            c[engine.run(prompt, s).tokens] += 1
        counts[mode] = c
    keys = sorted(set(counts["plain"]) | set(counts["speculative"]))
    a = np.array([counts["plain"][k] for k in keys], dtype=float)
    b = np.array([counts["speculative"][k] for k in keys], dtype=float)
    # two-sample chi-square over the cells with enough mass
    mask = (a + b) >= 10
    stat = (((a - b) ** 2) / (a + b))[mask].sum()
    dof = int(mask.sum()) - 1
    assert stat < 3 * dof + 15, (
        f"chi2={stat:.1f} dof={dof}\nplain={counts['plain']}\nspec={counts['speculative']}"
    )


def test_prompt_longer_than_context_is_a_clear_error(engine: Engine) -> None:
    long_prompt = engine.tokenize("word " * 2000)
    with pytest.raises(PromptTooLongError, match="context"):
        engine.run(long_prompt, settings("speculative"))
    assert engine.run(engine.tokenize(PROMPTS[0]), settings("speculative")).tokens  # still usable


def test_generation_stops_at_a_full_context(tiny_pair) -> None:
    with Engine(LoadSettings(target=str(tiny_pair.target), draft=str(tiny_pair.draft), n_ctx=64)) as eng:
        prompt = eng.tokenize(PROMPTS[3])
        fin = eng.run(prompt, settings("speculative", max_tokens=500, n_max=8))
        assert fin.reason in ("context", "eog")
        # llama.cpp rounds the context size up (to 256 here); the reply fills what is left, no more
        assert len(prompt) + len(fin.tokens) <= eng.n_ctx + 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n_max": 0}, "n_max"),
        ({"n_max": -3}, "n_max"),
        ({"mode": "turbo"}, "unknown mode"),
        ({"n_min": 5, "n_max": 2}, "n_min"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"stop": ("",)}, "stop"),
    ],
)
def test_bad_generation_settings(kwargs: dict, message: str) -> None:
    with pytest.raises(EngineError, match=message):
        GenerationSettings(**kwargs)


def test_speculative_mode_without_draft_is_refused(tiny_pair) -> None:
    with Engine(LoadSettings(target=str(tiny_pair.target), n_ctx=128)) as eng:
        with pytest.raises(EngineError, match="draft model"):
            eng.run(eng.tokenize("hi"), settings("speculative"))
        assert eng.run(eng.tokenize("hi"), settings("lookup")).tokens


def test_incompatible_pair_is_refused_before_loading(tiny_pair, tiny_incompatible_draft) -> None:
    with pytest.raises(IncompatibleDraftError, match="token"):
        Engine(LoadSettings(target=str(tiny_pair.target), draft=str(tiny_incompatible_draft)))


def test_bad_model_files(tmp_path, tiny_pair) -> None:
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    text = tmp_path / "notes.gguf"
    text.write_text("this is not a model\n")
    data = tiny_pair.target.read_bytes()
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(data[: len(data) // 2])
    header_only = tmp_path / "header.gguf"
    header_only.write_bytes(data[:30])
    cases = [
        (tmp_path / "missing.gguf", "not found"),
        (empty, "empty"),
        (text, "not a GGUF"),
        (truncated, "could not load"),
        (header_only, "could not load"),
    ]
    for path, message in cases:
        with pytest.raises(ModelLoadError, match=message):
            Engine(LoadSettings(target=str(path)))
        # as a draft, the file is refused before the compatibility check or any loading
        with pytest.raises(ModelLoadError, match=message if message != "could not load" else "truncated"):
            Engine(LoadSettings(target=str(tiny_pair.target), draft=str(path)))


def test_greedy_speculative_equals_plain_with_quantized_weights(tmp_path) -> None:
    """Q4_0 weights take llama.cpp's quantized kernels (batched and single-token paths differ)."""
    from app.tiny_gguf import write_tiny_pair

    target, draft = write_tiny_pair(tmp_path, quant="Q4_0", noise=0.01)
    with Engine(LoadSettings(target=str(target), draft=str(draft), n_ctx=512, n_threads=2)) as eng:
        ties = runs = 0
        for n_max, prompt in itertools.product((1, 2, 4, 8, 16), PROMPTS):
            ids = eng.tokenize(prompt)
            plain = eng.run(ids, settings("plain"))
            spec = eng.run(ids, settings("speculative", n_max=n_max, adaptive=False))
            ties += not assert_same_or_tie(eng, ids, plain.tokens, spec.tokens)
            runs += 1
        print(f"\nQ4_0: {runs} runs, {ties} differed at a numerical tie")
        assert ties <= runs // 10
