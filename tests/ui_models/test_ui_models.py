"""The Models panel against the local fake Hub (pytest-qt, offscreen, no network)."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import dataclasses
import html
import shutil
from pathlib import Path

import pytest
from arch_headers import hybrid_and_moe
from models_panel_kit import (
    GAMER,
    LAPTOP,
    WAIT,
    GiB,
)
from PySide6.QtCore import QObject, Qt, Signal

from app.gguf.compat import check_files
from app.ui.core.settings import AppSettings
from app.ui.models import models_panel
from app.ui.models.catalog_table import BadgeRole, CatalogTableModel
from app.ui.models.downloads_view import fmt_eta
from app.ui.models.models_install import install_models_panel
from app.ui.models.models_panel import ModelsPanel, should_show_first_run
from app.ui.models.pair_chooser import normalize_ref
from models_registry import library
from models_registry.bandwidth import Bandwidth
from models_registry.catalog import default_catalog
from models_registry.fit import Machine, recommend
from models_registry.measured import SpeedStore
from models_registry.units import format_bytes

pytestmark = pytest.mark.timeout(60)

# ------------------------------------------------------------------------------------------- catalog


def test_catalog_table_shows_every_pair_with_fit_badge(make_panel) -> None:
    cat = default_catalog()
    for machine in (GAMER, LAPTOP):
        panel = make_panel(machine=machine)
        model = panel.model
        assert model.rowCount() == len(cat.pairs)
        assert {r.pair.id for r in panel.rows()} == {p.id for p in cat.pairs}
        best = recommend(machine, catalog=cat)
        assert best is not None and best.pair is not None
        assert panel.rows()[0].pair.id == best.pair.id and panel.rows()[0].recommended
        assert sum(r.recommended for r in panel.rows()) == 1
        assert model.index(0, CatalogTableModel.TARGET).data().startswith("★ ")
        badges = [model.index(i, CatalogTableModel.FIT).data(BadgeRole) for i in range(model.rowCount())]
        for text, fg, bg in badges:
            assert text.startswith(("GPU", "Partly on GPU", "CPU only", "Does not fit"))
            assert fg.startswith("#") and bg.startswith("#")
        texts = {b[0].split(":")[0].split(" (")[0] for b in badges}
        if machine is GAMER:
            assert {"GPU", "Partly on GPU", "Does not fit"} <= texts
            assert any(
                f"/{r.fit.need.target.n_layers} layers" in b[0]
                for r, b in zip(panel.rows(), badges, strict=True)
            )
        else:
            assert texts <= {"CPU only", "Does not fit"}
        # recommended first, then better fits before worse ones
        ranks = [{"gpu": 3, "partial": 2, "cpu": 1, "none": 0}[r.fit.verdict] for r in panel.rows()[1:]]
        assert ranks == sorted(ranks, reverse=True)
        for i in range(model.rowCount()):
            assert model.index(i, CatalogTableModel.STATUS).data() == "Not downloaded"
            assert model.index(i, CatalogTableModel.SIZE).data().endswith("GB")
        # first start: nothing on disk -> recommendation banner
        assert panel.should_show_first_run() and should_show_first_run(folders=[])
        assert panel.banner.isVisible()
        assert best.pair.id and panel.row(best.pair.id).target.name in panel.banner.label.text()


def test_quantization_choice_changes_size_and_fit(make_panel) -> None:
    panel = make_panel(machine=GAMER)
    r = next(r for r in panel.rows() if len(r.draft.files) > 1)
    other = next(q for q in r.draft.files if q != r.draft_quant)
    panel.select_pair(r.pair.id)
    combo = panel.details.draft_quant
    assert combo.isEnabled() and combo.count() == len(r.draft.files)
    combo.setCurrentIndex(combo.findData(other))
    new = panel.row(r.pair.id)
    assert new.draft_quant == other and new.size == r.target.file().size + r.draft.file(other).size
    assert other in panel.model.index(panel.model.row_of(r.pair.id), CatalogTableModel.QUANT).data()


# ---------------------------------------------------------------------------------------- custom pair


def test_incompatible_custom_pair_is_refused(make_panel, qtbot, tiny_pair, tiny_incompatible_draft) -> None:
    panel = make_panel(catalog=default_catalog())
    ch = panel.chooser
    ch.set_target(str(tiny_pair.target))
    ch.set_draft(str(tiny_incompatible_draft))
    assert not ch.load_button.isEnabled()
    with qtbot.waitSignal(ch.checked, timeout=WAIT) as sig:
        ch.check_button.click()
    res = sig.args[0]
    expected = check_files(tiny_pair.target, tiny_incompatible_draft)
    assert not res.ok and res.compat.reason == expected.reason
    assert ch.verdict.property("verdict") == "bad"
    text = ch.verdict.text()
    assert "Incompatible" in text and html.escape(expected.reason) in text
    assert not ch.load_button.isEnabled() and expected.reason in ch.load_button.toolTip()
    ch.load()
    # editing an input invalidates the verdict
    ch.set_draft(str(tiny_pair.draft))
    assert ch.result is None and not ch.load_button.isEnabled()


def test_compatible_custom_pair_is_accepted(make_panel, qtbot, tiny_pair) -> None:
    panel = make_panel(catalog=default_catalog())
    ch = panel.chooser
    ch.set_target(str(tiny_pair.target))
    ch.set_draft(str(tiny_pair.draft))
    with qtbot.waitSignal(ch.checked, timeout=WAIT):
        ch.check_button.click()
    assert ch.result is not None and ch.result.ok and ch.result.local
    assert ch.verdict.property("verdict") == "ok" and "Compatible" in ch.verdict.text()
    assert "llama" in ch.target_facts.text() and "local file" in ch.target_facts.text()
    assert ch.load_button.isEnabled() and not ch.download_button.isVisibleTo(ch)
    with qtbot.waitSignal(panel.loadRequested) as sig:
        ch.load_button.click()
    assert sig.args == [str(tiny_pair.target), str(tiny_pair.draft)]


def test_custom_pair_names_architectures_and_drafting(make_panel, qtbot, tmp_path) -> None:
    """A hybrid target and a mixture-of-experts draft (headers only): each model's architecture, and
    how the pair drafts and rolls back."""
    hybrid, moe = hybrid_and_moe(tmp_path)
    ch = make_panel(catalog=default_catalog()).chooser
    ch.set_target(str(hybrid))
    ch.set_draft(str(moe))
    with qtbot.waitSignal(ch.checked, timeout=WAIT):
        ch.check_button.click()
    assert ch.result is not None and ch.result.ok
    assert ch.result.target_arch.words == "qwen35: hybrid (recurrent + attention layers)"
    assert ch.target_facts.text().startswith("qwen35: hybrid (recurrent + attention layers)\n")
    assert "qwen3moe: attention, mixture of 128 experts (8 per token)" in ch.draft_facts.text()
    text = html.unescape(ch.verdict.text())
    assert (
        "Drafting: draft model, prompt lookup, drafting history; target rolls back by recurrent-state "
        "snapshots (up to 16 tokens a round; longer drafts by checkpoint and replay)" in text
    )
    assert "the draft model by trimming its KV cache" in text
    ch.swap()
    with qtbot.waitSignal(ch.checked, timeout=WAIT):
        ch.check_button.click()
    text = html.unescape(ch.verdict.text())
    assert (
        "target rolls back by trimming its KV cache (any draft length); the draft model by checkpoint" in text
    )


def test_normalize_ref_forms(tmp_path: Path) -> None:
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF")
    assert normalize_ref(f" {f} ") == str(f)
    assert normalize_ref("hf://a/b/c.gguf") == "hf://a/b/c.gguf"
    assert normalize_ref("acme/Repo-GGUF/x-q4.gguf") == "hf://acme/Repo-GGUF/x-q4.gguf"
    assert normalize_ref("acme/Repo-GGUF  x-q4.gguf") == "hf://acme/Repo-GGUF/x-q4.gguf"
    assert normalize_ref("https://huggingface.co/acme/R/blob/main/sub/x.gguf") == "hf://acme/R/sub/x.gguf"
    assert (
        normalize_ref("https://huggingface.co/acme/R/resolve/v2/x.gguf?download=1") == "hf://acme/R/x.gguf@v2"
    )
    assert normalize_ref("qwen3-8b:Q8_0") == "qwen3-8b:Q8_0"
    with pytest.raises(ValueError):
        normalize_ref("  ")
    assert format_bytes(5_300_000_000) == "5.3 GB" and fmt_eta(75) == "1 min 15 s" and fmt_eta(None) == "–"


# ------------------------------------------------------------------------------------ installed, wiring


def test_installed_folders_use_and_delete(make_panel, qtbot, tmp_path: Path, tiny_pair) -> None:
    folder = tmp_path / "my-models"
    folder.mkdir()
    t = Path(shutil.copy(tiny_pair.target, folder / "my-target.gguf"))
    shutil.copy(tiny_pair.draft, folder / "my-draft.gguf")
    panel = make_panel(catalog=default_catalog())
    assert panel.should_show_first_run()
    assert panel.add_folder(folder)
    assert library.load_folders(tmp_path / "library.json") == [folder.resolve()]
    names = sorted(it.text(0) for it in panel.installed.model_items())
    assert names == ["my-draft.gguf", "my-target.gguf"] and not panel.should_show_first_run()

    item = next(it for it in panel.installed.model_items() if it.text(0) == "my-target.gguf")
    panel.installed.tree.setCurrentItem(item)
    panel.installed.target_button.click()
    assert panel.chooser.target_edit.text() == str(t) and panel.tabs.currentWidget() is panel.chooser

    panel.confirm = lambda title, text: False  # declined: nothing happens
    panel.installed.delete_button.click()
    assert t.exists()
    panel.confirm = lambda title, text: True
    panel.installed.tree.setCurrentItem(item)
    panel.installed.delete_button.click()
    assert not t.exists()
    assert [it.text(0) for it in panel.installed.model_items()] == ["my-draft.gguf"]

    group = panel.installed.tree.topLevelItem(1)
    panel.installed.tree.setCurrentItem(group)
    assert panel.installed.remove_folder_button.isEnabled()
    panel.installed.remove_folder_button.click()
    assert panel.installed.model_items() == [] and (folder / "my-draft.gguf").exists()


class StubSession(QObject):
    """What `install_models_panel` needs of the session (`app.ui.core.session.Session`)."""

    settingsChanged = Signal(object)
    pairLoaded = Signal(object)
    client = None

    def __init__(self) -> None:
        super().__init__()
        self.settings = AppSettings(n_ctx=8192, n_max=8, p_min=0.0)
        self.loads: list[tuple[str, str | None]] = []

    def apply_settings(self, new: AppSettings) -> None:
        self.settings = new
        self.settingsChanged.emit(new)

    def load_pair(self, target: str, draft: str | None = None) -> None:
        self.loads.append((target, draft))


def test_install_models_panel_wires_load_with_suggested_settings(
    qtbot, make_panel, tmp_path: Path, tiny_pair, no_threads_left
) -> None:
    win = StubSession()
    panel = install_models_panel(win, machine=LAPTOP, folders_path=tmp_path / "library.json")
    qtbot.addWidget(panel)
    try:
        assert isinstance(panel, ModelsPanel) and panel.n_ctx == 8192
        pair = default_catalog().pairs[0]
        panel.pairLoadRequested.emit(str(tiny_pair.target), str(tiny_pair.draft), pair)
        assert win.loads == [(str(tiny_pair.target), str(tiny_pair.draft))]
        assert (win.settings.n_max, win.settings.p_min) == (pair.n_max, pair.p_min)
        panel.pairLoadRequested.emit(str(tiny_pair.target), str(tiny_pair.draft), None)  # custom pair
        assert len(win.loads) == 2 and win.settings.n_max == pair.n_max
    finally:
        panel.shutdown()


# ------------------------------------------------------------------------------------------- speeds

EPYC = Machine(24 * GiB, 23 * GiB, 2, cpu_bandwidth=25e9, bandwidth_source="cached")


def test_catalog_shows_expected_speeds_and_recommends_by_speed(make_panel, tmp_path: Path) -> None:
    cat = default_catalog()
    panel = make_panel(machine=EPYC, catalog=cat)
    model = panel.model
    speeds = [model.index(i, CatalogTableModel.SPEED).data() for i in range(model.rowCount())]
    assert all(s.startswith("~") and s.endswith(" tok/s") for s in speeds)  # nothing measured: estimated
    first = panel.rows()[0]
    assert first.recommended and first.speed is not None
    assert first.target.params <= 4_000_000_000  # 2 cores, no GPU: a small target, not the 14B that fits
    assert speeds[0] == f"~{first.speed.best:.0f} tok/s"
    tip = model.index(0, CatalogTableModel.SPEED).data(Qt.ItemDataRole.ToolTipRole)
    assert "Plain decoding: ~" in tip and "estimated from the memory bandwidth" in tip
    text = panel.banner.label.text()
    assert (
        f"About <b>{first.speed.best:.0f} tokens/s</b> here (expected)" in text and first.target.name in text
    )
    assert "25 GB/s" in panel.machine_line.text()
    # a measured speed replaces the estimate (the recommended target's default file, measured plain)
    qf = first.target.file()
    SpeedStore().record(qf.file, qf.size, 40.0)
    panel.refresh()
    row = panel.row(first.pair.id)
    assert row.speed is not None and (row.speed.plain, row.speed.plain_source) == (40.0, "measured")
    i = model.row_of(first.pair.id)
    assert model.index(i, CatalogTableModel.SPEED).data() == "40 tok/s"
    assert "measured on this machine" in model.index(i, CatalogTableModel.SPEED).data(
        Qt.ItemDataRole.ToolTipRole
    )
    # a lower usable speed lets larger targets in; the recommendation follows the setting
    panel.set_min_speed(1.0)
    big = panel.rows()[0]
    assert big.recommended and big.target.params > first.target.params


def test_panel_takes_the_gpus_from_the_engine(make_panel, qtbot, monkeypatch: pytest.MonkeyPatch) -> None:
    from app.engine import Device

    panel = make_panel(machine=EPYC)
    assert {r.fit.verdict for r in panel.rows()} <= {"cpu", "none"}
    rtx = Device("CUDA0", "NVIDIA GeForce RTX 4090", "GPU", 23 * GiB, 24 * GiB)
    cpu = Device("CPU", "AMD EPYC", "CPU", 23 * GiB, 24 * GiB)
    panel.set_devices((cpu, rtx), gpu_offload=True)
    assert panel.machine.gpus[0].name == "NVIDIA GeForce RTX 4090" and panel.machine.gpu_source == "engine"
    assert "NVIDIA GeForce RTX 4090" in panel.machine_line.text()
    assert any(r.fit.verdict == "gpu" for r in panel.rows())
    assert max(r.speed.best for r in panel.rows() if r.speed) > 100  # on a 4090 small models fly
    panel.set_devices((cpu, rtx), gpu_offload=False)  # a CPU build cannot use it
    assert panel.machine.gpus == ()

    # in the background: the engine's status and the bandwidth (stubbed: no real probe here)
    class Status:
        devices = (cpu, rtx)
        gpu_offload = True

    monkeypatch.setattr(models_panel, "cpu_bandwidth", lambda: Bandwidth(33e9, "measured"))
    with qtbot.waitSignal(panel.machineDetected, timeout=WAIT):
        panel.detect_machine_in_background(Status)
    assert panel.machine.ram_bandwidth == 33e9 and panel.machine.gpus[0].kind == "cuda"

    def broken() -> None:
        raise RuntimeError("the engine did not start")

    with qtbot.waitSignal(panel.machineDetected, timeout=WAIT):
        panel.detect_machine_in_background(broken)
    assert panel.machine.gpu_source == "guessed"
    panel._detector.join(5)  # type: ignore[union-attr]


def test_usable_speed_is_a_setting(qtbot, tmp_path: Path) -> None:
    from app.ui.settings.dialog import SettingsDialog

    assert AppSettings().min_speed == 15.0
    dlg = SettingsDialog(AppSettings(min_speed=8.0))
    qtbot.addWidget(dlg)
    assert dlg.min_speed.value() == 8.0
    dlg.min_speed.setValue(25.0)
    assert dlg.result_settings().min_speed == 25.0
    dlg._defaults()
    assert dlg.result_settings().min_speed == 15.0
    AppSettings(min_speed=12.0).write(tmp_path)
    assert AppSettings.read(tmp_path).min_speed == 12.0


def test_install_models_panel_follows_the_settings(
    qtbot, make_panel, tmp_path: Path, no_threads_left
) -> None:
    win = StubSession()
    panel = install_models_panel(win, machine=EPYC, folders_path=tmp_path / "library.json")
    qtbot.addWidget(panel)
    try:
        assert panel.min_speed == 15.0
        win.apply_settings(dataclasses.replace(win.settings, min_speed=1.0, n_ctx=2048))
        assert win.settings.min_speed == 1.0  # the session's own apply_settings runs
        assert (panel.min_speed, panel.n_ctx) == (1.0, 2048)
    finally:
        panel.shutdown()
