"""Builder of tiny, real llama-architecture GGUF models for tests and the self-test.

The files hold random F32 weights and a real GPT-2 style byte-level BPE tokenizer (merges learned
deterministically from a small embedded English + Python corpus), ChatML special tokens and a ChatML
chat template, so llama.cpp loads, tokenizes, templates and generates with them like with a real
Qwen2.5-style model. A *draft* is made from a target's weights plus gaussian noise, so its greedy
choices agree with the target's on part of the positions only.

Imports only numpy, gguf and the standard library.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from itertools import pairwise
from pathlib import Path
from typing import Literal

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter, LlamaFileType, TokenType
from gguf.quants import quant_shape_to_byte_shape, quantize

__all__ = [
    "CHATML_TEMPLATE",
    "DEFAULT_DRAFT_NOISE",
    "SPECIAL_TOKENS",
    "TinyTokenizer",
    "build_tokenizer",
    "write_incompatible_draft",
    "write_tiny_llama",
    "write_tiny_pair",
]

CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}"
)
"""A simple ChatML template like Qwen2.5's (without tools or a default system message)."""

SPECIAL_TOKENS: tuple[str, ...] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
"""Control tokens, appended after the BPE vocabulary in this order."""

DEFAULT_DRAFT_NOISE = 0.035
"""Relative noise of :func:`write_tiny_pair`'s draft: its greedy token equals the target's on about 2/3 of
the positions of the target's greedy text (66-67% measured with llama.cpp 0.3.36 over ~900 positions)."""

N_MERGES = 250
"""Merges of each tokenizer: the vocabulary is 256 bytes + 250 merges + 3 specials = 509 tokens."""

PRE_TOKENIZER = "qwen2"
"""llama.cpp pre-tokenizer name: Qwen2's split regex, and no clean-up of spaces on detokenizing."""

_CORPUS_EN = """\
The quick brown fox jumps over the lazy dog. A small model can still answer questions, if the
questions are simple and the answers are short. When the weather is fine, we walk to the river
and watch the boats go by. She said that the meeting would start at nine, but it started late.
There is nothing more important than a good night's sleep; without it, the whole day goes wrong.
Speculative decoding lets a small draft model propose several tokens, and the large target model
checks them all at once. If the draft is right, the answer comes faster; if it is wrong, nothing is
lost, because the target decides every token. The result is exactly the same text as before.
Hello world! How are you today? I'm fine, thank you. We've been waiting for you, and they'll be
here soon. It's a long way to the top, but the view from there is worth the walk.
Local language models run on your own computer, with no data sent to a server. They are private,
they work offline, and they can be fast when the hardware is good and the software is careful.
The café near the station sells crème brûlée for 5 € — a naïve price, the café owner said.
"""

_CORPUS_CODE = '''\
def foo():
    return 1


def add(a, b):
    """Return the sum of a and b."""
    return a + b


class Counter:
    def __init__(self, start=0):
        self.value = start

    def increment(self, step=1):
        self.value += step
        return self.value


def fibonacci(n):
    if n < 2:
        return n
    return fibonacci(n - 1) + fibonacci(n - 2)


for i in range(10):
    print(i, fibonacci(i))

import os
import sys
from pathlib import Path


def read_file(path):
    with open(path, "r", encoding="utf-8") as handle:
        return handle.read()


def main(argv=None):
    args = sys.argv[1:] if argv is None else argv
    for name in args:
        text = read_file(Path(name))
        print(len(text), name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
'''

_CORPUS_B = """\
Numbers and lists: [1, 2, 3], {"key": "value"}, (x, y) = (0, 0); while True: break
Le café est très bon, mais la crème brûlée coûte 5 € de plus. Ça va? Naïve façade, déjà vu.
SELECT name, price FROM items WHERE price > 10 ORDER BY name; -- the cheapest items first
fn main() { let x = vec![1, 2, 3]; println!("{:?}", x); } // a Rust program, not Python
<html><body><p>Some markup with <b>bold</b> text and a <a href="#">link</a>.</p></body></html>
"""

# Qwen2's pre-tokenizer regex, approximated with Python's ``re`` (letters are ``[^\W\d_]``).
_L = r"[^\W\d_]"
_NOT_LN = r"[\W_]"
_PRE_SPLIT = re.compile(
    r"'(?:[sS]|[tT]|[rR][eE]|[vV][eE]|[mM]|[lL][lL]|[dD])"
    rf"|(?:(?![\r\n]){_NOT_LN})?{_L}+"
    r"|\d"
    rf"| ?(?:(?!\s){_NOT_LN})+[\r\n]*"
    r"|\s*[\r\n]+"
    r"|\s+(?!\S)"
    r"|\s+"
)


@functools.cache
def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from the 256 byte values to printable unicode characters."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


def _train_merges(corpus: str, n_merges: int) -> list[tuple[str, str]]:
    """Learn ``n_merges`` BPE merges over ``corpus`` (pre-split like llama.cpp's qwen2), deterministically."""
    b2u = _bytes_to_unicode()
    counts = Counter(tuple(b2u[b] for b in piece.encode("utf-8")) for piece in _PRE_SPLIT.findall(corpus))
    words = [list(word) for word in counts]
    freqs = list(counts.values())
    pairs: Counter[tuple[str, str]] = Counter()
    where: dict[tuple[str, str], set[int]] = {}
    for i, word in enumerate(words):
        for pair in pairwise(word):
            pairs[pair] += freqs[i]
            where.setdefault(pair, set()).add(i)
    merges: list[tuple[str, str]] = []
    while len(merges) < n_merges and pairs:
        # Most frequent pair; ties broken by the pair's text, so the result never depends on hash order.
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        merged = best[0] + best[1]
        for i in sorted(where.pop(best, ())):
            word = words[i]
            for pair in pairwise(word):
                pairs[pair] -= freqs[i]
            out: list[str] = []
            j = 0
            while j < len(word):
                if j + 1 < len(word) and (word[j], word[j + 1]) == best:
                    out.append(merged)
                    j += 2
                else:
                    out.append(word[j])
                    j += 1
            words[i] = out
            for pair in pairwise(out):
                pairs[pair] += freqs[i]
                where.setdefault(pair, set()).add(i)
        pairs = +pairs  # drop pairs whose count fell to zero
    if len(merges) < n_merges:
        raise ValueError(f"corpus too small: only {len(merges)} of {n_merges} merges learned")
    return merges


class TinyTokenizer:
    """The vocabulary of a tiny model: token texts, types and BPE merges, plus its special ids."""

    def __init__(self, tokens: Sequence[str], types: Sequence[int], merges: Sequence[str]) -> None:
        self.tokens = tuple(tokens)
        self.types = tuple(types)
        self.merges = tuple(merges)
        self.bos_id = self.tokens.index("<|endoftext|>")
        self.eos_id = self.tokens.index("<|im_end|>")
        self.im_start_id = self.tokens.index("<|im_start|>")
        self._rank_of = {(m.split(" ", 1)[0], m.split(" ", 1)[1]): r for r, m in enumerate(self.merges)}
        self._id_of = {t: i for i, t in enumerate(self.tokens)}

    @property
    def n_vocab(self) -> int:
        """Number of tokens."""
        return len(self.tokens)

    def encode(self, text: str) -> list[int]:
        """Tokenize ``text`` (no special tokens parsed) the way llama.cpp does, in pure Python."""
        b2u = _bytes_to_unicode()
        ranks = self._rank_of
        ids: list[int] = []
        for piece in _PRE_SPLIT.findall(text):
            word = [b2u[b] for b in piece.encode("utf-8")]
            while len(word) > 1:
                rank, i = min((ranks.get(pair, len(ranks)), i) for i, pair in enumerate(pairwise(word)))
                if rank == len(ranks):
                    break
                word[i : i + 2] = [word[i] + word[i + 1]]
            ids += (self._id_of[sym] for sym in word)
        return ids

    def decode(self, ids: Sequence[int]) -> bytes:
        """The bytes of ``ids`` (control tokens give their text)."""
        u2b = {c: b for b, c in _bytes_to_unicode().items()}
        out = bytearray()
        for i in ids:
            text = self.tokens[i]
            out += text.encode("utf-8") if self.types[i] == TokenType.CONTROL else bytes(u2b[c] for c in text)
        return bytes(out)


@functools.cache
def build_tokenizer(kind: Literal["a", "b"] = "a") -> TinyTokenizer:
    """Build tokenizer ``kind``.

    ``"a"`` is the standard one: GPT-2's byte tokens in GPT-2's order, merges learned from English and
    Python code, then the three control tokens. ``"b"`` has the same size and special ids but byte
    tokens in plain byte order and merges learned from other text, so token texts differ from id 0 on
    and llama.cpp's speculative compatibility rules reject it against ``"a"``.
    """
    b2u = _bytes_to_unicode()
    if kind == "a":
        byte_tokens = list(b2u.values())
        corpus = _CORPUS_EN + _CORPUS_CODE
    elif kind == "b":
        byte_tokens = [b2u[b] for b in range(256)]
        corpus = _CORPUS_B + _CORPUS_EN
    else:
        raise ValueError(f"unknown tokenizer kind {kind!r}")
    tokens = list(byte_tokens)
    known = set(tokens)
    merges = _train_merges(corpus, N_MERGES)
    for left, right in merges:
        # Distinct merges may produce the same text; the vocabulary holds it once, like HF's.
        if left + right not in known:
            known.add(left + right)
            tokens.append(left + right)
    types = [int(TokenType.NORMAL)] * len(tokens)
    tokens += SPECIAL_TOKENS
    types += [int(TokenType.CONTROL)] * len(SPECIAL_TOKENS)
    return TinyTokenizer(tokens, types, [f"{left} {right}" for left, right in merges])


def _weights(
    rng: np.random.Generator,
    *,
    n_vocab: int,
    n_embd: int,
    n_layer: int,
    n_head: int,
    n_head_kv: int,
    n_ff: int,
) -> dict[str, np.ndarray]:
    """Random weights (numpy shapes are ggml's reversed) of scales that give non-degenerate output."""
    head_dim = n_embd // n_head

    def mat(rows: int, cols: int, gain: float = 1.0) -> np.ndarray:
        return rng.standard_normal((rows, cols), dtype=np.float32) * np.float32(gain / np.sqrt(cols))

    def norm() -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n_embd, dtype=np.float32)).astype(np.float32)

    w: dict[str, np.ndarray] = {"token_embd.weight": mat(n_vocab, n_embd, np.sqrt(n_embd) * 0.5)}
    for i in range(n_layer):
        p = f"blk.{i}."
        w[p + "attn_norm.weight"] = norm()
        w[p + "attn_q.weight"] = mat(n_head * head_dim, n_embd, 2.0)
        w[p + "attn_k.weight"] = mat(n_head_kv * head_dim, n_embd, 2.0)
        w[p + "attn_v.weight"] = mat(n_head_kv * head_dim, n_embd)
        w[p + "attn_output.weight"] = mat(n_embd, n_head * head_dim)
        w[p + "ffn_norm.weight"] = norm()
        w[p + "ffn_gate.weight"] = mat(n_ff, n_embd)
        w[p + "ffn_up.weight"] = mat(n_ff, n_embd)
        w[p + "ffn_down.weight"] = mat(n_embd, n_ff)
    w["output_norm.weight"] = norm()
    w["output.weight"] = mat(n_vocab, n_embd, 4.0)
    return w


def add_tokenizer(writer: GGUFWriter, tok: TinyTokenizer, n_vocab: int | None = None) -> None:
    """Write ``tok`` as a GGUF's tokenizer (GPT-2 BPE with Qwen2's pre-tokenizer, no BOS added),
    padded with unused tokens to ``n_vocab`` where the model's vocabulary is larger."""
    n_vocab = tok.n_vocab if n_vocab is None else n_vocab
    if n_vocab < tok.n_vocab:
        raise ValueError(f"n_vocab {n_vocab} is below the tokenizer's {tok.n_vocab} tokens")
    pad = n_vocab - tok.n_vocab
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(PRE_TOKENIZER)
    writer.add_token_list([*tok.tokens, *(f"<pad{i}>" for i in range(pad))])
    writer.add_token_types([*tok.types, *[int(TokenType.NORMAL)] * pad])
    writer.add_token_merges(list(tok.merges))
    writer.add_bos_token_id(tok.bos_id)
    writer.add_eos_token_id(tok.eos_id)
    writer.add_eot_token_id(tok.eos_id)
    writer.add_pad_token_id(tok.bos_id)
    writer.add_add_bos_token(False)


def add_hparams(writer: GGUFWriter, arch: str, kv: Mapping[str, object]) -> None:
    """Write ``{arch}.{key}`` hyperparameters: lists as arrays, floats as f32, the rest as u32."""
    for key, value in kv.items():
        full = f"{arch}.{key}"
        if isinstance(value, list):
            writer.add_array(full, value)
        elif isinstance(value, float):
            writer.add_float32(full, value)
        else:
            writer.add_uint32(full, int(value))  # type: ignore[call-overload]


def write_tiny_llama(
    path: str | Path,
    *,
    seed: int = 0,
    n_embd: int = 64,
    n_layer: int = 2,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_ff: int = 160,
    n_ctx_train: int = 4096,
    base_seed: int | None = None,
    noise: float = 0.0,
    tokenizer: Literal["a", "b"] = "a",
    chat_template: str | None = CHATML_TEMPLATE,
    name: str = "tiny",
    quant: Literal["F32", "Q4_0", "Q8_0"] = "F32",
    split_tensors: int = 0,
    memoryless: bool = False,
) -> Path:
    """Write a tiny llama-architecture GGUF (F32 weights) to ``path`` and return the path.

    ``split_tensors`` > 0 writes a split model instead, at most that many tensors a part, as
    ``<stem>-00001-of-0000N.gguf`` beside ``path``, and returns the first part's path.

    ``quant`` "Q4_0" or "Q8_0" quantizes the 2-D weight matrices (norms stay F32), which makes
    llama.cpp take its quantized kernels: batched and single-token evaluation then differ slightly,
    as with real quantized models.

    Weights are drawn from ``numpy.random.default_rng(seed)``. With ``base_seed``, they are instead the
    weights of ``base_seed`` plus, for each tensor, gaussian noise (from ``seed``) of ``noise`` times
    that tensor's standard deviation: a draft of the model ``base_seed``. Deterministic.

    ``memoryless`` zeroes every layer's output projections, so the next token is a function of the
    current token alone: greedy text soon runs in a cycle, a text that repeats itself for copies.
    """
    if n_embd % n_head or n_head % n_head_kv:
        raise ValueError("n_embd must be a multiple of n_head, and n_head of n_head_kv")
    path = Path(path)
    tok = build_tokenizer(tokenizer)
    shape = dict(
        n_vocab=tok.n_vocab, n_embd=n_embd, n_layer=n_layer, n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff
    )
    if base_seed is None:
        weights = _weights(np.random.default_rng(seed), **shape)
    else:
        weights = _weights(np.random.default_rng(base_seed), **shape)
        rng = np.random.default_rng(seed)
        for key, w in weights.items():
            scale = np.float32(noise * float(w.std()))
            weights[key] = (w + scale * rng.standard_normal(w.shape, dtype=np.float32)).astype(np.float32)

    if memoryless:
        for key in weights:
            if key.endswith(("attn_output.weight", "ffn_down.weight")):
                weights[key] = np.zeros_like(weights[key])

    path.parent.mkdir(parents=True, exist_ok=True)
    writer = GGUFWriter(path, "llama", split_max_tensors=split_tensors)
    writer.add_name(name)
    writer.add_file_type(
        {"F32": LlamaFileType.ALL_F32, "Q4_0": LlamaFileType.MOSTLY_Q4_0, "Q8_0": LlamaFileType.MOSTLY_Q8_0}[
            quant
        ]
    )
    writer.add_vocab_size(tok.n_vocab)
    writer.add_context_length(n_ctx_train)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(n_embd // n_head)
    writer.add_rope_freq_base(10000.0)

    add_tokenizer(writer, tok)
    if chat_template is not None:
        writer.add_chat_template(chat_template)

    qtype = {"Q4_0": GGMLQuantizationType.Q4_0, "Q8_0": GGMLQuantizationType.Q8_0}.get(quant)
    for key, w in weights.items():
        if qtype is not None and w.ndim == 2:
            writer.add_tensor(
                key, quantize(w, qtype), raw_shape=quant_shape_to_byte_shape(w.shape, qtype), raw_dtype=qtype
            )
        else:
            writer.add_tensor(key, w)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    if split_tensors:
        parts = sorted(path.parent.glob(f"{path.stem}-*-of-*.gguf"))
        return parts[0]
    return path


def write_tiny_pair(
    directory: str | Path,
    *,
    noise: float = DEFAULT_DRAFT_NOISE,
    quant: Literal["F32", "Q4_0", "Q8_0"] = "F32",
) -> tuple[Path, Path]:
    """Write a target (seed 0) and its draft (its weights plus ``noise``) into ``directory``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    suffix = "" if quant == "F32" else f"-{quant.lower()}"
    target = write_tiny_llama(
        directory / f"tiny-target{suffix}.gguf", seed=0, name="tiny-target", quant=quant
    )
    draft = write_tiny_llama(
        directory / f"tiny-draft{suffix}.gguf",
        seed=1,
        base_seed=0,
        noise=noise,
        name="tiny-draft",
        quant=quant,
    )
    return target, draft


def write_incompatible_draft(path: str | Path) -> Path:
    """Write a tiny model whose vocabulary llama.cpp's speculative rules find incompatible with the pair's."""
    return write_tiny_llama(path, seed=2, tokenizer="b", name="tiny-incompatible")
