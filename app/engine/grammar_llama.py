"""The target's vocabulary for the grammar engine, read from llama.cpp (with ``llama.py`` and
``devices.py``, the only modules that call ``llama_cpp``).

Each token's bytes as llama.cpp renders it (special tokens included), and which tokens are special:
control tokens, and user-defined tokens written like one (``<...>``), as llama.cpp's llguidance
integration marks them. A grammar's text never spells a special token.
"""

from __future__ import annotations

import ctypes

import llama_cpp

from app.engine.errors import LlamaError
from app.engine.grammar import Vocabulary
from app.engine.llama import Model

_SPECIAL_MARK = b"\xff"  # how llguidance tells a special token's bytes from text


def vocabulary(model: Model) -> Vocabulary:
    """``model``'s vocabulary for :class:`~app.engine.grammar.Grammar` (about 1 s for 152k tokens:
    build it once per loaded model)."""
    vocab = model._vocab
    size = 256
    buf = ctypes.create_string_buffer(size)
    pieces: list[bytes] = []
    special: list[int] = []
    control = llama_cpp.LLAMA_TOKEN_ATTR_CONTROL
    user = llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED
    for token in range(model.n_vocab):
        n = llama_cpp.llama_token_to_piece(vocab, token, buf, size, 0, True)
        if n < 0:
            size = -n
            buf = ctypes.create_string_buffer(size)
            n = llama_cpp.llama_token_to_piece(vocab, token, buf, size, 0, True)
            if n < 0:
                raise LlamaError(f"could not read token {token}'s text")
        piece = buf.raw[:n]
        attr = llama_cpp.llama_vocab_get_attr(vocab, token)
        if attr & control or (attr & user and piece.startswith(b"<") and piece.endswith(b">")):
            special.append(token)
            piece = _SPECIAL_MARK + piece
        pieces.append(piece)
    eog = [t for t in range(model.n_vocab) if model.is_eog(t)]

    def tokenize(text: str) -> list[int]:
        return model.tokenize(text, add_special=False, parse_special=False)

    return Vocabulary.build(pieces, special, eog, tokenize)
