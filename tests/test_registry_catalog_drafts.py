"""The catalog's drafts that are not a second model: a target's own MTP layers and heads for one target."""

from __future__ import annotations

import pytest

from models_registry.catalog import CatalogError, default_catalog, loads_catalog
from models_registry.catalog_facts import DRAFT_KINDS
from models_registry.fit import estimate_model, estimate_pair

MODEL = """
[[model]]
id = "{id}"
repo = "acme/{id}-GGUF"
family = "f"
tokenizer = "a"
architecture = "{arch}"
params = {params}
n_layers = 2
n_kv_heads = 1
head_dim = 64
context_length = 4096
license = "mit"
gated = false
{extra}
[model.files.Q4_K_M]
file = "{id}.gguf"
size = 1000
"""
PAIR = """
[[pair]]
id = "{target}+{draft}"
target = "{target}"
draft = "{draft}"
n_max = 4
p_min = 0.8
good_for = "tests"
"""
HEAD = 'draft_kind = "assistant"\ndrafts_for = ["big"]\nkv_layers = 0'


def catalog(*pairs: tuple[str, str], head: str = HEAD, big: str = "", other: str = "gemma4") -> str:
    """Targets ``big`` (gemma4) and ``other``, a head ``asst`` and a draft model ``small``, and ``pairs``."""
    models = (
        MODEL.format(id="big", arch="gemma4", params=100, extra=big)
        + MODEL.format(id="other", arch=other, params=90, extra="")
        + MODEL.format(id="asst", arch="gemma4-assistant", params=5, extra=head)
        + MODEL.format(id="small", arch="gemma4", params=10, extra="")
    )
    return models + "".join(PAIR.format(target=t, draft=d) for t, d in pairs)


def test_a_head_pairs_with_its_target_only() -> None:
    cat = loads_catalog(catalog(("big", "asst"), ("big", "small"), ("other", "small")))
    asst = cat.model("asst")
    assert (asst.draft_kind, asst.drafts_for, asst.kv_layers) == ("assistant", ("big",), 0)
    with pytest.raises(CatalogError, match="trained for big, not for 'other'"):
        loads_catalog(catalog(("other", "asst")))
    with pytest.raises(CatalogError, match="not a model that answers"):
        loads_catalog(catalog(("asst", "small")))


@pytest.mark.parametrize(
    ("head", "other", "match"),
    [
        ('draft_kind = "medusa"\ndrafts_for = ["big"]', "gemma4", "'draft_kind' must be one of"),
        ('draft_kind = "assistant"', "gemma4", "lists the target ids"),
        ('drafts_for = ["big"]', "gemma4", "'draft_kind' must be one of"),
        ('draft_kind = "eagle3"\ndrafts_for = ["big"]', "gemma4", "has architecture 'eagle3'"),
        ('draft_kind = "assistant"\ndrafts_for = ["nobody"]', "gemma4", "not a model of the catalog"),
        ('draft_kind = "assistant"\ndrafts_for = ["other"]', "llama", "drafts for a gemma4 model"),
        (HEAD + "\nmtp_layers = 1", "gemma4", "no 'mtp_layers' of its own"),
    ],
)
def test_broken_heads_rejected(head: str, other: str, match: str) -> None:
    with pytest.raises(CatalogError, match=match):
        loads_catalog(catalog(head=head, other=other))


def test_mtp_layers_checked_and_drafting_words() -> None:
    with pytest.raises(CatalogError, match="'mtp_layers' must be positive"):
        loads_catalog(catalog(big="mtp_layers = 0"))
    cat = loads_catalog(catalog(("big", "asst"), ("big", "small"), big="mtp_layers = 2"))
    head, model = (cat.drafting(p) for p in cat.pairs)
    assert head.sources == ("own MTP layers (2)", "Gemma 4 assistant", "prompt lookup", "drafting history")
    assert head.to_data()["draft_kind"] == "assistant" and head.to_data()["target_mtp_layers"] == 2
    assert model.sources[:2] == ("own MTP layers (2)", "draft model")
    # the draft pickers: its own layers first, then the head trained for it, then its pairs' drafts
    assert [(o.kind, o.draft) for o in cat.draft_options("big")] == [
        ("mtp", ""), ("assistant", "asst"), ("model", "small"),
    ]  # fmt: skip
    assert "own MTP layers (2, no draft file)" in cat.draft_options("big")[0].words
    assert cat.draft_options("other") == () and cat.draft_options("asst") == ()


def test_fit_counts_the_mtp_context_and_no_cache_for_an_assistant() -> None:
    plain = loads_catalog(catalog(("big", "asst")))
    mtp = loads_catalog(catalog(("big", "asst"), big="mtp_layers = 1"))
    kv = [estimate_model(c.model("big"), n_ctx=1024).kv for c in (plain, mtp)]
    assert kv[1] == kv[0] * 3 // 2  # two layers of its own and one MTP layer, each a full cache
    assert estimate_pair(mtp.model("big"), mtp.model("asst"), n_ctx=1024).draft.kv == 0


def test_the_real_catalog_offers_mtp_and_assistants() -> None:
    cat = default_catalog()
    mtp = cat.model("qwen3.6-27b-mtp")
    assert mtp.mtp_layers == 1 and mtp.repo == "unsloth/Qwen3.6-27B-MTP-GGUF"
    assert mtp.file().size == 17_106_773_120 and not mtp.file().size_approx
    assert cat.draft_options("qwen3.6-27b-mtp")[0].kind == "mtp"
    heads = [m for m in cat.models.values() if m.draft_kind]
    assert {m.id for m in heads} >= {"gemma-4-e2b-it-assistant", "gemma-4-31b-it-assistant"}
    for m in heads:
        assert m.architecture == DRAFT_KINDS[m.draft_kind] and m.sources
        assert all(p.target in m.drafts_for for p in cat.pairs if p.draft == m.id)
        assert any(p.draft == m.id for p in cat.pairs)  # the Models panel offers each head
    assert cat.model("gemma-4-31b-it-assistant").file().size == 514_687_104
    assert cat.model("gemma-4-e2b-it-assistant").file().size == 97_817_664
    assert not any(o.kind == "assistant" for o in cat.draft_options("qwen3.6-27b"))


def test_models_catalog_says_how_mtp_and_head_pairs_draft(capsys: pytest.CaptureFixture[str]) -> None:
    from models_registry import cli

    assert cli.main(["models", "catalog"]) == 0
    out = capsys.readouterr().out
    head = out.split("gemma-4-31b+assistant\n", 1)[1].split("\n\n")[0]
    assert "drafting: Gemma 4 assistant, prompt lookup" in head
    assert "drafting: own MTP layers (1), draft model" in out.split("qwen3.6-27b-mtp+3.5-0.8b\n", 1)[1]
