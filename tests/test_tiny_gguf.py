"""Checks of the tiny GGUF builder, in pure Python and against the real llama.cpp."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from gguf import GGUFReader

from app.tiny_gguf import (
    CHATML_TEMPLATE,
    SPECIAL_TOKENS,
    build_tokenizer,
    write_tiny_llama,
    write_tiny_pair,
)

SAMPLE = b"Hello world, def foo():\n  return 1 \xc3\xa9\xe2\x82\xac"
TEXTS = [
    SAMPLE.decode(),
    "The café sells crème brûlée for 5 €. I'm here, WE'LL go!!",
    "日本語 😀 emoji\n\n\t x = [1,2,3]  # ok\n   \n",
    "def __init__(self, start=0):\n        self.value = start\r\n",
]
PROMPTS = [b"Hello world", b"def foo():\n", b"The quick brown fox", b"import os\n", b"She said that"]


def _field(reader: GGUFReader, key: str) -> object:
    return reader.get_field(key).contents()


def test_files_are_deterministic_small_and_complete(tmp_path: Path) -> None:
    first = write_tiny_pair(tmp_path / "one")
    second = write_tiny_pair(tmp_path / "two")
    for a, b in zip(first, second, strict=True):
        assert a.read_bytes() == b.read_bytes()
        assert 100_000 < a.stat().st_size < 1_000_000
    assert first[0].read_bytes() != first[1].read_bytes()

    reader = GGUFReader(first[0])
    tok = build_tokenizer("a")
    assert _field(reader, "general.architecture") == "llama"
    assert _field(reader, "tokenizer.ggml.model") == "gpt2"
    assert _field(reader, "tokenizer.ggml.tokens") == list(tok.tokens)
    assert _field(reader, "tokenizer.ggml.eos_token_id") == tok.eos_id
    assert _field(reader, "tokenizer.ggml.add_bos_token") is False
    assert _field(reader, "tokenizer.chat_template") == CHATML_TEMPLATE
    names = {t.name for t in reader.tensors}
    assert {"token_embd.weight", "output.weight", "blk.1.ffn_down.weight"} <= names


def test_draft_is_a_noisy_copy_of_its_base(tmp_path: Path) -> None:
    base = GGUFReader(write_tiny_llama(tmp_path / "base.gguf", seed=3))
    draft = GGUFReader(write_tiny_llama(tmp_path / "draft.gguf", seed=4, base_seed=3, noise=0.1))
    for tb, td in zip(base.tensors, draft.tensors, strict=True):
        diff = np.asarray(td.data) - np.asarray(tb.data)
        assert 0.05 < diff.std() / np.asarray(tb.data).std() < 0.2, tb.name


def test_tokenizers() -> None:
    a, b = build_tokenizer("a"), build_tokenizer("b")
    assert 400 <= a.n_vocab <= 600 and a.n_vocab == b.n_vocab
    assert (a.bos_id, a.eos_id) == (b.bos_id, b.eos_id)
    assert a.tokens[5] != b.tokens[5]
    assert [a.tokens[i] for i, t in enumerate(a.types) if t == 3] == list(SPECIAL_TOKENS)
    assert len(set(a.tokens)) == a.n_vocab
    for text in TEXTS:
        ids = a.encode(text)
        assert a.decode(ids) == text.encode()
        assert len(ids) < len(text.encode())


# ---- against the real llama.cpp ----


@pytest.fixture(scope="module")
def llama_cpp() -> ModuleType:
    return pytest.importorskip("llama_cpp")


@pytest.fixture(scope="module")
def target(llama_cpp: ModuleType, tiny_pair: Any) -> Any:
    return llama_cpp.Llama(model_path=str(tiny_pair.target), n_ctx=256, logits_all=True, verbose=False)


@pytest.fixture(scope="module")
def draft(llama_cpp: ModuleType, tiny_pair: Any) -> Any:
    return llama_cpp.Llama(model_path=str(tiny_pair.draft), n_ctx=256, logits_all=True, verbose=False)


def test_llama_cpp_tokenizes_like_the_builder(target: Any) -> None:
    tok = build_tokenizer("a")
    ids = target.tokenize(SAMPLE, add_bos=False, special=False)
    assert target.detokenize(ids) == SAMPLE
    pieces = [target.detokenize([i]) for i in ids]
    assert any(not _is_utf8(p) for p in pieces), "some tokens should be partial UTF-8"
    for text in TEXTS:
        assert target.tokenize(text.encode(), add_bos=False, special=False) == tok.encode(text)

    chat = b"<|im_start|>user\nHi<|im_end|>\n<|endoftext|>"
    ids = target.tokenize(chat, add_bos=False, special=True)
    assert ids[0] == tok.im_start_id and ids[-1] == tok.bos_id and tok.eos_id in ids
    assert target.detokenize(ids, special=True) == chat
    assert target.token_eos() == tok.eos_id
    assert tok.im_start_id not in target.tokenize(chat, add_bos=False, special=False)


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _greedy(model: Any, prompt: bytes, n: int) -> list[int]:
    model.reset()
    out: list[int] = []
    for token in model.generate(model.tokenize(prompt, add_bos=False, special=True), top_k=1, temp=0.0):
        out.append(token)
        if len(out) == n:
            return out
    return out


def test_generation_is_not_degenerate_and_draft_partly_agrees(target: Any, draft: Any) -> None:
    agree = total = 0
    continuations = []
    for prompt in PROMPTS:
        gen = _greedy(target, prompt, 24)
        assert len(gen) == 24 and len(set(gen)) > 8
        continuations.append(tuple(gen))
        full = target.tokenize(prompt, add_bos=False, special=True) + gen
        draft.reset()
        draft.eval(full)
        logits = np.asarray(draft.scores[: len(full)])
        for i in range(len(full) - len(gen) - 1, len(full) - 1):
            total += 1
            agree += int(logits[i].argmax() == full[i + 1])
        assert logits.std(axis=1).mean() > 1.0
    assert len(set(continuations)) == len(PROMPTS)
    assert 0.45 <= agree / total <= 0.85, agree / total


def _compatible(llama_cpp: ModuleType, tgt: Any, dft: Any) -> bool:
    """llama.cpp's common_speculative_are_compatible, on two loaded models."""
    vt, vd = llama_cpp.llama_model_get_vocab(tgt.model), llama_cpp.llama_model_get_vocab(dft.model)
    if llama_cpp.llama_vocab_type(vt) != llama_cpp.llama_vocab_type(vd):
        return False
    if llama_cpp.llama_vocab_get_add_bos(vt) != llama_cpp.llama_vocab_get_add_bos(vd):
        return False
    nt, nd = llama_cpp.llama_vocab_n_tokens(vt), llama_cpp.llama_vocab_n_tokens(vd)
    if abs(nt - nd) > 128:
        return False
    text = llama_cpp.llama_vocab_get_text
    return all(text(vt, i) == text(vd, i) for i in range(5, min(nt, nd)))


def test_incompatible_draft_loads_but_is_incompatible(
    llama_cpp: ModuleType, target: Any, draft: Any, tiny_incompatible_draft: Path
) -> None:
    other = llama_cpp.Llama(model_path=str(tiny_incompatible_draft), n_ctx=64, verbose=False)
    assert len(_greedy(other, b"Hello", 4)) == 4
    assert _compatible(llama_cpp, target, draft)
    assert not _compatible(llama_cpp, target, other)
