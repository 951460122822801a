"""Split GGUFs end to end against the local fake Hub: one download for every part (one progress, a cut
connection and a cancel resumed, each part verified), listed once by the library, read remotely from the
first part, and loaded by the engine from the cache."""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

import pytest

from app.engine.engine import Engine, LoadSettings
from app.gguf.split import part_names
from app.tiny_gguf import write_tiny_llama
from fakehub import FakeHub
from models_registry import hub, library
from models_registry.catalog import loads_catalog
from models_registry.hub import (
    DownloadCancelled,
    IntegrityError,
    NotFoundError,
    RetryPolicy,
    cached_model,
    download_model,
)
from models_registry.refs import check_refs, resolve_model_ref
from models_registry.remote import HfRef, read_ref_metadata

REPO = "acme/Split-GGUF"
FAST = RetryPolicy(
    max_retries=5, backoff_base=0.01, backoff_max=0.05, stall_timeout=1.0, connect_timeout=1.0,
    metadata_timeout=2.0, metadata_retries=1,
)  # fmt: skip
CATALOG = """
[[model]]
id = "split"
repo = "acme/Split-GGUF"
family = "f"
tokenizer = "a"
architecture = "llama"
params = 1000
n_layers = 2
n_kv_heads = 2
head_dim = 64
context_length = 4096
license = "mit"
gated = false
default_quant = "F32"
[model.files.F32]
file = "tiny-00001-of-00003.gguf"
parts = [
  {{ file = "tiny-00001-of-00003.gguf", size = {0} }},
  {{ file = "tiny-00002-of-00003.gguf", size = {1} }},
  {{ file = "tiny-00003-of-00003.gguf", size = {2} }},
]
"""


@pytest.fixture(scope="module")
def split_model(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """A tiny llama in three parts of a few hundred kB to a few MB each (wide enough for the transfer to
    take several chunks and progress reports per part)."""
    first = write_tiny_llama(
        tmp_path_factory.mktemp("split") / "tiny.gguf", n_embd=256, n_ff=640, split_tensors=8
    )
    return [first.with_name(n) for n in part_names(first.name)]


@pytest.fixture
def served(fake_hub: FakeHub, split_model: list[Path]) -> list[bytes]:
    data = [p.read_bytes() for p in split_model]
    for p, d in zip(split_model, data, strict=True):
        fake_hub.add_file(REPO, p.name, d)
    return data


def cache() -> Path:
    return Path(os.environ["HF_HOME"]) / "hub"


def blob_gets(h: FakeHub) -> list[tuple[str, str | None]]:
    return [(p, hdrs.get("Range")) for m, p, hdrs in h.requests if m == "GET" and p.startswith("/blobs/")]


def test_a_split_model_downloads_whole_under_one_progress(
    fake_hub: FakeHub, served: list[bytes], split_model: list[Path]
) -> None:
    total = sum(map(len, served))
    assert len(served) == 3 and all(len(d) > 200_000 for d in served)
    fake_hub.cut_at = [150_000]  # the connection drops in the middle of the first part
    calls: list[tuple[int, int, float, float | None]] = []
    path = download_model(REPO, split_model[1].name, policy=FAST, progress=lambda *a: calls.append(a))

    commit = fake_hub.commit_of(REPO)
    snapshot = cache() / "models--acme--Split-GGUF" / "snapshots" / commit
    assert path == snapshot / "tiny-00001-of-00003.gguf"  # named by its second part, opened by its first
    for p, d in zip(split_model, served, strict=True):
        assert (snapshot / p.name).read_bytes() == d
    assert (cache() / "models--acme--Split-GGUF" / "refs" / "main").read_text() == commit
    assert cached_model(REPO, split_model[2].name) == path and hub.model_bytes(path) == total

    # one progress for the whole model: same total, never backwards, complete once, at the end
    assert {t for _, t, _, _ in calls} == {total}
    dones = [d for d, *_ in calls]
    assert dones == sorted(dones) and dones[-1] == total and dones.count(total) == 1
    assert any(len(served[0]) < d < total for d in dones)  # reports during the later parts
    gets = blob_gets(fake_hub)
    first_blob = f"/blobs/{hashlib.sha256(served[0]).hexdigest()}"
    assert (first_blob, "bytes=150000-") in gets  # resumed where the connection dropped
    assert fake_hub.bytes_served == total  # nothing fetched twice

    # a second call is a cache hit: nothing more is fetched
    assert download_model(REPO, split_model[0].name, policy=FAST) == path
    assert fake_hub.bytes_served == total


def test_a_cancel_in_a_later_part_resumes_and_the_library_lists_the_model_once(
    fake_hub: FakeHub, served: list[bytes], split_model: list[Path]
) -> None:
    cat = loads_catalog(CATALOG.format(*map(len, served)))
    first = len(served[0])
    fake_hub.block_delay = 0.01  # slow enough for progress (every 0.1 s) to cancel midway
    cancel = threading.Event()

    def progress(done: int, total: int, speed: float, eta: float | None) -> None:
        if done > first + 100_000:
            cancel.set()

    with pytest.raises(DownloadCancelled, match=r"tiny-00002-of-00003\.gguf.*partial kept"):
        download_model(REPO, split_model[0].name, policy=FAST, cancel=cancel, progress=progress)

    # partly downloaded: not a model to load, one partial download (the first part names it)
    assert library.list_local(folders=[], catalog=cat) == []
    assert cached_model(REPO, split_model[0].name) is None
    [partial] = library.list_partials()
    assert (partial.repo_id, partial.filename) == (REPO, "tiny-00001-of-00003.gguf")
    assert partial.missing == ("tiny-00002-of-00003.gguf", "tiny-00003-of-00003.gguf")
    assert first + 100_000 < partial.size < sum(map(len, served))  # the unfinished part's bytes count too

    fake_hub.block_delay = 0.0
    path = download_model(REPO, split_model[2].name, policy=FAST)
    second = f"/blobs/{hashlib.sha256(served[1]).hexdigest()}"
    resumed_at = partial.size - first  # the second part's unfinished bytes: resumed, not restarted
    assert [r for p, r in blob_gets(fake_hub) if p == second][-1] == f"bytes={resumed_at}-"
    assert library.list_partials() == []
    [model] = library.list_local(folders=[], catalog=cat)
    assert (model.path, model.filename, model.parts, model.size) == (
        path, "tiny-00001-of-00003.gguf", 3, sum(map(len, served)),
    )  # fmt: skip
    assert (model.catalog_id, model.quant, model.complete) == ("split", "F32", True)

    # loadable: llama.cpp opens the first part in the snapshot and finds the others beside it
    with (
        Engine(LoadSettings(target=str(path), n_ctx=256)) as cached,
        Engine(LoadSettings(target=str(split_model[0]), n_ctx=256)) as local,
    ):
        prompt = local.tokenize("Hello world")
        assert cached.run(prompt).tokens == local.run(prompt).tokens

    # deleting the revision removes every part
    freed = library.delete_cached_revision(REPO, model.commit or "")
    assert freed == sum(map(len, served)) and library.list_local(folders=[], catalog=cat) == []


def test_every_part_is_verified_and_a_missing_part_is_named(
    fake_hub: FakeHub, served: list[bytes], split_model: list[Path]
) -> None:
    fake_hub.corrupt_at = len(served[1]) // 2  # flips a byte of every body that covers this offset
    with pytest.raises(IntegrityError, match="corrupt"):
        download_model(REPO, split_model[0].name, policy=FAST)
    assert not list((cache() / "models--acme--Split-GGUF" / "blobs").glob("*.incomplete"))
    fake_hub.corrupt_at = None

    fake_hub.add_file("acme/Broken-GGUF", "m-00001-of-00002.gguf", served[0])
    fetched = len(blob_gets(fake_hub))
    with pytest.raises(NotFoundError, match=r"m-00002-of-00002\.gguf"):
        download_model("acme/Broken-GGUF", "m-00001-of-00002.gguf", policy=FAST)
    assert len(blob_gets(fake_hub)) == fetched  # a missing part is found before any byte is fetched


def test_a_remote_split_model_is_read_from_its_first_part(
    fake_hub: FakeHub, served: list[bytes], split_model: list[Path]
) -> None:
    meta, facts = read_ref_metadata(f"hf://{REPO}/{split_model[2].name}")
    assert meta.architecture == "llama" and facts.n_layers == 2
    assert facts.file_size == sum(map(len, served))  # every part, from the Hub's sizes
    assert facts.bytes_read is not None and facts.bytes_read <= len(served[0])
    assert set(fake_hub.served_paths("/blobs/")) == {
        f"/blobs/{hashlib.sha256(served[0]).hexdigest()}"
    }  # the header: first part only

    # a local split model likewise, named by any part
    local = read_ref_metadata(split_model[1])[1]
    assert local.file_size == sum(map(len, served)) and local.n_layers == 2

    # `tandem check` on a split model named by a later part, then resolved to the cache once downloaded
    ref = f"hf://{REPO}/{split_model[1].name}"
    assert resolve_model_ref(ref) == HfRef(REPO, split_model[1].name)
    assert check_refs(ref, str(split_model[0])).ok
    download_model(REPO, split_model[1].name, policy=FAST)
    assert resolve_model_ref(ref) == cached_model(REPO, split_model[0].name)


def test_split_models_in_a_user_folder(tmp_path: Path, split_model: list[Path]) -> None:
    cat = loads_catalog(CATALOG.format(*(p.stat().st_size for p in split_model)))
    folder = tmp_path / "models"
    folder.mkdir()
    for p in split_model:
        (folder / p.name).write_bytes(p.read_bytes())
    (folder / "other.gguf").write_bytes(b"GGUF")
    models = library.list_local(folders=[folder], catalog=cat, cache_dir=tmp_path / "no-cache")
    assert [(m.filename, m.parts, m.catalog_id) for m in models] == [
        ("other.gguf", 1, None), ("tiny-00001-of-00003.gguf", 3, "split"),
    ]  # fmt: skip
    assert models[1].size == sum(p.stat().st_size for p in split_model)

    (folder / split_model[2].name).unlink()
    [_, partial] = library.list_local(folders=[folder], catalog=cat, cache_dir=tmp_path / "no-cache")
    assert partial.missing == ("tiny-00003-of-00003.gguf",) and not partial.complete
    assert partial.catalog_id is None  # not the catalog model until it is whole

    freed = library.delete_user_file(folder / split_model[1].name, folders=[folder])
    assert freed == sum(p.stat().st_size for p in split_model[:2])
    assert sorted(p.name for p in folder.iterdir()) == ["other.gguf"]


def test_tandem_download_fetches_every_part(
    fake_hub: FakeHub, served: list[bytes], split_model: list[Path], capsys: pytest.CaptureFixture[str]
) -> None:
    from models_registry.cli import main

    assert main(["download", REPO, split_model[2].name]) == 0
    printed = Path(capsys.readouterr().out.strip())
    assert printed.name == "tiny-00001-of-00003.gguf"  # the file llama.cpp opens
    assert [(printed.parent / p.name).read_bytes() for p in split_model] == served
