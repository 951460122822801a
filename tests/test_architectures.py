"""Speculation on the model families people run now, over tiny real GGUFs of each architecture.

qwen35 (hybrid: Gated DeltaNet + attention), gemma3 (sliding window), qwen3moe (mixture of experts)
and mamba2 (pure recurrent), written by ``app.tiny_arch`` and loaded by the real llama.cpp. Greedy
output in every mode equals plain decoding's; sampled output follows plain sampling's law; a draft
rejected at any position of a long draft (beyond what the recurrent snapshots undo) rolls back right;
a memory that cannot undo a draft decodes plainly and says so.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from app.engine import Action, EngineClient, MemoryKind, Rollback
from app.engine import engine as engine_module
from app.engine.drafting.base import Outcome, Proposal
from app.engine.engine import Engine, GenerationSettings, LoadSettings
from app.engine.events import Finished, Source
from app.engine.llama import Context, Model
from app.engine.policy import FixedPolicy, PlainPolicy
from app.engine.sampling import SamplingParams
from app.engine.speculative import TargetCache, generate
from app.server.responses import timings
from app.tiny_arch import write_tiny_arch_pair
from app.ui.shared.wording import describe_decision

pytestmark = pytest.mark.timeout(300)

ARCHS = {
    "qwen35": (MemoryKind.HYBRID, Rollback.SNAPSHOT),
    "gemma3": (MemoryKind.SLIDING_WINDOW, Rollback.TRIM),
    "qwen3moe": (MemoryKind.ATTENTION, Rollback.TRIM),
    "mamba2": (MemoryKind.RECURRENT, Rollback.CHECKPOINT),
}
PROMPTS = (
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\n"
    "def fibonacci(n):",
    "The quick brown fox jumps over the lazy dog. The quick brown",
    "Hello world! How are you today?",
)
MODES = (
    GenerationSettings(mode="speculative", n_max=6, adaptive=False, max_tokens=48),
    GenerationSettings(mode="speculative", n_max=24, adaptive=False, max_tokens=48),  # past 16 snapshots
    GenerationSettings(mode="speculative", n_max=8, adaptive=True, max_tokens=48),
    GenerationSettings(mode="lookup", n_max=24, max_tokens=48),
    GenerationSettings(mode="auto", max_tokens=48),
    GenerationSettings(mode="auto", max_tokens=48, history_doc="doc-1"),
)


@pytest.fixture(scope="module", params=list(ARCHS))
def arch_pair(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, Path, Path]:
    arch = request.param
    target, draft = write_tiny_arch_pair(tmp_path_factory.mktemp(f"tiny-{arch}"), arch)
    return arch, target, draft


def _load(target: Path, draft: Path, history: Path | None = None) -> LoadSettings:
    return LoadSettings(
        target=str(target),
        draft=str(draft),
        n_ctx=512,
        n_threads=1,
        history_dir=str(history) if history else None,
    )


def _finish(stream) -> Finished:
    return [e for e in stream if isinstance(e, Finished)][-1]


def test_every_mode_equals_plain_decoding_through_the_engine_process(arch_pair, tmp_path) -> None:
    """Greedy output, in every mode and with the drafting history, is plain decoding's token for token;
    the engine names the memory kind and how it rolls back."""
    arch, target, draft = arch_pair
    kind, rollback = ARCHS[arch]
    client = EngineClient()
    client.start()
    try:
        info = client.load(_load(target, draft, tmp_path / "history"))
        assert (info.target.memory, info.target.rollback, info.target.architecture) == (kind, rollback, arch)
        if rollback is Rollback.SNAPSHOT:
            assert info.target.snapshots == 16
        if arch == "qwen3moe":
            assert info.target.experts > 1 and 0 < info.target.experts_used < info.target.experts
        drafted = 0
        for text in PROMPTS:
            prompt = client.tokenize(text)
            plain = _finish(client.generate(prompt=prompt, settings=replace(MODES[0], mode="plain")))
            for gs in MODES:
                for _ in range(2):  # the second time starts from what the first left in the memory
                    got = _finish(client.generate(prompt=prompt, settings=gs))
                    assert got.tokens == plain.tokens, (arch, gs.mode, gs.n_max, text)
                    drafted += got.stats.n_drafted
            again = _finish(client.generate(prompt=prompt, settings=replace(MODES[0], mode="plain")))
            assert again.tokens == plain.tokens
        assert drafted > 0
    finally:
        client.shutdown()


def test_sampled_output_follows_plain_sampling(arch_pair) -> None:
    """At temperature 1 the joint law of the first two tokens is the same with and without drafts."""
    _, target, draft = arch_pair
    with Engine(_load(target, draft)) as eng:
        prompt = eng.tokenize(PROMPTS[1])
        counts = {}
        for mode in ("plain", "speculative"):
            c: Counter = Counter()
            for i in range(300):
                sp = SamplingParams(seed=i, temperature=1.0, top_k=3)
                gs = GenerationSettings(mode=mode, sampling=sp, max_tokens=2, n_max=2, adaptive=False)
                c[eng.run(prompt, gs).tokens] += 1
            counts[mode] = c
    keys = sorted(set(counts["plain"]) | set(counts["speculative"]))
    a = np.array([counts["plain"][k] for k in keys], dtype=float)
    b = np.array([counts["speculative"][k] for k in keys], dtype=float)
    mask = (a + b) >= 10
    stat = (((a - b) ** 2) / (a + b))[mask].sum()
    dof = max(1, int(mask.sum()) - 1)
    assert stat < 3 * dof + 15, (
        f"chi2={stat:.1f} dof={dof}\nplain={counts['plain']}\nspec={counts['speculative']}"
    )


class _Scripted:
    """Drafts plain decoding's own continuation with one wrong token at ``wrong_at`` (none: -1)."""

    name = "scripted"
    wants_target_confidence = 0
    target_confidence_floor = 0.0

    def __init__(self, reply: Sequence[int], n_prompt: int, wrong_at: int, n_vocab: int):
        self.reply, self.n_prompt, self.wrong_at, self.n_vocab = list(reply), n_prompt, wrong_at, n_vocab

    def begin(self, prompt: Sequence[int]) -> float:
        return 0.0

    def propose(self, tokens, k, params, rng) -> Proposal:
        done = len(tokens) - self.n_prompt
        draft = self.reply[done : done + k]
        if 0 <= self.wrong_at < len(draft):
            draft[self.wrong_at] = (draft[self.wrong_at] + 1) % self.n_vocab
        return Proposal(tuple(draft), (None,) * len(draft), (1.0,) * len(draft), Source.LOOKUP, 0.0)

    def observe(self, proposal: Proposal, outcome: Outcome) -> None:
        pass

    def close(self) -> None:
        pass


def test_a_rejection_at_every_position_of_a_long_draft_rolls_back_right(arch_pair) -> None:
    """Drafts of 24 tokens (past the 16 a hybrid model's snapshots undo) rejected at each position in
    turn: the reply is still plain decoding's, and rollbacks past the snapshots restore a checkpoint."""
    arch, target, _ = arch_pair
    model = Model(target)
    try:
        ctx = Context(model, n_ctx=512, n_threads=1, n_rs_seq=16)
        cache = TargetCache(ctx)
        prompt = model.tokenize(PROMPTS[0], add_special=True, parse_special=False)
        greedy = SamplingParams()

        def run(drafter, policy) -> tuple[int, ...]:
            events = list(
                generate(cache, drafter, policy, prompt, greedy, piece=model.piece, is_eog=lambda t: False,
                         max_tokens=60)
            )  # fmt: skip
            return events[-1].tokens

        plain = run(None, PlainPolicy())
        long = 24
        for wrong_at in (*range(long), -1):
            cache.reset()  # a fresh memory each time (a reused prompt is tested above)
            before = replace(cache.stats)
            got = run(_Scripted(plain, len(prompt), wrong_at, model.n_vocab), FixedPolicy(long))
            assert got == plain, (arch, wrong_at)
            restored = cache.stats.restores > before.restores
            method = ARCHS[arch][1]
            if method is Rollback.CHECKPOINT and wrong_at >= 0:
                assert restored, (arch, wrong_at)  # no snapshots: every rejection restores a checkpoint
            elif method is Rollback.SNAPSHOT and wrong_at >= 0:
                # a rejection of up to 16 tokens is undone by snapshots, a longer one by a checkpoint
                assert restored == (wrong_at < long - 16), (arch, wrong_at)
            else:
                assert not restored and cache.stats.replayed == before.replayed, (arch, wrong_at)
        ctx.close()
    finally:
        model.close()


def test_a_memory_that_cannot_undo_a_draft_decodes_plainly_and_says_why(arch_pair, monkeypatch) -> None:
    """Where the target's memory can neither remove tokens nor restore a state, every mode decodes
    plainly, each round and the reply's statistics say why, and so do the API's timings and the UI."""
    _, target, draft = arch_pair
    probe = engine_module.probe_rollback
    monkeypatch.setattr(
        engine_module, "probe_rollback", lambda ctx: replace(probe(ctx), rollback=Rollback.NONE)
    )
    with Engine(_load(target, draft)) as eng:
        assert eng.info().target.rollback is Rollback.NONE
        prompt = eng.tokenize(PROMPTS[0])
        plain = eng.run(prompt, GenerationSettings(mode="plain", max_tokens=24))
        for mode in ("speculative", "lookup", "auto"):
            events = list(eng.generate(prompt, GenerationSettings(mode=mode, max_tokens=24)))
            fin = events[-1]
            assert fin.tokens == plain.tokens
            assert fin.stats.n_drafted == 0 and fin.stats.drafting_off is Action.NO_ROLLBACK
            # every round (a first token read with the prompt's batch is none)
            rounds = [e for e in events[1:-1] if e.decision.action is not Action.PROMPT]
            assert rounds and all(e.decision.action is Action.NO_ROLLBACK for e in rounds)
            assert "cannot undo" in timings(fin.stats)["drafting_off"]
            assert "cannot undo" in describe_decision(rounds[0].decision)
        assert plain.stats.drafting_off is None and "drafting_off" not in timings(plain.stats)
