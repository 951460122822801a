"""The catalog's drafts that are not a second model: a target's own MTP layers and heads for one target."""

from __future__ import annotations

from pathlib import Path

import pytest

from models_registry import library
from models_registry.catalog import CatalogError, default_catalog, loads_catalog
from models_registry.catalog_facts import DRAFT_KINDS
from models_registry.fit import estimate_model, estimate_pair, kv_cache_bytes

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
ASST = "gemma4-assistant"
EAGLE3 = 'draft_kind = "eagle3"\ndrafts_for = ["big"]'  # one layer with a KV cache of its own


def catalog(
    *pairs: tuple[str, str], head: str = HEAD, big: str = "", other: str = "gemma4", head_arch: str = ASST
) -> str:
    """Targets ``big`` (gemma4) and ``other``, a head ``asst`` (architecture ``head_arch``), a draft model
    ``small``, and ``pairs``."""
    models = (
        MODEL.format(id="big", arch="gemma4", params=100, extra=big)
        + MODEL.format(id="other", arch=other, params=90, extra="")
        + MODEL.format(id="asst", arch=head_arch, params=5, extra=head)
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


def one_layer(text: str, model_id: str) -> str:
    """``text`` with model ``model_id`` given one layer (the pinned loader's EAGLE-3 head has one)."""
    before, sep, rest = text.partition(f'id = "{model_id}"\n')
    return before + sep + rest.replace("n_layers = 2", "n_layers = 1", 1)


def test_an_eagle3_head_loads_fits_and_is_offered_for_its_target_only() -> None:
    text = catalog(("big", "asst"), ("big", "small"), ("other", "small"), head=EAGLE3, head_arch="eagle3",
                   other="llama")  # fmt: skip
    cat = loads_catalog(one_layer(text, "asst"))
    head = cat.model("asst")
    assert (head.draft_kind, head.drafts_for, head.architecture) == ("eagle3", ("big",), "eagle3")
    assert head.kv_layers == head.n_layers == 1 and head.mtp_layers == 0
    # the fit counts the head as the draft: its file and the cache of its one layer
    need = estimate_pair(cat.model("big"), head, n_ctx=1024)
    assert need.draft.weights == head.file().size == 1000
    assert need.draft.kv == kv_cache_bytes(1, 1024, head.n_kv_heads, head.head_dim) > 0
    assert need.total == need.target.total + need.draft.total + need.overhead
    drafting = cat.drafting(cat.pair("big+asst"))
    assert drafting.sources[0] == "EAGLE-3 head" and drafting.to_data()["draft_kind"] == "eagle3"
    # the draft picker: offered for its target, after nothing else of its own, and for no other target
    assert [(o.kind, o.draft) for o in cat.draft_options("big")] == [("eagle3", "asst"), ("model", "small")]
    assert cat.draft_options("big")[0].words == "asst: an EAGLE-3 head"
    assert [(o.kind, o.draft) for o in cat.draft_options("other")] == [("model", "small")]
    assert cat.draft_options("asst") == ()
    with pytest.raises(CatalogError, match="an EAGLE-3 head trained for big, not for 'other'"):
        loads_catalog(
            one_layer(catalog(("other", "asst"), head=EAGLE3, head_arch="eagle3", other="llama"), "asst")
        )
    with pytest.raises(CatalogError, match="an EAGLE-3 head has one layer, not 2"):
        loads_catalog(catalog(head=EAGLE3, head_arch="eagle3"))


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


#: the real catalog's MTP entries: the plain entry each is a conversion of, and its default file's size
MTP_TWINS = {
    "qwen3.6-27b-mtp": ("qwen3.6-27b", 17_106_773_120),
    "qwen3.5-4b-mtp": ("qwen3.5-4b", 2_834_975_040),
    "qwen3.5-9b-mtp": ("qwen3.5-9b", 5_868_826_976),
    "qwen3.6-35b-a3b-mtp": ("qwen3.6-35b-a3b", 22_663_387_424),
}
SAME = ("family", "tokenizer", "architecture", "params", "active_params", "experts", "experts_used",
        "n_layers", "n_kv_heads", "head_dim", "context_length", "kv_layers", "recurrent_state", "license",
        "gated")  # fmt: skip


def test_the_real_catalogs_mtp_entries_are_their_plain_twins_with_one_mtp_layer() -> None:
    cat = default_catalog()
    assert {m.id for m in cat.models.values() if m.mtp_layers} == set(MTP_TWINS)
    for mid, (plain_id, size) in MTP_TWINS.items():
        m, plain = cat.model(mid), cat.model(plain_id)
        assert m.mtp_layers == 1 and not plain.mtp_layers
        assert [getattr(m, f) for f in SAME] == [getattr(plain, f) for f in SAME], mid
        assert m.repo == plain.repo.replace("-GGUF", "-MTP-GGUF") and m.sources
        assert m.file().size == size and not any(qf.size_approx for qf in m.files.values())
        # the fit adds the MTP context: one more full-context KV layer of the model's geometry
        kv = [estimate_model(x, n_ctx=4096).kv for x in (plain, m)]
        assert kv[1] - kv[0] == kv_cache_bytes(1, 4096, m.n_kv_heads, m.head_dim)
        # the pickers offer its own layer first, and the plain twin's none; each MTP entry has a pair
        assert cat.draft_options(mid)[0].kind == "mtp"
        assert all(o.kind != "mtp" for o in cat.draft_options(plain_id))
        pairs = [p for p in cat.pairs if p.target == mid]
        own = ("own MTP layers (1)", "draft model")
        assert pairs and all(cat.drafting(p).sources[:2] == own for p in pairs)


def test_a_file_name_an_mtp_entry_shares_with_its_plain_twin(tmp_path: Path) -> None:
    """unsloth publishes the MTP conversions under the plain ones' file names: a Hub file is known by its
    repository; a file known by its name alone (in a user folder) is taken for the plain entry."""
    cat = default_catalog()
    owners: dict[str, list] = {}
    for m in cat.models.values():
        for qf in m.files.values():
            for name in qf.names():
                owners.setdefault(name.lower(), []).append((m, qf))
    shared = {name: hits for name, hits in owners.items() if len(hits) > 1}
    assert len(shared) == 6  # 27B Q4_K_M; 4B and 9B Q4_K_M and Q8_0; 35B-A3B UD-Q4_K_M
    for name, hits in shared.items():
        plain = [(m, qf) for m, qf in hits if not m.mtp_layers]
        assert len(hits) == 2 and len(plain) == 1, name  # one plain entry and its MTP twin, nothing else
        assert MTP_TWINS[next(m.id for m, _ in hits if m.mtp_layers)][0] == plain[0][0].id
        assert cat.find_filename(name) == plain[0]
        assert all(cat.find_file(m.repo, qf.file) == (m, qf) for m, qf in hits)
        assert hits[0][1].size != hits[1][1].size  # the speeds measured per file (name and size) stay apart
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "Qwen3.5-9B-Q8_0.gguf").write_bytes(b"GGUF" + b"\0" * 96)
    [found] = library.list_local(cache_dir=tmp_path / "no-cache", folders=[folder], catalog=cat)
    assert (found.catalog_id, found.quant) == ("qwen3.5-9b", "Q8_0")


def test_models_catalog_says_how_mtp_and_head_pairs_draft(capsys: pytest.CaptureFixture[str]) -> None:
    from models_registry import cli

    assert cli.main(["models", "catalog"]) == 0
    out = capsys.readouterr().out
    head = out.split("gemma-4-31b+assistant\n", 1)[1].split("\n\n")[0]
    assert "drafting: Gemma 4 assistant, prompt lookup" in head
    assert "drafting: own MTP layers (1), draft model" in out.split("qwen3.6-27b-mtp+3.5-0.8b\n", 1)[1]
