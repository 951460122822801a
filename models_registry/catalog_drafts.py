"""The catalog's drafts that are not a second model: a model's own multi-token-prediction (MTP) layers, and
heads (an EAGLE-3 head, a Gemma 4 assistant) trained for one target.

A head is only a draft of the targets it names (``drafts_for``): a pair with another target is refused
when the catalog loads, as the engine refuses the file (`app.gguf.drafts.head_fits`), so nothing is
downloaded that cannot run. `draft_options` lists what can draft for a target, for the draft pickers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .catalog import Catalog, CatalogModel

__all__ = ["DraftOption", "check_heads", "check_pair_draft", "draft_options", "draft_words", "mtp_words"]

_KIND_WORDS = {"eagle3": "an EAGLE-3 head", "assistant": "a Gemma 4 assistant"}


def draft_words(model: CatalogModel) -> str:
    """What ``model`` is as a draft, in a few words."""
    return _KIND_WORDS.get(model.draft_kind, "a draft model")


def mtp_words(n: int) -> str:
    """A target's own MTP layers, in words."""
    return f"drafts with its own MTP layer{'s' * (n > 1)} ({n}, no draft file)"


def check_heads(models: Mapping[str, CatalogModel]) -> None:
    """Every head's targets are catalog models that are not heads, and an EAGLE-3 head has one layer
    (ValueError naming the head)."""
    for m in models.values():
        for tid in m.drafts_for:
            t = models.get(tid)
            if t is None:
                raise ValueError(f"model {m.id!r}: 'drafts_for' names {tid!r}, not a model of the catalog")
            if t.draft_kind:
                raise ValueError(f"model {m.id!r}: 'drafts_for' names {tid!r}, itself a head")
            if m.draft_kind == "assistant" and t.architecture != "gemma4":
                why = f"a Gemma 4 assistant drafts for a gemma4 model, not {tid!r}"
                raise ValueError(f"model {m.id!r}: {why}")
        if m.draft_kind == "eagle3" and m.n_layers != 1:  # llama.cpp loads an EAGLE-3 head of one layer
            raise ValueError(f"model {m.id!r}: an EAGLE-3 head has one layer, not {m.n_layers}")


def check_pair_draft(target: CatalogModel, draft: CatalogModel) -> None:
    """A head pairs only with a target it was trained for; a head is never a target (ValueError)."""
    if target.draft_kind:
        raise ValueError(f"target {target.id!r} is {draft_words(target)}, not a model that answers")
    if draft.draft_kind and target.id not in draft.drafts_for:
        raise ValueError(
            f"draft {draft.id!r} is {draft_words(draft)} trained for {', '.join(draft.drafts_for)}, "
            f"not for {target.id!r}"
        )


@dataclass(frozen=True)
class DraftOption:
    """One way to draft for a target: ``kind`` ``mtp`` (its own layers; ``draft`` is empty), ``eagle3``,
    ``assistant`` or ``model`` (``draft`` the catalog id), and its words."""

    kind: str
    draft: str
    words: str


def draft_options(catalog: Catalog, target_id: str) -> tuple[DraftOption, ...]:
    """What can draft for ``target_id``: its own MTP layers, the heads trained for it, then the draft
    models of the catalog's pairs with it (each once; none for a head or an unknown id)."""
    t = catalog.models.get(target_id)
    if t is None or t.draft_kind:
        return ()
    out: list[DraftOption] = []
    if t.mtp_layers:
        out.append(DraftOption("mtp", "", f"{t.name} {mtp_words(t.mtp_layers)}"))
    heads = [m for m in catalog.models.values() if target_id in m.drafts_for]
    pairs = [catalog.models[p.draft] for p in catalog.pairs if p.target == target_id]
    for m in _unique([*heads, *pairs]):
        out.append(DraftOption(m.draft_kind or "model", m.id, f"{m.name}: {draft_words(m)}"))
    return tuple(out)


def _unique(models: Iterable[CatalogModel]) -> list[CatalogModel]:
    seen: set[str] = set()
    return [m for m in models if not (m.id in seen or seen.add(m.id))]  # type: ignore[func-returns-value]
