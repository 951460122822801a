"""The Models panel against the local fake Hub (pytest-qt, offscreen, no network)."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import dataclasses
import gc
import html
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest
from arch_headers import hybrid_and_moe
from PySide6.QtCore import QEvent, QObject, Qt, Signal
from PySide6.QtWidgets import QApplication, QWidget

from app.gguf.compat import check_files
from app.gguf.split import part_names
from app.tiny_gguf import write_tiny_llama
from app.ui.core.settings import AppSettings
from app.ui.models import models_panel
from app.ui.models.catalog_table import BadgeRole, CatalogTableModel
from app.ui.models.downloads import CANCELLED, DONE, FAILED
from app.ui.models.downloads_view import DownloadRow, fmt_eta
from app.ui.models.models_install import install_models_panel
from app.ui.models.models_panel import ModelsPanel, should_show_first_run
from app.ui.models.pair_chooser import normalize_ref
from fakehub import FakeHub
from models_registry import library
from models_registry.bandwidth import Bandwidth
from models_registry.catalog import Catalog, default_catalog, loads_catalog
from models_registry.fit import Gpu, Machine, recommend
from models_registry.hub import RetryPolicy
from models_registry.measured import SpeedStore
from models_registry.remote import FIRST_CHUNK
from models_registry.units import format_bytes

pytestmark = pytest.mark.timeout(60)

GiB = 1024**3
FAST = RetryPolicy(
    max_retries=2, backoff_base=0.01, backoff_max=0.05, stall_timeout=2.0, connect_timeout=1.0,
    metadata_timeout=2.0, metadata_retries=1,
)  # fmt: skip
LAPTOP = Machine(total_ram=16 * GiB, available_ram=12 * GiB, physical_cores=4)
GAMER = Machine(32 * GiB, 28 * GiB, 8, (Gpu("RTX 4070", "cuda", total=12 * GiB, free=11 * GiB),))
WAIT = 15_000  # ms

TARGET_REPO, TARGET_FILE = "acme/Tiny-Target-GGUF", "tiny-target-q4_k_m.gguf"
DRAFT_REPO, DRAFT_FILE = "acme/Tiny-Draft-GGUF", "tiny-draft-q8_0.gguf"
GATED_REPO, GATED_FILE = "locked/Tiny-Locked-GGUF", "tiny-locked-q4_k_m.gguf"


# ------------------------------------------------------------------------------------------- fixtures


@pytest.fixture
def no_threads_left(fake_hub: FakeHub):
    """Fail if a test leaves a thread running (the fake Hub's own threads excepted).

    Depends on `fake_hub` so it is set up after the servers start and torn down before they stop;
    closing huggingface_hub's shared HTTP session ends the server's keep-alive handler threads.
    """
    from huggingface_hub.utils import close_session

    before = set(threading.enumerate())
    yield
    close_session()
    leaked = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    for t in leaked:
        t.join(5)
    alive = [t.name for t in leaked if t.is_alive()]
    assert not alive, f"threads left running: {alive}"


@dataclass
class Served:
    catalog: Catalog
    target: bytes
    draft: bytes


def _model(mid: str, repo: str, quant: str, file: str, size: int, params: int, gated: bool = False) -> str:
    return f"""
[[model]]
id = "{mid}"
name = "{mid.replace("-", " ").title()}"
repo = "{repo}"
family = "tiny"
tokenizer = "tiny-a"
architecture = "llama"
params = {params}
n_layers = 2
n_kv_heads = 2
head_dim = 32
context_length = 4096
license = "{"tiny-community" if gated else "mit"}"
gated = {"true" if gated else "false"}
default_quant = "{quant}"
[model.files.{quant}]
file = "{file}"
size = {size}
"""


@pytest.fixture
def served(fake_hub: FakeHub, tiny_pair) -> Served:
    """A catalog of tiny pairs whose files the fake Hub serves (the target padded to ~2 MB so a download
    reports progress several times; GGUF readers ignore bytes after the tensor data)."""
    target = tiny_pair.target.read_bytes() + os.urandom(1_500_000)
    draft = tiny_pair.draft.read_bytes()
    fake_hub.add_file(TARGET_REPO, TARGET_FILE, target)
    fake_hub.add_file(DRAFT_REPO, DRAFT_FILE, draft)
    fake_hub.add_file(GATED_REPO, GATED_FILE, target, gated=True)
    text = "schema = 1\n" + "".join([
        _model("tiny-target", TARGET_REPO, "Q4_K_M", TARGET_FILE, len(target), 2_000_000),
        _model("tiny-draft", DRAFT_REPO, "Q8_0", DRAFT_FILE, len(draft), 1_000_000),
        _model("tiny-locked", GATED_REPO, "Q4_K_M", GATED_FILE, len(target), 2_000_000, gated=True),
    ]) + """
[[pair]]
id = "tiny+draft"
target = "tiny-target"
draft = "tiny-draft"
n_max = 6
p_min = 0.5
good_for = "Tests."

[[pair]]
id = "locked+draft"
target = "tiny-locked"
draft = "tiny-draft"
n_max = 4
p_min = 0.6
good_for = "Gated tests."
"""  # fmt: skip
    return Served(loads_catalog(text, "test-catalog"), target, draft)


@pytest.fixture
def make_panel(qtbot, tmp_path: Path, no_threads_left, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TANDEM_DATA_DIR", str(tmp_path / "data"))  # the speeds measured: none yet
    panels: list[QWidget] = []

    def make(**kwargs) -> ModelsPanel:
        kwargs.setdefault("machine", LAPTOP)
        kwargs.setdefault("folders_path", tmp_path / "library.json")
        kwargs.setdefault("policy", FAST)
        kwargs.setdefault("check_kwargs", {"policy": FAST})
        panel = ModelsPanel(**kwargs)
        panel.confirm = lambda title, text: True
        qtbot.addWidget(panel)
        panel.resize(1100, 700)
        panel.show()
        panels.append(panel)
        return panel

    yield make
    for p in panels:
        p.shutdown()  # type: ignore[attr-defined]
        p.close()
        p.deleteLater()
    QApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    gc.collect()


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


# ------------------------------------------------------------------------------------------- downloads


def test_download_pair_progress_install_load_delete(make_panel, qtbot, served: Served, fake_hub) -> None:
    fake_hub.block_delay = 0.01  # ~0.4 s for the target: several progress reports
    panel = make_panel(catalog=served.catalog)
    assert panel.rows()[0].pair.id == "tiny+draft" and panel.banner.isVisible()
    seen: dict[int, list[tuple[int, int]]] = {}
    panel.downloads.progress.connect(lambda k, d, t: seen.setdefault(k, []).append((d, t)))
    panel.select_pair("tiny+draft")
    panel.details.download_button.click()
    assert panel.row("tiny+draft").status in ("queued", "downloading")
    qtbot.waitUntil(lambda: panel.row("tiny+draft").status == "installed", timeout=WAIT)

    items = {it.filename: it for it in panel.downloads.items.values()}
    assert {it.state for it in items.values()} == {DONE}
    tkey = items[TARGET_FILE].key
    done = [d for d, _ in seen[tkey]]
    assert len(done) >= 3 and done == sorted(done) and len(set(done)) >= 3
    assert seen[tkey][-1] == (len(served.target), len(served.target))
    r = panel.row("tiny+draft")
    assert r.target_path is not None and r.target_path.read_bytes() == served.target
    assert r.draft_path is not None and r.draft_path.read_bytes() == served.draft
    # the Downloads tab shows both as done, the Installed tab lists them with their catalog entry
    rows = panel.downloads_view.rows
    assert all(row.status.text().startswith("Done") for row in rows.values())
    installed = {it.data(0, Qt.ItemDataRole.UserRole).filename: it for it in panel.installed.model_items()}
    assert installed[TARGET_FILE].text(2) == "tiny-target (Q4_K_M)"
    assert installed[DRAFT_FILE].text(2) == "tiny-draft (Q8_0)"
    assert not panel.should_show_first_run() and not panel.banner.isVisible()
    assert panel.model.index(0, CatalogTableModel.STATUS).data() == "Installed"

    # Load hands both paths and the pair (suggested settings) to the window
    assert panel.details.load_button.isEnabled()
    with qtbot.waitSignal(panel.pairLoadRequested) as sig:
        panel.details.load_button.click()
    assert sig.args == [str(r.target_path), str(r.draft_path), served.catalog.pair("tiny+draft")]

    # Delete (confirmed) removes both files from the cache
    asked: list[str] = []
    panel.confirm = lambda title, text: asked.append(text) or True
    panel.details.delete_button.click()
    assert TARGET_FILE in asked[0] and DRAFT_FILE in asked[0]
    assert panel.row("tiny+draft").status == "missing"
    assert not r.target_path.exists() and not r.draft_path.exists()
    assert panel.installed.model_items() == [] and panel.banner.isVisible()


def test_cancel_then_resume_completes_with_exact_bytes(make_panel, qtbot, served: Served, fake_hub) -> None:
    fake_hub.block_delay = 0.03  # ~0.7 s for the target
    panel = make_panel(catalog=served.catalog)
    keys = panel.download_pair("tiny+draft")
    tkey = keys[0]
    item = panel.downloads.items[tkey]
    assert item.filename == TARGET_FILE
    qtbot.waitUntil(lambda: item.done > 300_000, timeout=WAIT)
    row = panel.downloads_view.rows[tkey]
    assert isinstance(row, DownloadRow) and row.cancel_button.isVisibleTo(row)
    row.cancel_button.click()
    qtbot.waitUntil(lambda: item.state == CANCELLED, timeout=WAIT)
    assert 0 < item.done < len(served.target)
    assert row.resume_button.isVisibleTo(row) and "partial file is kept" in row.status.text()
    [partial] = [p for p in library.list_partials() if p.repo_id == TARGET_REPO]
    assert 0 < partial.size < len(served.target)
    fake_hub.block_delay = 0.0
    qtbot.waitUntil(lambda: panel.downloads.items[keys[1]].state in (DONE, CANCELLED), timeout=WAIT)

    row.resume_button.click()
    qtbot.waitUntil(lambda: item.state == DONE, timeout=WAIT)
    assert item.path is not None and item.path.read_bytes() == served.target
    target_gets = [
        h["Range"] for m, p, h in fake_hub.requests if m == "GET" and p.startswith("/blobs/") and "Range" in h
    ]
    assert target_gets[-1] != "bytes=0-"  # resumed, not restarted
    assert int(target_gets[-1][6:-1]) == partial.size
    qtbot.waitUntil(lambda: panel.row("tiny+draft").status == "installed", timeout=WAIT)
    assert not library.list_partials()


def test_a_split_target_downloads_as_one_item_under_one_progress(
    make_panel, qtbot, fake_hub, tiny_pair, tmp_path: Path
) -> None:
    first = write_tiny_llama(tmp_path / "split" / "tiny-split.gguf", n_embd=128, split_tensors=8)
    parts = [first.with_name(n) for n in part_names(first.name)]
    data = [p.read_bytes() for p in parts]
    for p, d in zip(parts, data, strict=True):
        fake_hub.add_file("acme/Tiny-Split-GGUF", p.name, d)
    draft = tiny_pair.draft.read_bytes()
    fake_hub.add_file(DRAFT_REPO, DRAFT_FILE, draft)
    listing = ", ".join(f'{{ file = "{p.name}", size = {len(d)} }}' for p, d in zip(parts, data, strict=True))
    target = _model("tiny-split", "acme/Tiny-Split-GGUF", "F32", first.name, sum(map(len, data)), 2_000_000)
    target = target.replace(f"size = {sum(map(len, data))}", f"parts = [{listing}]")
    pair = (
        '[[pair]]\nid = "split+draft"\ntarget = "tiny-split"\ndraft = "tiny-draft"\nn_max = 4\np_min = 0.5\n'
    )
    draft_model = _model("tiny-draft", DRAFT_REPO, "Q8_0", DRAFT_FILE, len(draft), 1_000_000)
    cat = loads_catalog(f'schema = 1\n{target}{draft_model}{pair}good_for = "Tests."\n')
    assert cat.model("tiny-split").file().split
    fake_hub.block_delay = 0.005
    panel = make_panel(catalog=cat)
    seen: dict[int, list[tuple[int, int]]] = {}
    panel.downloads.progress.connect(lambda k, d, t: seen.setdefault(k, []).append((d, t)))
    keys = panel.download_pair("split+draft")
    qtbot.waitUntil(lambda: panel.row("split+draft").status == "installed", timeout=WAIT)

    # one item for the three parts, found by any of them, with one progress over their bytes
    assert len(keys) == 2 and sorted(it.filename for it in panel.downloads.items.values()) == sorted(
        [first.name, DRAFT_FILE]
    )
    item = panel.downloads.find("acme/Tiny-Split-GGUF", parts[2].name)
    assert item is not None and item.key == keys[0] and item.state == DONE
    total = sum(map(len, data))
    assert {t for _, t in seen[item.key]} == {total} and seen[item.key][-1] == (total, total)
    assert item.done == item.total == total and item.parts == [p.name for p in parts]
    row = panel.downloads_view.rows[item.key]
    assert row.status.text().startswith("Done") and "(3 parts)" in row.status.text()
    assert parts[1].name in row.name.toolTip()

    # installed once, as its first part in the cache, beside its other parts
    r = panel.row("split+draft")
    assert r.target_path is not None and r.target_path.name == first.name
    assert [r.target_path.with_name(p.name).read_bytes() for p in parts] == data
    names = [it.data(0, Qt.ItemDataRole.UserRole).filename for it in panel.installed.model_items()]
    assert sorted(names) == sorted([first.name, DRAFT_FILE])
    assert panel.downloads.enqueue("acme/Tiny-Split-GGUF", parts[1].name) == item.key  # no second item


def test_gated_and_missing_files_show_readable_errors(make_panel, qtbot, served: Served) -> None:
    panel = make_panel(catalog=served.catalog)
    panel.download_pair("locked+draft")
    qtbot.waitUntil(lambda: panel.row("locked+draft").status == "failed", timeout=WAIT)
    item = panel.downloads.find(GATED_REPO, GATED_FILE)
    assert item is not None and item.state == FAILED and item.error_kind == "gated"
    assert "gated" in item.error and "HF_TOKEN" in item.error
    row = panel.downloads_view.rows[item.key]
    assert row.error.isVisibleTo(panel.downloads_view) and "HF_TOKEN" in row.error.text()
    assert row.status.text().startswith("Access needed")
    assert "HF_TOKEN" in panel.message.text()
    assert panel.row("locked+draft").error == item.error
    assert "gated" in panel.row("locked+draft").licence_text

    key = panel.downloads.enqueue(TARGET_REPO, "no-such-file.gguf")
    qtbot.waitUntil(lambda: panel.downloads.items[key].state == FAILED, timeout=WAIT)
    missing = panel.downloads.items[key]
    assert missing.error_kind == "not-found" and "not found" in missing.error
    qtbot.waitUntil(lambda: not panel.downloads.is_running(), timeout=WAIT)


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


def test_hub_refs_are_checked_from_headers_then_downloaded(make_panel, qtbot, fake_hub, tiny_pair) -> None:
    big = tiny_pair.target.read_bytes() + os.urandom(8_000_000)
    fake_hub.add_file("acme/Big-GGUF", "big.gguf", big)
    fake_hub.add_file(DRAFT_REPO, DRAFT_FILE, tiny_pair.draft.read_bytes())
    panel = make_panel(catalog=default_catalog())
    ch = panel.chooser
    ch.set_target("hf://acme/Big-GGUF/big.gguf")
    ch.set_draft(f"{DRAFT_REPO} {DRAFT_FILE}")  # "owner/repo file" form
    with qtbot.waitSignal(ch.checked, timeout=WAIT):
        ch.check()
    assert ch.result is not None and ch.result.ok and not ch.result.local
    assert fake_hub.bytes_served <= 2 * FIRST_CHUNK < len(big) // 4  # headers only
    assert ch.result.target_facts is not None and ch.result.target_facts.file_size == len(big)
    assert "header read" in ch.target_facts.text()
    assert not ch.load_button.isEnabled() and ch.download_button.isVisibleTo(ch)

    ch.download_button.click()
    qtbot.waitUntil(ch.load_button.isEnabled, timeout=WAIT)
    assert ch.result.local
    assert Path(str(ch.result.target)).read_bytes() == big


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
