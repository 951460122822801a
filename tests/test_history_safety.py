"""The history file trusts nothing it finds: a FIFO, a device behind a symlink, a file too large or holding
token ids outside the vocabulary are refused at load with a log line (the history starts empty and the next
save replaces them); killed saves' temporary files are removed at start; two processes sharing a data
folder keep each other's documents, and a forget or a removal in one holds in the other. Real files in
temporary folders, real processes."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from app.engine.history import safety
from app.engine.history import store as store_module
from app.engine.history.fileformat import HistoryFileError, file_name, load, read, save
from app.engine.history.index import HistoryIndex
from app.engine.history.layout import file_limit
from app.engine.history.store import HistoryStore
from app.engine.keeper import HistoryKeeper

pytestmark = pytest.mark.timeout(60)

FP = "fam"
ROOT = Path(__file__).resolve().parents[1]


def loaded(folder: Path, **kw) -> HistoryStore:
    """A store on ``folder`` whose load finished (within 5 s: nothing may hang it)."""
    store = HistoryStore(folder, FP, **kw)
    thread = store.load_in_background()
    thread.join(5)
    assert not thread.is_alive() and store.ready.is_set(), "loading the history hung"
    return store


def docs_in(folder: Path) -> set[str]:
    return set(load(folder / file_name(FP)).documents())


def tokens(seed: int, n: int = 40) -> list[int]:
    return np.random.default_rng(seed).integers(0, 900, n).tolist()


# -- what the store opens ------------------------------------------------------------------------------


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX")
def test_a_fifo_in_place_of_the_file_is_refused_and_replaced_by_the_next_save(tmp_path, caplog) -> None:
    path = tmp_path / file_name(FP)
    os.mkfifo(path)
    with caplog.at_level(logging.WARNING, logger="tandem.history"):
        store = loaded(tmp_path)
    assert len(store.index) == 0
    (line,) = [r.getMessage() for r in caplog.records if "history not loaded" in r.getMessage()]
    assert "not a regular file (a FIFO)" in line
    store.index.add("a", tokens(1))
    done = threading.Thread(target=store.save, daemon=True)
    done.start()
    done.join(5)
    assert not done.is_alive(), "saving over a FIFO hung"
    assert path.is_file() and docs_in(tmp_path) == {"a"}


def test_a_symlink_to_a_device_is_refused_without_reading_it(tmp_path, caplog) -> None:
    path = tmp_path / file_name(FP)
    device = "/dev/zero" if os.path.exists("/dev/zero") else os.devnull
    path.symlink_to(device)
    with caplog.at_level(logging.WARNING, logger="tandem.history"):
        store = loaded(tmp_path)
    assert len(store.index) == 0 and "symbolic link" in caplog.text
    with pytest.raises(HistoryFileError, match="symbolic link"):
        load(path)
    # a save replaces the link, never writes through it
    outside = tmp_path / "elsewhere.bin"
    outside.write_bytes(b"precious")
    path.unlink()
    path.symlink_to(outside)
    store.index.add("a", tokens(2))
    store.save()
    assert not path.is_symlink() and outside.read_bytes() == b"precious" and docs_in(tmp_path) == {"a"}


def test_a_device_or_a_folder_is_refused_and_a_save_that_cannot_write_is_logged(tmp_path, caplog) -> None:
    if os.path.exists("/dev/null"):
        with pytest.raises(safety.RefusedFile, match="character device"):
            safety.read_regular(Path("/dev/null"), 100)
    (tmp_path / file_name(FP)).mkdir()
    with caplog.at_level(logging.WARNING):
        keeper = HistoryKeeper(tmp_path, FP)
        keeper.store.load_in_background().join(5)
        keeper.drafter.learn(tokens(3))
        keeper.record("chat")
        keeper.save()  # cannot replace a folder: logged, never raised
        assert keeper.forget().tokens == 0
    assert "a folder" in caplog.text and "could not" in caplog.text


def test_a_file_over_the_bound_and_its_margin_is_refused(tmp_path, caplog) -> None:
    path = tmp_path / file_name(FP)
    with open(path, "wb") as f:  # sparse: nothing is written
        f.truncate(file_limit(1 << 20) + 1)
    with caplog.at_level(logging.WARNING, logger="tandem.history"):
        store = loaded(tmp_path, max_bytes=1 << 20)
    assert len(store.index) == 0 and "a history file may hold" in caplog.text
    big = HistoryIndex(max_bytes=8 << 20, fingerprint=FP)
    big.add("big", np.arange(400_000) % 1000)  # 1.6 MB
    save(big, path)
    with pytest.raises(HistoryFileError, match="may hold"):
        read(path, max_bytes=256 << 10)
    assert len(read(path, max_bytes=2 << 20).tokens) > 400_000


def test_token_ids_outside_the_vocabulary_are_refused_at_load(tmp_path, caplog) -> None:
    index = HistoryIndex(fingerprint=FP)
    index.add("fine", [1, 2, 3, 4, 5, 6])
    index.add("bad", [7, 8, 9, 1000, 10])  # valid checksum, id 1000 in a vocabulary of 1000
    path = tmp_path / file_name(FP)
    save(index, path)
    assert load(path, n_vocab=1001).documents() == ["fine", "bad"]
    with pytest.raises(HistoryFileError, match="token id 1000 is outside the vocabulary"):
        load(path, n_vocab=1000)
    with caplog.at_level(logging.WARNING, logger="tandem.history"):
        store = loaded(tmp_path, n_vocab=1000)
    assert len(store.index) == 0
    (line,) = [r.getMessage() for r in caplog.records if "history not loaded" in r.getMessage()]
    assert "outside the vocabulary (1000 tokens)" in line
    store.index.add("new", [4, 5, 6, 7])
    store.save()  # the refused file is replaced, not merged
    assert docs_in(tmp_path) == {"new"} and load(path, n_vocab=1000).documents() == ["new"]


# -- temporary files -----------------------------------------------------------------------------------


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_stale_temporary_files_are_removed_at_start_and_what_remains_is_counted(tmp_path) -> None:
    name = file_name(FP)
    gone = tmp_path / f"{name}.{dead_pid()}.abc123_x.tmp"  # a killed save's
    old = tmp_path / f"{name}.q1w2e3r4.tmp"  # an older version's name, a minute old
    live = tmp_path / f"{name}.{os.getpid()}.zz9.tmp"  # a save in progress
    other = tmp_path / f"{file_name('other')}.{dead_pid()}.x.tmp"  # another family's: its own start
    for f in (gone, old, live, other):
        f.write_bytes(b"\0" * 1000)
    past = time.time() - 2 * safety.STALE_AFTER
    os.utime(old, (past, past))
    assert safety.remove_stale_temporaries(tmp_path / name, locked=False) == 1000
    assert not gone.exists() and not old.exists() and live.exists() and other.exists()
    assert safety.remove_stale_temporaries(tmp_path / name, locked=True) == 0  # under the lock: all
    assert not live.exists() and other.exists()


def test_what_cannot_be_removed_counts_in_the_bound(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(store_module, "remove_stale_temporaries", lambda path, locked: 300_000)
    store = loaded(tmp_path, max_bytes=1 << 20)
    assert store.index.max_bytes == (1 << 20) - 300_000 and store.size_bytes() == 300_000


WRITER = textwrap.dedent(
    """
    import os, sys, time
    import numpy as np
    from app.engine.history.store import HistoryStore
    store = HistoryStore(sys.argv[1], "fam")
    store.load_in_background().join()
    store.index.add("doc", np.arange(200_000) % 1000)
    def stall(fd):  # stop for good in the middle of a save: the parent kills the process here
        print("writing", flush=True)
        time.sleep(60)
    os.fsync = stall
    store.save()
    """
)


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")
def test_a_save_killed_midway_leaves_a_temporary_file_the_next_start_removes(tmp_path) -> None:
    for _ in range(3):  # each start removes the previous one's
        proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE, text=True
        )
        assert proc.stdout is not None and proc.stdout.readline().strip() == "writing"
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        (temp,) = tmp_path.glob("*.tmp")
        assert temp.stat().st_size > 0 and f".{proc.pid}." in temp.name
    store = loaded(tmp_path)
    assert not list(tmp_path.glob("*.tmp")) and store.leftover == 0 and len(store.index) == 0


# -- two processes on one folder ------------------------------------------------------------------------

REPL = textwrap.dedent(
    """
    import json, sys
    from app.engine.history.store import HistoryStore
    store = HistoryStore(sys.argv[1], "fam", n_vocab=1000)
    store.load_in_background().join()
    print(json.dumps(store.index.documents()), flush=True)
    for line in sys.stdin:
        cmd, *args = line.split()
        if cmd == "add":
            store.index.add(args[0], [int(t) for t in args[1:]])
        elif cmd == "save":
            store.save()
        elif cmd == "forget":
            store.forget()
        elif cmd == "remove":
            store.remove(args)
        elif cmd == "tokens":
            print(json.dumps(store.index.tokens(args[0]).tolist()), flush=True)
            continue
        elif cmd == "loop":  # add and save, many times
            for i in range(int(args[1])):
                store.index.add(f"{args[0]}{i}", list(range(i, i + 30)))
                store.save()
        print(json.dumps(store.index.documents()), flush=True)
    """
)


class Proc:
    """A process holding a ``HistoryStore`` on a folder, driven line by line."""

    def __init__(self, folder: Path):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", REPL, str(folder)],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.docs = self._answer()

    def _answer(self) -> list:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, "the process died"
        return json.loads(line)

    def __call__(self, command: str) -> list:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self._answer()

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(10)


@pytest.fixture
def procs(tmp_path):
    started: list[Proc] = []

    def start() -> Proc:
        started.append(Proc(tmp_path))
        return started[-1]

    yield start
    for p in started:
        p.close()


def words(seed: int) -> str:
    return " ".join(map(str, tokens(seed, 30)))


def test_two_processes_keep_both_sets_of_documents(tmp_path, procs) -> None:
    a, b = procs(), procs()  # both start before either saves: the last to save used to win
    for i in range(4):
        a(f"add a{i} {words(i)}")
        b(f"add b{i} {words(10 + i)}")
        a("save")
        b("save")
    both = {f"a{i}" for i in range(4)} | {f"b{i}" for i in range(4)}
    assert docs_in(tmp_path) == both and set(procs().docs) == both


def test_saves_racing_from_two_processes_lose_nothing(tmp_path, procs) -> None:
    a, b = procs(), procs()
    assert a.proc.stdin is not None and b.proc.stdin is not None
    for p, name in ((a, "a"), (b, "b")):  # at the same time, no waiting between them
        p.proc.stdin.write(f"loop {name} 25\n")
        p.proc.stdin.flush()
    a._answer()
    b._answer()
    assert docs_in(tmp_path) == {f"{n}{i}" for n in "ab" for i in range(25)}


def test_the_newest_version_of_a_document_wins(tmp_path, procs) -> None:
    a, b = procs(), procs()
    a(f"add chat {words(1)}")
    b(f"add chat {words(2)}")  # written later
    b("save")
    assert a("save") == []  # a's older version does not overwrite b's: a drops it
    assert load(tmp_path / file_name(FP)).tokens("chat").tolist() == tokens(2, 30)


def test_a_forget_in_one_process_holds_in_the_other(tmp_path, procs) -> None:
    a, b = procs(), procs()
    a(f"add a1 {words(1)}")
    b(f"add b1 {words(2)}")
    a("save")
    b("save")
    assert docs_in(tmp_path) == {"a1", "b1"}
    assert a("forget") == []
    assert docs_in(tmp_path) == set()
    assert b(f"add b2 {words(3)}") == ["b1", "b2"]
    assert b("save") == ["b2"]  # b1 was written before the forget: gone from b too
    assert docs_in(tmp_path) == {"b2"}
    c = procs()  # a process started later loads only what came after the forget
    assert c.docs == ["b2"]


def test_a_removal_in_one_process_holds_in_another_that_holds_the_document(tmp_path, procs) -> None:
    a = procs()
    a(f"add x {words(1)}")
    a(f"add y {words(2)}")
    a("save")
    b = procs()
    assert b.docs == ["x", "y"]
    assert a("remove x") == ["y"]
    a("save")
    b(f"add z {words(3)}")
    assert b("save") == ["y", "z"]  # b held x: it does not bring it back
    assert docs_in(tmp_path) == {"y", "z"}
    assert procs().docs == ["y", "z"]


def test_the_bound_holds_after_a_merge_oldest_first(tmp_path) -> None:
    bound = 64 << 10
    a, b = loaded(tmp_path, max_bytes=bound), loaded(tmp_path, max_bytes=bound)
    for i in range(6):  # 6 x 3000 tokens x 4 bytes each: 72 KB between the two, over the bound
        (a if i % 2 else b).index.add(f"d{i}", tokens(i, 3000))
    b.save()
    size = a.save()
    assert size <= bound and (tmp_path / file_name(FP)).stat().st_size == size
    kept = load(tmp_path / file_name(FP)).documents()
    assert kept == [f"d{i}" for i in range(6 - len(kept), 6)] and 3 <= len(kept) < 6


def test_a_version_1_file_is_read_and_merged(tmp_path) -> None:
    import struct
    import zlib

    index = HistoryIndex(fingerprint=FP)
    index.add("old", tokens(1))
    path = tmp_path / file_name(FP)
    save(index, path)
    data = path.read_bytes()  # rewrite as version 1: a 40-byte header, no removals
    magic, _, k, n_fp, n_docs, n_tok, n_table, *_ = struct.unpack_from("<8sIIIIQQQdII", data)
    body = data[64 : len(data) - 4]
    head = struct.pack("<8sIIIIQQ", magic, 1, k, n_fp, n_docs, n_tok, n_table)
    path.write_bytes(head + body + struct.pack("<I", zlib.crc32(head + body)))
    assert load(path).documents() == ["old"]
    other = HistoryStore(tmp_path, FP)
    other.index.add("new", tokens(2))
    other.save()  # not loaded: merged with the file
    assert docs_in(tmp_path) == {"old", "new"}


def test_a_document_removed_while_the_file_loads_stays_removed(tmp_path) -> None:
    index = HistoryIndex(fingerprint=FP)
    index.add("deleted", tokens(1))
    index.add("kept", tokens(2))
    save(index, tmp_path / file_name(FP))
    store = HistoryStore(tmp_path, FP)
    store.remove(["deleted"])  # the app removes deleted chats as soon as the pair loads
    store.load_in_background().join(5)
    assert store.index.documents() == ["kept"]
    assert store.index.lookup(tokens(1)[:12])[0] == 0  # its text is not drafted from either
    store.save()
    assert docs_in(tmp_path) == {"kept"}


def test_a_save_waits_for_the_lock_a_bounded_time_and_is_logged(tmp_path, monkeypatch, caplog) -> None:
    monkeypatch.setattr(safety, "LOCK_TIMEOUT", 0.3)
    keeper = HistoryKeeper(tmp_path, FP)
    keeper.store.load_in_background().join(5)
    keeper.drafter.learn(tokens(1))
    keeper.record("chat")
    with safety.file_lock(keeper.store.lock_path), caplog.at_level(logging.WARNING):  # another save, stuck
        t0 = time.monotonic()
        keeper.save()
        assert time.monotonic() - t0 < 3
    assert "held by another process" in caplog.text and not (tmp_path / file_name(FP)).exists()
    keeper.save()  # the lock is free again: saved
    assert docs_in(tmp_path) == {"chat"}
