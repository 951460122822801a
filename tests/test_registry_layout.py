"""models_registry's modules stay small and use only each other's public names (layering: test_code_rules)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "models_registry"
MODULES = sorted(PACKAGE.glob("*.py"))


def _from_imports(path: Path) -> list[tuple[str, list[str]]]:
    """(absolute module, imported names) of every ``from ... import`` in `path`."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = "models_registry." * bool(node.level) + (node.module or "")
            out.append((base.rstrip("."), [a.name for a in node.names]))
    return out


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_no_private_names_from_other_modules(path: Path) -> None:
    for module, names in _from_imports(path):
        if module.startswith("models_registry") or module.startswith("app."):
            private = [n for n in names if n.startswith("_")]
            assert not private, f"{path.name} imports private {private} from {module}"


def test_hub_keeps_its_public_names() -> None:
    from models_registry import hub

    for name in hub.__all__:
        assert getattr(hub, name) is not None
    assert {"download", "resolve_file", "HubError", "RetryPolicy", "cached_path", "hub_cache_dir"} <= set(
        hub.__all__
    )


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_modules_stay_small(path: Path) -> None:
    n = len(path.read_text(encoding="utf-8").splitlines())
    assert n <= 500, f"{path.name} has {n} lines: split it by what its parts own"
