"""A catalog model's optional architecture facts, read and checked against each other.

``active_params``, ``experts``, ``experts_used`` (a mixture of experts: parameters and experts a token
uses); ``kv_layers`` (layers with a KV cache; the others are recurrent); ``sliding_window`` and
``sliding_layers`` (layers that see only the window; the rest are global); ``recurrent_state`` (bytes of
one sequence's recurrent state over every recurrent layer, f32, as llama.cpp holds it; required for a
hybrid or recurrent architecture); ``sources`` (where the facts and files come from: model cards, Hub
listings). Drafting by the model itself or for another: ``mtp_layers`` (multi-token-prediction layers
the file carries: it drafts for itself), ``draft_kind`` (``"eagle3"``: an EAGLE-3 head; ``"assistant"``:
a Gemma 4 assistant) with ``drafts_for`` (the catalog ids of the targets it was trained for). Raises
ValueError naming the field; the catalog adds the model's name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.gguf.arch import MemoryKind, memory_kind

__all__ = ["DRAFT_KINDS", "INT_FIELDS", "optional_facts"]

INT_FIELDS = (
    "active_params", "experts", "experts_used", "kv_layers", "sliding_window", "sliding_layers",
    "recurrent_state", "mtp_layers",
)  # fmt: skip
_MAY_BE_ZERO = ("kv_layers", "recurrent_state")
#: a head's kind and the GGUF architecture its file has (`app.gguf.drafts.draft_facts` reads the same)
DRAFT_KINDS = {"eagle3": "eagle3", "assistant": "gemma4-assistant"}


def _int(entry: Mapping[str, Any], key: str) -> int:
    value = entry[key]
    if isinstance(value, bool) or not isinstance(value, int):
        got = "a boolean" if isinstance(value, bool) else type(value).__name__
        raise ValueError(f"field {key!r} must be an integer, got {got}")
    if value < 0 or (value == 0 and key not in _MAY_BE_ZERO):
        need = "must not be negative" if key in _MAY_BE_ZERO else "must be positive"
        raise ValueError(f"field {key!r} {need}, got {value}")
    return value


def optional_facts(entry: Mapping[str, Any], *, params: int, n_layers: int) -> dict[str, Any]:
    """The optional fields `entry` gives (``sources`` always, as a tuple), checked."""
    facts = {k: _int(entry, k) for k in INT_FIELDS if k in entry}
    for a, b in (("experts", "experts_used"), ("sliding_window", "sliding_layers")):
        if (a in facts) != (b in facts):
            raise ValueError(f"{a!r} and {b!r} go together")
    if facts.get("experts_used", 0) > facts.get("experts", 0):
        raise ValueError(f"'experts_used' ({facts['experts_used']}) exceeds 'experts'")
    if facts.get("active_params", 0) > params:
        raise ValueError("'active_params' exceeds 'params'")
    kv_layers = facts.get("kv_layers", n_layers)
    if kv_layers > n_layers:
        raise ValueError(f"'kv_layers' ({kv_layers}) exceeds 'n_layers'")
    if facts.get("sliding_layers", 0) > kv_layers:
        raise ValueError(f"'sliding_layers' exceeds the layers with a KV cache ({kv_layers})")
    kind = memory_kind(str(entry.get("architecture", "")))
    if kind in (MemoryKind.HYBRID, MemoryKind.RECURRENT) and not facts.get("recurrent_state"):
        raise ValueError(f"a {kind.value} model needs 'recurrent_state' (bytes)")
    sources = entry.get("sources", [])
    if not isinstance(sources, list) or not all(isinstance(u, str) and u.strip() and "\n" not in u
                                                for u in sources):  # fmt: skip
        raise ValueError("'sources' must be a list of one-line strings")
    return {**facts, **_draft_facts(entry, facts), "sources": tuple(u.strip() for u in sources)}


def _draft_facts(entry: Mapping[str, Any], facts: Mapping[str, int]) -> dict[str, Any]:
    """``draft_kind`` and ``drafts_for``: a head's kind, its targets, and its kind's architecture."""
    kind, targets = entry.get("draft_kind", ""), entry.get("drafts_for", [])
    if not kind and not targets:
        return {}
    if kind not in DRAFT_KINDS:
        raise ValueError(f"'draft_kind' must be one of {', '.join(map(repr, DRAFT_KINDS))}, got {kind!r}")
    if not isinstance(targets, list) or not targets or not all(isinstance(t, str) and t for t in targets):
        raise ValueError("a head lists the target ids it was trained for in 'drafts_for'")
    if entry.get("architecture") != DRAFT_KINDS[kind]:
        raise ValueError(f"a {kind!r} head has architecture {DRAFT_KINDS[kind]!r}")
    if facts.get("mtp_layers"):
        raise ValueError("a head has no 'mtp_layers' of its own")
    return {"draft_kind": kind, "drafts_for": tuple(targets)}
