"""Checks of the tiny GGUF builder of qwen35, gemma3, qwen3moe and mamba2 models, with the real llama.cpp."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf import GGUFReader

from app.gguf.arch import MemoryKind, arch_facts
from app.gguf.meta import read_metadata_file
from app.tiny_arch import (
    ARCHS,
    QWEN35_2B_SHAPE,
    count_params,
    model_shape,
    write_tiny_arch_pair,
    write_tiny_model,
)
from app.tiny_gguf import CHATML_TEMPLATE, build_tokenizer

PROMPTS = ["The quick brown fox", "def foo():\n", "Hello world", "She said that"]
MEMORY = {
    "qwen35": MemoryKind.HYBRID,
    "gemma3": MemoryKind.SLIDING_WINDOW,
    "qwen3moe": MemoryKind.ATTENTION,
    "mamba2": MemoryKind.RECURRENT,
}


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    root = tmp_path_factory.mktemp("tiny_arch")
    return {arch: write_tiny_arch_pair(root / arch, arch) for arch in ARCHS}


@pytest.mark.parametrize("arch", ARCHS)
def test_files_are_deterministic_small_and_classified(
    arch: str, pairs: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    target, draft = pairs[arch]
    again, _ = write_tiny_arch_pair(tmp_path, arch)
    assert target.read_bytes() == again.read_bytes()
    assert target.read_bytes() != draft.read_bytes()
    assert 100_000 < target.stat().st_size < 1_500_000

    reader = GGUFReader(target)
    assert reader.get_field("general.architecture").contents() == arch
    assert reader.get_field("tokenizer.ggml.tokens").contents() == list(build_tokenizer("a").tokens)
    assert reader.get_field("tokenizer.chat_template").contents() == CHATML_TEMPLATE
    assert sum(int(np.prod(t.shape)) for t in reader.tensors) == count_params(arch)

    facts = arch_facts(read_metadata_file(target))
    assert facts.memory is MEMORY[arch]
    assert facts.moe is (arch == "qwen3moe")
    if arch == "gemma3":
        assert facts.sliding_window == 16
    if arch == "qwen3moe":
        assert (facts.experts, facts.experts_used) == (8, 2)


def test_shapes() -> None:
    assert count_params("qwen35", QWEN35_2B_SHAPE) == 1_881_825_088  # llama.cpp's count for Qwen3.5-2B
    assert model_shape("mamba2", {"n_layer": 3})["n_layer"] == 3
    with pytest.raises(ValueError, match="unknown"):
        model_shape("gemma3", {"n_expert": 4})
    with pytest.raises(ValueError, match="unknown architecture"):
        model_shape("llama")
    with pytest.raises(ValueError, match="F32"):
        write_tiny_model("never.gguf", "qwen35", shape=QWEN35_2B_SHAPE)


# ---- against the real llama.cpp ----


@pytest.fixture(scope="module")
def llama() -> Any:
    pytest.importorskip("llama_cpp")
    from app.engine import llama

    return llama


def _greedy(ctx: Any, ids: list[int], n: int) -> list[int]:
    ctx.clear()
    ctx.decode(ids, 0)
    out: list[int] = []
    for _ in range(n):
        logits = ctx.logits(-1)
        assert np.isfinite(logits).all()
        out.append(int(logits.argmax()))
        ctx.decode(out[-1:], len(ids) + len(out) - 1)
    return out


@pytest.mark.parametrize("arch", ARCHS)
def test_llama_cpp_loads_generates_and_drafts(
    arch: str, pairs: dict[str, tuple[Path, Path]], llama: Any
) -> None:
    import llama_cpp

    target, draft = (llama.Model(p) for p in pairs[arch])
    handle = target._handle
    assert llama_cpp.llama_model_is_recurrent(handle) == (arch == "mamba2")
    assert llama_cpp.llama_model_is_hybrid(handle) == (arch == "qwen35")
    assert llama_cpp.llama_model_n_swa(handle) == (16 if arch == "gemma3" else 0)
    assert target.n_params == count_params(arch) and target.n_vocab == 509
    assert target.chat_template() == CHATML_TEMPLATE

    tctx, dctx = llama.Context(target, n_ctx=128), llama.Context(draft, n_ctx=128)
    agree = total = 0
    continuations = set()
    for prompt in PROMPTS:
        ids = target.tokenize(prompt, add_special=False, parse_special=True)
        gen = _greedy(tctx, ids, 24)
        assert len(set(gen)) > 8, gen  # not one token repeated
        continuations.add(tuple(gen))
        full = ids + gen
        dctx.clear()
        dctx.decode(full, 0, logits="all")
        for i in range(len(ids) - 1, len(full) - 1):
            total += 1
            agree += int(dctx.logits(i).argmax() == full[i + 1])
    assert len(continuations) == len(PROMPTS)
    assert 0.45 <= agree / total <= 0.8, agree / total


@pytest.mark.parametrize("arch", ARCHS)
def test_batched_equals_sequential(arch: str, pairs: dict[str, tuple[Path, Path]], llama: Any) -> None:
    """A batch of N tokens gives the logits of N single-token decodes (F32, no flash attention: llama.cpp's
    CPU flash attention accumulates in F16 and moves logits by up to ~0.05, for llama models too)."""
    model = llama.Model(pairs[arch][0])
    ctx = llama.Context(model, n_ctx=128, flash_attn=False)
    ids = model.tokenize(
        PROMPTS[0] + " jumps over the lazy dog. " + PROMPTS[1], add_special=False, parse_special=True
    )
    seq = ids + _greedy(ctx, ids, 24)  # over 16 tokens: gemma3's window slides
    ctx.clear()
    ctx.decode(seq, 0, logits="all")
    batched = np.array([ctx.logits(i) for i in range(len(seq))])
    ctx.clear()
    single = []
    for i, token in enumerate(seq):
        ctx.decode([token], i)
        single.append(ctx.logits(-1).copy())
    sequential = np.array(single)
    top2 = np.sort(sequential, axis=1)[:, -2:]
    assert (batched.argmax(axis=1) == sequential.argmax(axis=1)).all()
    assert np.abs(batched - sequential).max() < 0.02 < 0.5 * sequential.std(axis=1).mean()
    assert np.median(top2[:, 1] - top2[:, 0]) > 0.1


@pytest.mark.parametrize("quant", ["Q4_0", "Q8_0"])
def test_quantized_and_big_shapes_load(quant: str, tmp_path: Path, llama: Any) -> None:
    """Quantized tiny files, and a wider qwen35 whose big matrices are raw random quantized blocks and whose
    vocabulary is padded to 4096 tokens, load and generate finite, varied text."""
    wide = {"n_embd": 512, "n_ff": 2048, "n_vocab": 4096, "tied": True}
    files = [write_tiny_model(tmp_path / f"{arch}.gguf", arch, quant=quant) for arch in ARCHS]
    files.append(write_tiny_model(tmp_path / "wide.gguf", "qwen35", quant=quant, shape=wide))
    for path in files:
        model = llama.Model(path)
        ids = model.tokenize(PROMPTS[0], add_special=False, parse_special=True)
        assert len(set(_greedy(llama.Context(model, n_ctx=64), ids, 12))) > 4, path.name
    assert model.n_params == count_params("qwen35", wide) and model.n_vocab == 4096
