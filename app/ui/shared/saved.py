"""What is saved with an assistant message, as a frozen record: why the reply ended, the engine's
figures (its :class:`~app.engine.Stats`) and what the app measured (time to the first text, the spans of
drafted text). Stored as JSON in the conversation store; an older or foreign record reads with the
figures it lacks as zero."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from app.engine import Action, FinishReason, Mode, Stats

__all__ = ["SavedReply"]

Span = tuple[int, int]


@dataclass(frozen=True)
class SavedReply:
    """A reply's record. ``reason`` None: not known (an old record)."""

    reason: FinishReason | None = None
    stats: Stats | None = None
    ttft_ui_s: float | None = None  # seconds from sending to the first text, as the app saw it
    draft_spans: tuple[Span, ...] = ()  # character ranges the draft proposed and the target accepted

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.reason is not None:
            out["reason"] = self.reason.value
        if self.stats is not None:
            out["stats"] = asdict(self.stats)
        if self.ttft_ui_s is not None:
            out["ttft_ui_s"] = self.ttft_ui_s
        out["draft_spans"] = [list(s) for s in self.draft_spans]
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> SavedReply:
        data = data or {}
        reason = data.get("reason")
        ttft = data.get("ttft_ui_s")
        return cls(
            reason=FinishReason(reason) if reason in FinishReason._value2member_map_ else None,
            stats=_stats(data["stats"]) if isinstance(data.get("stats"), Mapping) else None,
            ttft_ui_s=float(ttft) if isinstance(ttft, int | float) else None,
            draft_spans=tuple((int(a), int(b)) for a, b in data.get("draft_spans") or ()),
        )


def _stats(d: Mapping[str, Any]) -> Stats:
    """Stats from their JSON: each field converted to its type, a missing one zero (or empty)."""
    hints = typing.get_type_hints(Stats)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(Stats):
        v, kind = d.get(f.name), hints[f.name]
        if f.name == "mode":
            values[f.name] = Mode(v) if v in Mode._value2member_map_ else Mode.REMOTE
        elif f.name == "drafting_off":
            values[f.name] = Action(v) if v in Action._value2member_map_ else None
        elif kind is int:
            values[f.name] = int(v or 0)
        elif kind is float:
            values[f.name] = float(v or 0.0)
        else:  # the histograms: tuples of numbers
            values[f.name] = tuple(v or ())
    return Stats(**values)
