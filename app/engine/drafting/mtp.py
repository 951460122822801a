"""The MTP drafter: the target's own multi-token-prediction head drafts, from the target's hidden state.

No second model: the head's layers load with the target (``Model(load_mtp=True)``) and run in an MTP
context (:class:`app.engine.llama_mtp.MtpContext`). The protocol is llama.cpp's ``draft-mtp``: the head
holds, at position ``p``, the pair (the target's hidden state after token ``p-1``, token ``p``); its
output at ``p`` predicts token ``p+1``, and its own hidden state there chains into the next step.

Staying in step: every batch the target evaluates (prompt, verification, replays after a rollback)
passes through ``Context.on_decode``, where the target's hidden state of each position is kept (a new
batch at ``pos0`` replaces what was kept from ``pos0`` on, as the target's memory was cut there). The
head's memory holds pairs only for positions whose token and hidden state the target confirmed; each
round cuts it to the prefix it shares with the accepted text (whatever was rejected, cancelled or
drafted after it goes), then evaluates the missing pairs and the pending token in one batch, whose
logits give the first draft token. A position whose hidden state is unknown (a new request that parts
from the cached text there) is paired with zeros, as llama.cpp pairs a prompt's first token: drafts
may be worse, never the output (the target verifies every token).

A model with several heads (Step-3.5's) chains them as llama.cpp does: every head's layer holds the
confirmed pairs (the catch-up batch runs under each head in turn, the first head last, for its
logits); draft token ``i`` comes from head ``i``, which evaluates the pending token and the ``i`` drafted
before it again, each paired with the hidden state the previous head gave (a draft is at most as long
as the heads are many). One head (Qwen3.5/3.6) chains on itself, one position at a time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from app.engine.drafting.base import EMPTY, Outcome, Proposal, common_prefix, draft_token
from app.engine.events import Source
from app.engine.llama_mtp import MtpContext, hidden_rows, output_hidden
from app.engine.sampling import SamplingParams

if TYPE_CHECKING:
    from app.engine.grammar import Grammar
    from app.engine.llama import Context


class MtpDrafter:
    """Drafts with the target's multi-token-prediction head, chained from the target's hidden state."""

    name = "mtp"
    source = Source.MTP
    shift = 0  # the head holds the pair of token p at position p - shift (the first ``shift``: none)
    wants_target_confidence = 0
    target_confidence_floor = 0.0

    def __init__(
        self,
        target: Context,
        *,
        p_min: float = 0.0,
        n_threads: int | None = None,
        head: MtpContext | None = None,
        width: int | None = None,
    ):
        """``head``: another head's context (an EAGLE-3 head's); ``width``: the width of what is kept
        of the target per position (the hidden state's by default)."""
        self.target = target
        self.mtp = head or MtpContext(target, n_batch=target.n_batch, n_threads=n_threads)
        self.p_min = p_min
        self.held: list[int] = []  # the tokens whose pairs the head's memory holds, position by position
        # what the target gave at each position it holds (its hidden state; float16: half the memory,
        # the head normalises it first) and the token there; positions from ``_n`` on are unknown
        self._h = np.zeros((0, width or self.mtp.n_embd), dtype=np.float16)
        self._tok = np.zeros(0, dtype=np.int64)
        self._n = 0
        self.unpaired = 0  # positions paired with zeros, their hidden state unknown (for tests, reports)
        self.chain = self.mtp.n_heads > 1  # several heads, one per draft position
        self._capture()
        target.on_decode = self._seen

    def _capture(self) -> None:
        """Make the target output what the head reads of it."""
        output_hidden(self.target)

    def _rows(self, n: int) -> np.ndarray:
        """What the head reads of the target's last batch of ``n`` tokens, a row per token."""
        return hidden_rows(self.target, n, self.mtp.n_embd)

    def _inputs(self, rows: np.ndarray) -> np.ndarray:
        """The head's inputs paired with tokens, from the kept rows (the hidden states themselves)."""
        return rows

    def _chain_pos(self, n: int, j: int) -> int:
        """The position of draft token ``j``'s pair when chaining (the pending token at ``n - 1``)."""
        return n + j - self.shift

    # -- the target's hidden states -----------------------------------------------------------------
    def _seen(self, tokens: Sequence[int], pos0: int) -> None:
        """A batch the target evaluated: keep each position's token and hidden state."""
        end = pos0 + len(tokens)
        if end > len(self._tok):  # grow by doubling (at most the context's size)
            cap = min(max(end, 2 * len(self._tok), 256), max(end, self.target.n_ctx))
            self._h = np.resize(self._h, (cap, self._h.shape[1]))
            self._tok = np.resize(self._tok, cap)
        self._tok[self._n : pos0] = -1  # skipped positions: unknown
        self._h[pos0:end] = self._rows(len(tokens))
        self._tok[pos0:end] = tokens
        self._n = end

    def _hidden(self, tokens: Sequence[int], positions: range) -> np.ndarray:
        """The target's hidden state after each of ``positions`` of ``tokens`` (zeros where unknown)."""
        out = np.zeros((len(positions), self._h.shape[1]), dtype=np.float32)
        lo, hi = max(0, positions.start), min(positions.stop, self._n)
        if hi > lo:
            ok = self._tok[lo:hi] == np.asarray(tokens[lo:hi])
            out[lo - positions.start : hi - positions.start][ok] = self._h[lo:hi][ok]
            self.unpaired += int((~ok).sum())
        self.unpaired += max(0, positions.stop - max(hi, lo))
        return out

    def _catch_up(self, tokens: Sequence[int], n: int, *, logits: bool) -> int:
        """Hold the pairs of ``tokens[:n]``: cut the head's memory to the prefix it shares with them
        and evaluate the rest; returns how many it evaluated."""
        keep = common_prefix(self.held, tokens[:n])
        shift = self.shift
        self.mtp.remove(max(0, keep - shift))  # also the positions the last draft chained
        del self.held[keep:]
        if keep < shift:  # the first tokens are paired with nothing
            self.held.extend(tokens[keep:shift])
            keep = shift
        if keep == n and not logits:
            return 0
        if keep == n:  # the last pair again, for its logits
            keep = n - 1
            self.mtp.remove(keep - shift)
            del self.held[keep:]
        hidden = self._inputs(self._hidden(tokens, range(keep - 1, n - 1)))
        for head in reversed(range(self.mtp.n_heads if self.chain else 1)):  # each head's layer
            if self.chain:
                self.mtp.head(head)
                self.mtp.remove(keep)
            self.mtp.decode(tokens[keep:n], keep - shift, hidden, logits=logits and head == 0)
        self.held.extend(tokens[keep:n])
        return n - keep

    # -- the Drafter protocol -------------------------------------------------------------------------
    def begin(self, prompt: Sequence[int], *, evaluate: bool = True) -> float:
        """The prompt's pairs (all but the pending token's), while the prompt is being processed
        (``evaluate=False``: later, when the head next drafts; auto mode, where it is out of play)."""
        t0 = time.perf_counter()
        if evaluate and len(prompt) > 1:
            self._catch_up(prompt, len(prompt) - 1, logits=False)
        return time.perf_counter() - t0

    def pending(self, tokens: Sequence[int]) -> int:
        """The pairs the head would evaluate before drafting after ``tokens`` (its catch-up)."""
        return max(1, len(tokens) - common_prefix(self.held, tokens))

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
        """Up to ``k`` tokens after ``tokens`` (the last one pending: the target has not evaluated it).
        Greedy: the head's argmax (a point mass); sampling: drawn from the head's distribution under
        the same settings, which verification gets as ``q`` (exact rejection sampling). With
        ``keep_going`` (auto mode), the draft stops where it says a longer one no longer pays."""
        if k <= 0 or len(tokens) < 2 + self.shift:
            return EMPTY
        t0 = time.perf_counter()
        n = len(tokens)
        if self.chain:
            k = min(k, self.mtp.n_heads)
        n_sync = self._catch_up(tokens, n, logits=True)
        t_sync = time.perf_counter() - t0
        t_steps, n_steps = 0.0, 0
        ids: list[int] = []
        qs: list[np.ndarray | None] = []
        conf: list[float] = []
        history = list(tokens)
        walk = grammar.fork() if grammar is not None else None
        chained = [self._hidden(tokens, range(n - 2, n - 1))[0]] if self.chain else []  # chained on
        for j in range(k):
            drawn = draft_token(self.mtp.logits(), history, params, rng, walk, self.p_min)
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
            if self.chain:  # head j + 1 evaluates the pending token and the draft so far again
                chained.append(self.mtp.hidden())
                self.mtp.remove(n - 1)
                self.mtp.head(j + 1)
                self.mtp.decode([tokens[-1], *ids], n - 1, np.stack(chained))
            else:  # the head's own hidden state chains: the pair (h', token) at the next position
                self.mtp.decode([tok], self._chain_pos(n, j), self.mtp.hidden()[None, :])
            t_steps += time.perf_counter() - t1
            n_steps += 1
        if self.chain:
            self.mtp.head(0)
        dt = time.perf_counter() - t0
        return Proposal(
            tuple(ids),
            tuple(qs),
            tuple(conf),
            self.source,
            dt,
            t_sync + t_steps,
            n_steps,
            t_steps,
            n_sync=n_sync,
            t_sync=t_sync,
        )

    def observe(self, proposal: Proposal, outcome: Outcome) -> None:
        pass  # the next round finds the accepted text in ``tokens`` and the target's hidden states

    def reset(self) -> None:
        """Forget the head's memory and the kept hidden states."""
        self.mtp.clear()
        self.held.clear()
        self._n = 0

    def close(self) -> None:
        if self.target.on_decode == self._seen:
            self.target.on_decode = None
        self.mtp.close()
