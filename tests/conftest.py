"""Shared pytest fixtures and options."""

from __future__ import annotations

import os
import tempfile

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # GUI tests never need a screen
# Nothing a test runs (the CLI in a subprocess included) writes to the user's own data folder:
# measured speeds, the drafting history, settings and conversations go to a folder of the run's.
os.environ["TANDEM_DATA_DIR"] = tempfile.mkdtemp(prefix="tandem-test-data-")

from pathlib import Path
from typing import NamedTuple

import pytest

from app.tiny_gguf import write_incompatible_draft, write_tiny_pair


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-slow", action="store_true", default=False, help="also run tests marked slow")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--run-slow"):
        return
    skip_slow = pytest.mark.skip(reason="slow: give --run-slow to run it")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip_slow)


class TinyPair(NamedTuple):
    """A tiny target model and its draft (same tokenizer, noisy copy of the weights)."""

    target: Path
    draft: Path


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory: pytest.TempPathFactory) -> TinyPair:
    """A tiny llama target + draft pair of GGUF files, built once per session."""
    return TinyPair(*write_tiny_pair(tmp_path_factory.mktemp("tiny_pair")))


@pytest.fixture(scope="session")
def tiny_incompatible_draft(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny GGUF whose vocabulary is incompatible with ``tiny_pair``'s for speculative decoding."""
    return write_incompatible_draft(tmp_path_factory.mktemp("tiny_incompatible") / "tiny-incompatible.gguf")


@pytest.fixture
def fake_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A running `tests.fakehub.FakeHub`, with the environment pointing huggingface_hub at it.

    HF_HOME is a fresh temp dir, HF_ENDPOINT the fake hub, no token and not offline. huggingface_hub
    reads some settings at import time, so the matching constants are patched too, and its
    once-a-day agent-registry fetch (triggered by building request headers) is short-circuited.
    """
    import huggingface_hub.constants as hf_constants
    from huggingface_hub.utils import _detect_agent

    from fakehub import FakeHub

    home = tmp_path / "hf_home"
    monkeypatch.setenv("HF_HOME", str(home))
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hf_constants, "HF_TOKEN_PATH", str(home / "token"))
    monkeypatch.setattr(hf_constants, "HF_STORED_TOKENS_PATH", str(home / "stored_tokens"))
    monkeypatch.setattr(hf_constants, "AGENT_HARNESSES_PATH", str(home / ".agent_harnesses.json"))
    monkeypatch.setattr(_detect_agent, "_registry", _detect_agent._EMPTY_REGISTRY)
    hub = FakeHub().start()
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    try:
        yield hub
    finally:
        hub.stop()


@pytest.fixture
def ui_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh app data directory (``TANDEM_DATA_DIR``) for the desktop app's conversations and settings."""
    path = tmp_path / "tandem-data"
    path.mkdir()
    monkeypatch.setenv("TANDEM_DATA_DIR", str(path))
    return path


@pytest.fixture
def no_leaked_threads():
    """Fail the test if it leaves a Python thread running (e.g. an engine worker or reader thread)."""
    import threading

    before = set(threading.enumerate())
    yield
    leaked = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    for t in leaked:
        t.join(5)
    leaked = [t.name for t in leaked if t.is_alive()]
    assert not leaked, f"threads left running: {leaked}"
