"""History drafting: continue the context the way the user's earlier documents most often did."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable, Sequence

import numpy as np

from app.engine.drafting.base import EMPTY, Outcome, Proposal, common_prefix
from app.engine.events import Source
from app.engine.history.index import TRANSIENT, HistoryIndex
from app.engine.sampling import SamplingParams

_LIVE = itertools.count()


class HistoryDrafter:
    """Drafts the most frequent continuation, in a :class:`HistoryIndex`, of the context's end.

    The request in progress is a live document of the index (``begin``, then every ``propose`` and
    ``learn`` extends it), so the current prompt and reply are searched too, as prompt lookup does;
    ``commit`` keeps it under a document id once the reply is done.

    A draft needs a match of at least K tokens (the index's K-gram) and is at most ``spec_factor`` times
    the match length long, capped at ``max_draft`` and the loop's ``k``: ArcticInference's suffix
    decoding rule (``max_spec_tokens = max_spec_factor * match length``), with its default factor 1.0.
    A short match (K = 4 tokens) is often a common phrase whose continuation breaks early, so it earns a
    short draft; a match of 16 or more tokens is a copy of earlier text in progress, and earns up to 64.
    Each token is drafted while its share of the candidates still in play is at least ``min_prob``.
    Drafts are deterministic (``q`` is None): sampling stays exact through the loop's rejection sampling.
    """

    name = "history"
    wants_target_confidence = 0
    target_confidence_floor = 0.0

    def __init__(
        self,
        index: HistoryIndex,
        *,
        min_prob: float = 0.5,
        spec_factor: float = 1.0,
        max_draft: int = 64,
        max_match: int = 64,
        max_candidates: int = 64,
        stops: Iterable[int] = (),
    ):
        """``stops``: control tokens (the chat template's turn markers); a draft ends before one."""
        if not 0.0 < min_prob <= 1.0:
            raise ValueError(f"min_prob must be within (0, 1], not {min_prob}")
        if spec_factor <= 0 or max_draft < 1:
            raise ValueError("spec_factor must be > 0 and max_draft >= 1")
        self.index = index
        self.min_prob = min_prob
        self.spec_factor = spec_factor
        self.max_draft = max_draft
        self.max_match = max_match
        self.max_candidates = max_candidates
        self.stops = frozenset(stops)
        self.live_id = f"{TRANSIENT}live-{next(_LIVE)}"  # the request in progress (never saved)
        self._live: list[int] = []  # the tokens it holds

    def max_len(self, match: int) -> int:
        """The longest draft a match of this length earns."""
        return min(self.max_draft, max(1, int(self.spec_factor * match)))

    def begin(self, prompt: Sequence[int]) -> float:
        t0 = time.perf_counter()
        self._drop()
        self.learn(prompt)
        return time.perf_counter() - t0

    def learn(self, tokens: Sequence[int]) -> None:
        """The request's text so far (the prompt and the reply): the live document takes what is new."""
        live = self._live
        if live and self.live_id not in self.index:  # the index was cleared or replaced meanwhile
            live.clear()
        keep = common_prefix(live, tokens, max(0, len(live) - 8))
        if keep < len(live):  # not a continuation: another text, start over
            self._drop()
            keep = 0
        new = tokens[keep:]
        if len(new):
            self.index.add(self.live_id, new)
            live.extend(int(t) for t in new)

    def propose(
        self, tokens: Sequence[int], k: int, params: SamplingParams, rng: np.random.Generator
    ) -> Proposal:
        if k <= 0:
            return EMPTY
        t0 = time.perf_counter()
        self.learn(tokens)
        match, cands = self.index.lookup(tokens, max_candidates=self.max_candidates, max_match=self.max_match)
        if not match:
            return Proposal((), (), (), Source.HISTORY, time.perf_counter() - t0)
        draft, probs = self.index.continuation(cands, min(k, self.max_len(match)), self.min_prob)
        if self.stops:
            stop = next((i for i, t in enumerate(draft) if t in self.stops), len(draft))
            draft, probs = draft[:stop], probs[:stop]
        return Proposal(
            tuple(draft),
            (None,) * len(draft),
            tuple(probs),
            Source.HISTORY,
            time.perf_counter() - t0,
            match=match,
        )

    def observe(self, proposal: Proposal, outcome: Outcome) -> None:
        pass

    def commit(self, doc_id: str, tokens: Sequence[int] | None = None) -> int:
        """Keep the request (its prompt and reply: ``tokens``, else what the drafter has seen) under
        ``doc_id``. Only what that document does not hold yet is added: a later turn of a conversation
        repeats the earlier ones. Returns the tokens added."""
        if tokens is not None:
            self.learn(tokens)
        if not self._live:
            return 0
        self._live = []
        return self.index.absorb(self.live_id, doc_id)

    def _drop(self) -> None:
        if self._live:
            self.index.remove(self.live_id)
        self._live = []

    def close(self) -> None:
        """Drop the request in progress (what was committed stays)."""
        self._drop()
