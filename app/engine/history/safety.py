"""What the history store does before it trusts a path in the data folder: it reads only a regular file of a
sane size (never a FIFO, a device, a symlink), writes through a temporary file named after its process
(replaced atomically, never written through), removes the temporary files of killed saves, and holds a lock
file while it reads, merges and writes, so that two processes sharing the folder take turns."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import stat
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger("tandem.history")

STALE_AFTER = 60.0  # seconds: a temporary file this old belongs to no save in progress
LOCK_TIMEOUT = 10.0  # seconds: a save waits this long for another process's save, then gives up
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_READ_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | _NOFOLLOW | getattr(os, "O_BINARY", 0)
_LOCK_FLAGS = os.O_RDWR | os.O_CREAT | getattr(os, "O_NONBLOCK", 0) | _NOFOLLOW | getattr(os, "O_BINARY", 0)
_TEMP = re.compile(r"(?P<base>.+\.bin)\.(?:(?P<pid>\d+)\.)?[A-Za-z0-9_]+\.tmp")


class RefusedFile(OSError):
    """A path the store does not read: not a regular file (a FIFO, a device, a symlink, a folder) or too
    large. Its message names why."""


def read_regular(path: Path, max_bytes: int, *, head: int | None = None) -> bytes:
    """The bytes of ``path`` (the first ``head`` only, if given), if it is a regular file (not a symlink)
    of at most ``max_bytes``. Opened without blocking and checked on the open descriptor, so a FIFO or a
    device swapped in meanwhile is refused too. Raises :class:`RefusedFile`, ``FileNotFoundError``."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise RefusedFile(f"{path} is a symbolic link, not a regular file")
    if not stat.S_ISREG(st.st_mode):
        raise RefusedFile(f"{path} is not a regular file ({_kind(st.st_mode)})")
    try:
        fd = os.open(path, _READ_FLAGS)
    except OSError as e:
        if e.errno == errno.ELOOP:  # replaced by a symlink since the lstat
            raise RefusedFile(f"{path} is a symbolic link, not a regular file") from None
        raise
    with os.fdopen(fd, "rb", buffering=0) as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise RefusedFile(f"{path} is not a regular file ({_kind(st.st_mode)})")
        if st.st_size > max_bytes:
            raise RefusedFile(f"{path} is {st.st_size} bytes, over the {max_bytes} a history file may hold")
        want = st.st_size if head is None else min(head, st.st_size)
        data = _read_exactly(f, want)
        if head is None and f.read(1):
            raise RefusedFile(f"{path} grew while it was read")
    return data


def _read_exactly(f, n: int) -> bytes:
    parts, left = [], n
    while left > 0:
        chunk = f.read(min(left, 1 << 24))
        if not chunk:
            break
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a plain file"


def write_atomically(path: Path, parts: list[bytes] | tuple[bytes, ...]) -> int:
    """Write ``parts`` to a new temporary file beside ``path`` (named after this process, so that a later
    start can tell a killed save's leftover), fsync it, and rename it over ``path``: the rename replaces
    whatever entry ``path`` was (a FIFO, a symlink) and never writes through it. Returns the bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f"{path.name}.{os.getpid()}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            for part in parts:
                f.write(part)
            f.flush()
            os.fsync(f.fileno())
            size = f.tell()
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return size


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    if sys.platform == "win32":  # os.kill would end the process there: rely on the file's age
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: alive, another user's
        return True
    return True


def remove_stale_temporaries(path: Path, *, locked: bool) -> int:
    """Remove the temporary files that killed saves of ``path`` left (``<name>.<pid>.<random>.tmp``):
    all of them if ``locked`` (this process holds the lock every save holds), else those of a process
    that is gone or older than :data:`STALE_AFTER`. Returns the bytes of those that remain."""
    left = 0
    now = time.time()
    try:
        entries = list(os.scandir(path.parent))
    except OSError:
        return 0
    for entry in entries:
        m = _TEMP.fullmatch(entry.name)
        if not m or m["base"] != path.name:
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        pid = int(m["pid"]) if m["pid"] else None
        stale = locked or now - st.st_mtime > STALE_AFTER or (pid is not None and not _pid_alive(pid))
        if stale:
            try:
                os.unlink(entry.path)
                log.info("removed %s, left by a save that did not finish", entry.name)
                continue
            except OSError as e:
                log.warning("could not remove %s: %s", entry.name, e)
        left += st.st_size if stat.S_ISREG(st.st_mode) else 0
    return left


@contextlib.contextmanager
def file_lock(path: Path, timeout: float | None = None) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (a lock file, created if missing, never removed): ``fcntl.flock``
    on POSIX, ``msvcrt.locking`` on Windows. Raises ``TimeoutError`` after ``timeout`` seconds (default
    :data:`LOCK_TIMEOUT`) and :class:`RefusedFile` if ``path`` is not a regular file."""
    timeout = LOCK_TIMEOUT if timeout is None else timeout
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, _LOCK_FLAGS, 0o600)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise RefusedFile(f"{path} is a symbolic link, not a lock file") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise RefusedFile(f"{path} is not a regular file ({_kind(st.st_mode)})")
        deadline = time.monotonic() + timeout
        delay = 0.002
        while not _try_lock(fd):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{path} is held by another process for more than {timeout:g} s")
            time.sleep(delay)
            delay = min(2 * delay, 0.05)
        try:
            yield
        finally:
            _unlock(fd)
    finally:
        os.close(fd)


if sys.platform == "win32":  # pragma: no cover - exercised on Windows only
    import msvcrt

    def _try_lock(fd: int) -> bool:
        os.lseek(fd, 0, os.SEEK_SET)
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError:
            return False
        return True

    def _unlock(fd: int) -> None:
        os.lseek(fd, 0, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)

else:
    import fcntl

    def _try_lock(fd: int) -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def _unlock(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_UN)
