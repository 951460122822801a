"""``tandem serve`` and the command line as a hostile but fair user runs them (issue 33): real
subprocesses on the tiny models, on 127.0.0.1, each bounded in time.

The drafting history records what the server answers; the port is bound before the model loads;
SIGTERM and SIGINT stop the server with the engine process and its folder gone; bad numbers and broken
model files are one line on stderr and exit code 2 (llama.cpp's log only with TANDEM_DEBUG=1)."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.timeout(180)

READY = re.compile(r"at http://127\.0\.0\.1:(\d+)/v1")


def tandem(*args: str, env: dict[str, str] | None = None, timeout: float = 60):
    return subprocess.run(
        [sys.executable, "-m", "app", *args], capture_output=True, text=True, timeout=timeout, env=env
    )


def stderr_lines(res: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in res.stderr.splitlines() if line.strip()]


@dataclass
class Server:
    """A ``tandem serve`` subprocess and the lines it has written to stderr."""

    proc: subprocess.Popen[str]
    lines: queue.Queue[str]
    seen: list[str]
    port: int = 0

    def wait_for(self, pattern: re.Pattern[str] | str, seconds: float = 90) -> re.Match[str]:
        deadline = time.monotonic() + seconds
        while True:
            for line in self.seen:
                m = re.search(pattern, line)
                if m:
                    return m
            left = deadline - time.monotonic()
            assert left > 0, f"tandem serve never said {pattern!r}: {self.seen}"
            try:
                self.seen.append(self.lines.get(timeout=min(left, 1)))
            except queue.Empty:
                assert self.proc.poll() is None, f"tandem serve exited: {self.seen}"

    def ready(self) -> int:
        self.port = int(self.wait_for(READY).group(1))
        return self.port

    def post(self, path: str, body: dict) -> tuple[int, dict]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
            resp = conn.getresponse()
            return resp.status, json.loads(resp.read())
        finally:
            conn.close()

    def engine_processes(self) -> list[psutil.Process]:
        return psutil.Process(self.proc.pid).children(recursive=True)

    def stop(self, sig: int = signal.SIGTERM, seconds: float = 20) -> tuple[int, float]:
        """Send ``sig``; the exit code and how long the server took to exit."""
        t0 = time.monotonic()
        self.proc.send_signal(sig)
        code = self.proc.wait(seconds)
        return code, time.monotonic() - t0


def _pump(stream, lines: queue.Queue[str]) -> None:
    for line in stream:
        lines.put(line.rstrip("\n"))


@pytest.fixture
def folders(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    """A data folder and a TMPDIR of the test's own, and the environment naming them."""
    data, tmp = tmp_path / "data", tmp_path / "tmp"
    data.mkdir()
    tmp.mkdir()
    env = {**os.environ, "TANDEM_DATA_DIR": str(data), "TMPDIR": str(tmp)}
    env.pop("TANDEM_DEBUG", None)
    return data, tmp, env


@pytest.fixture
def serve(tiny_pair, folders) -> Iterator:
    """Start ``tandem serve`` on the tiny target (port 0: any free port, announced), killed at the end
    if a test left it running."""
    started: list[Server] = []

    def start(*extra: str) -> Server:
        args = ["serve", "--model", str(tiny_pair.target), "--port", "0", "--ctx", "512", "--threads", "1"]
        proc = subprocess.Popen(
            [sys.executable, "-m", "app", *args, *extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=folders[2],
        )  # fmt: skip
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=_pump, args=(proc.stderr, lines), daemon=True).start()
        server = Server(proc, lines, [])
        started.append(server)
        return server

    yield start
    for server in started:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait(10)


def chat(server: Server, text: str = "Tell me about the fox") -> dict:
    status, body = server.post(
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": text}], "max_tokens": 8, "temperature": 0},
    )
    assert status == 200, body
    return body


# -- the drafting history -----------------------------------------------------------------------------


def history_files(data: Path) -> list[Path]:
    return sorted((data / "history").glob("history-*.bin"))


def test_serve_records_requests_in_the_drafting_history(serve, folders) -> None:
    data, _, _ = folders
    server = serve()
    server.ready()
    chat(server)
    code, _ = server.stop()
    assert code == 0, server.seen
    files = history_files(data)
    assert len(files) == 1, "tandem serve kept no drafting history"
    first = files[0].read_bytes()
    assert first.count(b"api-") == 1  # the request, as its own document

    server = serve()  # the next server drafts from it and adds to it
    server.ready()
    chat(server, "Tell me about the dog")
    assert server.stop()[0] == 0
    assert history_files(data)[0].read_bytes().count(b"api-") == 2


def test_serve_no_history_records_nothing(serve, folders) -> None:
    data, _, _ = folders
    server = serve("--no-history")
    server.ready()
    chat(server)
    assert server.stop()[0] == 0
    assert history_files(data) == []


# -- the port ------------------------------------------------------------------------------------------


def test_a_port_in_use_fails_at_once_in_one_line_before_the_model_loads(tiny_pair, folders) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        t0 = time.monotonic()
        res = tandem("serve", "--model", str(tiny_pair.target), "--port", str(port), env=folders[2])
    assert res.returncode == 2
    assert stderr_lines(res) == [
        f"tandem serve: error: cannot listen on 127.0.0.1:{port}: the port is in use (another server?): "
        "choose another --port"
    ]
    assert time.monotonic() - t0 < 30  # no model was loaded (and no engine started)
    assert list(Path(folders[2]["TMPDIR"]).iterdir()) == []


def test_port_zero_serves_on_the_port_it_announces(serve) -> None:
    server = serve()
    port = server.ready()
    assert 0 < port < 65536
    assert chat(server)["object"] == "chat.completion"
    assert server.stop()[0] == 0


# -- signals -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_the_server_and_its_engine_cleanly(serve, folders, sig: int) -> None:
    _, tmp, _ = folders
    server = serve()
    server.ready()
    chat(server)
    engines = server.engine_processes()
    assert engines, "no engine process under tandem serve"
    assert [p.name[:14] for p in tmp.iterdir()] == ["tandem-engine-"]
    code, took = server.stop(sig)
    assert code == 0, server.seen
    assert took < 15
    assert list(tmp.iterdir()) == [], "the engine's folder was left behind"
    _, alive = psutil.wait_procs(engines, timeout=5)
    assert alive == [], f"engine processes left running: {alive}"


def test_ctrl_c_during_a_streamed_reply(serve, folders) -> None:
    """The reply in progress is cut off within the grace period, and the server still stops cleanly."""
    _, tmp, _ = folders
    server = serve("--ctx", "16384")
    server.ready()
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    body = {
        "messages": [{"role": "user", "content": "Write a long story"}],
        "max_tokens": 16000,
        "temperature": 1,
        "stream": True,
    }
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200 and resp.readline().startswith(b"data: ")  # the reply is streaming
    code, took = server.stop(signal.SIGINT)
    with contextlib.suppress(http.client.HTTPException, OSError):
        resp.read()
    conn.close()
    assert code == 0, server.seen
    assert took < 15
    assert list(tmp.iterdir()) == []


def test_sigterm_while_the_model_loads(serve, folders) -> None:
    """Stopped as soon as it starts (loading or just loaded): exit 0, nothing left behind."""
    _, tmp, _ = folders
    server = serve()
    server.wait_for("loading tiny-target.gguf")
    code, took = server.stop(signal.SIGTERM)
    assert code == 0, server.seen
    assert took < 15
    assert list(tmp.iterdir()) == []
    assert not any("error" in line for line in server.seen), server.seen


# -- one-line errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--port", "99999"], "argument --port: 99999 is out of range: give 0-65535"),
        (["--port", "-1"], "argument --port: -1 is out of range: give 0-65535"),
        (["--ctx", "4294967312"], "argument --ctx: 4294967312 is out of range: give 256-16777216"),
        (["--ctx", "1099511627776"], "argument --ctx: 1099511627776 is out of range: give 256-16777216"),
        (["--ctx", "16"], "argument --ctx: 16 is out of range: give 256-16777216"),
        (["--threads", "100000"], "argument --threads: 100000 is out of range: give 1-512"),
        (["--threads", "0"], "argument --threads: 0 is out of range: give 1-512"),
        (["--port", "http"], "argument --port: 'http' is not a whole number"),
    ],
)
def test_serve_refuses_bad_numbers_in_one_line(tiny_pair, folders, args: list[str], says: str) -> None:
    res = tandem("serve", "--model", str(tiny_pair.target), *args, env=folders[2])
    assert res.returncode == 2
    lines = stderr_lines(res)
    assert len(lines) == 1 and lines[0].startswith(f"tandem serve: error: {says}"), lines


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--ctx", "4294967312"], "argument --ctx: 4294967312 is out of range"),
        (["--threads", "100000"], "argument --threads: 100000 is out of range"),
        (["--max-tokens", "0"], "argument --max-tokens: 0 is out of range"),
        (["--n-max", "100000"], "argument --n-max: 100000 is out of range: give 1-256"),
        (["--top-k", "-1"], "argument --top-k: -1 is out of range"),
        (["--mode", "turbo"], "argument --mode: invalid choice: 'turbo'"),
    ],
)
def test_generate_refuses_bad_numbers_in_one_line(tiny_pair, folders, args: list[str], says: str) -> None:
    res = tandem("generate", "--target", str(tiny_pair.target), "--prompt", "hi", *args, env=folders[2])
    assert res.returncode == 2
    lines = stderr_lines(res)
    assert len(lines) == 1 and lines[0].startswith(f"tandem generate: error: {says}"), lines


def write_unknown_architecture(path: Path) -> Path:
    """A well-formed GGUF of an architecture llama.cpp does not know: it fails inside llama.cpp."""
    import gguf

    w = gguf.GGUFWriter(str(path), "no-such-architecture")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture
def broken(tiny_pair, tmp_path: Path) -> dict[str, Path]:
    whole = tiny_pair.target.read_bytes()
    files = {
        "truncated": whole[: len(whole) * 2 // 3],  # an incomplete download: tensors past the end
        "truncated-header": whole[:100],
        "not-gguf": b"<!DOCTYPE html><html>Not Found</html>",
        "empty": b"",
    }
    out = {}
    for name, data in files.items():
        out[name] = tmp_path / f"{name}.gguf"
        out[name].write_bytes(data)
    return out


@pytest.mark.parametrize("command", ["generate", "serve", "check"])
@pytest.mark.parametrize("kind", ["truncated", "truncated-header", "not-gguf", "empty"])
def test_a_broken_model_file_is_exactly_one_line(tiny_pair, broken, folders, command: str, kind: str) -> None:
    path = str(broken[kind])
    args = {
        "generate": ["generate", "--target", path, "--prompt", "hi"],
        "serve": ["serve", "--model", path, "--port", "0"],
        "check": ["check", path, str(tiny_pair.draft)],
    }[command]
    res = tandem(*args, env=folders[2])
    assert res.returncode == 2, res.stdout + res.stderr
    lines = stderr_lines(res)
    assert len(lines) == 1, lines
    assert path in lines[0] and "error" in lines[0]


def test_llamas_log_only_with_tandem_debug(tiny_pair, tmp_path: Path, folders) -> None:
    """A file that llama.cpp itself refuses: one line naming why; TANDEM_DEBUG=1 adds llama.cpp's log."""
    odd = write_unknown_architecture(tmp_path / "odd.gguf")
    res = tandem("generate", "--target", str(odd), "--prompt", "hi", env=folders[2])
    assert res.returncode == 2
    lines = stderr_lines(res)
    assert len(lines) == 1 and "unknown model architecture: 'no-such-architecture'" in lines[0], lines
    assert "print_info" not in lines[0]  # llama.cpp's warnings and errors, not its chatter
    debug = tandem(
        "generate", "--target", str(odd), "--prompt", "hi", env={**folders[2], "TANDEM_DEBUG": "1"}
    )
    assert debug.returncode == 2
    lines = stderr_lines(debug)
    assert len(lines) > 1 and any(line.startswith("llama_model_load") for line in lines[:-1]), lines
    assert lines[-1].startswith("tandem: error: llama.cpp could not load odd.gguf")
