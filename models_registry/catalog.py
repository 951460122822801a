"""Typed loader and validator for the curated model catalog (``catalog.toml``)."""

from __future__ import annotations

import dataclasses
import functools
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.gguf.arch import MemoryKind, Rollback, memory_kind, rollback_for
from app.gguf.split import part_names, split_info

from .catalog_drafts import DraftOption, check_heads, check_pair_draft, draft_options
from .catalog_facts import optional_facts
from .drafting import PairDrafting, pair_drafting

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 needs the tomli backport
    import tomli as tomllib

__all__ = [
    "DEFAULT_CATALOG_PATH",
    "DEFAULT_QUANT",
    "Catalog",
    "CatalogError",
    "CatalogModel",
    "Pair",
    "PartFile",
    "QuantFile",
    "default_catalog",
    "load_catalog",
    "loads_catalog",
    "parse_catalog",
    "validate_filename",
    "validate_repo_id",
]

DEFAULT_CATALOG_PATH = Path(__file__).with_name("catalog.toml")
DEFAULT_QUANT = "Q4_K_M"
SCHEMA_VERSION = 1

# Hub rules: letters, digits, "-", "_", "."; no "--" or ".." ; no leading/trailing "-" or "."; <= 96 chars.
_REPO_PART = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_ID = re.compile(r"^[a-z0-9][a-z0-9._+-]{0,63}$")
_QUANT = re.compile(r"^[A-Z0-9][A-Z0-9_]{0,15}$")


class CatalogError(ValueError):
    """The catalog (or one entry of it) is malformed."""


def validate_repo_id(repo_id: object) -> str:
    """Return `repo_id` if it is a well-formed ``owner/name`` Hub id, else raise `CatalogError`."""
    if not isinstance(repo_id, str):
        raise CatalogError(f"repo id must be a string like 'owner/name', got {type(repo_id).__name__}")
    parts = repo_id.split("/")
    if len(parts) != 2 or not all(parts):
        raise CatalogError(f"repo id {repo_id!r} must have the form 'owner/name'")
    for part in parts:
        if not _REPO_PART.match(part) or "--" in part or ".." in part:
            raise CatalogError(
                f"repo id {repo_id!r}: {part!r} may only use letters, digits, '-', '_' and '.', "
                "must not start or end with '-' or '.', nor contain '--' or '..'"
            )
    return repo_id


def validate_filename(filename: object, *, allow_subfolder: bool = False) -> str:
    """Return `filename` if it is a safe ``*.gguf`` name, else raise `CatalogError`.

    Rejects absolute paths, backslashes, ``..``, empty segments and control characters. Only with
    `allow_subfolder` may it contain ``/`` (plain relative segments, as in ``Q8_0/model-00001.gguf``).
    """
    if not isinstance(filename, str) or not filename:
        raise CatalogError("file name must be a non-empty string")
    if _CONTROL.search(filename):
        raise CatalogError(f"file name {filename!r} contains control characters")
    if "\\" in filename:
        raise CatalogError(f"file name {filename!r} contains a backslash")
    if filename.startswith("/") or re.match(r"^[A-Za-z]:", filename):
        raise CatalogError(f"file name {filename!r} is an absolute path")
    segments = filename.split("/")
    if len(segments) > 1 and not allow_subfolder:
        raise CatalogError(f"file name {filename!r} must be a plain name without '/'")
    for seg in segments:
        if seg in ("", ".", ".."):
            raise CatalogError(f"file name {filename!r} has an empty, '.' or '..' path segment")
    if not filename.lower().endswith(".gguf") or segments[-1].lower() == ".gguf":
        raise CatalogError(f"file name {filename!r} must end in '.gguf'")
    return filename


@dataclass(frozen=True)
class PartFile:
    """One part of a split GGUF (``name-00001-of-00003.gguf``) and its size."""

    file: str
    size: int


@dataclass(frozen=True)
class QuantFile:
    """A model at one quantization: one GGUF file, or a split GGUF published as parts.

    For a split model `file` is the first part (what llama.cpp opens), `parts` lists every part in order
    and `size` is their sum.
    """

    quant: str
    file: str
    size: int
    size_approx: bool = False
    parts: tuple[PartFile, ...] = ()

    @property
    def split(self) -> bool:
        return bool(self.parts)

    @property
    def downloads(self) -> tuple[PartFile, ...]:
        """The files to fetch: every part of a split model, else the one file."""
        return self.parts or (PartFile(self.file, self.size),)

    def names(self) -> tuple[str, ...]:
        """Every file name of the model (the parts of a split one)."""
        return tuple(p.file for p in self.downloads)


@dataclass(frozen=True)
class CatalogModel:
    """A model of the catalog, with what the memory and speed estimates need. Optional: a mixture of
    experts' ``active_params`` (0: ``params``), ``experts``, ``experts_used``; ``kv_layers`` (-1: all);
    ``sliding_window``, ``sliding_layers``; ``recurrent_state`` (bytes of one sequence's state over its
    recurrent layers, f32); ``sources`` (where the facts come from); ``mtp_layers`` (its own
    multi-token-prediction layers: it drafts for itself); ``draft_kind`` and ``drafts_for`` (a head: an
    EAGLE-3 head or a Gemma 4 assistant, and the target ids it was trained for; `catalog_drafts`)."""

    id: str
    name: str
    repo: str
    family: str
    tokenizer: str
    architecture: str
    params: int
    n_layers: int
    n_kv_heads: int
    head_dim: int
    context_length: int
    license: str
    gated: bool
    files: Mapping[str, QuantFile]
    default_quant: str = DEFAULT_QUANT
    active_params: int = 0
    experts: int = 0
    experts_used: int = 0
    kv_layers: int = -1
    sliding_window: int = 0
    sliding_layers: int = 0
    recurrent_state: int = 0
    sources: tuple[str, ...] = ()
    mtp_layers: int = 0
    draft_kind: str = ""
    drafts_for: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.active_params <= 0:
            object.__setattr__(self, "active_params", self.params)
        if self.kv_layers < 0:
            object.__setattr__(self, "kv_layers", self.n_layers)

    @property
    def memory(self) -> MemoryKind:
        """What the model keeps of the text it has read (`app.gguf.arch.memory_kind`)."""
        return memory_kind(self.architecture, sliding_window=self.sliding_window)

    @property
    def rollback(self) -> Rollback:
        """How the engine undoes a rejected draft on this model."""
        return rollback_for(self.memory, self.architecture)

    @property
    def moe(self) -> bool:
        """A mixture of experts (some of its weights are read per token)."""
        return self.experts > 1 and self.experts_used > 0

    def file(self, quant: str | None = None) -> QuantFile:
        """The file for `quant` (default: the model's default quantization)."""
        q = quant or self.default_quant
        try:
            return self.files[q]
        except KeyError:
            raise CatalogError(
                f"model {self.id!r} has no {q} file (offered: {', '.join(self.files)})"
            ) from None


@dataclass(frozen=True)
class Pair:
    """A curated target/draft pair with suggested draft settings."""

    id: str
    target: str
    draft: str
    n_max: int
    p_min: float
    good_for: str


@dataclass(frozen=True)
class Catalog:
    """Validated catalog: models by id, and pairs in file order."""

    models: Mapping[str, CatalogModel]
    pairs: tuple[Pair, ...]
    source: str = field(default="<catalog>", compare=False)

    def model(self, model_id: str) -> CatalogModel:
        """The model with id `model_id` (raises `CatalogError` naming it if unknown)."""
        try:
            return self.models[model_id]
        except KeyError:
            raise CatalogError(f"unknown model id {model_id!r}") from None

    def pair(self, pair_id: str) -> Pair:
        """The pair with id `pair_id`."""
        for p in self.pairs:
            if p.id == pair_id:
                return p
        raise CatalogError(f"unknown pair id {pair_id!r}")

    def drafting(self, pair: Pair) -> PairDrafting:
        """What drafting `pair` supports (its models' memory kinds and rollbacks)."""
        return pair_drafting(self.model(pair.target), self.model(pair.draft))

    def draft_options(self, target_id: str) -> tuple[DraftOption, ...]:
        """What can draft for a target: its own MTP layers, heads trained for it, its pairs' drafts."""
        return draft_options(self, target_id)

    def to_data(self) -> dict[str, Any]:
        """The catalog as plain data (for JSON): pairs in order, and each model with its facts and, per
        quantization, its file's repo, name, size and parts (a single file is its own one part)."""
        return {
            "schema": SCHEMA_VERSION,
            "pairs": [{**dataclasses.asdict(p), "drafting": self.drafting(p).to_data()} for p in self.pairs],
            "models": {m.id: _model_data(m) for m in self.models.values()},
        }

    def find_file(self, repo_id: str, filename: str) -> tuple[CatalogModel, QuantFile] | None:
        """The catalog model and quantization a Hub file is (any part of a split one), or None (repo ids
        compare case-insensitively)."""
        for m in self.models.values():
            if m.repo.lower() != repo_id.lower():
                continue
            for qf in m.files.values():
                if filename in qf.names():
                    return m, qf
        return None

    def find_filename(self, filename: str) -> tuple[CatalogModel, QuantFile] | None:
        """Match on the file name alone (for files in user folders; any part of a split model)."""
        for m in self.models.values():
            for qf in m.files.values():
                if filename.lower() in (n.lower() for n in qf.names()):
                    return m, qf
        return None


def _model_data(m: CatalogModel) -> dict[str, Any]:
    facts = {f.name: getattr(m, f.name) for f in dataclasses.fields(m) if f.name not in ("id", "files")}
    facts.update(sources=list(m.sources), memory=m.memory.value, rollback=m.rollback.value, moe=m.moe)
    files = {
        q: {"quant": q, "repo": m.repo, "file": qf.file, "size": qf.size, "size_approx": qf.size_approx,
            "split": qf.split, "parts": [dataclasses.asdict(p) for p in qf.downloads]}
        for q, qf in m.files.items()
    }  # fmt: skip
    return {**facts, "files": files}


# ------------------------------------------------------------------------------------------- parsing


def _get(entry: Mapping[str, Any], key: str, typ: type | tuple[type, ...], where: str) -> Any:
    if key not in entry:
        raise CatalogError(f"{where}: missing required field {key!r}")
    value = entry[key]
    # bool is an int subclass: never accept one where a number is required
    if isinstance(value, bool) and bool not in (typ if isinstance(typ, tuple) else (typ,)):
        raise CatalogError(f"{where}: field {key!r} must be {_tname(typ)}, got a boolean")
    if not isinstance(value, typ):
        raise CatalogError(f"{where}: field {key!r} must be {_tname(typ)}, got {type(value).__name__}")
    return value


def _tname(typ: type | tuple[type, ...]) -> str:
    types = typ if isinstance(typ, tuple) else (typ,)
    return " or ".join({"str": "a string", "int": "an integer", "bool": "a boolean", "float": "a number"}.get(
        t.__name__, t.__name__) for t in types)  # fmt: skip


def _positive(value: int, key: str, where: str) -> int:
    if value <= 0:
        raise CatalogError(f"{where}: field {key!r} must be positive, got {value}")
    return value


def _parse_file(quant: str, fentry: Mapping[str, Any], where: str) -> QuantFile:
    """One quantization's file: ``file`` and ``size``, or for a split GGUF ``file`` (the first part) and
    ``parts`` (every part's ``file`` and ``size``, in order; ``size`` may be left out: it is their sum)."""
    try:
        fname = validate_filename(_get(fentry, "file", str, where))
    except CatalogError as e:
        raise CatalogError(f"{where}: {e}") from None
    approx = fentry.get("size_approx", False)
    if not isinstance(approx, bool):
        raise CatalogError(f"{where}: 'size_approx' must be a boolean")
    if "parts" not in fentry:
        if split_info(fname) is not None:
            raise CatalogError(f"{where}: {fname!r} is one part of a split model: list every part in 'parts'")
        size = _positive(_get(fentry, "size", int, where), "size", where)
        return QuantFile(quant=quant, file=fname, size=size, size_approx=approx)
    raw = _get(fentry, "parts", list, where)
    parts = tuple(_parse_part(p, i, where) for i, p in enumerate(raw))
    info = split_info(fname)
    if info is None or info[1] != 1:
        raise CatalogError(
            f"{where}: {fname!r} must be the first part of a split model, like name-00001-of-00003.gguf"
        )
    expected = part_names(fname)
    if [p.file for p in parts] != expected:
        raise CatalogError(f"{where}: 'parts' must be {', '.join(expected)} in this order")
    total = sum(p.size for p in parts)
    size = fentry.get("size", total)
    if isinstance(size, bool) or not isinstance(size, int) or size != total:
        raise CatalogError(f"{where}: 'size' must be the sum of the parts ({total}), got {size!r}")
    return QuantFile(quant=quant, file=fname, size=total, size_approx=approx, parts=parts)


def _parse_part(entry: Any, index: int, where: str) -> PartFile:
    pwhere = f"{where} part {index + 1}"
    if not isinstance(entry, Mapping):
        raise CatalogError(f"{pwhere}: must be a table with 'file' and 'size'")
    try:
        name = validate_filename(_get(entry, "file", str, pwhere))
    except CatalogError as e:
        raise CatalogError(f"{pwhere}: {e}") from None
    return PartFile(name, _positive(_get(entry, "size", int, pwhere), "size", pwhere))


def _parse_model(entry: Any, index: int) -> CatalogModel:
    if not isinstance(entry, Mapping):
        raise CatalogError(f"model #{index + 1}: must be a table")
    mid = entry.get("id")
    where = f"model {mid!r}" if isinstance(mid, str) else f"model #{index + 1}"
    mid = _get(entry, "id", str, where)
    if not _ID.match(mid):
        raise CatalogError(f"{where}: id must be lowercase letters, digits, '.', '_', '+' or '-'")
    try:
        repo = validate_repo_id(_get(entry, "repo", str, where))
    except CatalogError as e:
        raise CatalogError(f"{where}: {e}") from None
    ints = {k: _positive(_get(entry, k, int, where), k, where)
            for k in ("params", "n_layers", "n_kv_heads", "head_dim", "context_length")}  # fmt: skip
    files_raw = _get(entry, "files", Mapping, where)
    if not files_raw:
        raise CatalogError(f"{where}: 'files' lists no quantization")
    files: dict[str, QuantFile] = {}
    for quant, fentry in files_raw.items():
        fwhere = f"{where} file {quant}"
        if not _QUANT.match(quant):
            raise CatalogError(f"{fwhere}: quantization names look like 'Q4_K_M'")
        if not isinstance(fentry, Mapping):
            raise CatalogError(f"{fwhere}: must be a table with 'file' and 'size'")
        files[quant] = _parse_file(quant, fentry, fwhere)
    default_quant = entry.get("default_quant", DEFAULT_QUANT)
    if default_quant not in files:
        raise CatalogError(
            f"{where}: default quantization {default_quant} is not among its files ({', '.join(files)}); "
            "set 'default_quant'"
        )
    gated = _get(entry, "gated", bool, where)
    strs = {k: _get(entry, k, str, where).strip() for k in ("family", "tokenizer", "architecture", "license")}
    for k, v in strs.items():
        if not v:
            raise CatalogError(f"{where}: field {k!r} must not be empty")
    return CatalogModel(
        id=mid, name=str(entry.get("name", mid)), repo=repo, gated=gated, files=files,
        default_quant=default_quant, **strs, **ints, **_optional_facts(entry, ints, where),
    )  # fmt: skip


def _optional_facts(entry: Mapping[str, Any], ints: Mapping[str, int], where: str) -> dict[str, Any]:
    try:
        return optional_facts(entry, params=ints["params"], n_layers=ints["n_layers"])
    except ValueError as e:
        raise CatalogError(f"{where}: {e}") from None


def _parse_pair(entry: Any, index: int, models: Mapping[str, CatalogModel]) -> Pair:
    if not isinstance(entry, Mapping):
        raise CatalogError(f"pair #{index + 1}: must be a table")
    pid = entry.get("id")
    where = f"pair {pid!r}" if isinstance(pid, str) else f"pair #{index + 1}"
    pid = _get(entry, "id", str, where)
    target = _get(entry, "target", str, where)
    draft = _get(entry, "draft", str, where)
    for role, mid in (("target", target), ("draft", draft)):
        if mid not in models:
            raise CatalogError(f"{where}: {role} {mid!r} is not a model of the catalog")
    if target == draft:
        raise CatalogError(f"{where}: target and draft are the same model {target!r}")
    t, d = models[target], models[draft]
    try:
        check_pair_draft(t, d)
    except ValueError as e:
        raise CatalogError(f"{where}: {e}") from None
    if t.tokenizer != d.tokenizer:
        raise CatalogError(
            f"{where}: target {target!r} (tokenizer {t.tokenizer!r}) and draft {draft!r} "
            f"(tokenizer {d.tokenizer!r}) do not share a tokenizer family"
        )
    if d.params >= t.params:
        raise CatalogError(f"{where}: draft {draft!r} is not smaller than target {target!r}")
    n_max = _positive(_get(entry, "n_max", int, where), "n_max", where)
    p_min = float(_get(entry, "p_min", (int, float), where))
    if not 0.0 <= p_min <= 1.0:
        raise CatalogError(f"{where}: p_min must be between 0 and 1, got {p_min}")
    good_for = _get(entry, "good_for", str, where).strip()
    if not good_for or "\n" in good_for:
        raise CatalogError(f"{where}: good_for must be one non-empty line")
    return Pair(id=pid, target=target, draft=draft, n_max=n_max, p_min=p_min, good_for=good_for)


def parse_catalog(data: Mapping[str, Any], source: str = "<catalog>") -> Catalog:
    """Validate decoded TOML data and build a `Catalog`; raises `CatalogError` naming the bad entry."""
    try:
        schema = data.get("schema", SCHEMA_VERSION)
        if schema != SCHEMA_VERSION:
            raise CatalogError(f"unsupported catalog schema {schema!r} (expected {SCHEMA_VERSION})")
        raw_models = data.get("model", [])
        raw_pairs = data.get("pair", [])
        if not isinstance(raw_models, list) or not isinstance(raw_pairs, list):
            raise CatalogError("'model' and 'pair' must be arrays of tables ([[model]], [[pair]])")
        models: dict[str, CatalogModel] = {}
        for i, entry in enumerate(raw_models):
            m = _parse_model(entry, i)
            if m.id in models:
                raise CatalogError(f"duplicate model id {m.id!r}")
            models[m.id] = m
        try:
            check_heads(models)
        except ValueError as e:
            raise CatalogError(str(e)) from None
        pairs: list[Pair] = []
        seen: set[str] = set()
        for i, entry in enumerate(raw_pairs):
            p = _parse_pair(entry, i, models)
            if p.id in seen:
                raise CatalogError(f"duplicate pair id {p.id!r}")
            seen.add(p.id)
            pairs.append(p)
    except CatalogError as e:
        raise CatalogError(f"{source}: {e}") from None
    return Catalog(models=models, pairs=tuple(pairs), source=source)


def loads_catalog(text: str, source: str = "<string>") -> Catalog:
    """Parse and validate catalog TOML text."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise CatalogError(f"{source}: invalid TOML: {e}") from None
    return parse_catalog(data, source)


def load_catalog(path: str | Path | None = None) -> Catalog:
    """Load and validate a catalog file (default: the bundled ``catalog.toml``)."""
    p = Path(path) if path is not None else DEFAULT_CATALOG_PATH
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise CatalogError(f"cannot read catalog {p}: {e.strerror or e}") from None
    return loads_catalog(text, str(p))


@functools.cache
def default_catalog() -> Catalog:
    """The bundled catalog, loaded once."""
    return load_catalog()
