"""A local stand-in for the Hugging Face Hub's file endpoints, with injectable network faults.

Two ``ThreadingHTTPServer``s on 127.0.0.1 share one state:

* the *hub* answers ``HEAD|GET /{owner}/{name}/resolve/{revision}/{path}`` like huggingface.co: for an
  LFS file a 302 to the CDN with ``X-Repo-Commit``, ``X-Linked-Etag`` (the sha256), ``X-Linked-Size``
  and a git ``ETag``; for a small non-LFS file a 200 with the bytes and the git blob sha1 as ETag;
  errors carry ``X-Error-Code`` (``RepoNotFound``, ``RevisionNotFound``, ``EntryNotFound``,
  ``GatedRepo``) exactly as huggingface_hub's ``hf_raise_for_status`` expects;
* the *CDN* (another origin, so huggingface_hub stops following the redirect and strips the token, as
  with the real signed CDN URLs) serves blobs with ``Accept-Ranges`` and answers ``Range`` with 206.

Faults (applied to CDN GETs): ``cut_at`` (close the connection after the byte at these absolute file
offsets, each once), ``block_delay`` (slow link), ``stall_at`` (stop sending for ``stall_seconds`` at
that offset, once), ``corrupt_at`` (flip one byte of every body served), ``ignore_range``.
``bytes_served`` counts body bytes sent, ``requests`` logs ``(method, path, headers)``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

TOKEN = "hf_fake_test_token"
_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class FakeFile:
    data: bytes
    lfs: bool = True

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


@dataclass
class FakeRepo:
    gated: bool = False
    revisions: dict[str, str] = field(default_factory=dict)  # branch/tag -> commit
    files: dict[str, dict[str, FakeFile]] = field(default_factory=dict)  # commit -> path -> file


class FakeHub:
    """Hub + CDN servers; use as a context manager or call `start`/`stop`."""

    def __init__(self) -> None:
        self.repos: dict[str, FakeRepo] = {}
        self.lock = threading.Lock()
        self.bytes_served = 0
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.cut_at: list[int] = []
        self.stall_at: int | None = None
        self.stall_seconds = 2.0
        self.corrupt_at: int | None = None
        self.ignore_range = False
        self.block_delay = 0.0  # seconds slept after each 64 KiB block (slow link)
        self._stop = threading.Event()
        self._servers: list[ThreadingHTTPServer] = []
        self.endpoint = ""
        self.cdn = ""

    # ------------------------------------------------------------------------------------- content
    def add_file(
        self,
        repo_id: str,
        path: str,
        data: bytes,
        *,
        lfs: bool = True,
        gated: bool = False,
        revision: str = "main",
    ) -> FakeFile:
        with self.lock:
            repo = self.repos.setdefault(repo_id, FakeRepo())
            repo.gated = repo.gated or gated
            commit = (
                repo.revisions.get(revision) or hashlib.sha1(f"{repo_id}@{revision}".encode()).hexdigest()
            )
            repo.revisions[revision] = commit
            f = FakeFile(data, lfs)
            repo.files.setdefault(commit, {})[path] = f
            return f

    def blob(self, sha256: str) -> bytes | None:
        for repo in self.repos.values():
            for files in repo.files.values():
                for f in files.values():
                    if f.sha256 == sha256:
                        return f.data
        return None

    def commit_of(self, repo_id: str, revision: str = "main") -> str:
        return self.repos[repo_id].revisions[revision]

    def served_paths(self, prefix: str = "") -> list[str]:
        return [p for _, p, _ in self.requests if p.startswith(prefix)]

    # ------------------------------------------------------------------------------------- servers
    def start(self) -> FakeHub:
        hub = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(self, "hub"))
        cdn = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(self, "cdn"))
        for s in (hub, cdn):
            s.daemon_threads = True
            threading.Thread(target=s.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
            self._servers.append(s)
        self.endpoint = f"http://127.0.0.1:{hub.server_address[1]}"
        self.cdn = f"http://127.0.0.1:{cdn.server_address[1]}"
        return self

    def stop(self) -> None:
        self._stop.set()
        for s in self._servers:
            s.shutdown()
            s.server_close()
        self._servers.clear()

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _make_handler(hub: FakeHub, role: str) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_HEAD(self) -> None:
            self._dispatch(head=True)

        def do_GET(self) -> None:
            self._dispatch(head=False)

        # ------------------------------------------------------------------------------ plumbing
        def _dispatch(self, *, head: bool) -> None:
            path = urlsplit(self.path).path
            with hub.lock:
                hub.requests.append((self.command, path, dict(self.headers.items())))
            try:
                if role == "cdn":
                    self._cdn(path, head)
                else:
                    self._hub(path, head)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True

        def _error(
            self, status: int, code: str | None, message: str, extra: dict[str, str] | None = None
        ) -> None:
            body = json.dumps({"error": message}).encode()
            self.send_response(status)
            if code:
                self.send_header("X-Error-Code", code)
            self.send_header("X-Error-Message", message)
            for k, v in (extra or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        # ---------------------------------------------------------------------------- the Hub
        def _hub(self, path: str, head: bool) -> None:
            m = re.match(r"^/([^/]+)/([^/]+)/resolve/([^/]+)/(.+)$", path)
            if not m:
                return self._error(404, None, "Not found")
            repo_id = f"{m.group(1)}/{m.group(2)}"
            revision, filename = unquote(m.group(3)), unquote(m.group(4))
            repo = hub.repos.get(repo_id)
            if repo is None:
                return self._error(401, "RepoNotFound", "Repository not found")
            if repo.gated:
                auth = self.headers.get("Authorization")
                if auth is None:
                    return self._error(
                        401, "GatedRepo", f"Access to model {repo_id} is restricted. You must have access "
                        "to it and be authenticated to access it. Please log in.",
                    )  # fmt: skip
                if auth != f"Bearer {TOKEN}":
                    return self._error(
                        403, "GatedRepo", f"Access to model {repo_id} is restricted and you are not in the "
                        "authorized list.",
                    )  # fmt: skip
            commit = repo.revisions.get(revision, revision if revision in repo.files else None)
            if commit is None:
                return self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
            f = repo.files[commit].get(filename)
            if f is None:
                return self._error(
                    404,
                    "EntryNotFound",
                    f'{filename} does not exist on "{revision}"',
                    {"X-Repo-Commit": commit},
                )
            if f.lfs:
                self.send_response(302)
                self.send_header("Location", f"{hub.cdn}/blobs/{f.sha256}?X-Amz-Signature=fake")
                self.send_header("X-Repo-Commit", commit)
                self.send_header("ETag", f'"{git_blob_sha1(b"pointer " + f.sha256.encode())}"')
                self.send_header("X-Linked-Etag", f'"{f.sha256}"')
                self.send_header("X-Linked-Size", str(len(f.data)))
                self.send_header("Content-Length", "0")
                self.end_headers()
                return None
            self.send_response(200)
            self.send_header("X-Repo-Commit", commit)
            self.send_header("ETag", f'"{git_blob_sha1(f.data)}"')
            self.send_header("Content-Length", str(len(f.data)))
            self.end_headers()
            if not head:
                with hub.lock:
                    hub.bytes_served += len(f.data)
                self.wfile.write(f.data)
            return None

        # ---------------------------------------------------------------------------- the CDN
        def _cdn(self, path: str, head: bool) -> None:
            m = re.match(r"^/blobs/([0-9a-f]{64})$", path)
            data = hub.blob(m.group(1)) if m else None
            if data is None:
                return self._error(404, None, "NoSuchKey")
            size = len(data)
            start, end = 0, size - 1
            rng = self.headers.get("Range")
            partial = False
            if rng and not hub.ignore_range:
                rm = _RANGE.match(rng.strip())
                if not rm:
                    return self._error(400, None, "bad range")
                start = int(rm.group(1))
                end = min(int(rm.group(2)), size - 1) if rm.group(2) else size - 1
                if start >= size or start > end:
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{size}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return None
                partial = True
            self.send_response(206 if partial else 200)
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(end - start + 1))
            if partial:
                self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
            self.end_headers()
            if head:
                return None
            self._send_body(data, start, end + 1)
            return None

        def _send_body(self, data: bytes, start: int, stop: int) -> None:
            with hub.lock:
                cut = min((c for c in hub.cut_at if start <= c < stop), default=None)
                if cut is not None:
                    hub.cut_at.remove(cut)
                stall = hub.stall_at if hub.stall_at is not None and start <= hub.stall_at < stop else None
                if stall is not None:
                    hub.stall_at = None
            body = bytearray(data[start:stop])
            if hub.corrupt_at is not None and start <= hub.corrupt_at < stop:
                body[hub.corrupt_at - start] ^= 0xFF
            limit = stop
            if cut is not None:
                limit = cut
            pos = start
            block = 64 * 1024
            while pos < limit:
                if stall is not None and pos >= stall:
                    self.wfile.flush()
                    hub._stop.wait(hub.stall_seconds)
                    self.close_connection = True
                    return
                n = min(block, limit - pos, (stall - pos) if stall is not None and stall > pos else block)
                with hub.lock:  # counted before sending, so a client that got the bytes sees them counted
                    hub.bytes_served += n
                self.wfile.write(body[pos - start : pos - start + n])
                pos += n
                if hub.block_delay:
                    time.sleep(hub.block_delay)
            if cut is not None:
                self.wfile.flush()
                self.close_connection = True
                with contextlib.suppress(OSError):
                    self.connection.shutdown(socket.SHUT_RDWR)

    return Handler
