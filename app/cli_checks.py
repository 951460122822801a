"""What the command line checks before anything starts: numbers within what llama.cpp can take, ports,
model files llama.cpp can open, and every usage error in one line (exit code 2).

No engine, no llama.cpp: argparse ``type=`` functions, a parser class, and a GGUF check that reads only
headers (``app.gguf.meta``).
"""

from __future__ import annotations

import argparse
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

#: llama.cpp rounds a context up to a multiple of 256 tokens: anything smaller runs at 256 anyway
MIN_CTX = 256
#: 16M tokens: beyond every model trained so far (10M), far below where llama.cpp's 32-bit context size
#: and positions wrap around (2^32 wraps to a small context, near 2^31 positions overflow)
MAX_CTX = 1 << 24
#: ggml's GGML_MAX_N_THREADS: more threads than this crash or hang llama.cpp's thread pool
MAX_THREADS = 512
#: the most tokens drafted per round: far past where drafting pays (auto mode copies up to 63), and a
#: round's verify batch stays within one llama.cpp batch (512)
MAX_DRAFT = 256
#: llama.cpp's token positions and counts are 32-bit
MAX_INT32 = (1 << 31) - 1
MAX_PORT = 65535


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line, ``tandem serve: error: ...``, exit code 2
    (subcommands' parsers are of the same class)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())}\n")


def int_range(lo: int, hi: int, why: str = "") -> Callable[[str], int]:
    """An argparse ``type=``: a whole number in [lo, hi], else a one-line reason."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not lo <= value <= hi:
            reason = f" ({why})" if why else ""
            raise argparse.ArgumentTypeError(f"{value} is out of range: give {lo}-{hi}{reason}")
        return value

    parse.__name__ = "int"
    return parse


ctx_size = int_range(
    MIN_CTX, MAX_CTX, f"llama.cpp rounds a context up to {MIN_CTX} tokens; no model is trained for 16M"
)
thread_count = int_range(1, MAX_THREADS, "ggml's thread pool takes at most 512")
port_number = int_range(0, MAX_PORT, "0: any free port, announced when the server starts")
positive_tokens = int_range(1, MAX_INT32)
draft_tokens = int_range(1, MAX_DRAFT, "the draft length n_max: longer drafts never pay")
fewest_draft_tokens = int_range(0, MAX_DRAFT)
top_k = int_range(0, MAX_INT32, "0: no top-k")


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` and listening (as uvicorn would bind it: IPv6 where the host
    has a ':'), so a port in use is known before anything loads. Raises ``OSError`` (``socket.gaierror``
    for a host that does not resolve)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    infos = socket.getaddrinfo(host, port, family, socket.SOCK_STREAM, 0, socket.AI_PASSIVE)
    fam, kind, proto, _, addr = infos[0]
    sock = socket.socket(fam, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart need not wait out TIME_WAIT
        sock.bind(addr)
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    return sock


def listen_error(host: str, port: int, e: OSError) -> str:
    """What a failed bind says, in one line."""
    import errno

    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if e.errno == errno.EADDRINUSE:
        return f"cannot listen on {where}: the port is in use (another server?): choose another --port"
    if e.errno == errno.EACCES:
        return f"cannot listen on {where}: permission denied (ports under 1024 need privileges)"
    if e.errno == errno.EADDRNOTAVAIL:
        return f"cannot listen on {where}: {host} is not an address of this machine"
    if isinstance(e, socket.gaierror):
        return f"cannot listen on {where}: {host} does not resolve ({e.strerror})"
    return f"cannot listen on {where}: {e.strerror or e}"


def check_model_file(path: str | os.PathLike[str]) -> None:
    """Raise ``ValueError`` with one line when ``path`` is not a GGUF that llama.cpp could open: missing,
    not a file, not GGUF, a header that does not parse, no architecture, or tensor data past the end of
    the file (an incomplete download). Reads the headers only (every part of a split model)."""
    from app.gguf.meta import GGUFError, read_metadata_file
    from app.gguf.split import model_parts, split_info

    p = Path(path)
    parts = model_parts(p) if split_info(p.name) else [p]
    for i, part in enumerate(parts):
        if not part.exists():
            what = f"part {i + 1} of {len(parts)} of {p.name} is missing" if len(parts) > 1 else "not found"
            raise ValueError(f"model file {what}: {part}")
        if not part.is_file():
            raise ValueError(f"not a file: {part}")
        try:
            meta = read_metadata_file(part, tensor_infos=True)
            size = part.stat().st_size
        except GGUFError as e:
            raise ValueError(str(e)) from None
        except OSError as e:
            raise ValueError(f"cannot read {part}: {e.strerror or e}") from None
        if i == 0 and not meta.architecture:
            raise ValueError(
                f"{part}: not a model llama.cpp can load (no general.architecture in its header)"
            )
        assert meta.tensors is not None and meta.data_offset is not None
        for t in meta.tensors:
            n = t.n_bytes
            end = meta.data_offset + t.offset + (n or 0)
            if end > size:
                raise ValueError(
                    f"{part}: truncated or corrupt: tensor {t.name!r} ends at byte {end:,} but the file has "
                    f"{size:,} bytes (an incomplete download?)"
                )
