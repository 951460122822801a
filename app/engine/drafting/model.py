"""The draft-model drafter: a small model that shares the target's vocabulary, in its own context.

Its memory stays in sync with the accepted text by decoding only the tokens it has not seen yet (on a
recurrent or hybrid draft, a checkpoint taken before drafting undoes the rejected tokens).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from app.engine.drafting.base import EMPTY, Outcome, Proposal, common_prefix, draft_token
from app.engine.events import Source
from app.engine.sampling import SamplingParams
from app.engine.sequence import PROMPT, CachedSequence

if TYPE_CHECKING:
    from app.engine.grammar import Grammar
    from app.engine.llama import Context


class ModelDrafter:
    """Drafts with a small model that shares the target's vocabulary."""

    name = "model"
    wants_target_confidence = 0
    target_confidence_floor = 0.0

    def __init__(self, ctx: Context, *, p_min: float = 0.0):
        self.ctx = ctx
        self.p_min = p_min
        self.seq = CachedSequence(ctx)  # the tokens the draft's memory holds, in order
        self._stable = 0  # a prefix length known to agree with the caller's tokens

    def begin(self, prompt: Sequence[int], *, evaluate: bool = True) -> float:
        """Reuse the held common prefix; evaluate the rest now or (``evaluate=False``) lazily."""
        t0 = time.perf_counter()
        if evaluate and len(prompt) > 1:
            # all but the last prompt token now, so the first round only decodes one token
            reused = self.seq.sync(prompt[:-1])
            if not self.seq.can_trim_any and len(self.seq.tokens) > reused:
                self.seq.checkpoint(PROMPT)  # where the next request starts again
            self._stable = len(self.seq.tokens)
        else:
            keep = common_prefix(self.seq.tokens, prompt)
            self._stable = self.seq.truncate(keep)
        return time.perf_counter() - t0

    def pending(self, tokens: Sequence[int]) -> int:
        """How many of ``tokens`` the draft would have to evaluate before drafting (at least 1).

        Draft tokens the target accepted are already in the draft's memory and do not count (but a
        memory that cannot remove the rejected ones evaluates the accepted ones again).
        """
        held = self.seq.tokens
        keep = common_prefix(held, tokens, min(self._stable, len(held)))
        return max(1, len(tokens) - self.seq.would_hold(min(keep, len(tokens) - 1)))

    def _sync(self, tokens: Sequence[int]) -> float:
        """Bring the draft's memory to ``tokens`` (evaluating only what it lacks); leaves logits for
        the last token."""
        t0 = time.perf_counter()
        self.seq.sync(tokens, logits="last", last_again=True, agree=self._stable)
        self._stable = len(tokens)
        return time.perf_counter() - t0

    def propose(
        self,
        tokens: Sequence[int],
        k: int,
        params: SamplingParams,
        rng: np.random.Generator,
        *,
        keep_going: Callable[[int, Sequence[float]], bool] | None = None,
        grammar: Grammar | None = None,
    ) -> Proposal:
        """Draft up to ``k`` tokens; stop early under ``p_min`` or when ``keep_going(j, conf)`` says so.

        With a ``grammar``, the draft's distribution is masked by it as the target's is (in a copy of
        its state that walks ahead with the draft), so the draft holds to it; drafting stops where it
        is complete."""
        if k <= 0:
            return EMPTY
        t0 = time.perf_counter()
        n_sync = self.pending(tokens)
        t_llama = self._sync(tokens)
        t_sync = t_llama
        t_steps, n_steps = 0.0, 0
        ids: list[int] = []
        qs: list[np.ndarray | None] = []
        conf: list[float] = []
        history = list(tokens)
        walk = grammar.fork() if grammar is not None else None
        for j in range(k):
            drawn = draft_token(self.ctx.logits(-1), history, params, rng, walk, self.p_min)
            if drawn is None:
                break
            tok, q, c = drawn
            ids.append(tok)
            qs.append(q)
            conf.append(c)
            history.append(tok)
            if walk is not None and (not walk.advance(tok) or walk.done):
                break
            if j == k - 1 or (keep_going is not None and not keep_going(j, conf)):
                break
            t1 = time.perf_counter()
            if j == 0 and not self.seq.can_trim_any:
                self.seq.checkpoint()  # the rejected draft tokens are undone by restoring it
            self.seq.extend([tok], logits="last")
            dt = time.perf_counter() - t1
            t_llama += dt
            t_steps += dt
            n_steps += 1
        return Proposal(
            tuple(ids),
            tuple(qs),
            tuple(conf),
            Source.MODEL,
            time.perf_counter() - t0,
            t_llama,
            n_steps,
            t_steps,
            n_sync=n_sync,
            t_sync=t_sync,
        )

    def reset(self) -> None:
        """Forget the cached context."""
        self.seq.reset()
        self._stable = 0

    def observe(self, proposal: Proposal, outcome: Outcome) -> None:
        pass

    def close(self) -> None:
        self.seq.tokens.clear()
