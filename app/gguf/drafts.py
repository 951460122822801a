"""What kind of draft a GGUF is, from its header: a draft model, a target that carries its own
multi-token-prediction (MTP) layers, an EAGLE-3 head, Gemma 4's assistant or a DFlash drafter; and
whether a head or an assistant fits a target.

The keys are the pinned llama.cpp's (``src/llama-arch.cpp``): ``<arch>.nextn_predict_layers`` (MTP
blocks after the trunk, counted in ``block_count``), ``eagle3.target_layers`` and
``eagle3.target_hidden_size`` (the three target layers an EAGLE-3 head reads, and their width),
``gemma4-assistant.embedding_length_out`` (the width of the Gemma 4 it was trained beside).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from app.gguf.meta import GGUFMetadata


class DraftKind(str, Enum):
    MODEL = "model"  # a small model of the target's vocabulary, in its own context
    MTP = "mtp"  # a model with multi-token-prediction layers: it drafts for itself
    EAGLE3 = "eagle3"  # an EAGLE-3 head: reads three of its target's layers
    GEMMA4_ASSISTANT = "gemma4-assistant"  # Gemma 4's assistant draft: shares its target's cache
    DFLASH = "dflash"  # a DFlash block drafter


@dataclass(frozen=True)
class DraftFacts:
    """What a file is as a draft."""

    kind: DraftKind
    mtp_layers: int = 0  # MTP blocks (a model of kind MTP)
    target_width: int = 0  # the width of the target a head or an assistant was trained for (0: unknown)
    target_layers: tuple[int, ...] = ()  # EAGLE-3: the target layers it reads

    @property
    def words(self) -> str:
        if self.kind is DraftKind.MTP:
            return f"a model with {self.mtp_layers} multi-token-prediction layer{'s' * (self.mtp_layers > 1)} (drafts for itself: --mode mtp)"  # noqa: E501
        if self.kind is DraftKind.EAGLE3:
            return f"an EAGLE-3 head for a target of width {self.target_width or '?'} (reads its layers {', '.join(map(str, self.target_layers)) or '?'})"  # noqa: E501
        if self.kind is DraftKind.GEMMA4_ASSISTANT:
            return f"a Gemma 4 assistant for a Gemma 4 of width {self.target_width or '?'}"
        if self.kind is DraftKind.DFLASH:
            return "a DFlash block drafter"
        return "a draft model"


def _int(value: object) -> int:
    try:
        return int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return 0


def draft_facts(meta: GGUFMetadata) -> DraftFacts:
    """What ``meta``'s file is as a draft."""
    arch = meta.architecture or ""
    if arch == "eagle3":
        layers = tuple(_int(x) for x in (meta.get("eagle3.target_layers") or ()))
        return DraftFacts(
            DraftKind.EAGLE3, target_width=_int(meta.get("eagle3.target_hidden_size")), target_layers=layers
        )
    if arch == "gemma4-assistant":
        return DraftFacts(
            DraftKind.GEMMA4_ASSISTANT, target_width=_int(meta.get(f"{arch}.embedding_length_out"))
        )
    if arch == "dflash":
        return DraftFacts(DraftKind.DFLASH)
    n = mtp_layers(meta)
    return DraftFacts(DraftKind.MTP, mtp_layers=n) if n else DraftFacts(DraftKind.MODEL)


def mtp_layers(meta: GGUFMetadata) -> int:
    """How many multi-token-prediction layers the model carries (0: none)."""
    arch = meta.architecture or ""
    return _int(meta.get(f"{arch}.nextn_predict_layers")) if arch not in ("eagle3", "dflash") else 0


def head_fits(target: GGUFMetadata, head: GGUFMetadata) -> tuple[bool, str]:
    """Whether an EAGLE-3 head or a Gemma 4 assistant was made for ``target``'s architecture and size
    (the reason where not); a draft model or an MTP model is judged by its vocabulary instead."""
    facts = draft_facts(head)
    width = target.embedding_length or 0
    trunk = (target.block_count or 0) - mtp_layers(target)
    if facts.kind is DraftKind.EAGLE3:
        if facts.target_width and width and facts.target_width != width:
            return (
                False,
                f"the EAGLE-3 head was trained for a target of width {facts.target_width}, not {width}",
            )
        if len(facts.target_layers) != 3:
            return False, f"an EAGLE-3 head reads 3 target layers; this one names {len(facts.target_layers)}"
        if trunk and max(facts.target_layers) > trunk:  # layer ``trunk``: the output of the last
            return (
                False,
                f"the EAGLE-3 head reads layer {max(facts.target_layers)}, the target has {trunk} layers",
            )
        return True, ""
    if facts.kind is DraftKind.GEMMA4_ASSISTANT:
        if target.architecture != "gemma4":
            return False, f"a Gemma 4 assistant drafts for a Gemma 4 (gemma4), not for {target.architecture}"
        if facts.target_width and width and facts.target_width != width:
            return (
                False,
                f"the assistant was made for a Gemma 4 of width {facts.target_width}, this one's is {width}",
            )
        for key, what in (("key_length", "channels per head"), ("head_count_kv", "KV heads")):
            mine = _int(head.get(f"gemma4-assistant.attention.{key}"))
            theirs = _int(target.get(f"gemma4.attention.{key}"))
            if mine and theirs and mine != theirs:  # it attends over the target's cache with its heads
                why = f"the assistant reads the target's cache with {mine} {what}; the target has {theirs}"
                return False, why
        return True, ""
    if facts.kind is DraftKind.DFLASH:
        return False, "DFlash drafters are not supported"
    return True, ""
