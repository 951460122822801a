"""What drafting a target/draft pair supports, by the memory of its two models.

Every pair drafts from all three sources (a draft model, prompt lookup, the drafting history); what
differs is how a rejected draft is undone (`app.gguf.arch.Rollback`) and so the longest draft a round
rolls back cheaply:

- TRIM (attention, sliding window): the rejected positions leave the KV cache; any length.
- SNAPSHOT (recurrent layers with per-token snapshots): up to `RECURRENT_SNAPSHOTS` tokens a round;
  beyond that the engine restores a checkpoint and replays the accepted tokens.
- CHECKPOINT (other recurrent layers): a checkpoint before each verify, restored and replayed.

The draft model drafts one token at a time, which snapshots cannot undo: on a recurrent memory it rolls
back by checkpoint (the engine gives it no snapshots). NONE (a memory that can do neither) decodes
plainly.

A catalog target with its own multi-token-prediction layers (``mtp_layers``) drafts with them too; a
head as the draft (``draft_kind``: an EAGLE-3 head, a Gemma 4 assistant) takes the draft model's place.
Works on anything with ``memory`` and ``rollback`` (`app.gguf.arch.ArchFacts`, a catalog model).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from app.gguf.arch import MemoryKind, Rollback
from app.gguf.memory import RECURRENT_SNAPSHOTS

__all__ = ["HEAD_SOURCES", "SOURCES", "PairDrafting", "pair_drafting", "rollback_limit", "rollback_words"]

#: the drafting sources; every pair supports all of them
SOURCES = ("draft model", "prompt lookup", "drafting history")
#: what a head drafts as, by its catalog ``draft_kind``
HEAD_SOURCES = {"eagle3": "EAGLE-3 head", "assistant": "Gemma 4 assistant"}


class _Memory(Protocol):
    @property
    def memory(self) -> MemoryKind: ...

    @property
    def rollback(self) -> Rollback: ...


def rollback_limit(rollback: Rollback) -> int | None:
    """The longest draft rolled back without a checkpoint: None for any length, 0 for none."""
    return None if rollback is Rollback.TRIM else RECURRENT_SNAPSHOTS if rollback is Rollback.SNAPSHOT else 0


def rollback_words(rollback: Rollback) -> str:
    """How a rejected draft is undone, in a few words."""
    if rollback is Rollback.TRIM:
        return "trimming its KV cache (any draft length)"
    if rollback is Rollback.SNAPSHOT:
        return (
            f"recurrent-state snapshots (up to {RECURRENT_SNAPSHOTS} tokens a round; "
            "longer drafts by checkpoint and replay)"
        )
    if rollback is Rollback.CHECKPOINT:
        return "checkpoint and replay (the state is restored and the accepted tokens decoded again)"
    return "nothing: it cannot undo a rejected draft, so it decodes plainly"


@dataclass(frozen=True)
class PairDrafting:
    """A pair's drafting facts: each model's memory kind and rollback, and the sources it drafts from."""

    target_memory: MemoryKind
    draft_memory: MemoryKind
    target_rollback: Rollback
    draft_rollback: Rollback
    sources: tuple[str, ...] = SOURCES
    target_mtp_layers: int = 0  # the target's own multi-token-prediction layers (a source of their own)
    draft_kind: str = ""  # "" a draft model; "eagle3" or "assistant" a head trained for the target

    @property
    def longest_snapshot_draft(self) -> int | None:
        """The longest draft the pair rolls back by trimming or snapshots (None: any length): the target's
        limit, and the draft model's own for its drafts."""
        limits = (rollback_limit(self.target_rollback), rollback_limit(self.draft_rollback))
        return min((n for n in limits if n is not None), default=None)

    @property
    def words(self) -> str:
        """One line: the sources, then how the target (and the draft, where it differs) rolls back."""
        line = f"drafting: {', '.join(self.sources)}; "
        line += f"target rolls back by {rollback_words(self.target_rollback)}"
        if self.draft_rollback is not self.target_rollback:
            line += f"; the draft model by {rollback_words(self.draft_rollback)}"
        return line

    def to_data(self) -> dict[str, Any]:
        """JSON-ready data (enum values as strings)."""
        return {
            "target_memory": self.target_memory.value,
            "draft_memory": self.draft_memory.value,
            "target_rollback": self.target_rollback.value,
            "draft_rollback": self.draft_rollback.value,
            "longest_snapshot_draft": self.longest_snapshot_draft,
            "sources": list(self.sources),
            "target_mtp_layers": self.target_mtp_layers,
            "draft_kind": self.draft_kind or "model",
        }


def pair_drafting(target: _Memory, draft: _Memory) -> PairDrafting:
    """The drafting facts of a target and a draft (`ArchFacts` or catalog models)."""
    draft_rollback = Rollback.CHECKPOINT if draft.rollback is Rollback.SNAPSHOT else draft.rollback
    sources = () if target.rollback is Rollback.NONE else SOURCES
    if draft_rollback is Rollback.NONE:
        sources = tuple(s for s in sources if s != "draft model")
    mtp, kind = int(getattr(target, "mtp_layers", 0) or 0), str(getattr(draft, "draft_kind", "") or "")
    if kind:
        sources = tuple(HEAD_SOURCES[kind] if s == "draft model" else s for s in sources)
    if mtp and sources:
        sources = (f"own MTP layers ({mtp})", *sources)
    return PairDrafting(target.memory, draft.memory, target.rollback, draft_rollback, sources, mtp, kind)
