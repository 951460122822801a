"""The draft-model drafter: a small model that shares the target's vocabulary, in its own context.

Its KV cache stays in sync with the accepted text by decoding only the tokens it has not seen yet.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from app.engine import sampling
from app.engine.drafting.base import EMPTY, Outcome, Proposal, common_prefix
from app.engine.events import Source
from app.engine.sampling import SamplingParams

if TYPE_CHECKING:
    from app.engine.llama import Context


class ModelDrafter:
    """Drafts with a small model that shares the target's vocabulary."""

    name = "model"
    wants_target_confidence = 0
    target_confidence_floor = 0.0

    def __init__(self, ctx: Context, *, p_min: float = 0.0):
        self.ctx = ctx
        self.p_min = p_min
        self._cached: list[int] = []  # tokens whose KV is in the draft context, in order
        self._stable = 0  # a prefix length known to agree with the caller's tokens

    def begin(self, prompt: Sequence[int], *, evaluate: bool = True) -> float:
        """Reuse the cached common prefix; evaluate the rest now or (``evaluate=False``) lazily."""
        t0 = time.perf_counter()
        keep = common_prefix(self._cached, prompt)
        self._trim(keep)
        self._stable = keep
        # Evaluate all but the last prompt token now, so the first round only decodes one token.
        if evaluate and len(prompt) - 1 > keep:
            self.ctx.decode(prompt[keep:-1], keep, logits="none")
            self._cached.extend(prompt[keep:-1])
        self._stable = len(self._cached)
        return time.perf_counter() - t0

    def _trim(self, n: int) -> None:
        if n < len(self._cached):
            self.ctx.trim(n)
            del self._cached[n:]

    def pending(self, tokens: Sequence[int]) -> int:
        """How many of ``tokens`` the draft would have to evaluate before drafting (at least 1).

        Draft tokens the target accepted are already in the draft's cache and do not count.
        """
        keep = common_prefix(self._cached, tokens, min(self._stable, len(self._cached)))
        return max(1, len(tokens) - keep)

    def _sync(self, tokens: Sequence[int]) -> float:
        """Bring the draft KV to ``tokens`` (decoding only unseen ones); leaves logits for the last."""
        keep = common_prefix(self._cached, tokens, self._stable)
        if keep == len(tokens):  # the last token's logits are needed again: re-evaluate it
            keep -= 1
        self._trim(keep)
        t0 = time.perf_counter()
        self.ctx.decode(tokens[keep:], keep, logits="last")
        self._cached.extend(tokens[keep:])
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
    ) -> Proposal:
        """Draft up to ``k`` tokens; stop early under ``p_min`` or when ``keep_going(j, conf)`` says so."""
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
        for j in range(k):
            logits = self.ctx.logits(-1)
            if params.greedy:
                top = sampling.top_probability(sampling.penalized(logits, history, params))
                if top < self.p_min:
                    break
                tok, q, c = sampling.greedy_token(logits, history, params), None, top
            else:
                q = sampling.distribution(logits, history, params)
                c = float(q.max())
                if c < self.p_min:
                    break
                tok = sampling.sample(q, rng)
                c = float(q[tok])
            ids.append(tok)
            qs.append(q)
            conf.append(c)
            history.append(tok)
            if j == k - 1 or (keep_going is not None and not keep_going(j, conf)):
                break
            t1 = time.perf_counter()
            self.ctx.decode([tok], len(self._cached), logits="last")
            dt = time.perf_counter() - t1
            t_llama += dt
            t_steps += dt
            n_steps += 1
            self._cached.append(tok)
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
        self._trim(0)
        self._stable = 0

    def observe(self, proposal: Proposal, outcome: Outcome) -> None:
        pass

    def close(self) -> None:
        self._cached.clear()
