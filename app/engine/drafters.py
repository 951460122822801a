"""Drafters propose the next few tokens; the target verifies them. One small interface, two drafters.

- :class:`ModelDrafter` runs a small draft model in its own llama.cpp context. Its KV cache stays in
  sync with the accepted text by decoding only the tokens it has not seen yet.
- :class:`LookupDrafter` (prompt lookup decoding) copies what followed the most recent earlier
  occurrence of the context's last n-gram: free to run, strong when the reply repeats its input.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from app.engine import sampling
from app.engine.sampling import SamplingParams

if TYPE_CHECKING:  # the UI imports auto mode's wording through here: keep llama.cpp out of it
    from app.engine.llama import Context


@dataclass(frozen=True, slots=True)
class Proposal:
    """Drafted tokens with the draft distribution each was drawn from (None: deterministic)."""

    tokens: tuple[int, ...]
    q: tuple[np.ndarray | None, ...]
    confidence: tuple[float, ...]  # the drafter's own probability of each token (1.0 for lookup)
    source: str  # "model" or "lookup"
    t: float  # seconds spent drafting
    t_llama: float = 0.0  # of which inside llama_decode
    n_steps: int = 0  # single-token draft decodes (the per-token cost sample for auto mode)
    t_steps: float = 0.0  # seconds those took
    n_sync: int = 0  # tokens the draft evaluated to catch up with the text before drafting
    t_sync: float = 0.0  # seconds that took
    planned: int = -1  # the draft length the drafter planned (-1: the policy's choice)
    reason: str = ""  # why (empty: the policy's reason)
    match: int = 0  # lookup: how many tokens of the context's end matched where the draft was copied
    origin: int = -1  # lookup: the context index the draft was copied from


EMPTY = Proposal((), (), (), "none", 0.0)


class Drafter(Protocol):
    name: str

    def begin(self, prompt: Sequence[int]) -> float:
        """A new request with this prompt; returns seconds spent (prompt processing)."""
        ...

    def propose(
        self, tokens: Sequence[int], k: int, params: SamplingParams, rng: np.random.Generator
    ) -> Proposal:
        """Up to ``k`` tokens likely to follow ``tokens``."""
        ...

    def close(self) -> None: ...


def common_prefix(a: Sequence[int], b: Sequence[int], start: int = 0) -> int:
    """Length of the common prefix of ``a`` and ``b``, given that the first ``start`` items agree."""
    n = min(len(a), len(b))
    i = min(start, n)
    while i < n and a[i] == b[i]:
        i += 1
    return i


class ModelDrafter:
    """Drafts with a small model that shares the target's vocabulary."""

    name = "model"

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
            self.name,
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

    def close(self) -> None:
        self._cached.clear()


class LookupDrafter:
    """Prompt lookup decoding: continue an earlier occurrence of the context's last n-gram.

    Of the few most recent occurrences, the one whose match extends furthest back wins; that match
    length travels with the proposal, since it predicts acceptance well (a 2-token match is right about
    half the time, a match of 9 or more tokens is a copy in progress and nearly always right).
    """

    name = "lookup"
    CANDIDATES = 4  # recent occurrences kept per n-gram
    MATCH_CAP = 64  # longest match length measured

    def __init__(self, *, ngram_max: int = 4, ngram_min: int = 2):
        if not 1 <= ngram_min <= ngram_max:
            raise ValueError(f"need 1 <= ngram_min <= ngram_max, got {ngram_min}, {ngram_max}")
        self.ngram_max = ngram_max
        self.ngram_min = ngram_min
        self._tokens: list[int] = []
        # n -> {n-gram: end indexes (exclusive) of its most recent occurrences, newest last}
        self._index: dict[int, dict[tuple[int, ...], list[int]]] = {}
        self._indexed = 0  # n-grams ending at positions <= this have been indexed

    def begin(self, prompt: Sequence[int]) -> float:
        t0 = time.perf_counter()
        self._tokens = []
        self._index = {n: {} for n in range(self.ngram_min, self.ngram_max + 1)}
        self._indexed = 0
        self._extend(prompt)
        return time.perf_counter() - t0

    def _extend(self, tokens: Sequence[int]) -> None:
        keep = common_prefix(self._tokens, tokens, max(0, self._indexed - self.ngram_max))
        if keep < len(self._tokens):  # the context changed behind us: rebuild
            self.begin(tokens)
            return
        self._tokens.extend(tokens[len(self._tokens) :])
        # index every n-gram that ends before the last token (the current suffix is the query)
        toks = self._tokens
        for end in range(max(self._indexed, 1), len(toks)):
            for n, table in self._index.items():
                if end >= n:
                    ends = table.setdefault(tuple(toks[end - n : end]), [])
                    ends.append(end)
                    if len(ends) > self.CANDIDATES:
                        del ends[0]
        self._indexed = max(self._indexed, len(toks) - 1)

    def _match_length(self, end: int, n: int) -> int:
        """How far the match of the context's end with the text before ``end`` reaches back."""
        toks, m = self._tokens, n
        last = len(toks)
        while m < self.MATCH_CAP and end - m - 1 >= 0 and toks[end - m - 1] == toks[last - m - 1]:
            m += 1
        return m

    def propose(
        self, tokens: Sequence[int], k: int, params: SamplingParams, rng: np.random.Generator
    ) -> Proposal:
        if k <= 0:
            return EMPTY
        t0 = time.perf_counter()
        self._extend(tokens)
        toks = self._tokens
        for n in range(self.ngram_max, self.ngram_min - 1, -1):
            if len(toks) <= n:
                continue
            ends = [e for e in self._index[n].get(tuple(toks[-n:]), ()) if e < len(toks)]
            if ends:
                m, end = max((self._match_length(e, n), e) for e in ends)
                cont = tuple(toks[end : end + k])
                return Proposal(
                    cont,
                    (None,) * len(cont),
                    (1.0,) * len(cont),
                    self.name,
                    time.perf_counter() - t0,
                    match=m,
                    origin=end,
                )
        return Proposal((), (), (), self.name, time.perf_counter() - t0)

    def close(self) -> None:
        self._tokens = []
