"""With ``llama.py``, the calls into ``llama_cpp`` that drafting with heads needs. Multi-token prediction
(MTP): a context of type ``LLAMA_CONTEXT_TYPE_MTP`` on the target's own model, batches that carry a hidden
state with each token (``llama_batch_ext_*``, ``llama_process``), and the experimental nextn
embeddings of ``llama_cpp.llama_cpp_ext`` (``llama-ext.h``: a staging API of llama.cpp).

The protocol is llama.cpp's ``draft-mtp`` (``common/speculative.cpp``): the target outputs, for every
token it evaluates, its last hidden state ``h`` (unmasked nextn embeddings); the MTP context holds, at
position ``p``, the pair (``h[p-1]``, token ``p``) and predicts token ``p+1``; drafting chains the MTP
head's own hidden state into the next step. An EAGLE-3 head (``draft-eagle3``) is its own small model
in a context bound to the target's (``ctx_other``: it may use the target's token embeddings and output
layer): the target outputs the inputs of three of its layers for every token; the head's encoder fuses
them into one row ``g``; its decoder holds, at position ``p``, the pair (``g[p]``, token ``p + 1``) and
chains its own pre-norm hidden state. The three calls of the target's side are exported by libllama
under C++ names only (``llama-ext.h``), bound here by every ABI's name. A Gemma 4 assistant is its
own small model too, in a context bound to the target's whose memory *is* the target's KV cache: it
evaluates (token, the target's hidden state) pairs over the target's cells and writes none. Thin
wrappers only: the drafters are :mod:`app.engine.drafting.mtp`, :mod:`app.engine.drafting.eagle3` and
:mod:`app.engine.drafting.gemma4_assistant`.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import llama_cpp
import numpy as np
from llama_cpp import llama_cpp_ext

from app.engine.errors import DecodeError, LlamaError
from app.engine.llama import Context, Model, recent_log

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


def _bound_params(target: Context, n_batch: int, n_threads: int | None) -> object:
    """Context parameters for a head bound to ``target``'s context (``ctx_other``, as llama.cpp's own
    driver sets it): the target's context size, one sequence."""
    params = llama_cpp.llama_context_default_params()
    params.ctx_other = target._handle
    params.n_ctx = target.n_ctx
    params.n_batch = int(n_batch)
    params.n_ubatch = min(int(n_batch), 512)
    params.n_seq_max = 1
    params.n_threads = params.n_threads_batch = n_threads or target.n_threads
    params.no_perf = True
    return params


class MtpContext:
    """A ``LLAMA_CONTEXT_TYPE_MTP`` context on the target's model (loaded with ``load_mtp``): the MTP
    heads' own attention cache, one sequence. Each entry of a batch is a token with a hidden state."""

    def __init__(self, target: Context, *, n_batch: int = 512, n_threads: int | None = None):
        model = target.model
        if model.n_layer_nextn <= 0:
            raise LlamaError(f"{model.path.name} has no multi-token-prediction layers loaded")
        params = _bound_params(target, n_batch, n_threads)
        params.ctx_type = llama_cpp.LLAMA_CONTEXT_TYPE_MTP
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
        llama_cpp.llama_synchronize(self._handle)  # done on a GPU too, as Context.decode: timed whole

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


# -- EAGLE-3 --------------------------------------------------------------------------------------------


def _ext(names: tuple[str, ...], argtypes: list[object], restype: object) -> object | None:
    """A libllama function exported under one of ``names`` (plain, Itanium or MSVC C++ name)."""
    lib = llama_cpp.llama_cpp._lib  # the loaded libllama
    for name in names:
        func = getattr(lib, name, None)
        if func is not None:
            func.argtypes, func.restype = argtypes, restype
            return func
    return None


_ctx, _model = llama_cpp.llama_context_p_ctypes, llama_cpp.llama_model_p_ctypes
# every call EAGLE-3 drafting makes that llama-cpp-python does not bind (None: not exported; tests check)
EAGLE3_CALLS: dict[str, object | None] = {
    # void llama_set_embeddings_layer_inp(struct llama_context * ctx, uint32_t lid, bool value)
    "llama_set_embeddings_layer_inp": _ext(
        (
            "llama_set_embeddings_layer_inp",
            "_Z30llama_set_embeddings_layer_inpP13llama_contextjb",
            "?llama_set_embeddings_layer_inp@@YAXPEAUllama_context@@I_N@Z",
        ),
        [_ctx, ctypes.c_uint32, ctypes.c_bool],
        None,
    ),
    # float * llama_get_embeddings_layer_inp(struct llama_context * ctx, uint32_t lid)
    "llama_get_embeddings_layer_inp": _ext(
        (
            "llama_get_embeddings_layer_inp",
            "_Z30llama_get_embeddings_layer_inpP13llama_contextj",
            "?llama_get_embeddings_layer_inp@@YAPEAMPEAUllama_context@@I@Z",
        ),
        [_ctx, ctypes.c_uint32],
        ctypes.POINTER(ctypes.c_float),
    ),
    # const int32_t * llama_model_target_layer_ids(const struct llama_model * model)
    "llama_model_target_layer_ids": _ext(
        (
            "llama_model_target_layer_ids",
            "_Z28llama_model_target_layer_idsPK11llama_model",
            "?llama_model_target_layer_ids@@YAPEBHPEBUllama_model@@@Z",
        ),
        [_model],
        ctypes.POINTER(ctypes.c_int32),
    ),
    # uint32_t llama_model_target_layer_ids_n(const struct llama_model * model)
    "llama_model_target_layer_ids_n": _ext(
        (
            "llama_model_target_layer_ids_n",
            "_Z30llama_model_target_layer_ids_nPK11llama_model",
            "?llama_model_target_layer_ids_n@@YAIPEBUllama_model@@@Z",
        ),
        [_model],
        ctypes.c_uint32,
    ),
}


def _call(name: str, *args: object) -> object:
    func = EAGLE3_CALLS[name]
    if func is None:
        raise LlamaError(f"this build of llama.cpp does not export {name} (EAGLE-3 drafting needs it)")
    return func(*args)  # type: ignore[operator]


def target_layers(head: Model) -> tuple[int, ...]:
    """The target layers an EAGLE-3 head reads (the inputs of those layers; ``n_layer``: the output)."""
    n = int(_call("llama_model_target_layer_ids_n", head._handle))  # type: ignore[arg-type]
    ptr = _call("llama_model_target_layer_ids", head._handle)
    return tuple(int(ptr[i]) for i in range(n)) if n else ()  # type: ignore[index]


def output_layer_inputs(target: Context, layers: Sequence[int]) -> None:
    """Make the target output, for every token it evaluates, the input of each of ``layers`` (a layer
    past its last: its final hidden state)."""
    for lid in layers:
        if lid < target.model.n_layer:
            _call("llama_set_embeddings_layer_inp", target._handle, int(lid), True)
        else:
            llama_cpp_ext.llama_set_embeddings_nextn(target._handle, True, False)


def layer_input_rows(target: Context, layers: Sequence[int], n: int) -> np.ndarray:
    """The last batch's ``n`` rows of ``layers``' inputs, concatenated per token (float32, a copy)."""
    e = target.model.n_embd
    out = np.empty((n, len(layers) * e), dtype=np.float32)
    for k, lid in enumerate(layers):
        if lid < target.model.n_layer:
            ptr = _call("llama_get_embeddings_layer_inp", target._handle, int(lid))
        else:
            ptr = llama_cpp_ext.llama_get_embeddings_nextn(target._handle)
        if not ptr:
            raise LlamaError(f"the target kept no input of layer {lid}")
        out[:, k * e : (k + 1) * e] = np.ctypeslib.as_array(ptr, shape=(n, e))  # type: ignore[arg-type]
    return out


class Eagle3Context(MtpContext):
    """An EAGLE-3 head's context, bound to its target's (``ctx_other``): its encoder fuses the target's
    layer inputs into one row per token, its decoder evaluates (token, row) pairs as an MTP head does
    (:meth:`MtpContext.decode`), one sequence."""

    def __init__(self, target: Context, head: Model, *, n_batch: int = 512, n_threads: int | None = None):
        params = _bound_params(target, n_batch, n_threads)  # the target's embeddings, if it has none
        handle = llama_cpp.llama_init_from_model(head._handle, params)
        if not handle:
            raise LlamaError(f"could not create a context for {head.path.name}: {'; '.join(recent_log(5))}")
        self._handle = handle
        self._mem = llama_cpp.llama_get_memory(handle)
        self.n_heads = 1
        self.n_embd = head.n_embd  # the decoder's width (its pre-norm hidden state's, and g's)
        self.n_vocab = target.model.n_vocab  # logits over the target's vocabulary (d2t maps a smaller one)
        self.n_batch = int(n_batch)
        self.layers = target_layers(head)
        self.n_embd_in = len(self.layers) * target.model.n_embd
        llama_cpp_ext.llama_set_embeddings_nextn(handle, True, True)  # g, and the pre-norm state
        self._batch = llama_cpp.llama_batch_ext_init(handle)
        self._pos = llama_cpp.llama_pos(0)
        self._n = 0

    def encode(self, features: np.ndarray) -> np.ndarray:
        """The encoder's row ``g`` for each row of the target's concatenated layer inputs (a copy)."""
        n = len(features)
        out = np.empty((n, self.n_embd), dtype=np.float32)
        f = np.ascontiguousarray(features, dtype=np.float32)
        fp = ctypes.POINTER(ctypes.c_float)
        b = self._batch
        for start in range(0, n, self.n_batch):
            stop = min(n, start + self.n_batch)
            llama_cpp.llama_batch_ext_clear(b)
            # the encoder is per token: its positions are placeholders after the decoder's, as the
            # batch must continue the sequence's positions
            pos0 = llama_cpp.llama_memory_seq_pos_max(self._mem, 0) + 1
            for i in range(start, stop):
                row = llama_cpp.llama_embd(f[i].ctypes.data_as(fp), 1, self.n_embd_in)
                idx = llama_cpp.llama_batch_ext_add_embd(b, 0, row)
                self._pos.value = pos0 + i - start
                if idx < 0 or not llama_cpp.llama_batch_ext_set_pos(b, idx, ctypes.byref(self._pos)):
                    raise DecodeError(f"could not fill the EAGLE-3 encoder batch at row {i}")
                llama_cpp.llama_batch_ext_set_output_logits(b, idx, True)
            rc = llama_cpp.llama_process(self._handle, llama_cpp.LLAMA_PROCESS_TYPE_ENCODE, b)
            if rc != 0:
                raise DecodeError(f"the EAGLE-3 encoder failed with code {rc}")
            ptr = llama_cpp_ext.llama_get_embeddings_nextn(self._handle)
            if not ptr:
                raise LlamaError("no output from the EAGLE-3 encoder")
            out[start:stop] = np.ctypeslib.as_array(ptr, shape=(stop - start, self.n_embd))
        return out


# -- Gemma 4's assistant ---------------------------------------------------------------------------------


class AssistantContext(MtpContext):
    """A Gemma 4 assistant's context, bound to its target's (``ctx_other``, which llama.cpp requires):
    its memory is the target's KV cache (its layers attend over the target's last sliding and last global
    layer), so it holds nothing of its own; a decode evaluates (token, the target's hidden state) pairs
    and writes no cell. Removing positions is a no-op there, and clearing is refused: it would clear the
    target's cells."""

    def __init__(self, target: Context, head: Model, *, n_batch: int = 512, n_threads: int | None = None):
        params = _bound_params(target, n_batch, n_threads)
        handle = llama_cpp.llama_init_from_model(head._handle, params)
        if not handle:
            raise LlamaError(f"could not create a context for {head.path.name}: {'; '.join(recent_log(5))}")
        if llama_cpp_ext.llama_get_ctx_other(handle) != target._handle:
            llama_cpp.llama_free(handle)
            raise LlamaError(f"{head.path.name}'s context is not bound to its target's")
        self._handle = handle
        self._mem = llama_cpp.llama_get_memory(handle)
        self.n_heads = 1  # its blocks run in one graph
        self.n_embd = head.n_embd_out  # the target's width: its hidden state in, the next one out
        self.n_vocab = target.model.n_vocab
        self.n_batch = int(n_batch)
        llama_cpp_ext.llama_set_embeddings_nextn(handle, True, True)  # its next hidden state, for chaining
        self._batch = llama_cpp.llama_batch_ext_init(handle)
        self._pos = llama_cpp.llama_pos(0)
        self._n = 0

    def remove(self, pos: int) -> None:
        """Nothing to forget: the cells are the target's."""

    def clear(self) -> None:
        """Nothing to clear (the shared cells are the target's, which clearing here would empty)."""
