"""Decode speeds the engine measured on this machine, per model file: the store the speed estimate
prefers to its own arithmetic (`models_registry.speed`, `fit.pair_speed`).

A model file is known by its name and size (a re-download of the same file keeps its figures, another
quantization has another name) and by where it ran: ``"cpu"``, ``"gpu"`` (every layer offloaded) or
``"partial"``. For each, the store keeps the last `KEEP` figures of

- plain decoding's tokens/s (the model alone),
- each other mode's tokens/s with the draft it ran with (``speculative``, ``auto``, ``lookup``),
- the draft's acceptance rate, per draft,
- verify costs: what a batch of n tokens cost, in decode steps of the model, where a run gave one;

and `lookup` answers with their medians. It lives in ``speeds.json`` in the app's data folder, written
atomically; an unreadable file is logged and read as empty (the next `record` replaces it).
"""

from __future__ import annotations

import json
import logging
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .datadir import data_dir, write_json_atomic

__all__ = ["KEEP", "PLACEMENTS", "Measured", "SpeedStore", "placement_of", "speeds_file"]

log = logging.getLogger("tandem.registry")

FILE_NAME = "speeds.json"
VERSION = 1
KEEP = 5  # figures kept per model, mode and draft (the median of them is used)
PLACEMENTS = ("cpu", "gpu", "partial")


def speeds_file() -> Path:
    """``<data folder>/speeds.json``."""
    return data_dir() / FILE_NAME


def placement_of(layers_on_gpu: int, layers_total: int) -> str:
    """``"cpu"``, ``"gpu"`` or ``"partial"`` for a model with `layers_on_gpu` of `layers_total` offloaded."""
    if layers_on_gpu <= 0:
        return "cpu"
    return "gpu" if layers_on_gpu >= layers_total else "partial"


def _same(name: str, size: int, other_name: object, other_size: object, tolerance: float) -> bool:
    if not isinstance(other_name, str) or not isinstance(other_size, int):
        return False
    return other_name.lower() == name.lower() and abs(other_size - size) <= tolerance * size


def _median(values: object, *, floor: float = 0.0) -> float | None:
    """The median of the numbers above `floor` in `values` (a list), or None."""
    if not isinstance(values, list):
        return None
    nums = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and v > floor]
    return statistics.median(nums) if nums else None


@dataclass(frozen=True)
class Measured:
    """What the engine measured for one model file at one placement (medians of the last runs)."""

    file: str
    size: int
    placement: str
    plain: float | None = None  # tokens/s of plain decoding
    runs: tuple[tuple[str, str, int, float], ...] = ()  # (mode, draft file, draft size, tokens/s)
    acceptance: tuple[tuple[str, int, float], ...] = ()  # (draft file, draft size, rate)
    verify_costs: Mapping[int, float] = field(default_factory=dict)  # batch size -> decode steps

    def speed(
        self, mode: str, draft: tuple[str, int] | None = None, *, tolerance: float = 0.0
    ) -> float | None:
        """Tokens/s measured in `mode` (with `draft`, where the mode drafts with a model)."""
        if mode == "plain":
            return self.plain
        for m, f, s, tps in self.runs:
            if m != mode:
                continue
            if (not f) if draft is None else _same(*draft, f, s, tolerance):
                return tps
        return None

    def acceptance_with(self, draft: tuple[str, int], *, tolerance: float = 0.0) -> float | None:
        """The acceptance rate measured with `draft`."""
        return next((a for f, s, a in self.acceptance if _same(*draft, f, s, tolerance)), None)


class SpeedStore:
    """``speeds.json``: `record` what a run measured, `lookup` what is known of a model file."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = Path(path) if path is not None else speeds_file()

    # -- reading ------------------------------------------------------------------------------------
    def _read(self) -> list[dict[str, Any]]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as e:
            log.warning("ignoring unreadable speed store %s: %s", self.path, e)
            return []
        models = data.get("models") if isinstance(data, dict) else None
        if not isinstance(models, list):
            log.warning("ignoring speed store %s: no list of models in it", self.path)
            return []
        return [m for m in models if isinstance(m, dict)]

    def lookup(
        self, file: str, size: int, *, placement: str | None = None, tolerance: float = 0.0
    ) -> Measured | None:
        """What was measured for the model file `file` of `size` bytes (a path's name is used) at
        `placement` (any, the latest, if None); sizes within `tolerance` (a fraction) match, for catalog
        sizes that are approximate. None if nothing was."""
        name = Path(file).name
        found = [
            m for m in self._read()
            if _same(name, size, m.get("file"), m.get("size"), tolerance)
            and (placement is None or m.get("placement") == placement)
        ]  # fmt: skip
        if not found:
            return None
        entry = max(found, key=lambda m: str(m.get("updated", "")))
        return _to_measured(entry)

    # -- writing ------------------------------------------------------------------------------------
    def record(
        self,
        file: str,
        size: int,
        tokens_per_second: float,
        *,
        mode: str = "plain",
        placement: str = "cpu",
        draft: tuple[str, int] | None = None,
        acceptance: float | None = None,
        verify_costs: Mapping[int, float] | None = None,
        now: datetime | None = None,
    ) -> None:
        """Add one run's figures for the model file `file` (a path's name is used) of `size` bytes:
        its decode tokens/s in `mode` (with `draft`: its file name and size), and where known the
        draft's acceptance rate and verify costs (batch size -> decode steps)."""
        if placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")
        if not tokens_per_second > 0:
            raise ValueError(f"tokens/s must be positive, got {tokens_per_second}")
        name = Path(file).name
        dname, dsize = (Path(draft[0]).name, int(draft[1])) if draft is not None else ("", 0)
        models = self._read()
        entry = next(
            (m for m in models
             if _same(name, size, m.get("file"), m.get("size"), 0.0) and m.get("placement") == placement),
            None,
        )  # fmt: skip
        if entry is None:
            entry = {"file": name, "size": int(size), "placement": placement}
            models.append(entry)
        runs = entry.setdefault("runs", [])
        run = next((r for r in runs if isinstance(r, dict) and r.get("mode") == mode
                    and r.get("draft", "") == dname and r.get("draft_size", 0) == dsize), None)  # fmt: skip
        if run is None:
            run = {"mode": mode, "draft": dname, "draft_size": dsize, "tokens_per_second": []}
            runs.append(run)
        _push(run, "tokens_per_second", float(tokens_per_second))
        if acceptance is not None and draft is not None:
            acc = entry.setdefault("acceptance", [])
            row = next((a for a in acc if isinstance(a, dict) and a.get("draft") == dname
                        and a.get("draft_size") == dsize), None)  # fmt: skip
            if row is None:
                row = {"draft": dname, "draft_size": dsize, "rate": []}
                acc.append(row)
            _push(row, "rate", float(acceptance))
        if verify_costs:
            costs = entry.setdefault("verify_costs", {})
            for batch, cost in verify_costs.items():
                if int(batch) >= 1 and cost > 0:
                    _push(costs, str(int(batch)), float(cost))
        entry["updated"] = (now or datetime.now(timezone.utc)).isoformat(timespec="seconds")
        write_json_atomic(self.path, {"version": VERSION, "models": models})


def _push(container: dict[str, Any], key: str, value: float) -> None:
    values = container.get(key)
    values = [v for v in values if isinstance(v, (int, float))] if isinstance(values, list) else []
    container[key] = [*values, value][-KEEP:]


def _to_measured(entry: Mapping[str, Any]) -> Measured:
    plain = None
    runs: list[tuple[str, str, int, float]] = []
    for r in entry.get("runs", []) if isinstance(entry.get("runs"), list) else []:
        if not isinstance(r, dict) or not isinstance(r.get("mode"), str):
            continue
        tps = _median(r.get("tokens_per_second"))
        if tps is None:
            continue
        if r["mode"] == "plain":
            plain = tps
        else:
            runs.append((r["mode"], str(r.get("draft", "")), int(r.get("draft_size", 0) or 0), tps))
    acceptance = []
    for a in entry.get("acceptance", []) if isinstance(entry.get("acceptance"), list) else []:
        rate = _median(a.get("rate"), floor=-1.0) if isinstance(a, dict) else None
        if rate is not None:
            acceptance.append((str(a.get("draft", "")), int(a.get("draft_size", 0) or 0), rate))
    costs: dict[int, float] = {}
    raw_costs = entry.get("verify_costs")
    for batch, values in raw_costs.items() if isinstance(raw_costs, dict) else ():
        cost = _median(values)
        if cost is not None and str(batch).isdigit():
            costs[int(batch)] = cost
    return Measured(
        file=str(entry["file"]), size=int(entry["size"]), placement=str(entry.get("placement", "cpu")),
        plain=plain, runs=tuple(runs), acceptance=tuple(acceptance), verify_costs=dict(sorted(costs.items())),
    )  # fmt: skip
