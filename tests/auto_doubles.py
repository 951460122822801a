"""Stand-ins for auto mode's tests: fixed cost models of a few machines, drafts that report how far
behind the text they are, and a teacher-forced decode."""

from __future__ import annotations

from app.engine.auto import (
    AutoDrafter,
)
from app.engine.drafting import Outcome, Proposal, common_prefix
from app.engine.events import Source


class SyntheticCosts:
    """A fixed cost model: verify(b) = base + slope * (b - 1); draft = draft seconds per token."""

    def __init__(self, base: float, slope: float, draft: float):
        self.base, self.slope, self.draft = base, slope, draft

    def verify(self, batch: int) -> float:
        return self.base + self.slope * (batch - 1)

    def draft_step(self) -> float:
        return self.draft

    def observe_verify(self, batch: int, seconds: float) -> None:
        pass

    def observe_draft(self, n_tokens: int, seconds: float) -> None:
        pass


GPU_LIKE = SyntheticCosts(base=0.010, slope=0.0002, draft=0.0005)  # verify is nearly free per token
CPU_LIKE = SyntheticCosts(base=0.100, slope=0.033, draft=0.050)  # batch of 4 costs 2x; draft is half
EXPENSIVE = SyntheticCosts(base=0.100, slope=0.100, draft=0.050)  # verifying b tokens costs b steps


class StaleDraft:
    """Stands in for the draft model in probe decisions: how far behind the text it is."""

    def __init__(self, pending: int):
        self.n = pending

    def pending(self, tokens) -> int:
        return self.n


class RecordingDraft(StaleDraft):
    """Records how auto mode asked the draft model to begin a reply."""

    def __init__(self):
        super().__init__(1)
        self.evaluate: list[bool] = []

    def begin(self, prompt, *, evaluate: bool = True) -> float:
        self.evaluate.append(evaluate)
        return 0.0


class MeasuredCpu(SyntheticCosts):
    """Verify costs as measured on a 2-core CPU (Qwen2.5 1.5B Q4_K_M): lumpy, 16 cheap per token."""

    def verify(self, batch: int) -> float:
        ratio = {1: 1.0, 2: 1.55, 3: 2.02, 4: 2.05, 5: 2.65, 6: 3.0, 7: 3.63, 8: 4.39, 9: 4.86, 16: 5.73}
        r = ratio.get(batch) or (4.86 + (5.73 - 4.86) * (batch - 9) / 7 if batch < 16 else 5.73)
        return 0.1 * r


class Avx512Cpu(SyntheticCosts):
    """Verify costs measured with the AVX-512 build on this 2-core CPU (Qwen2.5 1.5B Q4_K_M)."""

    RATIOS = (1, 1.55, 1.99, 1.66, 2.11, 2.68, 3.11, 3.08, 3.49, 3.95, 4.18, 4.06, 4.52, 4.67, 4.89, 4.03)

    def verify(self, batch: int) -> float:
        return 0.1 * self.RATIOS[min(batch, len(self.RATIOS)) - 1]


class SureDraft(StaleDraft):
    """A draft model stand-in that proposes ``len`` tokens, each with the given confidence."""

    name = "model"

    def __init__(self, pending: int = 1, confidence: float = 0.99):
        super().__init__(pending)
        self.confidence = confidence
        self.asked: list[int] = []

    def begin(self, prompt, *, evaluate: bool = True) -> float:
        return 0.0

    def propose(self, tokens, k, params, rng, *, keep_going=None):
        from app.engine.drafting import Proposal

        ids: list[int] = []
        for j in range(k):
            ids.append(7)
            if keep_going is not None and not keep_going(j, [self.confidence] * len(ids)):
                break
        self.asked.append(k)
        n = len(ids)
        return Proposal(
            tuple(ids), (None,) * n, (self.confidence,) * n, Source.MODEL, 0.0, n_steps=n, t_steps=0.0
        )


class EpycCpu(SyntheticCosts):
    """Verify costs measured on a 2-core AMD EPYC (Qwen2.5 1.5B Q4_K_M): one step is fast, batches dear."""

    RATIOS = (1, 1.73, 2.24, 2.9, 3.44, 3.97, 4.42, 4.88, 5.37, 5.61, 5.86, 6.1, 6.03, 5.95, 5.88, 5.8)

    def verify(self, batch: int) -> float:
        return 0.03 * self.RATIOS[min(batch, len(self.RATIOS)) - 1]


class SlowBatchCpu(SyntheticCosts):
    """Verify costs the engine measured on the AMD EPYC in one run: batches of 2-4 dearer still."""

    RATIOS = (1, 1.9, 2.67, 3.1, 3.85, 4.25, 4.74, 5.22, 5.2, 5.35, 5.5, 5.65, 5.97, 6.3, 6.62, 5.24)

    def verify(self, batch: int) -> float:
        return 0.03 * self.RATIOS[min(batch, len(self.RATIOS)) - 1]


def decode_teacher_forced(auto: AutoDrafter, prompt: list[int], reply: list[int], costs) -> list[Proposal]:
    """Run ``reply`` through auto's rounds as greedy verification would accept it; the drafts."""

    auto.begin(prompt)
    drafts, done = [], 0
    while done < len(reply):
        prop = auto.propose([*prompt, *reply[:done]], len(reply) - done, None, None)  # type: ignore[arg-type]
        n = len(prop.tokens)
        ok = common_prefix(prop.tokens, reply[done : done + n])
        t = costs.verify(n + 1)
        auto.observe(prop, Outcome(prop.source if n else "none", n, ok, n + 1, t, t))
        if n:
            drafts.append(prop)
        done += ok + 1
    return drafts


class FixedDraft:
    """A predictor that drafts ``k`` tokens every time it is asked (for choosing between sources)."""

    def __init__(self, source: Source):
        self.source = source
        self.p_min = 0.0

    def pending(self, tokens) -> int:
        return 1

    def begin(self, prompt, *, evaluate: bool = True) -> float:
        return 0.0

    def propose(self, tokens, k, params, rng, *, keep_going=None, grammar=None):
        from app.engine.drafting import Proposal

        return Proposal(tuple(range(7, 7 + k)), (None,) * k, (0.99,) * k, self.source, 0.0, 0.0, k - 1, 0.0)


class OracleDraft(StaleDraft):
    """A draft model stand-in that always drafts the reply's next tokens (teacher forced: ``reply``
    follows ``prompt``), sure of each, stopping where ``keep_going`` says."""

    name = "model"
    p_min = 0.0

    def __init__(self, prompt: list[int], reply: list[int]):
        super().__init__(1)
        self.prompt, self.reply = prompt, reply

    def begin(self, prompt, *, evaluate: bool = True) -> float:
        return 0.0

    def propose(self, tokens, k, params, rng, *, keep_going=None, grammar=None):
        at = len(tokens) - len(self.prompt)
        ids: list[int] = []
        for j, tok in enumerate(self.reply[at : at + k]):
            ids.append(tok)
            if keep_going is not None and not keep_going(j, [0.99] * len(ids)):
                break
        n = len(ids)
        return Proposal(tuple(ids), (None,) * n, (0.99,) * n, Source.MODEL, 0.0, n_steps=max(0, n - 1))
