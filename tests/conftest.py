"""Shared pytest fixtures and options."""

from __future__ import annotations

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
