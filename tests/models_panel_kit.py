"""The Models panel's test kit: a catalog of tiny pairs the fake Hub serves, and a panel factory
that checks no thread is left running (shared by the Models panel's test modules)."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import gc
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest
from PySide6.QtCore import QEvent
from PySide6.QtWidgets import QApplication, QWidget

from app.ui.models.models_panel import ModelsPanel
from fakehub import FakeHub
from models_registry.catalog import Catalog, loads_catalog
from models_registry.fit import Gpu, Machine
from models_registry.hub import RetryPolicy

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


def catalog_entry(
    mid: str, repo: str, quant: str, file: str, size: int, params: int, gated: bool = False
) -> str:
    """One model's entry in a catalog's TOML."""
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
        catalog_entry("tiny-target", TARGET_REPO, "Q4_K_M", TARGET_FILE, len(target), 2_000_000),
        catalog_entry("tiny-draft", DRAFT_REPO, "Q8_0", DRAFT_FILE, len(draft), 1_000_000),
        catalog_entry("tiny-locked", GATED_REPO, "Q4_K_M", GATED_FILE, len(target), 2_000_000, gated=True),
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
