"""The Models panel's drafts that are not a second model: a target's own MTP layers, heads for one target."""

from __future__ import annotations

from pathlib import Path

from models_panel_kit import WAIT
from test_registry_catalog_drafts import EAGLE3, catalog, one_layer

from app.tiny_arch import write_tiny_model
from app.tiny_gguf import write_tiny_llama
from models_registry.catalog import default_catalog, loads_catalog


def _offered(ch) -> list[tuple[str, str]]:
    """What the draft picker offers: (kind, draft id) per item (its first item is a prompt)."""
    return [ch.draft_picker.itemData(i) for i in range(1, ch.draft_picker.count())]


def _pick(ch, kind: str) -> None:
    i = next(i for i in range(1, ch.draft_picker.count()) if ch.draft_picker.itemData(i)[0] == kind)
    ch.draft_picker.setCurrentIndex(i)
    ch.draft_picker.activated.emit(i)


def test_the_draft_picker_offers_own_mtp_layers_and_heads_of_the_target_only(make_panel) -> None:
    ch = make_panel(catalog=default_catalog()).chooser
    assert not ch.draft_picker.isVisibleTo(ch)  # no target yet
    ch.set_target("qwen3.6-27b-mtp")
    assert ch.draft_picker.isVisibleTo(ch)
    assert _offered(ch) == [("mtp", ""), ("model", "qwen3.5-0.8b")]
    assert "drafts with its own MTP layer" in ch.draft_picker.itemText(1)
    ch.set_draft("something")
    _pick(ch, "mtp")
    assert ch.draft_edit.text() == ""  # no draft file
    _pick(ch, "model")
    assert ch.draft_edit.text() == "qwen3.5-0.8b"
    # a head is offered as the draft of its target only
    ch.set_target("gemma-4-31b-it")
    assert ("assistant", "gemma-4-31b-it-assistant") in _offered(ch)
    assert "a Gemma 4 assistant" in ch.draft_picker.itemText(1)
    _pick(ch, "assistant")
    assert ch.draft_edit.text() == "gemma-4-31b-it-assistant"
    ch.set_target("gemma-4-e2b-it")
    assert _offered(ch) == [("assistant", "gemma-4-e2b-it-assistant")]
    ch.set_target("qwen3.6-27b")
    assert all(kind == "model" for kind, _ in _offered(ch))
    # a Hub file is known by its repository: the same file name without the MTP layer offers none
    ch.set_target("hf://unsloth/Qwen3.6-27B-MTP-GGUF/Qwen3.6-27B-Q4_K_M.gguf")
    assert _offered(ch)[0] == ("mtp", "")
    ch.set_target("hf://unsloth/Qwen3.6-27B-GGUF/Qwen3.6-27B-Q4_K_M.gguf")
    assert ("mtp", "") not in _offered(ch)
    ch.set_target("hf://unsloth/Qwen3.5-9B-MTP-GGUF/Qwen3.5-9B-Q8_0.gguf")
    assert _offered(ch) == [("mtp", ""), ("model", "qwen3.5-0.8b")]
    # a local file known by its name alone is the plain entry's (docs/models.md)
    ch.set_target("/models/Qwen3.5-9B-Q8_0.gguf")
    assert _offered(ch) == [("model", "qwen3.5-0.8b")]
    ch.set_target("/nowhere/unknown.gguf")
    assert not ch.draft_picker.isVisibleTo(ch)


def test_the_draft_picker_offers_an_eagle3_head_for_its_target_only(make_panel) -> None:
    text = catalog(("big", "asst"), ("big", "small"), ("other", "small"), head=EAGLE3, head_arch="eagle3",
                   other="llama")  # fmt: skip
    ch = make_panel(catalog=loads_catalog(one_layer(text, "asst"))).chooser
    ch.set_target("big")
    assert _offered(ch) == [("eagle3", "asst"), ("model", "small")]
    assert "an EAGLE-3 head" in ch.draft_picker.itemText(1)
    _pick(ch, "eagle3")
    assert ch.draft_edit.text() == "asst"
    ch.set_target("other")
    assert _offered(ch) == [("model", "small")]
    ch.set_target("asst")  # a head is no target: nothing to offer
    assert not ch.draft_picker.isVisibleTo(ch)


def test_a_target_with_mtp_layers_loads_without_a_draft(make_panel, qtbot, tmp_path: Path) -> None:
    panel = make_panel(catalog=default_catalog())
    ch = panel.chooser
    mtp = write_tiny_model(tmp_path / "tiny-mtp.gguf", "qwen35", mtp=1)
    ch.set_target(str(mtp))
    assert ch.check_button.isEnabled() and ch.draft_edit.text() == ""
    with qtbot.waitSignal(ch.checked, timeout=WAIT) as sig:
        ch.check_button.click()
    res = sig.args[0]
    assert res.ok and res.local and res.draft is None
    assert "No draft needed" in ch.verdict.text() and "1 multi-token-prediction layer" in ch.verdict.text()
    with qtbot.waitSignal(panel.loadRequested) as load:
        ch.load_button.click()
    assert load.args == [str(mtp), ""]
    # a target without MTP layers still needs a draft
    plain = write_tiny_llama(tmp_path / "tiny-plain.gguf")
    ch.set_target(str(plain))
    with qtbot.waitSignal(ch.checked, timeout=WAIT) as sig:
        ch.check_button.click()
    assert not sig.args[0].ok and not ch.load_button.isEnabled()
    assert "no multi-token-prediction layers" in ch.verdict.text()


def test_catalog_pair_details_name_own_mtp_layers_and_heads(make_panel) -> None:
    panel = make_panel(catalog=default_catalog())
    panel.select_pair("gemma-4-31b+assistant")
    d = panel.details
    assert "(Gemma 4 assistant)" in d.title.text()
    assert "Gemma 4 assistant, prompt lookup" in d.info.text() and "for this target only" in d.info.text()
    panel.select_pair("qwen3.6-27b-mtp+3.5-0.8b")
    assert "(draft)" in d.title.text()
    assert "own MTP layers (1)" in d.info.text() and "it can also run alone" in d.info.text()
