"""Target/draft vocabulary compatibility, following llama.cpp's speculative-decoding rules.

Mirrors ``common_speculative_are_compatible`` (llama.cpp ``common/speculative.cpp``), evaluated from GGUF
metadata alone so a pair can be vetted before either model is loaded. The rules, checked in this order
(the first failing one is reported):

1. same vocab type (``tokenizer.ggml.model`` mapped to SPM/BPE/WPM/UGM/RWKV/...);
2. same ``add_bos`` flag and, when it is set, the same BOS id;
3. same ``add_eos`` flag and, when it is set, the same EOS id;
4. token counts differ by at most ``MAX_VOCAB_SIZE_DIFFERENCE`` (128);
5. identical token texts for ids ``CHECK_START_TOKEN_ID`` (5) .. ``min(n_vocab) - 1``.

Absent keys resolve to what llama.cpp's vocab loader (``llama_vocab::impl::load``) would use, because
that is what the engine will actually run with. In particular, when ``tokenizer.ggml.add_bos_token`` is
missing, ``add_bos`` is **not** simply false:

* SPM (``llama``) and WPM (``bert``): true;
* BPE (``gpt2``): true only for the pre-tokenizers llama.cpp flags (``llama3``, ``llama-bpe``,
  ``falcon3``, ``tekken``, ... see ``_BPE_PRE_ADD_BOS``), otherwise false;
* UGM (``t5``), RWKV, PLaMo-2, none: false.

A missing ``add_eos_token`` is true for UGM and false otherwise. Missing (or out-of-range) BOS/EOS ids take
the per-type defaults (SPM 1/2, BPE 11/11, WPM 101/none, UGM none/1, ...), and ``glm4``/``chatglm-bpe``
have no BOS. Each resolved value records whether it came from the file or from such a default, and the
reason string says so, since "defaults differ" is a common and otherwise confusing cause.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Any

from app.gguf.drafts import DraftKind, draft_facts, head_fits
from app.gguf.meta import GGUFMetadata, read_metadata_file

__all__ = [
    "CHECK_START_TOKEN_ID",
    "MAX_VOCAB_SIZE_DIFFERENCE",
    "Compatibility",
    "VocabInfo",
    "check_compatible",
    "check_files",
    "vocab_fingerprint",
    "vocab_info",
]

MAX_VOCAB_SIZE_DIFFERENCE = 128  # SPEC_VOCAB_MAX_SIZE_DIFFERENCE
CHECK_START_TOKEN_ID = 5  # SPEC_VOCAB_CHECK_START_TOKEN_ID

# tokenizer.ggml.model -> llama_vocab_type name
_VOCAB_TYPES = {
    "no_vocab": "NONE",
    "none": "NONE",
    "llama": "SPM",
    "gpt2": "BPE",
    "bert": "WPM",
    "t5": "UGM",
    "rwkv": "RWKV",
    "plamo2": "PLAMO2",
}
# default (bos_id, eos_id) per vocab type before the file's own keys are applied
_DEFAULT_SPECIAL_IDS: dict[str, tuple[int | None, int | None]] = {
    "NONE": (None, None),
    "SPM": (1, 2),
    "BPE": (11, 11),
    "WPM": (101, None),
    "UGM": (None, 1),
    "RWKV": (None, None),
    "PLAMO2": (1, 2),
}
# default (add_bos, add_eos) per vocab type when the keys are absent
_DEFAULT_ADD = {"SPM": (True, False), "WPM": (True, False), "UGM": (False, True)}
# BPE pre-tokenizers for which llama.cpp sets add_bos = true by default
_BPE_PRE_ADD_BOS = frozenset(
    {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "tekken"}
)
# BPE pre-tokenizers for which llama.cpp has no BOS token by default
_BPE_PRE_NO_BOS = frozenset({"glm4", "chatglm-bpe"})


@dataclass(frozen=True)
class VocabInfo:
    """A model's vocabulary settings as llama.cpp resolves them. ``*_source`` is ``"file"`` when the
    value comes from the GGUF key and ``"default"`` when llama.cpp's default applies."""

    model: str | None  # tokenizer.ggml.model
    type: str  # SPM, BPE, WPM, UGM, RWKV, PLAMO2, NONE, or "unknown(<model>)"
    pre: str | None
    n_vocab: int
    add_bos: bool
    add_bos_source: str
    bos_id: int | None
    bos_source: str
    add_eos: bool
    add_eos_source: str
    eos_id: int | None
    eos_source: str
    tokens: list[str] | None


def vocab_info(meta: GGUFMetadata) -> VocabInfo:
    """Resolve `meta`'s vocabulary settings, applying llama.cpp's defaults for absent keys."""
    kv = meta.kv
    model = kv.get("tokenizer.ggml.model")
    model = model if isinstance(model, str) else None
    pre = kv.get("tokenizer.ggml.pre")
    pre = pre if isinstance(pre, str) else None
    vtype = _VOCAB_TYPES.get(model, f"unknown({model})") if model is not None else "missing"
    tokens = meta.tokens
    n_vocab = len(tokens) if tokens is not None else 0
    if tokens is None and vtype == "NONE":
        n_vocab = meta.vocab_size or 0

    bos_def, eos_def = _DEFAULT_SPECIAL_IDS.get(vtype, (None, None))
    add_bos_def, add_eos_def = _DEFAULT_ADD.get(vtype, (False, False))
    if vtype == "BPE":
        add_bos_def = pre in _BPE_PRE_ADD_BOS
        if pre in _BPE_PRE_NO_BOS:
            bos_def = None

    def special(key: str, default: int | None) -> tuple[int | None, str]:
        v = kv.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < n_vocab:
            return v, "file"
        return default, "default"  # llama.cpp ignores ids outside the vocabulary

    def flag(key: str, default: bool) -> tuple[bool, str]:
        v = kv.get(key)
        if v is None or isinstance(v, (list, str)):
            return default, "default"
        return bool(v), "file"

    bos_id, bos_src = special("tokenizer.ggml.bos_token_id", bos_def)
    eos_id, eos_src = special("tokenizer.ggml.eos_token_id", eos_def)
    add_bos, add_bos_src = flag("tokenizer.ggml.add_bos_token", add_bos_def)
    add_eos, add_eos_src = flag("tokenizer.ggml.add_eos_token", add_eos_def)
    return VocabInfo(
        model=model, type=vtype, pre=pre, n_vocab=n_vocab,
        add_bos=add_bos, add_bos_source=add_bos_src, bos_id=bos_id, bos_source=bos_src,
        add_eos=add_eos, add_eos_source=add_eos_src, eos_id=eos_id, eos_source=eos_src,
        tokens=tokens,
    )  # fmt: skip


@dataclass(frozen=True)
class Compatibility:
    """Outcome of a target/draft check. ``rule`` names the failing rule (``ok`` when compatible):
    ``vocab``, ``vocab_type``, ``add_bos``, ``bos_id``, ``add_eos``, ``eos_id``, ``vocab_size``,
    ``token_text``. ``target_value``/``draft_value`` hold the differing values and ``token_id`` the first
    differing token for ``token_text``. Truthy iff compatible."""

    ok: bool
    reason: str
    rule: str = "ok"
    target_value: Any = None
    draft_value: Any = None
    token_id: int | None = None
    n_vocab_target: int | None = None
    n_vocab_draft: int | None = None

    def __bool__(self) -> bool:
        return self.ok


def _short(text: str, limit: int = 40) -> str:
    r = repr(text)
    return r if len(r) <= limit else r[: limit - 4] + "...'"


def _token_text(tokens: list[str], i: int) -> str:
    # llama.cpp replaces empty token texts with "[EMPTY_<id>]" when loading
    return tokens[i] or f"[EMPTY_{i}]"


def _first_token_difference(tgt: list[str], dft: list[str], start: int, stop: int) -> int | None:
    if tgt[start:stop] == dft[start:stop]:
        return None
    # bisect in slices (C-speed comparisons) down to the first differing id
    lo, hi = start, stop
    while hi - lo > 64:
        mid = (lo + hi) // 2
        if tgt[lo:mid] == dft[lo:mid]:
            lo = mid
        else:
            hi = mid
    for i in range(lo, hi):
        if _token_text(tgt, i) != _token_text(dft, i):
            return i
    # only empty-vs-"[EMPTY_i]" differences so far: keep scanning the rest
    return _first_token_difference(tgt, dft, hi, stop) if hi < stop else None


def check_compatible(target: GGUFMetadata, draft: GGUFMetadata) -> Compatibility:
    """Apply llama.cpp's speculative-decoding vocabulary rules to `target` and `draft` metadata.
    An EAGLE-3 head, a Gemma 4 assistant or a DFlash drafter (rule ``head``) is checked against its
    target's architecture and size (:func:`app.gguf.drafts.head_fits`); an EAGLE-3 head or a Gemma 4
    assistant that fits is compatible, a DFlash drafter is not drafted with yet."""
    t, d = vocab_info(target), vocab_info(draft)
    sizes = {"n_vocab_target": t.n_vocab, "n_vocab_draft": d.n_vocab}

    def fail(rule: str, reason: str, tv: Any, dv: Any, **extra: Any) -> Compatibility:
        return Compatibility(False, reason, rule, tv, dv, **extra, **sizes)

    kind = draft_facts(draft)
    if kind.kind in (DraftKind.EAGLE3, DraftKind.GEMMA4_ASSISTANT, DraftKind.DFLASH):
        fits, why = head_fits(target, draft)
        if not fits:
            return fail(
                "head",
                f"{kind.words} that does not match this target: {why}",
                target.architecture,
                kind.kind.value,
            )
        if kind.kind in (DraftKind.EAGLE3, DraftKind.GEMMA4_ASSISTANT):  # in the target's vocabulary
            return Compatibility(True, f"{kind.words}: it fits this target", "ok", **sizes)
        why = f"{kind.words}: it fits this target, but Tandem does not draft with {kind.kind.value} files yet"
        return fail("head", why, target.architecture, kind.kind.value)

    def src(info: VocabInfo, source: str, key: str) -> str:
        return f" (llama.cpp default for {info.type}, {key} absent)" if source == "default" else ""

    for who, info in (("target", t), ("draft", d)):
        if info.type == "missing":
            return fail("vocab", f"{who} has no tokenizer (tokenizer.ggml.model missing)", t.model, d.model)
        if info.tokens is None and info.type != "NONE":
            return fail(
                "vocab", f"{who} has no token list (tokenizer.ggml.tokens missing)", t.n_vocab, d.n_vocab
            )

    if t.type != d.type:
        return fail(
            "vocab_type",
            f"vocab types differ: target {t.model!r} ({t.type}) vs draft {d.model!r} ({d.type})",
            t.type, d.type,
        )  # fmt: skip
    if t.add_bos != d.add_bos:
        return fail(
            "add_bos",
            f"add_bos differs: target {t.add_bos}{src(t, t.add_bos_source, 'add_bos_token')} vs draft "
            f"{d.add_bos}{src(d, d.add_bos_source, 'add_bos_token')}",
            t.add_bos, d.add_bos,
        )  # fmt: skip
    if t.add_bos and t.bos_id != d.bos_id:
        return fail(
            "bos_id",
            f"BOS token ids differ: target {t.bos_id}{src(t, t.bos_source, 'bos_token_id')} vs draft "
            f"{d.bos_id}{src(d, d.bos_source, 'bos_token_id')}",
            t.bos_id, d.bos_id,
        )  # fmt: skip
    if t.add_eos != d.add_eos:
        return fail(
            "add_eos",
            f"add_eos differs: target {t.add_eos}{src(t, t.add_eos_source, 'add_eos_token')} vs draft "
            f"{d.add_eos}{src(d, d.add_eos_source, 'add_eos_token')}",
            t.add_eos, d.add_eos,
        )  # fmt: skip
    if t.add_eos and t.eos_id != d.eos_id:
        return fail(
            "eos_id",
            f"EOS token ids differ: target {t.eos_id}{src(t, t.eos_source, 'eos_token_id')} vs draft "
            f"{d.eos_id}{src(d, d.eos_source, 'eos_token_id')}",
            t.eos_id, d.eos_id,
        )  # fmt: skip

    diff = abs(t.n_vocab - d.n_vocab)
    if diff > MAX_VOCAB_SIZE_DIFFERENCE:
        return fail(
            "vocab_size",
            f"vocab sizes differ by {diff} (> {MAX_VOCAB_SIZE_DIFFERENCE}): target {t.n_vocab}, "
            f"draft {d.n_vocab}",
            t.n_vocab, d.n_vocab,
        )  # fmt: skip

    if t.tokens is not None and d.tokens is not None:
        stop = min(t.n_vocab, d.n_vocab)
        i = _first_token_difference(t.tokens, d.tokens, CHECK_START_TOKEN_ID, stop)
        if i is not None:
            tt, dt = _token_text(t.tokens, i), _token_text(d.tokens, i)
            return fail(
                "token_text",
                f"token {i} differs: target {_short(tt)} vs draft {_short(dt)}",
                tt, dt, token_id=i,
            )  # fmt: skip

    note = f" (sizes differ by {diff})" if diff else ""
    return Compatibility(True, f"compatible: same {t.type} vocabulary{note}", "ok", **sizes)


def check_files(target_path: str | os.PathLike[str], draft_path: str | os.PathLike[str]) -> Compatibility:
    """`check_compatible` on two local GGUF files (reads their headers only)."""
    return check_compatible(read_metadata_file(target_path), read_metadata_file(draft_path))


def vocab_fingerprint(meta: GGUFMetadata) -> str:
    """Short hex digest of everything the compatibility rules look at.

    Models with equal fingerprints are always compatible with each other; different fingerprints do not
    imply incompatibility (sizes may differ by up to 128 tokens, ids below 5 are not compared).
    """
    v = vocab_info(meta)
    h = hashlib.sha256()
    h.update(repr((v.type, v.add_bos, v.bos_id if v.add_bos else None,
                   v.add_eos, v.eos_id if v.add_eos else None, v.n_vocab)).encode())  # fmt: skip
    if v.tokens is not None:
        toks = v.tokens[CHECK_START_TOKEN_ID:]
        h.update("\0".join(toks).encode("utf-8", "surrogatepass"))
    return h.hexdigest()[:16]
