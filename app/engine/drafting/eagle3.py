"""The EAGLE-3 drafter: a head trained for one target drafts from three of the target's layers.

The protocol is llama.cpp's ``draft-eagle3`` (``common/speculative.cpp``), kept in step the way the MTP
drafter keeps its head (:class:`~app.engine.drafting.mtp.MtpDrafter`, whose bookkeeping this reuses):
every batch the target evaluates leaves, per position, the inputs of the three layers the head reads
(concatenated; :func:`app.engine.llama_mtp.layer_input_rows`). The head's encoder fuses a position's
row into ``g``; its decoder holds at position ``p`` the pair (``g[p]``, token ``p + 1``), one position
behind an MTP head, so the pair of the pending token (the target's latest) gives the first draft token,
and each draft token chains on the decoder's own pre-norm hidden state. Rollback, cancels and new
requests cut the decoder's memory to the prefix it shares with the accepted text, as for MTP.
"""

from __future__ import annotations

import numpy as np

from app.engine.drafting.mtp import MtpDrafter
from app.engine.events import Source
from app.engine.llama import Context, Model
from app.engine.llama_mtp import Eagle3Context, layer_input_rows, output_layer_inputs


class Eagle3Drafter(MtpDrafter):
    """Drafts with an EAGLE-3 head (its own GGUF, loaded beside the target)."""

    name = "eagle3"
    source = Source.EAGLE3
    shift = 1

    def __init__(self, target: Context, head: Model, *, p_min: float = 0.0, n_threads: int | None = None):
        ctx = Eagle3Context(target, head, n_batch=target.n_batch, n_threads=n_threads)
        self.layers = ctx.layers
        super().__init__(target, p_min=p_min, head=ctx, width=ctx.n_embd_in)

    def _capture(self) -> None:
        output_layer_inputs(self.target, self.layers)

    def _rows(self, n: int) -> np.ndarray:
        return layer_input_rows(self.target, self.layers, n)

    def _inputs(self, rows: np.ndarray) -> np.ndarray:
        return self.mtp.encode(rows)  # type: ignore[attr-defined]
