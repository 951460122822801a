"""The Models panel's downloads against the local fake Hub (pytest-qt, offscreen, no network)."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from pathlib import Path

import pytest
from models_panel_kit import (
    DRAFT_FILE,
    DRAFT_REPO,
    GATED_FILE,
    GATED_REPO,
    TARGET_FILE,
    TARGET_REPO,
    WAIT,
    Served,
    catalog_entry,
)
from PySide6.QtCore import Qt

from app.gguf.split import part_names
from app.tiny_gguf import write_tiny_llama
from app.ui.models.catalog_table import CatalogTableModel
from app.ui.models.downloads import CANCELLED, DONE, FAILED
from app.ui.models.downloads_view import DownloadRow
from models_registry import library
from models_registry.catalog import default_catalog, loads_catalog
from models_registry.remote import FIRST_CHUNK

pytestmark = pytest.mark.timeout(60)

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
    size = sum(map(len, data))
    target = catalog_entry("tiny-split", "acme/Tiny-Split-GGUF", "F32", first.name, size, 2_000_000)
    target = target.replace(f"size = {size}", f"parts = [{listing}]")
    pair = (
        '[[pair]]\nid = "split+draft"\ntarget = "tiny-split"\ndraft = "tiny-draft"\nn_max = 4\np_min = 0.5\n'
    )
    draft_model = catalog_entry("tiny-draft", DRAFT_REPO, "Q8_0", DRAFT_FILE, len(draft), 1_000_000)
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
