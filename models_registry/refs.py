"""Model references as users type them: a local path, ``hf://owner/name/file.gguf[@rev]`` or a catalog id
(``qwen3-8b``, ``qwen3-8b:Q8_0``); resolved to a file, and two of them checked as a target/draft pair.
A split GGUF may be named by any part: it resolves to its first part, cached only once every part is."""

from __future__ import annotations

from pathlib import Path

from app.gguf.compat import Compatibility, check_compatible
from app.gguf.meta import GGUFMetadata, read_metadata_file
from app.gguf.split import first_part

from .catalog import CatalogError, default_catalog
from .parts import cached_model
from .remote import HfRef, parse_hf_ref, read_remote_metadata

__all__ = ["check_refs", "resolve_model_ref"]


def resolve_model_ref(ref: str) -> Path | HfRef:
    """Turn a user's model reference into a local path or an `HfRef`.

    Accepts an existing local path; ``hf://owner/name/file.gguf[@rev]`` (returned as the cached file's
    path when it is already downloaded, else as an `HfRef`); or a catalog id, optionally with a
    quantization (``qwen3-8b`` / ``qwen3-8b:Q8_0``), resolved the same way. Raises `ValueError`.
    """
    ref = ref.strip()
    if ref.startswith("hf://"):
        h = parse_hf_ref(ref)
        hit = cached_model(h.repo_id, h.filename, revision=h.revision)
        return hit if hit is not None else h
    p = Path(ref).expanduser()
    if p.exists():
        if not p.is_file():
            raise ValueError(f"{ref} is not a file")
        return p
    model_id, _, quant = ref.partition(":")
    cat = default_catalog()
    if model_id in cat.models:
        try:
            qf = cat.model(model_id).file(quant or None)
        except CatalogError as e:
            raise ValueError(str(e)) from None
        repo = cat.model(model_id).repo
        hit = cached_model(repo, qf.file)
        return hit if hit is not None else HfRef(repo, qf.file)
    raise ValueError(f"{ref}: no such file, and not an hf://owner/name/file.gguf reference or catalog id")


def _metadata(ref: Path | HfRef) -> GGUFMetadata:
    if isinstance(ref, HfRef):
        meta, _ = read_remote_metadata(ref)
        return meta
    return read_metadata_file(first_part(ref))


def check_refs(target_ref: str, draft_ref: str) -> Compatibility:
    """Compatibility of two models given as local paths, ``hf://`` references or catalog ids.

    Remote files are judged from their header alone (HTTP Range requests, a few MB). Raises
    `ValueError` (bad reference), `HubError` (Hub trouble), `GGUFError` or `OSError` (bad file).
    """
    target = resolve_model_ref(target_ref)
    draft = resolve_model_ref(draft_ref)
    return check_compatible(_metadata(target), _metadata(draft))
