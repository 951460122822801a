"""Local library: HF cache scan, user folders, partial downloads, deletion."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from huggingface_hub import try_to_load_from_cache

from fakehub import FakeHub
from models_registry import library
from models_registry.catalog import loads_catalog
from models_registry.hub import DownloadCancelled, RetryPolicy, download

FAST = RetryPolicy(backoff_base=0.01, stall_timeout=1.0, metadata_retries=1)
CATALOG = """
[[model]]
id = "tiny"
repo = "acme/Tiny-GGUF"
family = "f"
tokenizer = "a"
architecture = "llama"
params = 1000
n_layers = 2
n_kv_heads = 1
head_dim = 64
context_length = 4096
license = "mit"
gated = false
[model.files.Q4_K_M]
file = "tiny-q4_k_m.gguf"
size = 1000
"""


def test_lists_cache_and_folders_with_catalog_match(fake_hub: FakeHub, tmp_path: Path) -> None:
    cat = loads_catalog(CATALOG)
    fake_hub.add_file("acme/Tiny-GGUF", "tiny-q4_k_m.gguf", os.urandom(10_000))
    fake_hub.add_file("other/Thing-GGUF", "thing.gguf", os.urandom(5_000))
    p1 = download("acme/Tiny-GGUF", "tiny-q4_k_m.gguf", policy=FAST)
    download("other/Thing-GGUF", "thing.gguf", policy=FAST)
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "tiny-q4_k_m.gguf").write_bytes(b"GGUF" + b"\0" * 96)
    (folder / "notes.txt").write_text("x")

    items = library.list_local(folders=[folder], catalog=cat)
    cached = [m for m in items if m.source == "hf-cache"]
    assert [(m.repo_id, m.filename, m.size) for m in cached] == [
        ("acme/Tiny-GGUF", "tiny-q4_k_m.gguf", 10_000),
        ("other/Thing-GGUF", "thing.gguf", 5_000),
    ]
    assert cached[0].path == p1 and cached[0].refs == ("main",)
    assert (cached[0].catalog_id, cached[0].quant) == ("tiny", "Q4_K_M") and cached[1].catalog_id is None
    [mine] = [m for m in items if m.source == "folder"]
    assert (mine.filename, mine.catalog_id, mine.size) == ("tiny-q4_k_m.gguf", "tiny", 100)

    freed = library.delete_cached_revision("acme/Tiny-GGUF", cached[0].commit or "")
    assert freed == 10_000 and not p1.exists()
    assert try_to_load_from_cache("acme/Tiny-GGUF", "tiny-q4_k_m.gguf") is None
    with pytest.raises(library.LibraryError, match="not in the cache"):
        library.delete_cached_revision("acme/Tiny-GGUF", "0" * 40)


def test_empty_cache_lists_nothing(fake_hub: FakeHub) -> None:
    assert library.list_local(folders=[]) == []
    assert library.list_partials() == []


def test_partials_are_listed(fake_hub: FakeHub) -> None:
    fake_hub.add_file("acme/Tiny-GGUF", "tiny-q4_k_m.gguf", os.urandom(2_000_000))
    fake_hub.block_delay = 0.01  # slow enough for progress (every 0.1 s) to cancel midway
    cancel = threading.Event()
    with pytest.raises(DownloadCancelled):
        download("acme/Tiny-GGUF", "tiny-q4_k_m.gguf", policy=FAST, cancel=cancel,
                 progress=lambda d, *_: cancel.set() if d > 200_000 else None)  # fmt: skip
    [p] = library.list_partials()
    assert p.repo_id == "acme/Tiny-GGUF" and 200_000 < p.size < 2_000_000


def test_user_folders_and_file_deletion(tmp_path: Path) -> None:
    store = tmp_path / "library.json"
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    assert library.load_folders(store) == []
    library.add_folder(a, store)
    assert library.add_folder(b, store) == [a.resolve(), b.resolve()]
    assert library.add_folder(a, store) == [a.resolve(), b.resolve()]  # no duplicates
    assert library.remove_folder(b, store) == [a.resolve()]
    with pytest.raises(library.LibraryError, match="is not a folder"):
        library.add_folder(tmp_path / "nope", store)

    f = a / "m.gguf"
    f.write_bytes(b"x" * 10)
    outside = b / "o.gguf"
    outside.write_bytes(b"x")
    txt = a / "m.txt"
    txt.write_text("x")
    with pytest.raises(library.LibraryError, match="not inside one of your model folders"):
        library.delete_user_file(outside, folders=[a])
    with pytest.raises(library.LibraryError, match=r"not a \.gguf file"):
        library.delete_user_file(txt, folders=[a])
    link = a / "l.gguf"
    link.symlink_to(outside)
    with pytest.raises(library.LibraryError, match="not a regular file"):
        library.delete_user_file(link, folders=[a])
    assert library.delete_user_file(f, folders=[a]) == 10 and not f.exists() and outside.exists()
