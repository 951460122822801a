"""Catalog loading and validation."""

from __future__ import annotations

import json

import pytest

from app.gguf.arch import MemoryKind, Rollback
from app.gguf.memory import RECURRENT_SNAPSHOTS
from app.gguf.split import part_names, split_info
from models_registry.catalog import (
    CatalogError,
    PartFile,
    default_catalog,
    load_catalog,
    loads_catalog,
    validate_filename,
    validate_repo_id,
)
from models_registry.drafting import PairDrafting

MODEL = """
[[model]]
id = "{id}"
repo = "{repo}"
family = "f"
tokenizer = "{tok}"
architecture = "llama"
params = {params}
n_layers = 2
n_kv_heads = 1
head_dim = 64
context_length = 4096
license = "mit"
gated = false
[model.files.Q4_K_M]
file = "{file}"
size = 1000
"""
PAIR = """
[[pair]]
id = "p"
target = "{target}"
draft = "{draft}"
n_max = 8
p_min = 0.8
good_for = "tests"
"""


def text(t: dict | None = None, d: dict | None = None, pair: dict | None = None) -> str:
    tm = {"id": "big", "repo": "acme/Big-GGUF", "tok": "a", "params": 100, "file": "big.gguf", **(t or {})}
    dm = {
        "id": "small",
        "repo": "acme/Small-GGUF",
        "tok": "a",
        "params": 10,
        "file": "small.gguf",
        **(d or {}),
    }
    return (
        MODEL.format(**tm)
        + MODEL.format(**dm)
        + PAIR.format(**{"target": "big", "draft": "small", **(pair or {})})
    )


def test_real_catalog_loads() -> None:
    cat = load_catalog()
    assert cat == default_catalog()
    assert len(cat.pairs) >= 8
    assert len({cat.model(p.target).tokenizer for p in cat.pairs}) >= 4
    for p in cat.pairs:
        t, d = cat.model(p.target), cat.model(p.draft)
        assert t.tokenizer == d.tokenizer and d.params < t.params
        assert t.file().file.endswith(".gguf") and t.default_quant in t.files
    coder = cat.model("qwen2.5-coder-7b-instruct")
    assert coder.repo == "Qwen/Qwen2.5-Coder-7B-Instruct-GGUF"
    q4 = coder.file("Q4_K_M")
    assert q4.file == "qwen2.5-coder-7b-instruct-q4_k_m-00001-of-00002.gguf" and q4.split
    assert q4.size == 3_993_201_376 + 689_872_288 and not q4.size_approx
    assert cat.find_file("qwen/qwen2.5-coder-7b-instruct-gguf", coder.file().file) == (coder, coder.file())
    assert cat.find_file(coder.repo, q4.parts[1].file) == (coder, q4)  # any part names the model
    # the two files the benchmarks use, at the sizes on this machine's disk
    assert cat.model("qwen2.5-coder-1.5b-instruct").file("Q4_K_M").size == 1_117_320_768
    assert cat.model("qwen2.5-coder-0.5b-instruct").file("Q4_K_M").size == 491_400_064


def test_every_catalog_file_has_a_positive_size_and_consistent_parts() -> None:
    cat = default_catalog()
    assert any(qf.split for m in cat.models.values() for qf in m.files.values())
    for m in cat.models.values():
        for qf in m.files.values():
            where = f"{m.id} {qf.quant}"
            assert qf.size > 0 and all(p.size > 0 for p in qf.downloads), where
            assert qf.size == sum(p.size for p in qf.downloads), where
            if qf.split:
                names = [p.file for p in qf.parts]
                assert names == part_names(qf.file) and len(names) >= 2, where
                assert [split_info(n)[1:] for n in names] == [
                    (i, len(names)) for i in range(1, len(names) + 1)
                ]
                assert qf.file == names[0], where
            else:
                assert split_info(qf.file) is None and qf.downloads == (PartFile(qf.file, qf.size),), where
    # the laptop pairs: a small target and its draft, no GPU needed
    for pid in ("qwen2.5-coder-1.5b+0.5b", "qwen2.5-coder-3b+0.5b", "qwen3-1.7b+0.6b", "qwen3-4b+0.6b",
                "llama-3.2-3b+1b"):  # fmt: skip
        p = cat.pair(pid)
        assert cat.model(p.target).file().size + cat.model(p.draft).file().size < 5_000_000_000


SPLIT = """
[model.files.Q8_0]
file = "big-q8_0-00001-of-00003.gguf"
parts = [
  { file = "big-q8_0-00001-of-00003.gguf", size = 400 },
  { file = "big-q8_0-00002-of-00003.gguf", size = 300 },
  { file = "big-q8_0-00003-of-00003.gguf", size = 100 },
]
"""


def test_split_files_are_parsed_and_checked() -> None:
    cat = loads_catalog(text().replace("[[model]]", SPLIT + "\n[[model]]", 2).replace(SPLIT, "", 1))
    qf = cat.model("big").file("Q8_0")
    assert (qf.file, qf.size, qf.split) == ("big-q8_0-00001-of-00003.gguf", 800, True)
    assert qf.names() == tuple(part_names(qf.file))
    assert cat.find_filename("BIG-Q8_0-00003-of-00003.gguf") == (cat.model("big"), qf)

    def broken(split: str, match: str) -> None:
        with pytest.raises(CatalogError, match=match):
            loads_catalog(text().replace("[[model]]", split + "\n[[model]]", 2).replace(split, "", 1))

    broken(SPLIT.replace("size = 100", "size = 0"), "part 3: field 'size' must be positive")
    broken(SPLIT.replace("00003-of-00003.gguf\", size = 100", "00004-of-00003.gguf\", size = 100"),
           "'parts' must be big-q8_0-00001-of-00003.gguf, big-q8_0-00002")  # fmt: skip
    broken(SPLIT.replace('file = "big-q8_0-00001-of-00003.gguf"\n', 'file = "big-q8_0.gguf"\n', 1),
           "must be the first part of a split model")  # fmt: skip
    broken(
        SPLIT.replace("parts = [", "size = 801\nparts = ["), r"'size' must be the sum of the parts \(800\)"
    )
    broken(SPLIT.split("parts")[0] + "size = 10\n", "is one part of a split model: list every part")
    first = '{ file = "big-q8_0-00001-of-00003.gguf", size = 400 }'
    broken(SPLIT.replace(first, "'big-q8_0-00001-of-00003.gguf'"), "part 1: must be a table")


def test_minimal_catalog_ok() -> None:
    cat = loads_catalog(text())
    assert list(cat.models) == ["big", "small"] and cat.pair("p").draft == "small"


@pytest.mark.parametrize(
    ("t", "match"),
    [
        (
            {"file": "../big.gguf"},
            r"model 'big' file Q4_K_M: file name '\.\./big\.gguf' must be a plain name",
        ),
        ({"file": "/etc/big.gguf"}, "is an absolute path"),
        ({"file": "dir/big.gguf"}, "must be a plain name without '/'"),
        ({"file": "C:big.gguf"}, "absolute path"),
        ({"file": "big\\\\x.gguf"}, "backslash"),
        ({"file": "big\\u0007.gguf"}, "control characters"),
        ({"file": "big.bin"}, "must end in '.gguf'"),
        ({"repo": "acme"}, r"model 'big': repo id 'acme' must have the form 'owner/name'"),
        ({"repo": "acme/Big/x"}, "must have the form"),
        ({"repo": "ac me/Big"}, "may only use letters"),
        ({"repo": "acme/-Big"}, "may only use letters"),
        ({"repo": "acme/Big--x"}, "nor contain '--'"),
        ({"id": "small"}, "duplicate model id 'small'"),
        ({"params": "0"}, "'params' must be positive"),
    ],
)
def test_broken_models_rejected(t: dict, match: str) -> None:
    with pytest.raises(CatalogError, match=match):
        loads_catalog(text(t=t))


@pytest.mark.parametrize(
    ("pair", "d", "match"),
    [
        ({"draft": "ghost"}, None, "pair 'p': draft 'ghost' is not a model of the catalog"),
        ({"target": "ghost"}, None, "target 'ghost' is not a model"),
        ({}, {"tok": "b"}, "do not share a tokenizer family"),
        ({}, {"params": 1000}, "is not smaller than target"),
        ({"draft": "big"}, None, "the same model"),
    ],
)
def test_broken_pairs_rejected(pair: dict, d: dict | None, match: str) -> None:
    with pytest.raises(CatalogError, match=match):
        loads_catalog(text(d=d, pair=pair))


def test_missing_field_and_bad_toml() -> None:
    with pytest.raises(CatalogError, match="model 'big': missing required field 'license'"):
        loads_catalog(text().replace('license = "mit"\n', "", 1))
    with pytest.raises(CatalogError, match="field 'gated' must be a boolean"):
        loads_catalog(text().replace("gated = false", 'gated = "no"', 1))
    with pytest.raises(CatalogError, match="invalid TOML"):
        loads_catalog("[[model]\n")
    with pytest.raises(CatalogError, match="default quantization Q4_K_M is not among its files"):
        loads_catalog(text().replace("[model.files.Q4_K_M]", "[model.files.Q8_0]", 1))


def test_validators_directly() -> None:
    assert validate_repo_id("bartowski/Qwen2.5-7B-Instruct-GGUF")
    assert validate_filename("Q8_0/m-00001-of-00002.gguf", allow_subfolder=True)
    for bad in ("a/../b.gguf", "a//b.gguf", "./b.gguf"):
        with pytest.raises(CatalogError):
            validate_filename(bad, allow_subfolder=True)


def with_facts(arch: str = "llama", extra: str = "", draft_arch: str = "llama") -> str:
    """The minimal catalog with the target's architecture and extra fields replaced."""
    big, small = text().split("[[model]]")[1:3]
    big = big.replace('architecture = "llama"', f'architecture = "{arch}"\n{extra}')
    small = small.replace('architecture = "llama"', f'architecture = "{draft_arch}"')
    return "[[model]]" + big + "[[model]]" + small


def test_optional_architecture_facts() -> None:
    cat = loads_catalog(with_facts())
    big = cat.model("big")
    assert (big.active_params, big.kv_layers, big.experts, big.sliding_window, big.recurrent_state) == (
        100, 2, 0, 0, 0,
    )  # fmt: skip
    assert big.memory is MemoryKind.ATTENTION and big.rollback is Rollback.TRIM and not big.moe
    moe = loads_catalog(with_facts("qwen3moe", "active_params = 30\nexperts = 128\nexperts_used = 8\n"
                                   'sources = ["https://huggingface.co/acme/Big"]'))  # fmt: skip
    m = moe.model("big")
    assert (m.active_params, m.experts, m.experts_used, m.moe) == (30, 128, 8, True)
    assert m.sources == ("https://huggingface.co/acme/Big",)
    swa = loads_catalog(with_facts("gemma3", "sliding_window = 1024\nsliding_layers = 1")).model("big")
    assert swa.memory is MemoryKind.SLIDING_WINDOW and swa.rollback is Rollback.TRIM
    hybrid = loads_catalog(with_facts("qwen35", "kv_layers = 1\nrecurrent_state = 4096"))
    h = hybrid.model("big")
    assert (h.kv_layers, h.recurrent_state, h.memory, h.rollback) == (
        1, 4096, MemoryKind.HYBRID, Rollback.SNAPSHOT,
    )  # fmt: skip
    rec = loads_catalog(with_facts("mamba", "kv_layers = 0\nrecurrent_state = 4096")).model("big")
    assert rec.kv_layers == 0 and rec.rollback is Rollback.CHECKPOINT


@pytest.mark.parametrize(
    ("arch", "extra", "match"),
    [
        ("llama", "experts = 8", "'experts' and 'experts_used' go together"),
        ("llama", "experts = 8\nexperts_used = 9", "'experts_used' \\(9\\) exceeds 'experts'"),
        ("llama", "experts = 0\nexperts_used = 0", "'experts' must be positive"),
        ("llama", "active_params = 101", "'active_params' exceeds 'params'"),
        ("llama", "active_params = true", "'active_params' must be an integer, got a boolean"),
        ("llama", "kv_layers = 3", "'kv_layers' \\(3\\) exceeds 'n_layers'"),
        ("llama", "kv_layers = -1", "'kv_layers' must not be negative"),
        ("llama", "sliding_window = 512", "'sliding_window' and 'sliding_layers' go together"),
        ("gemma3", "sliding_window = 512\nsliding_layers = 3", "'sliding_layers' exceeds the layers"),
        ("qwen35", "kv_layers = 1", "a hybrid model needs 'recurrent_state'"),
        ("mamba2", "kv_layers = 0", "a recurrent model needs 'recurrent_state'"),
        ("llama", "recurrent_state = -4", "'recurrent_state' must not be negative"),
        ("llama", 'sources = "https://x"', "'sources' must be a list of one-line strings"),
        ("llama", 'sources = [""]', "'sources' must be a list"),
    ],
)
def test_broken_architecture_facts_rejected(arch: str, extra: str, match: str) -> None:
    with pytest.raises(CatalogError, match=match):
        loads_catalog(with_facts(arch, extra))


def test_pair_drafting_in_the_catalog_data() -> None:
    cat = loads_catalog(with_facts("qwen35", "kv_layers = 1\nrecurrent_state = 4096"))
    data = cat.to_data()
    assert data["models"]["big"]["memory"] == "hybrid" and data["models"]["big"]["moe"] is False
    assert data["models"]["big"]["kv_layers"] == 1 and data["models"]["small"]["rollback"] == "trim"
    assert data["models"]["big"]["sources"] == []
    drafting = data["pairs"][0]["drafting"]
    assert drafting == {
        "target_memory": "hybrid", "draft_memory": "attention", "target_rollback": "snapshot",
        "draft_rollback": "trim", "longest_snapshot_draft": RECURRENT_SNAPSHOTS,
        "sources": ["draft model", "prompt lookup", "drafting history"],
        "target_mtp_layers": 0, "draft_kind": "model",
    }  # fmt: skip
    json.dumps(data)  # JSON-ready
    d = cat.drafting(cat.pair("p"))
    assert "up to 16 tokens a round" in d.words and "; the draft model by trimming its KV cache" in d.words
    assert d.words.startswith("drafting: draft model, prompt lookup, drafting history; target rolls back by")
    plain = loads_catalog(text()).drafting(loads_catalog(text()).pair("p"))
    assert plain.longest_snapshot_draft is None and "any draft length" in plain.words
    ck = loads_catalog(with_facts("mamba", "kv_layers = 0\nrecurrent_state = 64")).to_data()
    assert ck["pairs"][0]["drafting"]["longest_snapshot_draft"] == 0
    # a hybrid draft drafts one token at a time: it rolls back by checkpoint, not by snapshots
    both = with_facts("qwen35", "kv_layers = 1\nrecurrent_state = 4096", draft_arch="qwen35")
    head, tail = both.rsplit('architecture = "qwen35"', 1)  # the draft's
    both = head + 'architecture = "qwen35"\nkv_layers = 1\nrecurrent_state = 64' + tail
    hh = loads_catalog(both)
    d = hh.drafting(hh.pair("p"))
    assert (d.target_rollback, d.draft_rollback, d.longest_snapshot_draft) == (
        Rollback.SNAPSHOT, Rollback.CHECKPOINT, 0,
    )  # fmt: skip
    assert "; the draft model by checkpoint and replay" in d.words
    none = PairDrafting(MemoryKind.RECURRENT, MemoryKind.ATTENTION, Rollback.NONE, Rollback.TRIM)
    assert "cannot undo a rejected draft" in none.words


def test_real_catalog_facts_are_consistent() -> None:
    for m in default_catalog().models.values():
        assert m.active_params <= m.params and m.kv_layers <= m.n_layers, m.id
        assert (m.recurrent_state > 0) == (m.memory in (MemoryKind.HYBRID, MemoryKind.RECURRENT)), m.id
        assert m.moe == (m.experts > 1), m.id
    cat = default_catalog()
    for p in cat.pairs:
        t, d = cat.model(p.target), cat.model(p.draft)
        draft = {"eagle3": "EAGLE-3 head", "assistant": "Gemma 4 assistant"}.get(d.draft_kind, "draft model")
        own = (f"own MTP layers ({t.mtp_layers})",) if t.mtp_layers else ()
        assert cat.drafting(p).sources == (*own, draft, "prompt lookup", "drafting history")
