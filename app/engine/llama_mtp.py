"""With ``llama.py``, the calls into ``llama_cpp`` that multi-token-prediction (MTP) drafting needs:
a context of type ``LLAMA_CONTEXT_TYPE_MTP`` on the target's own model, batches that carry a hidden
state with each token (``llama_batch_ext_*``, ``llama_process``), and the experimental nextn
embeddings of ``llama_cpp.llama_cpp_ext`` (``llama-ext.h``: a staging API of llama.cpp).

The protocol is llama.cpp's ``draft-mtp`` (``common/speculative.cpp``): the target outputs, for every
token it evaluates, its last hidden state ``h`` (unmasked nextn embeddings); the MTP context holds, at
position ``p``, the pair (``h[p-1]``, token ``p``) and predicts token ``p+1``; drafting chains the MTP
head's own hidden state into the next step. Thin wrappers only: the drafter is
:mod:`app.engine.drafting.mtp`.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import llama_cpp
import numpy as np
from llama_cpp import llama_cpp_ext

from app.engine.errors import DecodeError, LlamaError
from app.engine.llama import Context, recent_log

# every symbol MTP drafting calls: tests check they exist, so an upgrade that drops one fails loudly
SYMBOLS: dict[str, tuple[str, ...]] = {
    "llama_cpp": (
        "LLAMA_CONTEXT_TYPE_MTP",
        "LLAMA_PROCESS_TYPE_DECODE",
        "llama_model_n_layer_nextn",
        "llama_model_n_embd_out",
        "llama_embd",
        "llama_batch_ext_init",
        "llama_batch_ext_free",
        "llama_batch_ext_clear",
        "llama_batch_ext_add_token",
        "llama_batch_ext_set_pos",
        "llama_batch_ext_set_embd_token",
        "llama_batch_ext_set_output_logits",
        "llama_process",
    ),
    "llama_cpp_ext": (
        "llama_set_embeddings_nextn",
        "llama_get_embeddings_nextn",
        "llama_get_embeddings_nextn_ith",
        "llama_set_nextn_layer_offset",
        "llama_get_ctx_other",
    ),
}
PARAMS: dict[str, tuple[str, ...]] = {
    "llama_model_params": ("load_mtp",),
    "llama_context_params": ("ctx_type", "ctx_other"),
}


def output_hidden(target: Context) -> None:
    """Make the target output its hidden state for every token it evaluates (not only the rows whose
    logits are asked for), as the MTP head reads it."""
    llama_cpp_ext.llama_set_embeddings_nextn(target._handle, True, False)


def hidden_rows(ctx: Context, n: int, n_embd: int) -> np.ndarray:
    """A copy of the hidden states of the last batch's ``n`` tokens (``output_hidden`` on), in order."""
    ptr = llama_cpp_ext.llama_get_embeddings_nextn(ctx._handle)
    if not ptr:
        raise LlamaError("the context kept no hidden states")
    return np.ctypeslib.as_array(ptr, shape=(n, n_embd)).copy()


class MtpContext:
    """A ``LLAMA_CONTEXT_TYPE_MTP`` context on the target's model (loaded with ``load_mtp``): the MTP
    heads' own attention cache, one sequence. Each entry of a batch is a token with a hidden state."""

    def __init__(self, target: Context, *, n_batch: int = 512, n_threads: int | None = None):
        model = target.model
        if model.n_layer_nextn <= 0:
            raise LlamaError(f"{model.path.name} has no multi-token-prediction layers loaded")
        params = llama_cpp.llama_context_default_params()
        params.ctx_type = llama_cpp.LLAMA_CONTEXT_TYPE_MTP
        params.ctx_other = target._handle  # as llama.cpp's own driver sets it
        params.n_ctx = target.n_ctx
        params.n_batch = int(n_batch)
        params.n_ubatch = min(int(n_batch), 512)
        params.n_seq_max = 1
        params.n_threads = params.n_threads_batch = n_threads or target.n_threads
        params.no_perf = True
        handle = llama_cpp.llama_init_from_model(model._handle, params)
        if not handle:
            raise LlamaError(
                f"could not create an MTP context for {model.path.name}: {'; '.join(recent_log(5))}"
            )
        self._handle = handle
        self._mem = llama_cpp.llama_get_memory(handle)
        self.n_heads = model.n_layer_nextn
        self.n_embd = model.n_embd_out
        self.n_vocab = model.n_vocab
        self.n_batch = int(n_batch)
        llama_cpp_ext.llama_set_embeddings_nextn(handle, True, True)  # the head's own, for chaining
        self._batch = llama_cpp.llama_batch_ext_init(handle)
        self._pos = llama_cpp.llama_pos(0)
        self._n = 0  # entries in the last batch

    def decode(self, tokens: Sequence[int], pos0: int, hidden: np.ndarray, *, logits: bool = True) -> None:
        """Evaluate ``tokens`` at positions ``pos0...``, token ``i`` paired with ``hidden[i]`` (float32,
        one row per token); logits (and the head's hidden state) for the last one where asked."""
        n = len(tokens)
        h = np.ascontiguousarray(hidden, dtype=np.float32)
        if h.shape != (n, self.n_embd):
            raise ValueError(f"hidden states of shape {h.shape}, expected {(n, self.n_embd)}")
        fp = ctypes.POINTER(ctypes.c_float)
        b = self._batch
        for start in range(0, n, self.n_batch):
            stop = min(n, start + self.n_batch)
            llama_cpp.llama_batch_ext_clear(b)
            for i in range(start, stop):
                idx = llama_cpp.llama_batch_ext_add_token(b, 0, int(tokens[i]))
                if idx < 0:
                    raise DecodeError(f"the MTP batch refused token {i} of {n} ({idx})")
                self._pos.value = pos0 + i
                row = llama_cpp.llama_embd(h[i].ctypes.data_as(fp), 1, self.n_embd)  # copied by llama.cpp
                ok = llama_cpp.llama_batch_ext_set_pos(b, idx, ctypes.byref(self._pos))
                ok = ok and llama_cpp.llama_batch_ext_set_embd_token(b, idx, row)
                ok = ok and llama_cpp.llama_batch_ext_set_output_logits(b, idx, logits and i == n - 1)
                if not ok:
                    raise DecodeError(f"could not fill the MTP batch at token {i}")
            rc = llama_cpp.llama_process(self._handle, llama_cpp.LLAMA_PROCESS_TYPE_DECODE, b)
            if rc != 0:
                raise DecodeError(f"the MTP head's decode failed with code {rc}")
            self._n = stop - start

    def logits(self) -> np.ndarray:
        """Logits of the last decode's last token (a view: copy it to keep it)."""
        ptr = llama_cpp.llama_get_logits_ith(self._handle, self._n - 1)
        if not ptr:
            raise LlamaError("no logits from the MTP head")
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))

    def hidden(self) -> np.ndarray:
        """The head's hidden state for the last decode's last token (a copy), the next step's input."""
        ptr = llama_cpp_ext.llama_get_embeddings_nextn_ith(self._handle, self._n - 1)
        if not ptr:
            raise LlamaError("no hidden state from the MTP head")
        return np.ctypeslib.as_array(ptr, shape=(self.n_embd,)).copy()

    def head(self, offset: int) -> None:
        """Run MTP head ``offset`` (0: the first) in the next decodes (models with several heads)."""
        llama_cpp_ext.llama_set_nextn_layer_offset(self._handle, int(offset))

    def remove(self, pos: int) -> None:
        """Forget every position ``>= pos``."""
        if not llama_cpp.llama_memory_seq_rm(self._mem, 0, int(pos), -1):
            raise LlamaError(f"could not remove MTP positions from {pos}")

    def clear(self) -> None:
        llama_cpp.llama_memory_clear(self._mem, True)

    def close(self) -> None:
        if getattr(self, "_handle", None):
            llama_cpp.llama_batch_ext_free(self._batch)
            llama_cpp.llama_free(self._handle)
            self._handle = None

    def __del__(self) -> None:
        self.close()
