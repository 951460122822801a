"""Every constant auto mode decides with is documented with the figure behind it.

No constant in ``app/engine/auto/`` may encode one machine's cost unless docs/benchmarks.md
("Auto mode's measured constants") names it beside the figure that justifies it; a constant added
without a row there fails here.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from app.engine.auto import AutoDrafter

ROOT = Path(__file__).resolve().parents[1]
AUTO = ROOT / "app" / "engine" / "auto"
SECTION = "## Auto mode's measured constants"

# Names that hold no figure to justify: kinds of round (what evidence is kept by), a bound that is
# true by definition, and the memory file's format.
NOT_FIGURES = {
    "ALWAYS": "an acceptance that is always right: the bound a plan cannot beat",
    "PLAIN": "the kind of a round without a draft",
    "PREDICTORS": "the sources judged by the target's confidence",
    "COPIERS": "the sources judged by the length of their match",
    "RESUMES": "the copiers whose copies have a place in the context",
    "RESUME": "the index of the class a resumed copy is judged in (its prior is RESUME_PRIOR)",
    "VERSION": "the memory file's format",
    "MAX_BYTES": "a sanity cap on the memory file read back (a real one holds a few kilobytes)",
}


def _constants_table() -> str:
    text = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    return text[start : end if end >= 0 else len(text)]


def _module_constants() -> dict[str, str]:
    """UPPER_CASE names assigned at the top level of each module in app/engine/auto, by module."""
    out: dict[str, str] = {}
    for path in sorted(AUTO.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            if not isinstance(node, (ast.Assign, ast.AnnAssign)):
                continue
            for target in targets:
                if isinstance(target, ast.Name) and target.id.isupper() and not target.id.startswith("_"):
                    out[target.id] = path.name
    return out


def _planning_defaults() -> list[str]:
    """AutoDrafter's keyword arguments that default to a number (what a user does not set)."""
    params = inspect.signature(AutoDrafter.__init__).parameters.values()
    return [p.name for p in params if isinstance(p.default, (int, float)) and not isinstance(p.default, bool)]


def test_the_scan_finds_the_constants_it_is_meant_to() -> None:
    found = _module_constants()
    assert {"LOOKUP_CLASSES", "PROBE_HOPE", "STALE", "BACK_OFF_MAX"} <= set(found)
    assert {"margin", "probe_every", "probe_odds", "n_max"} <= set(_planning_defaults())


def test_every_constant_of_auto_mode_has_its_row_in_the_benchmarks_doc() -> None:
    table = _constants_table()
    missing = [
        f"{name} ({module})"
        for name, module in _module_constants().items()
        if name not in NOT_FIGURES and f"`{name}`" not in table
    ]
    missing += [f"{name} (AutoDrafter)" for name in _planning_defaults() if f"`{name}`" not in table]
    assert not missing, f"document these in docs/benchmarks.md, {SECTION!r}: {missing}"


def test_the_exempt_names_are_still_there() -> None:
    # an exemption for a name that is gone would hide a new constant of that name
    assert set(NOT_FIGURES) <= set(_module_constants())
