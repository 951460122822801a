"""The Gemma 4 assistant drafter: Gemma 4's small assistant model drafts, from the target's own cache.

The protocol is llama.cpp's ``draft-mtp`` with shared memory (``common/speculative.cpp``, its
``is_mem_shared`` branch, as for Gemma 4 assistants). The assistant's context is bound to the target's
(:class:`app.engine.llama_mtp.AssistantContext`): its layers attend over the target's KV cache, so it
keeps nothing in step of its own, no catch-up batch and no rollback. To draft after ``tokens`` (the
target holds every one but the pending last), it evaluates the pending token paired with the target's
hidden state after the token before it (kept per position as the MTP drafter keeps it,
:class:`~app.engine.drafting.mtp.MtpDrafter`, whose drafting loop this reuses); each next draft token is
evaluated at the *same* position, paired with the assistant's own next hidden state, as the reference
implementation does. Nothing the assistant evaluates enters the cache, so rejections, cancels and new
requests need nothing from it: the target's cache is always the accepted text.
"""

from __future__ import annotations

from collections.abc import Sequence

from app.engine.drafting.mtp import MtpDrafter
from app.engine.events import Source
from app.engine.llama import Context, Model
from app.engine.llama_mtp import AssistantContext


class AssistantDrafter(MtpDrafter):
    """Drafts with a Gemma 4 assistant (its own GGUF, loaded beside its Gemma 4 target)."""

    name = "assistant"
    source = Source.ASSISTANT
    shift = 0

    def __init__(self, target: Context, head: Model, *, p_min: float = 0.0, n_threads: int | None = None):
        ctx = AssistantContext(target, head, n_batch=target.n_batch, n_threads=n_threads)
        super().__init__(target, p_min=p_min, head=ctx)

    def _catch_up(self, tokens: Sequence[int], n: int, *, logits: bool) -> int:
        """Nothing to hold (the cache is the target's); for logits, the pending token ``tokens[n - 1]``
        paired with the target's hidden state after ``tokens[n - 2]``."""
        if not logits:
            return 0
        self.mtp.decode([tokens[n - 1]], n - 1, self._hidden(tokens, range(n - 2, n - 1)))
        return 1

    def pending(self, tokens: Sequence[int]) -> int:
        return 1  # the pending token's pair, every round

    def _chain_pos(self, n: int, j: int) -> int:
        return n - 1  # every draft token at the pending token's position
