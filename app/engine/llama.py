"""With ``devices.py`` (ggml's device registry), the only module that calls ``llama_cpp``: thin
wrappers over llama.cpp's C handles.

One class per handle (``Model``, ``Context``), each with an explicit ``close()``; C error codes become
Python exceptions. Everything above this module sees token ids, bytes and numpy arrays only.
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
import threading
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path

import llama_cpp
import numpy as np

from app.engine.devices import _ggml_lib as _ggml_lib  # the devices (ggml's registry), re-exported
from app.engine.devices import backend_name as backend_name
from app.engine.devices import backends as backends
from app.engine.devices import device_list
from app.engine.devices import devices as devices
from app.engine.errors import ContextFullError, DecodeError, LlamaError, ModelLoadError
from app.engine.info import Offload
from app.engine.offload import backend_of, is_software, used_gpu

log = logging.getLogger("tandem.llama")
log.addHandler(logging.NullHandler())  # llama.cpp's log is opt-in: never printed through lastResort

GGUF_MAGIC = b"GGUF"


# --------------------------------------------------------------------------------------------------
# Process-wide backend state and logging
# --------------------------------------------------------------------------------------------------

_init_lock = threading.Lock()
_initialized = False
_log_lines: deque[str] = deque(maxlen=400)
_log_partial: list[str] = []
_captures: list[list[str]] = []
_LEVELS = {1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR, 5: logging.DEBUG}


@llama_cpp.llama_log_callback
def _log_callback(level: int, text: bytes, _user_data: ctypes.c_void_p) -> None:
    # llama.cpp logs in fragments; join them into lines. Level 5 (CONT) continues the previous line.
    msg = text.decode("utf-8", errors="replace") if text else ""
    _log_partial.append(msg)
    if msg.endswith("\n"):
        line = "".join(_log_partial).rstrip("\n")
        _log_partial.clear()
        _log_lines.append(line)
        for cap in _captures if level in (3, 4) else ():  # a failed load's message: warnings, errors
            cap.append(line)
        log.log(_LEVELS.get(level, logging.DEBUG), "%s", line)


def init_backend() -> None:
    """Initialise llama.cpp once per process and route its log into ``logging`` (quiet stderr)."""
    global _initialized
    with _init_lock:
        if _initialized:
            return
        llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))
        llama_cpp.llama_backend_init()
        _initialized = True


def recent_log(n: int = 50) -> list[str]:
    """The last ``n`` lines llama.cpp logged in this process (for error messages and reports)."""
    return list(_log_lines)[-n:]


def system_info() -> str:
    """llama.cpp's build and CPU feature summary."""
    init_backend()
    return (llama_cpp.llama_print_system_info() or b"").decode("utf-8", errors="replace").strip()


def supports_gpu_offload() -> bool:
    init_backend()
    return bool(llama_cpp.llama_supports_gpu_offload())


def force_abort(message: str = "forced abort (test)") -> None:
    """Tests only: call ggml's own ``ggml_abort`` (what a failed GGML_ASSERT does). Never returns."""
    lib_dir = Path(llama_cpp.__file__).parent / "lib"
    for name in ("libggml-base.so", "libggml-base.dylib", "ggml-base.dll"):
        if (lib_dir / name).exists():
            lib = ctypes.CDLL(str(lib_dir / name))
            lib.ggml_abort.restype = None
            # fixed arguments only (no varargs): escape '%' so the message is not read as a format
            lib.ggml_abort(__file__.encode(), ctypes.c_int(0), message.replace("%", "%%").encode())
    raise LlamaError(f"ggml base library not found in {lib_dir}")


# --------------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------------


def _model_buffers(lines: Sequence[str]) -> list[str] | None:
    """The buffers the last model load put its weights in ("CPU_Mapped", "Vulkan0", ...), from
    llama.cpp's log; None when the log does not show a load."""
    starts = [i for i, line in enumerate(lines) if "load_tensors: loading model tensors" in line]
    if not starts:
        return None
    found = (re.search(r"load_tensors:\s+(\S+) model buffer size", line) for line in lines[starts[-1] :])
    return [m.group(1) for m in found if m]


def check_model_file(path: str | os.PathLike[str]) -> Path:
    """Fail early, with a clear message, on files llama.cpp would reject (or worse)."""
    p = Path(path)
    if not p.exists():
        raise ModelLoadError(f"model file not found: {p}")
    if not p.is_file():
        raise ModelLoadError(f"not a file: {p}")
    size = p.stat().st_size
    if size == 0:
        raise ModelLoadError(f"model file is empty: {p}")
    with p.open("rb") as fh:
        head = fh.read(4)
    if head != GGUF_MAGIC:
        raise ModelLoadError(f"not a GGUF model file (starts with {head!r}, expected b'GGUF'): {p}")
    return p


class Model:
    """A loaded GGUF model (``llama_model``) and its vocabulary."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        n_gpu_layers: int = 0,
        use_mmap: bool = True,
        progress: Callable[[float], bool | None] | None = None,
        gpus: Sequence[str] | None = None,
        load_mtp: bool = False,
    ):
        """Load ``path``. ``progress(fraction)`` is called while loading; returning False cancels.
        ``gpus``: the ggml devices llama.cpp may use (None: its own choice; empty: none at all);
        ``load_mtp``: also load the multi-token-prediction layers (where the file has them)."""
        init_backend()
        self.path = check_model_file(path)
        params = llama_cpp.llama_model_default_params()
        params.n_gpu_layers = int(n_gpu_layers)
        params.load_mtp = bool(load_mtp)
        if gpus is not None:
            self._gpus = device_list(gpus)  # read during the load
            params.devices = ctypes.addressof(self._gpus)
        params.load_mode = llama_cpp.LLAMA_LOAD_MODE_MMAP if use_mmap else llama_cpp.LLAMA_LOAD_MODE_NONE
        if progress is not None:

            def _progress(fraction: float, _user: ctypes.c_void_p) -> bool:
                try:
                    return progress(float(fraction)) is not False
                except Exception:  # an exception must not cross the C boundary
                    log.exception("progress callback failed")
                    return True

            # keep the ctypes thunk alive for the duration of the load
            self._progress_cb = llama_cpp.llama_progress_callback(_progress)
            params.progress_callback = self._progress_cb
        captured: list[str] = []
        _captures.append(captured)
        try:
            handle = llama_cpp.llama_model_load_from_file(str(self.path).encode("utf-8"), params)
        finally:
            _captures.remove(captured)
        if not handle:
            detail = "; ".join(line for line in captured[-6:] if line.strip())
            raise ModelLoadError(f"llama.cpp could not load {self.path.name}: {detail or 'unknown error'}")
        self._handle = handle
        self._vocab = llama_cpp.llama_model_get_vocab(handle)
        self.n_vocab: int = llama_cpp.llama_vocab_n_tokens(self._vocab)
        self.n_layer: int = llama_cpp.llama_model_n_layer(handle)
        self.n_ctx_train: int = llama_cpp.llama_model_n_ctx_train(handle)
        self.n_embd: int = llama_cpp.llama_model_n_embd(handle)
        self.n_embd_out: int = llama_cpp.llama_model_n_embd_out(handle)
        # multi-token-prediction heads after the trunk (loaded only with ``load_mtp``)
        self.n_layer_nextn: int = llama_cpp.llama_model_n_layer_nextn(handle) if load_mtp else 0
        self.size_bytes: int = llama_cpp.llama_model_size(handle)
        self.n_params: int = llama_cpp.llama_model_n_params(handle)
        self.bos: int = llama_cpp.llama_vocab_bos(self._vocab)
        self.eos: int = llama_cpp.llama_vocab_eos(self._vocab)
        self.add_bos: bool = bool(llama_cpp.llama_vocab_get_add_bos(self._vocab))
        self.add_eos: bool = bool(llama_cpp.llama_vocab_get_add_eos(self._vocab))
        self.vocab_type: int = llama_cpp.llama_vocab_type(self._vocab)
        # what the model keeps of the text: a KV cache, a recurrent state, or both; a sliding window
        self.is_recurrent: bool = bool(llama_cpp.llama_model_is_recurrent(handle))
        self.is_hybrid: bool = bool(llama_cpp.llama_model_is_hybrid(handle))
        self.n_swa: int = int(llama_cpp.llama_model_n_swa(handle))
        self._eog = np.zeros(self.n_vocab, dtype=bool)
        control = []
        for t in range(self.n_vocab):
            self._eog[t] = llama_cpp.llama_vocab_is_eog(self._vocab, t)
            if llama_cpp.llama_vocab_is_control(self._vocab, t):
                control.append(t)
        # tokens of the chat template and the end of a turn, never text a reply copies
        self.control_tokens: frozenset[int] = frozenset(control)
        self._pieces: dict[tuple[int, bool], bytes] = {}
        self.offload = self._offload_report(int(n_gpu_layers))

    def _offload_report(self, requested: int) -> Offload:
        """Where the layers went: llama.cpp offloads the last ``requested`` of the repeating layers and
        the output layer (-1: all) to the GPU it uses (a discrete one before an integrated one). The
        load's own log ("Vulkan0 model buffer size = ...") must show weights on that GPU: a load that
        stayed on the CPU reads as the CPU, never as offloaded."""
        total = self.n_layer + 1
        gpu = used_gpu(devices())
        if gpu is None or not supports_gpu_offload() or requested == 0:
            return Offload(requested, 0, total, "CPU")
        held = _model_buffers(recent_log(120))
        if held is not None and not any(b.startswith(gpu.name) and not b.endswith("_Host") for b in held):
            return Offload(requested, 0, total, "CPU")
        layers = total if requested < 0 else min(requested, total)
        kind = "software" if is_software(gpu) else gpu.kind
        return Offload(
            requested, layers, total, backend_of(gpu), gpu.description or gpu.name, device_kind=kind
        )

    # -- metadata -----------------------------------------------------------------------------------
    def description(self) -> str:
        buf = ctypes.create_string_buffer(256)
        llama_cpp.llama_model_desc(self._handle, buf, len(buf))
        return buf.value.decode("utf-8", errors="replace")

    def meta(self, key: str) -> str | None:
        """A GGUF metadata value rendered as a string by llama.cpp, or None."""
        size = 4096
        while True:
            buf = ctypes.create_string_buffer(size)
            n = llama_cpp.llama_model_meta_val_str(self._handle, key.encode(), buf, size)
            if n < 0:
                return None
            if n < size:
                return buf.value.decode("utf-8", errors="replace")
            size = n + 1

    def chat_template(self) -> str | None:
        ptr = llama_cpp.llama_model_chat_template(self._handle, None)
        return ptr.decode("utf-8", errors="replace") if ptr else None

    # -- vocabulary ---------------------------------------------------------------------------------
    def is_eog(self, token: int) -> bool:
        return bool(self._eog[token])

    def token_text(self, token: int) -> str:
        raw = llama_cpp.llama_vocab_get_text(self._vocab, token)
        return raw.decode("utf-8", errors="replace") if raw else ""

    def token_name(self, token: int) -> str:
        """The token id's string form for messages (special tokens rendered)."""
        return self.piece(token, special=True).decode("utf-8", errors="replace")

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        data = text.encode("utf-8")
        cap = len(data) + 8
        buf = (llama_cpp.llama_token * cap)()
        n = llama_cpp.llama_tokenize(self._vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            buf = (llama_cpp.llama_token * cap)()
            n = llama_cpp.llama_tokenize(self._vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:
            raise LlamaError(f"tokenization failed ({n})")
        return list(buf[:n])

    def piece(self, token: int, *, special: bool = False) -> bytes:
        """The bytes of one token (possibly an incomplete UTF-8 sequence)."""
        key = (token, special)
        cached = self._pieces.get(key)
        if cached is not None:
            return cached
        buf = ctypes.create_string_buffer(64)
        n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, 64, 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, -n, 0, special)
        out = buf.raw[:n]
        self._pieces[key] = out
        return out

    def detokenize(self, tokens: Sequence[int], *, special: bool = False) -> bytes:
        return b"".join(self.piece(t, special=special) for t in tokens)

    def close(self) -> None:
        if getattr(self, "_handle", None):
            llama_cpp.llama_model_free(self._handle)
            self._handle = None

    def __del__(self) -> None:
        self.close()


def default_threads() -> int:
    """Physical cores: decoding is memory-bound, and hyper-threads only add contention."""
    try:
        import psutil

        n = psutil.cpu_count(logical=False)
    except Exception:  # psutil missing or the platform cannot say
        n = None
    return max(1, n or os.cpu_count() or 2)


# --------------------------------------------------------------------------------------------------
# Context
# --------------------------------------------------------------------------------------------------


class Context:
    """A ``llama_context`` on one model: one sequence, a KV cache, logits of the last decode."""

    def __init__(
        self,
        model: Model,
        *,
        n_ctx: int = 4096,
        n_batch: int = 512,
        n_threads: int | None = None,
        n_threads_batch: int | None = None,
        flash_attn: bool | None = None,
        n_rs_seq: int = 0,
        swa_full: bool = False,
    ):
        """``n_rs_seq``: per-token snapshots of a recurrent state kept for rollback (llama.cpp keeps
        them only for the architectures that support it, and reports 0 otherwise); ``swa_full``: a
        full-size cache for sliding-window layers (any suffix can then be removed)."""
        self.model = model
        threads = n_threads or default_threads()
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = int(n_ctx)
        params.n_batch = int(n_batch)
        params.n_ubatch = min(int(n_batch), 512)
        params.n_seq_max = 1
        params.n_threads = threads
        params.n_threads_batch = n_threads_batch or threads
        params.no_perf = True
        params.n_rs_seq = max(0, int(n_rs_seq)) if (model.is_recurrent or model.is_hybrid) else 0
        params.swa_full = bool(swa_full)
        params.flash_attn_type = {
            None: llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO,
            True: llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED,
            False: llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED,
        }[flash_attn]
        handle = llama_cpp.llama_init_from_model(model._handle, params)
        if not handle:
            detail = "; ".join(recent_log(5))
            raise LlamaError(f"could not create a context (n_ctx={n_ctx}) for {model.path.name}: {detail}")
        self._handle = handle
        self._mem = llama_cpp.llama_get_memory(handle)
        self.n_ctx: int = llama_cpp.llama_n_ctx(handle)
        self.n_batch: int = int(n_batch)
        self.n_threads = threads
        self.n_ubatch: int = int(params.n_ubatch)
        self.n_rs_seq: int = int(llama_cpp.llama_n_rs_seq(handle))
        self.swa_full: bool = bool(swa_full) and model.n_swa > 0
        self._batch = llama_cpp.llama_batch_init(self.n_batch, 0, 1)
        self._n_out = 0  # outputs (logit rows) of the last decode
        # called after each batch llama.cpp evaluated, with its tokens and first position (the MTP
        # drafter reads the target's hidden states there)
        self.on_decode: Callable[[Sequence[int], int], None] | None = None
        self._states: dict[int, tuple[ctypes.Array[ctypes.c_uint8], int]] = {}  # saved states, by slot
        self.n_vocab = model.n_vocab

    def decode(
        self, tokens: Sequence[int], pos0: int, *, logits: str | Sequence[bool] = "last", wait: bool = True
    ) -> int:
        """Evaluate ``tokens`` at positions ``pos0...``; keep logits "last", "all", "none" or by mask.

        Returns the number of logit rows available through :meth:`logits`, in batch order. Batches larger
        than ``n_batch`` are split; logits are then only kept for the final chunk's requested rows.
        Returns when the evaluation is done, also on a GPU; with ``wait=False`` a GPU backend returns
        once the work is queued (:meth:`synchronize` waits; reading a logit row waits too). The rows of
        the decode before are then no longer to be read: the queued one overwrites them.
        """
        n = len(tokens)
        if n == 0:
            return 0
        if pos0 + n > self.n_ctx:
            raise ContextFullError(f"context is full: {pos0 + n} tokens > n_ctx {self.n_ctx}")
        if isinstance(logits, str):
            mask = [False] * n
            if logits == "all":
                mask = [True] * n
            elif logits == "last":
                mask[-1] = True
            elif logits != "none":
                raise ValueError(f"logits must be 'last', 'all', 'none' or a mask, not {logits!r}")
        else:
            mask = list(logits)
        b = self._batch
        for start in range(0, n, self.n_batch):
            chunk = range(start, min(n, start + self.n_batch))
            n_out = 0
            for j, i in enumerate(chunk):
                b.token[j] = tokens[i]
                b.pos[j] = pos0 + i
                b.n_seq_id[j] = 1
                b.seq_id[j][0] = 0
                b.logits[j] = mask[i]
                n_out += mask[i]
            b.n_tokens = len(chunk)
            rc = llama_cpp.llama_decode(self._handle, b)
            if rc != 0:
                if rc == 1:
                    raise ContextFullError(f"no KV slot for {len(chunk)} tokens at position {pos0 + start}")
                raise DecodeError(f"llama_decode failed with code {rc}")
            self._n_out = n_out
            if self.on_decode is not None:
                self.on_decode(tokens[chunk.start : chunk.stop], pos0 + start)
        # A GPU backend returns from llama_decode once the work is queued; waiting here, not at the
        # first logits read, puts the evaluation's time where auto mode times it (its verify batches,
        # draft steps and warm-up would otherwise time the queueing: an H100's batch of 8 read as one
        # decode step, not two). Nothing is lost: every caller reads the logits or decodes again next.
        if wait:
            llama_cpp.llama_synchronize(self._handle)
        return self._n_out

    def synchronize(self) -> None:
        """Wait until the evaluations queued on the device are done (at once on the CPU)."""
        llama_cpp.llama_synchronize(self._handle)

    def logits(self, i: int) -> np.ndarray:
        """Logits of output row ``i`` of the last decode (a view: copy it to keep it past the next one)."""
        if not -self._n_out <= i < self._n_out:
            raise IndexError(f"logit row {i} of {self._n_out}")
        ptr = llama_cpp.llama_get_logits_ith(self._handle, i)
        if not ptr:
            raise LlamaError(f"no logits for row {i}")
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))

    def trim(self, pos: int) -> None:
        """Forget every cached position ``>= pos`` (KV-cache rollback)."""
        if not self.remove(pos):
            raise LlamaError(f"could not remove KV positions from {pos}")

    def remove(self, pos: int) -> bool:
        """Try to forget every position ``>= pos``; False where the memory cannot (a recurrent state
        without a snapshot that far back), and then nothing changed."""
        return bool(llama_cpp.llama_memory_seq_rm(self._mem, 0, int(pos), -1))

    def save_state(self, slot: int = 0) -> int:
        """Keep a copy of the parts of the sequence's memory a rollback cannot trim (its recurrent
        state, its sliding window) in checkpoint ``slot``; returns its size in bytes."""
        flags = llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
        size = llama_cpp.llama_state_seq_get_size_ext(self._handle, 0, flags)
        buf = self._states.get(slot)
        if buf is None or len(buf[0]) < size:
            buf = ((ctypes.c_uint8 * size)(), 0)
        n = llama_cpp.llama_state_seq_get_data_ext(self._handle, buf[0], size, 0, flags)
        if n == 0 and size:
            raise LlamaError("could not save the sequence state")
        self._states[slot] = (buf[0], int(n))
        return int(n)

    def load_state(self, slot: int = 0) -> None:
        """Put back the state ``save_state`` kept in ``slot`` (the attention cache is left as it is)."""
        if slot not in self._states:
            raise LlamaError(f"no saved sequence state in slot {slot}")
        buf, n = self._states[slot]
        flags = llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
        if llama_cpp.llama_state_seq_set_data_ext(self._handle, buf, n, 0, flags) == 0:
            raise LlamaError("could not restore the sequence state")

    def clear(self) -> None:
        llama_cpp.llama_memory_clear(self._mem, True)

    def pos_min(self) -> int:
        """The lowest position the memory still holds (-1: none)."""
        return int(llama_cpp.llama_memory_seq_pos_min(self._mem, 0))

    def n_cached(self) -> int:
        """Number of positions in the KV cache (max position + 1)."""
        return int(llama_cpp.llama_memory_seq_pos_max(self._mem, 0)) + 1

    def set_threads(self, n_threads: int, n_threads_batch: int | None = None) -> None:
        llama_cpp.llama_set_n_threads(self._handle, n_threads, n_threads_batch or n_threads)
        self.n_threads = n_threads

    def close(self) -> None:
        if getattr(self, "_handle", None):
            llama_cpp.llama_batch_free(self._batch)
            llama_cpp.llama_free(self._handle)
            self._handle = None

    def __del__(self) -> None:
        self.close()
