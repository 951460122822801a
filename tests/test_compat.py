"""Tests for app.gguf.compat: llama.cpp's target/draft vocabulary compatibility rules."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

from app.gguf.compat import (
    MAX_VOCAB_SIZE_DIFFERENCE,
    Compatibility,
    check_compatible,
    check_files,
    vocab_fingerprint,
    vocab_info,
)
from app.gguf.meta import GGUFMetadata, read_metadata_file

N_VOCAB = 1000
_counter = itertools.count()


def vocab(n: int = N_VOCAB) -> list[str]:
    return ["<unk>", "<s>", "</s>", "<pad>", "<mask>"] + [f"tok{i}" for i in range(5, n)]


def make(
    tmp_path: Path,
    tokens: list[str] | None = None,
    *,
    model: str | None = "gpt2",
    pre: str | None = "qwen2",
    add_bos: bool | None = False,
    add_eos: bool | None = False,
    bos: int | None = 1,
    eos: int | None = 2,
    arch: str = "llama",
) -> Path:
    """Write a small GGUF file with the given tokenizer metadata (None = key absent) and one tensor."""
    path = tmp_path / f"m{next(_counter)}.gguf"
    w = gguf.GGUFWriter(str(path), arch)
    if model is not None:
        w.add_tokenizer_model(model)
    if pre is not None:
        w.add_tokenizer_pre(pre)
    w.add_token_list(vocab() if tokens is None else tokens)
    if add_bos is not None:
        w.add_add_bos_token(add_bos)
    if add_eos is not None:
        w.add_add_eos_token(add_eos)
    if bos is not None:
        w.add_bos_token_id(bos)
    if eos is not None:
        w.add_eos_token_id(eos)
    w.add_tensor("t", np.zeros(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def meta(tmp_path: Path, tokens: list[str] | None = None, **kw: Any) -> GGUFMetadata:
    return read_metadata_file(make(tmp_path, tokens, **kw))


def check(tmp_path: Path, target: dict[str, Any], draft: dict[str, Any]) -> Compatibility:
    return check_compatible(meta(tmp_path, **target), meta(tmp_path, **draft))


def test_compatible_pair(tmp_path: Path) -> None:
    c = check_files(make(tmp_path, arch="qwen2"), make(tmp_path, arch="llama"))
    assert c.ok and bool(c) and c.rule == "ok"
    assert "compatible" in c.reason
    assert (c.n_vocab_target, c.n_vocab_draft) == (N_VOCAB, N_VOCAB)


def test_different_vocab_type(tmp_path: Path) -> None:
    c = check(tmp_path, {"model": "gpt2"}, {"model": "llama", "add_bos": False})
    assert not c and c.rule == "vocab_type"
    assert c.reason == "vocab types differ: target 'gpt2' (BPE) vs draft 'llama' (SPM)"
    assert (c.target_value, c.draft_value) == ("BPE", "SPM")


def test_add_bos_differs(tmp_path: Path) -> None:
    c = check(tmp_path, {"add_bos": True}, {"add_bos": False})
    assert not c.ok and c.rule == "add_bos"
    assert c.reason == "add_bos differs: target True vs draft False"


def test_bos_id_differs_only_matters_when_bos_is_added(tmp_path: Path) -> None:
    c = check(tmp_path, {"add_bos": True, "bos": 1}, {"add_bos": True, "bos": 3})
    assert not c.ok and c.rule == "bos_id"
    assert c.reason == "BOS token ids differ: target 1 vs draft 3"
    assert (c.target_value, c.draft_value) == (1, 3)
    assert check(tmp_path, {"add_bos": False, "bos": 1}, {"add_bos": False, "bos": 3}).ok


def test_eos_rules(tmp_path: Path) -> None:
    c = check(tmp_path, {"add_eos": True}, {"add_eos": False})
    assert not c.ok and c.rule == "add_eos"
    c = check(tmp_path, {"add_eos": True, "eos": 2}, {"add_eos": True, "eos": 4})
    assert not c.ok and c.rule == "eos_id"
    assert c.reason == "EOS token ids differ: target 2 vs draft 4"
    # llama.cpp ignores the EOS id when it is not auto-added (it is still an end-of-generation token)
    assert check(tmp_path, {"eos": 2}, {"eos": 4}).ok


@pytest.mark.parametrize(("draft_size", "ok"), [(N_VOCAB - 100, True), (N_VOCAB - 128, True),
                                                (N_VOCAB - 129, False), (N_VOCAB - 200, False),
                                                (N_VOCAB + 100, True), (N_VOCAB + 200, False)])  # fmt: skip
def test_vocab_size_difference(tmp_path: Path, draft_size: int, ok: bool) -> None:
    c = check_compatible(meta(tmp_path), meta(tmp_path, vocab(draft_size)))
    assert c.ok is ok, c.reason
    if not ok:
        diff = abs(draft_size - N_VOCAB)
        assert c.rule == "vocab_size"
        assert c.reason == (
            f"vocab sizes differ by {diff} (> {MAX_VOCAB_SIZE_DIFFERENCE}): "
            f"target {N_VOCAB}, draft {draft_size}"
        )


def test_token_text_differs_at_id_7(tmp_path: Path) -> None:
    toks = vocab()
    toks[7] = "Hallo"
    toks[500] = "also different"  # only the first difference is reported
    c = check_compatible(meta(tmp_path), meta(tmp_path, toks))
    assert not c.ok and c.rule == "token_text" and c.token_id == 7
    assert c.reason == "token 7 differs: target 'tok7' vs draft 'Hallo'"
    assert (c.target_value, c.draft_value) == ("tok7", "Hallo")


@pytest.mark.parametrize("i", [5, 63, 64, 65, 511, N_VOCAB - 129, N_VOCAB - 1])
def test_first_difference_found_anywhere(tmp_path: Path, i: int) -> None:
    toks = vocab()
    toks[i] = "x\ny"
    c = check_compatible(meta(tmp_path), meta(tmp_path, toks))
    assert c.token_id == i
    assert f"token {i} differs" in c.reason and "'x\\ny'" in c.reason  # control characters escaped


def test_differences_below_id_5_are_ignored(tmp_path: Path) -> None:
    toks = vocab()
    toks[:5] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "a", "b"]
    assert check_compatible(meta(tmp_path), meta(tmp_path, toks)).ok


def test_tokens_beyond_the_shorter_vocab_are_ignored(tmp_path: Path) -> None:
    longer = vocab(N_VOCAB + 50)
    longer[N_VOCAB + 10] = "anything"
    assert check_compatible(meta(tmp_path, longer), meta(tmp_path)).ok


def test_empty_token_text_matches_llama_cpp_placeholder(tmp_path: Path) -> None:
    a, b = vocab(), vocab()
    a[42], b[42] = "", "[EMPTY_42]"  # llama.cpp renames empty tokens on load
    assert check_compatible(meta(tmp_path, a), meta(tmp_path, b)).ok


def test_absent_add_bos_uses_llama_cpp_defaults(tmp_path: Path) -> None:
    # SPM: absent add_bos_token means true
    c = check(tmp_path, {"model": "llama", "add_bos": None}, {"model": "llama", "add_bos": False})
    assert not c.ok and c.rule == "add_bos"
    assert "llama.cpp default for SPM" in c.reason
    assert check(tmp_path, {"model": "llama", "add_bos": None}, {"model": "llama", "add_bos": True}).ok
    # BPE: false for most pre-tokenizers, true for llama3-style ones
    assert check(tmp_path, {"pre": "qwen2", "add_bos": None}, {"pre": "qwen2", "add_bos": False}).ok
    assert check(tmp_path, {"pre": "llama-bpe", "add_bos": None}, {"pre": "llama-bpe", "add_bos": True}).ok
    c = check(tmp_path, {"pre": "llama-bpe", "add_bos": None}, {"pre": "llama-bpe", "add_bos": False})
    assert c.rule == "add_bos"


def test_vocab_info_defaults(tmp_path: Path) -> None:
    spm = vocab_info(meta(tmp_path, model="llama", pre=None, add_bos=None, add_eos=None, bos=None, eos=None))
    assert (spm.type, spm.add_bos, spm.add_eos, spm.bos_id, spm.eos_id) == ("SPM", True, False, 1, 2)
    assert spm.add_bos_source == "default" and spm.bos_source == "default"
    bpe = vocab_info(meta(tmp_path, add_bos=None, add_eos=None, bos=None, eos=None))
    assert (bpe.type, bpe.add_bos, bpe.add_eos, bpe.bos_id, bpe.eos_id) == ("BPE", False, False, 11, 11)
    ugm = vocab_info(meta(tmp_path, model="t5", pre=None, add_bos=None, add_eos=None, bos=None, eos=None))
    assert (ugm.type, ugm.add_bos, ugm.add_eos, ugm.bos_id, ugm.eos_id) == ("UGM", False, True, None, 1)
    # an out-of-range id is ignored by llama.cpp, which keeps the default
    bad = vocab_info(meta(tmp_path, bos=N_VOCAB + 5))
    assert (bad.bos_id, bad.bos_source) == (11, "default")
    explicit = vocab_info(meta(tmp_path, add_bos=True, bos=3))
    assert (explicit.add_bos, explicit.add_bos_source, explicit.bos_id, explicit.bos_source) == (
        True, "file", 3, "file",
    )  # fmt: skip


def test_missing_tokenizer(tmp_path: Path) -> None:
    c = check(tmp_path, {}, {"model": None})
    assert not c.ok and c.rule == "vocab" and "draft" in c.reason and "tokenizer.ggml.model" in c.reason


def test_vocab_fingerprint(tmp_path: Path) -> None:
    a, b = meta(tmp_path, arch="qwen2"), meta(tmp_path, arch="llama")
    assert vocab_fingerprint(a) == vocab_fingerprint(b)
    assert len(vocab_fingerprint(a)) == 16
    toks = vocab()
    toks[9] = "other"
    assert vocab_fingerprint(meta(tmp_path, toks)) != vocab_fingerprint(a)
    assert vocab_fingerprint(meta(tmp_path, add_bos=True)) != vocab_fingerprint(a)


def test_check_files_missing(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nope"):
        check_files(make(tmp_path), tmp_path / "nope.gguf")
