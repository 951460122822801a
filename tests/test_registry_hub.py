"""Downloads against the local fake Hub: resume, retries, cancel, verification and error messages."""

from __future__ import annotations

import errno
import hashlib
import itertools
import os
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest
from huggingface_hub import hf_hub_download, scan_cache_dir, try_to_load_from_cache

from fakehub import TOKEN, FakeHub
from models_registry import hub
from models_registry.hub import (
    DiskSpaceError,
    DownloadCancelled,
    GatedRepoError,
    IntegrityError,
    NotFoundError,
    OfflineError,
    RetryPolicy,
    TransferError,
    download,
)

REPO = "acme/Tiny-GGUF"
FILE = "tiny-q4_k_m.gguf"
SIZE = 3_000_000
FAST = RetryPolicy(
    max_retries=5, backoff_base=0.01, backoff_max=0.05, stall_timeout=0.5, connect_timeout=1.0,
    metadata_timeout=2.0, metadata_retries=1,
)  # fmt: skip


@pytest.fixture
def payload(fake_hub: FakeHub) -> bytes:
    data = os.urandom(SIZE)
    fake_hub.add_file(REPO, FILE, data)
    return data


def cache() -> Path:
    return Path(os.environ["HF_HOME"]) / "hub"


def blob_dir() -> Path:
    return cache() / ("models--" + REPO.replace("/", "--")) / "blobs"


def cdn_gets(h: FakeHub) -> list[str | None]:
    return [hdrs.get("Range") for m, p, hdrs in h.requests if m == "GET" and p.startswith("/blobs/")]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_clean_download_lands_in_hf_cache_layout(fake_hub: FakeHub, payload: bytes) -> None:
    calls: list[tuple[int, int, float, float | None]] = []
    path = download(REPO, FILE, progress=lambda *a: calls.append(a), policy=FAST)

    assert path.read_bytes() == payload
    commit = fake_hub.commit_of(REPO)
    assert path == cache() / f"models--acme--Tiny-GGUF/snapshots/{commit}/{FILE}"
    assert path.is_symlink() and path.resolve() == blob_dir() / sha(payload)
    assert (cache() / "models--acme--Tiny-GGUF/refs/main").read_text() == commit
    assert not list(blob_dir().glob("*.incomplete"))
    assert try_to_load_from_cache(REPO, FILE, cache_dir=cache()) == str(path)
    [repo] = scan_cache_dir(cache()).repos
    assert repo.repo_id == REPO and repo.size_on_disk == SIZE
    assert calls[-1][:2] == (SIZE, SIZE)
    assert fake_hub.bytes_served == SIZE

    # a second call is a cache hit, and huggingface_hub itself finds the file without downloading
    assert download(REPO, FILE, policy=FAST) == path
    assert hf_hub_download(REPO, FILE, cache_dir=cache(), endpoint=fake_hub.endpoint) == str(path)
    assert len(cdn_gets(fake_hub)) == 1


def test_several_connection_cuts_resume_with_range(fake_hub: FakeHub, payload: bytes) -> None:
    fake_hub.cut_at = [400_000, 1_234_567, 2_999_000]
    path = download(REPO, FILE, policy=FAST)
    assert sha(path.read_bytes()) == sha(payload)
    assert cdn_gets(fake_hub) == ["bytes=0-", "bytes=400000-", "bytes=1234567-", "bytes=2999000-"]
    assert fake_hub.bytes_served == SIZE  # nothing fetched twice


def test_cancel_then_resume_later(fake_hub: FakeHub, payload: bytes) -> None:
    fake_hub.block_delay = 0.01  # slow enough for progress (every 0.1 s) to cancel midway
    cancel = threading.Event()

    def progress(done: int, total: int, speed: float, eta: float | None) -> None:
        if done >= 1_000_000:
            cancel.set()

    with pytest.raises(DownloadCancelled, match="partial kept"):
        download(REPO, FILE, progress=progress, cancel=cancel, policy=FAST)
    [part] = blob_dir().glob("*.incomplete")
    kept = part.stat().st_size
    assert 1_000_000 <= kept < SIZE
    assert part.read_bytes() == payload[:kept]
    assert try_to_load_from_cache(REPO, FILE, cache_dir=cache()) is None

    fake_hub.block_delay = 0.0
    path = download(REPO, FILE, policy=FAST)
    assert path.read_bytes() == payload
    assert cdn_gets(fake_hub)[-1] == f"bytes={kept}-"


def test_resume_after_crash_uses_existing_partial(fake_hub: FakeHub, payload: bytes) -> None:
    blob_dir().mkdir(parents=True)
    (blob_dir() / f"{sha(payload)}.incomplete").write_bytes(payload[:777_777])
    path = download(REPO, FILE, policy=FAST)
    assert path.read_bytes() == payload
    assert cdn_gets(fake_hub) == ["bytes=777777-"]
    assert fake_hub.bytes_served == SIZE - 777_777


def test_stall_is_retried(fake_hub: FakeHub, payload: bytes) -> None:
    fake_hub.stall_at, fake_hub.stall_seconds = 1_500_000, 3.0
    start = time.monotonic()
    path = download(REPO, FILE, policy=FAST)
    assert path.read_bytes() == payload
    assert time.monotonic() - start < 2.5
    assert cdn_gets(fake_hub)[-1] == "bytes=1500000-"


def test_stall_without_retries_fails_clearly_then_resumes(fake_hub: FakeHub, payload: bytes) -> None:
    fake_hub.stall_at, fake_hub.stall_seconds = 1_000_000, 3.0
    no_retry = RetryPolicy(max_retries=0, stall_timeout=0.3, backoff_base=0.01, metadata_retries=0)
    with pytest.raises(TransferError, match=r"1000000/3000000 bytes are kept.*resumes"):
        download(REPO, FILE, policy=no_retry)
    assert try_to_load_from_cache(REPO, FILE, cache_dir=cache()) is None
    path = download(REPO, FILE, policy=FAST)
    assert path.read_bytes() == payload
    assert cdn_gets(fake_hub)[-1] == "bytes=1000000-"


def test_corrupted_body_is_rejected_and_deleted(fake_hub: FakeHub, payload: bytes) -> None:
    fake_hub.corrupt_at = 1_234_567
    calls: list[tuple[int, int]] = []
    with pytest.raises(IntegrityError, match=r"corrupt: its sha256 does not match.*deleted"):
        download(REPO, FILE, progress=lambda d, t, *_: calls.append((d, t)), policy=FAST)
    assert all(d < t for d, t in calls)  # never reported complete
    assert not blob_dir().exists() or not any(blob_dir().iterdir())
    assert not (cache() / "models--acme--Tiny-GGUF" / "snapshots").exists()
    assert try_to_load_from_cache(REPO, FILE, cache_dir=cache()) is None


def test_gated_repo_needs_token(fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    data = os.urandom(200_000)
    fake_hub.add_file("meta/Gated-GGUF", "g.gguf", data, gated=True)
    with pytest.raises(
        GatedRepoError, match=r"meta/Gated-GGUF is gated: accept the licence on the Hub.*HF_TOKEN"
    ):
        download("meta/Gated-GGUF", "g.gguf", policy=FAST)

    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    with pytest.raises(GatedRepoError, match="no access yet"):
        download("meta/Gated-GGUF", "g.gguf", policy=FAST)

    monkeypatch.setenv("HF_TOKEN", TOKEN)
    assert download("meta/Gated-GGUF", "g.gguf", policy=FAST).read_bytes() == data
    # the token went to the Hub, never to the CDN
    for _, p, hdrs in fake_hub.requests:
        if p.startswith("/blobs/"):
            assert "Authorization" not in hdrs


def test_not_found_messages_name_repo_file_revision(fake_hub: FakeHub, payload: bytes) -> None:
    with pytest.raises(NotFoundError, match=r"repository 'acme/Nope-GGUF' not found"):
        download("acme/Nope-GGUF", FILE, policy=FAST)
    with pytest.raises(NotFoundError, match=r"file 'missing.gguf' not found in repository acme/Tiny-GGUF"):
        download(REPO, "missing.gguf", policy=FAST)
    with pytest.raises(NotFoundError, match=r"revision 'v9' not found in repository acme/Tiny-GGUF"):
        download(REPO, FILE, revision="v9", policy=FAST)


@pytest.mark.parametrize("bad", [("acme", FILE), ("a/b/c", FILE), (REPO, "../x.gguf"), (REPO, "/etc/x.gguf")])
def test_bad_names_rejected_before_network(fake_hub: FakeHub, bad: tuple[str, str]) -> None:
    with pytest.raises(NotFoundError):
        download(*bad, policy=FAST)
    assert fake_hub.requests == []


def test_unreachable_hub(monkeypatch: pytest.MonkeyPatch, fake_hub: FakeHub) -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now: connection refused
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    with pytest.raises(OfflineError, match=rf"cannot reach http://127.0.0.1:{port}"):
        download(REPO, FILE, policy=FAST)


def test_offline_mode_uses_cache_or_says_so(
    fake_hub: FakeHub, payload: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(OfflineError, match="offline mode is on"):
        download(REPO, FILE, policy=FAST)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    path = download(REPO, FILE, policy=FAST)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    n = len(fake_hub.requests)
    assert download(REPO, FILE, policy=FAST) == path
    assert len(fake_hub.requests) == n


def test_disk_space_check_counts_partial(
    fake_hub: FakeHub, payload: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = shutil.disk_usage

    def fake_usage(free: int):
        return lambda p: real(p)._replace(free=free)

    monkeypatch.setattr(shutil, "disk_usage", fake_usage(hub.DISK_MARGIN + SIZE - 1))
    with pytest.raises(DiskSpaceError, match="not enough disk space"):
        download(REPO, FILE, policy=FAST)
    assert cdn_gets(fake_hub) == []

    # with 2 MB already downloaded, only the last 1 MB (plus margin) is needed
    blob_dir().mkdir(parents=True, exist_ok=True)
    (blob_dir() / f"{sha(payload)}.incomplete").write_bytes(payload[:2_000_000])
    monkeypatch.setattr(shutil, "disk_usage", fake_usage(hub.DISK_MARGIN + 1_000_000))
    assert download(REPO, FILE, policy=FAST).read_bytes() == payload


def test_disk_full_while_writing(fake_hub: FakeHub, payload: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    real_open = Path.open

    class Full:
        def __init__(self, f):
            self.f, self.n = f, 0

        def write(self, b: bytes) -> int:
            if self.n + len(b) > 1_000_000:
                raise OSError(errno.ENOSPC, "No space left on device")
            self.n += len(b)
            return self.f.write(b)

        def __enter__(self):
            return self

        def __exit__(self, *a):
            self.f.close()

    def opener(self: Path, mode: str = "r", *a, **k):
        f = real_open(self, mode, *a, **k)
        return Full(f) if self.name.endswith(".incomplete") and "a" in mode else f

    monkeypatch.setattr(Path, "open", opener)
    with pytest.raises(DiskSpaceError, match=r"disk full while writing .*will resume"):
        download(REPO, FILE, policy=FAST)
    monkeypatch.setattr(Path, "open", real_open)
    assert download(REPO, FILE, policy=FAST).read_bytes() == payload


def test_progress_is_rate_limited_and_monotonic(fake_hub: FakeHub, payload: bytes) -> None:
    fake_hub.block_delay = 0.01  # ~46 blocks of 64 KiB: about half a second
    times: list[float] = []
    calls: list[tuple[int, int, float, float | None]] = []

    def progress(*a) -> None:
        times.append(time.monotonic())
        calls.append(a)

    start = time.monotonic()
    download(REPO, FILE, progress=progress, policy=FAST)
    elapsed = time.monotonic() - start
    done = [c[0] for c in calls]
    assert done == sorted(done) and done[0] == 0 and calls[-1][:2] == (SIZE, SIZE)
    assert all(c[1] == SIZE for c in calls)
    mid_times = times[1:-1]  # the first and last reports are forced
    gaps = [b - a for a, b in itertools.pairwise(mid_times)]
    assert all(g >= hub.PROGRESS_INTERVAL * 0.9 for g in gaps)
    assert 3 <= len(calls) <= elapsed / hub.PROGRESS_INTERVAL + 3
    mid = [c for c in calls[1:-1] if c[2] > 0]
    assert mid and all(c[3] is not None and c[3] >= 0 for c in mid)


def test_non_lfs_file_verified_with_git_sha1(fake_hub: FakeHub) -> None:
    data = b"GGUF" + os.urandom(5000)
    fake_hub.add_file(REPO, "small.gguf", data, lfs=False)
    assert download(REPO, "small.gguf", policy=FAST).read_bytes() == data
