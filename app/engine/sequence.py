"""The tokens a context's memory holds, and how to go back to a shorter text on every memory kind.

A speculative round evaluates a draft and then forgets its rejected tail. How depends on the memory:

- **attention** (a KV cache): remove the positions; any suffix, any time.
- **sliding window** (iSWA, the window's cells reused as the text moves on): removing the tail of the
  last batch is exact (the cells a batch reused were outside the window of every position it kept),
  but going back further than the start of the last batch may need cells the window has reused; then
  the text is evaluated again (``SequenceStats.replayed``).
- **recurrent / hybrid** (a fixed-size state per sequence): llama.cpp keeps per-token snapshots of the
  state for the last ``n_rs_seq`` tokens of a batch on the architectures that support them, usable
  once per batch; longer rollbacks restore a checkpoint saved before the batch and evaluate the
  accepted tokens again (``checkpoint`` is taken by the caller where the snapshots cannot cover a
  draft); with neither, the whole text is evaluated again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from app.engine.errors import LlamaError
from app.engine.llama import Context
from app.gguf.arch import MemoryKind, Rollback

ROUND, PROMPT = 0, 1  # checkpoint slots: before a round's batch, at the end of a prompt


@dataclass(frozen=True)
class MemoryInfo:
    """What a context's memory can undo (for the engine's info, the CLI and the UI)."""

    kind: MemoryKind
    rollback: Rollback
    snapshots: int = 0  # per-token recurrent snapshots (rollbacks of up to this many tokens are free)
    window: int = 0  # sliding-window size (0: none, or a full-size cache)


def memory_info(ctx: Context) -> MemoryInfo:
    """The memory kind of a context, as llama.cpp reports its model and parameters."""
    model = ctx.model
    if model.is_hybrid or model.is_recurrent:
        kind = MemoryKind.HYBRID if model.is_hybrid else MemoryKind.RECURRENT
        method = Rollback.SNAPSHOT if ctx.n_rs_seq > 0 else Rollback.CHECKPOINT
        return MemoryInfo(kind, method, snapshots=ctx.n_rs_seq)
    if model.n_swa > 0:
        return MemoryInfo(MemoryKind.SLIDING_WINDOW, Rollback.TRIM, window=0 if ctx.swa_full else model.n_swa)
    return MemoryInfo(MemoryKind.ATTENTION, Rollback.TRIM)


def probe_rollback(ctx: Context) -> MemoryInfo:
    """The memory's kind and how it rolls back, checked on the context itself: a recurrent memory
    without snapshots must save and restore its state, or it cannot undo a draft at all
    (``Rollback.NONE``). Leaves the context empty."""
    info = memory_info(ctx)
    if info.rollback is not Rollback.CHECKPOINT:
        return info
    try:
        ctx.clear()
        ctx.decode([0, 0], 0, logits="none")
        ctx.save_state()
        ctx.decode([0], 2, logits="none")
        ctx.load_state()
        ok = ctx.remove(2) and ctx.n_cached() == 2
    except LlamaError:
        ok = False
    ctx.clear()
    return info if ok else replace(info, rollback=Rollback.NONE)


@dataclass
class SequenceStats:
    """Counters of the rollbacks that cost more than a removal (mutable on purpose)."""

    checkpoints: int = 0  # states saved before a batch the snapshots could not undo
    restores: int = 0  # rollbacks that restored a checkpoint
    replayed: int = 0  # tokens evaluated again after a restore or a reset


class CachedSequence:
    """A context and the tokens its memory holds, in order; ``rollback`` keeps a prefix exactly."""

    def __init__(self, ctx: Context):
        self.ctx = ctx
        self.tokens: list[int] = []
        self.memory = memory_info(ctx)
        self.stats = SequenceStats()
        self._undo = 0  # trailing tokens the snapshots can remove now (once: llama.cpp's rule)
        self._floor = 0  # sliding window: the shortest length a removal keeps exact
        self._checkpoints: dict[int, int] = {}  # slot -> the length at which its state was saved

    @property
    def can_trim_any(self) -> bool:
        """Whether any suffix can be removed without evaluating anything again."""
        return self.memory.rollback is Rollback.TRIM and self.memory.window == 0

    def undo_reach(self, batch: int) -> int:
        """How many tokens of a batch of ``batch`` can be removed afterwards without a checkpoint."""
        if self.memory.rollback is Rollback.TRIM:
            return batch
        return min(batch - 1, self.memory.snapshots)

    # -- evaluation ---------------------------------------------------------------------------------
    def extend(
        self, tokens: Sequence[int], *, logits: str | Sequence[bool] = "last", wait: bool = True
    ) -> int:
        """Evaluate ``tokens`` after the held ones; returns the logit rows (see ``Context.decode``)."""
        if not tokens:
            return 0
        n0 = len(self.tokens)
        try:
            rows = self.ctx.decode(tokens, n0, logits=logits, wait=wait)
        except BaseException:
            self._reset()  # a failed batch leaves the memory in an unknown state
            raise
        self.tokens.extend(tokens)
        last = self.ctx.n_batch * ((len(tokens) - 1) // self.ctx.n_batch)  # the last chunk's start
        if self.memory.window:
            ub = self.ctx.n_ubatch
            self._floor = max(self._floor, n0 + last + ub * ((len(tokens) - last - 1) // ub))
        self._undo = min(len(tokens) - last - 1, self.memory.snapshots)
        return rows

    def checkpoint(self, slot: int = ROUND) -> None:
        """Save the state at the current length, so a later rollback to here or beyond is exact
        whatever the snapshots cover (recurrent and hybrid memories only). Two slots: ``ROUND``,
        before a batch the snapshots cannot undo, and ``PROMPT``, at the end of a request's prompt
        (a regenerated reply, or the next turn of a chat whose template rewrites the last reply,
        then starts from there)."""
        if self.memory.rollback is Rollback.TRIM:
            return
        self.ctx.save_state(slot)
        self._checkpoints[slot] = len(self.tokens)
        self.stats.checkpoints += 1

    def _best_checkpoint(self, n: int) -> tuple[int, int] | None:
        """The slot and length of the longest checkpoint at or before ``n``."""
        best = max(((c, s) for s, c in self._checkpoints.items() if 0 < c <= n), default=None)
        return (best[1], best[0]) if best else None

    # -- rollback -----------------------------------------------------------------------------------
    def would_hold(self, n: int) -> int:
        """How many tokens ``truncate(n)`` would leave held (nothing changes)."""
        n = max(0, n)
        if n >= len(self.tokens):
            return len(self.tokens)
        m = self.memory
        if n > 0:
            if m.rollback is Rollback.TRIM:
                if m.window == 0 or n >= self._floor:
                    return n
            elif len(self.tokens) - n <= self._undo:
                return n
            elif (best := self._best_checkpoint(n)) is not None:
                return best[1]
        return 0

    def truncate(self, n: int) -> int:
        """Hold at most ``tokens[:n]``, the cheapest way; returns how many tokens are held now.

        Fewer than ``n`` where the memory could not remove exactly (restored to a checkpoint, or
        cleared): the caller evaluates the rest again, with whatever else it evaluates next.
        """
        n = max(0, n)
        if n >= len(self.tokens):
            return len(self.tokens)
        m = self.memory
        if n > 0:
            if m.rollback is Rollback.TRIM:
                if (m.window == 0 or n >= self._floor) and self.ctx.remove(n):
                    return self._cut(n)
            elif len(self.tokens) - n <= self._undo and self.ctx.remove(n):
                self._undo = 0
                return self._cut(n)
            elif (best := self._best_checkpoint(n)) is not None:
                slot, c = best
                self.ctx.load_state(slot)
                self.ctx.remove(c)  # the attention layers of a hybrid model
                self.stats.restores += 1
                self._undo = 0
                return self._cut(c)
        self._reset()
        return 0

    def rollback(self, n: int) -> None:
        """Hold exactly ``tokens[:n]``: remove the rest, re-evaluating what a removal cannot keep."""
        n = max(0, n)
        if n >= len(self.tokens):
            return
        wanted = self.tokens[:n]
        held = self.truncate(n)
        if held < n:
            self.stats.replayed += n - held
            self.extend(wanted[held:], logits="none")

    def sync(
        self, tokens: Sequence[int], *, logits: str = "none", last_again: bool = False, agree: int = 0
    ) -> int:
        """Hold exactly ``tokens``, reusing the longest held prefix; evaluates what is missing in one
        batch. ``last_again``: evaluate the last token even if it is held (its logits are wanted);
        ``agree``: a prefix length known to be held already. Returns how many tokens were reused."""
        limit = min(len(self.tokens), len(tokens) - (1 if last_again else 0))
        keep = max(0, min(agree, limit))
        while keep < limit and self.tokens[keep] == tokens[keep]:
            keep += 1
        held = self.truncate(keep)
        self.stats.replayed += keep - held
        self.extend(tokens[held:], logits=logits)
        return held

    def _cut(self, n: int) -> int:
        del self.tokens[n:]
        self._checkpoints = {s: c for s, c in self._checkpoints.items() if c <= n}
        return n

    def _reset(self) -> None:
        self.ctx.clear()
        self.tokens.clear()
        self._undo = 0
        self._floor = 0
        self._checkpoints.clear()

    def reset(self) -> None:
        """Forget everything."""
        self._reset()
