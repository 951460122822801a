"""Prompt lookup decoding: copy what followed an earlier occurrence of the context's last n-gram.

Free to run, strong when the reply repeats its input (code edits, extraction, structured records).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from app.engine.drafting.base import EMPTY, Outcome, Proposal, common_prefix
from app.engine.events import Source
from app.engine.sampling import SamplingParams

if TYPE_CHECKING:
    from app.engine.grammar import Grammar

# A replacement of one copied token by another is made in the copies offered once this reply has
# made it EDIT_SEEN times (where a copy resumed on its diagonal for two tokens after it). Seen once,
# most are not edits: parallel text (" Args" -> " Returns" in a docstring, JSON records' values);
# over the benchmark's 16 replies, only the code edit's rename was seen twice.
EDIT_SEEN = 2


class LookupDrafter:
    """Prompt lookup decoding: continue an earlier occurrence of the context's last n-gram.

    Of the few most recent occurrences, the one whose match extends furthest back wins; that match
    length travels with the proposal, since it predicts acceptance well (a 2-token match is right about
    half the time, a match of 9 or more tokens is a copy in progress and nearly always right). Of
    equally long matches, the one nearest the place of the copy in progress wins: a reply that edits
    its input goes through it in order, and inserted text shifts the copy by a few tokens.

    A reply that renames something in the text it copies makes the same replacement at every
    occurrence. Once it has been made twice (see ``EDIT_SEEN``), copies are offered with it made, and
    text the reply has already changed is looked up as it was before the change.
    """

    name = "lookup"
    wants_target_confidence = 0
    target_confidence_floor = 0.0
    CANDIDATES = 4  # recent occurrences kept per n-gram
    MATCH_CAP = 64  # longest match length measured

    def __init__(self, *, ngram_max: int = 4, ngram_min: int = 2, stops: Iterable[int] = ()):
        """``stops``: control tokens (the chat template's turn markers); a copy ends before one."""
        if not 1 <= ngram_min <= ngram_max:
            raise ValueError(f"need 1 <= ngram_min <= ngram_max, got {ngram_min}, {ngram_max}")
        self.ngram_max = ngram_max
        self.ngram_min = ngram_min
        self.stops = frozenset(stops)
        self._tokens: list[int] = []
        # n -> {n-gram: end indexes (exclusive) of its most recent occurrences, newest last}
        self._index: dict[int, dict[tuple[int, ...], list[int]]] = {}
        self._indexed = 0  # n-grams ending at positions <= this have been indexed
        self._reset_edits()

    def _reset_edits(self) -> None:
        # What this reply has shown of the edit it makes to the text it copies: one token of the
        # copied text replaced by another (a rename), learned where a copy resumed on its diagonal
        # two tokens after it differed; copies are offered with the replacement made.
        self.replaced: dict[int, int] = {}
        self._restored: dict[int, int] = {}  # the inverse, to look up text the edit has changed
        self._diagonal: int | None = None  # context index minus copied index of the current copy
        self._learned_to = 0  # context indexes below this have been checked for a replacement
        self._seen: dict[tuple[int, int], int] = {}  # replacements made, before EDIT_SEEN

    def begin(self, prompt: Sequence[int]) -> float:
        t0 = time.perf_counter()
        self._tokens = []
        self._index = {n: {} for n in range(self.ngram_min, self.ngram_max + 1)}
        self._indexed = 0
        self._reset_edits()
        self._extend(prompt)
        self._learned_to = len(self._tokens)
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

    def _match_length(self, end: int, n: int, ahead: Sequence[int] = ()) -> int:
        """How far the match of the context's end (followed by ``ahead``) with the text before ``end``
        reaches back."""
        toks, m, rep = self._tokens, n, self.replaced
        last, extra = len(toks), len(ahead)
        while m < self.MATCH_CAP and end - m - 1 >= 0:
            i = m + 1  # the i-th token from the end of the context and ``ahead``
            a, b = toks[end - i], (ahead[extra - i] if i <= extra else toks[last + extra - i])
            if a != b and rep.get(a) != b:
                break
            m += 1
        return m

    def _same(self, i: int, diagonal: int) -> bool:
        """Token ``i`` is the copy's token on ``diagonal`` (with the replacements learned)."""
        j = i - diagonal
        if j < 0:
            return False
        a, b = self._tokens[j], self._tokens[i]
        return a == b or self.replaced.get(a) == b

    def _learn_edits(self) -> None:
        """Learn a replacement where the current copy differed at one token and resumed after it."""
        d, toks = self._diagonal, self._tokens
        start, self._learned_to = self._learned_to, max(self._learned_to, len(toks) - 2)
        if d is None:
            return
        for i in range(max(start, d), len(toks) - 2):
            old, new = toks[i - d], toks[i]
            if old == new:
                if old in self.replaced and self._same(i + 1, d):
                    del self._restored[self.replaced.pop(old)]  # the copy kept it after all
                continue
            if self.replaced.get(old) != new and self._same(i + 1, d) and self._same(i + 2, d):
                if new in self.replaced or old in self._restored:
                    continue  # not a chain or a swap: one replacement per token either way
                seen = self._seen[(old, new)] = self._seen.get((old, new), 0) + 1
                if seen >= EDIT_SEEN:
                    self.replaced[old] = new
                    self._restored[new] = old

    def _candidates(self, n: int, ahead: Sequence[int] = ()) -> list[int]:
        """End indexes of earlier occurrences of the last ``n`` tokens of the context followed by
        ``ahead`` (as the text was before this reply's edit, too)."""
        toks = self._tokens
        key = tuple([*toks[-n:], *ahead][-n:]) if ahead else tuple(toks[-n:])
        ends = [e for e in self._index[n].get(key, ()) if e < len(toks)]
        if self._restored:
            before = tuple(self._restored.get(t, t) for t in key)
            if before != key:
                ends += [e for e in self._index[n].get(before, ()) if e < len(toks) and e not in ends]
        return ends

    def propose(
        self,
        tokens: Sequence[int],
        k: int,
        params: SamplingParams,
        rng: np.random.Generator,
        *,
        grammar: Grammar | None = None,
    ) -> Proposal:
        """A copy of up to ``k`` tokens; with a ``grammar``, cut before the first token it forbids (a
        copy that starts with one gives way to a shorter match's)."""
        if k <= 0:
            return EMPTY
        t0 = time.perf_counter()
        self._extend(tokens)
        if len(self._tokens) - 2 > self._learned_to:
            self._learn_edits()
        return self._copy(k, (), grammar, t0)

    def after(
        self,
        tokens: Sequence[int],
        ahead: Sequence[int],
        k: int,
        *,
        grammar: Grammar | None = None,
    ) -> Proposal:
        """A copy of up to ``k`` tokens to follow ``ahead``, tokens drafted after ``tokens`` (by a draft
        model: the copy goes on where its draft ends); with a ``grammar`` (in the state after
        ``tokens``), cut before the first token it forbids after ``ahead``. Nothing is learned from it:
        the text is not known to go on with ``ahead``."""
        if k <= 0 or not ahead:
            return EMPTY
        t0 = time.perf_counter()
        self._extend(tokens)
        return self._copy(k, tuple(ahead), grammar, t0)

    def _copy(self, k: int, ahead: tuple[int, ...], grammar: Grammar | None, t0: float) -> Proposal:
        """The continuation of the longest match of the context's end (and ``ahead``) with earlier text."""
        toks = self._tokens
        last = len(toks) + len(ahead)
        for n in range(self.ngram_max, self.ngram_min - 1, -1):
            if last <= n:
                continue
            ends = self._candidates(n, ahead)
            if ends:
                # the longest match; of equally long ones, the one nearest the current copy's place
                # (an edit that inserts text shifts the copy a little, and the source repeats itself)
                d = self._diagonal
                found = [
                    (self._match_length(e, n, ahead), -abs(last - e - d) if d is not None else 0, e)
                    for e in ends
                ]
                m, _, end = max(found)
                rep = self.replaced
                # as long a match elsewhere going on with another token: a coin flip, not a copy
                ambiguous = len({rep.get(toks[e], toks[e]) for mi, _, e in found if mi == m}) > 1
                if not ahead:
                    self._diagonal = last - end
                cont = (
                    tuple(rep.get(t, t) for t in toks[end : end + k]) if rep else tuple(toks[end : end + k])
                )
                stop = next((i for i, t in enumerate(cont) if t in self.stops), None) if self.stops else None
                if stop is not None:
                    cont = cont[:stop]  # the text it copied went on into a turn of the chat template
                if grammar is not None:
                    cont = cont[: max(0, grammar.valid_prefix(ahead + cont) - len(ahead))]
                if not cont:
                    continue
                return Proposal(
                    cont,
                    (None,) * len(cont),
                    (1.0,) * len(cont),
                    Source.LOOKUP,
                    time.perf_counter() - t0,
                    match=m,
                    origin=end,
                    ambiguous=ambiguous,
                )
        return Proposal((), (), (), Source.LOOKUP, time.perf_counter() - t0)

    def observe(self, proposal: Proposal, outcome: Outcome) -> None:
        pass

    def close(self) -> None:
        self._tokens = []
