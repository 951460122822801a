"""Tests for app.gguf.meta: GGUF header/metadata parsing from files and streams."""

from __future__ import annotations

import io
import math
import re
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from gguf import GGUFValueType as VT

from app.gguf.meta import (
    DEFAULT_READ_AHEAD,
    NUMPY_ARRAY_THRESHOLD,
    GGUFCorruptError,
    GGUFEmptyFileError,
    GGUFError,
    GGUFLimitError,
    GGUFNotGGUFError,
    GGUFTruncatedError,
    GGUFUnsupportedError,
    read_metadata,
    read_metadata_file,
)

TOKENS = [f"tok{i}" for i in range(300)]


def write_gguf(
    path: Path,
    setup: Callable[[gguf.GGUFWriter], None] | None = None,
    *,
    arch: str = "llama",
    tensors: dict[str, np.ndarray] | None = None,
    endianess: gguf.GGUFEndian = gguf.GGUFEndian.LITTLE,
) -> Path:
    """Write a GGUF file with the given metadata and (by default) one tiny tensor."""
    w = gguf.GGUFWriter(str(path), arch, endianess=endianess)
    if setup is not None:
        setup(w)
    for name, arr in (tensors if tensors is not None else {"t": np.arange(4, dtype=np.float32)}).items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def model_setup(w: gguf.GGUFWriter) -> None:
    w.add_name("Tiny Test")
    w.add_context_length(4096)
    w.add_block_count(2)
    w.add_embedding_length(64)
    w.add_head_count(8)
    w.add_file_type(15)
    w.add_tokenizer_model("llama")
    w.add_token_list(TOKENS)
    w.add_chat_template("{{ messages }}")


class CountingReader:
    """File-like wrapper exposing only read(n) (not seekable), counting the bytes handed out."""

    def __init__(self, data: bytes | io.RawIOBase) -> None:
        self._f = io.BytesIO(data) if isinstance(data, bytes) else data
        self.bytes_read = 0
        self.calls = 0

    def read(self, n: int = -1) -> bytes:
        b = self._f.read(n)
        self.bytes_read += len(b)
        self.calls += 1
        return b


class Trickle(CountingReader):
    """Returns at most 7 bytes per read() call, like a slow network stream."""

    def read(self, n: int = -1) -> bytes:
        return super().read(min(n, 7) if n >= 0 else 7)


def kv_offsets(data: bytes, key: str) -> int:
    """Offset just after `key`'s name, i.e. where its u32 value type starts."""
    raw = key.encode()
    i = data.index(struct.pack("<Q", len(raw)) + raw)
    return i + 8 + len(raw)


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    return write_gguf(tmp_path / "m.gguf", model_setup)


# ------------------------------------------------------------------------------------------ round trips


def test_every_value_type_round_trips(tmp_path: Path) -> None:
    scalars: list[tuple[str, Any, VT]] = [
        ("t.u8", 250, VT.UINT8), ("t.i8", -100, VT.INT8), ("t.u16", 65000, VT.UINT16),
        ("t.i16", -32000, VT.INT16), ("t.u32", 4_000_000_000, VT.UINT32), ("t.i32", -2_000_000_000, VT.INT32),
        ("t.f32", 1.5, VT.FLOAT32), ("t.true", True, VT.BOOL), ("t.false", False, VT.BOOL),
        ("t.str", "héllo ☃ 🦙", VT.STRING), ("t.empty_str", "", VT.STRING),
        ("t.u64", 2**63 + 5, VT.UINT64), ("t.i64", -(2**62), VT.INT64), ("t.f64", math.pi, VT.FLOAT64),
    ]  # fmt: skip
    arrays: list[tuple[str, list[Any], VT]] = [
        ("a.u8", [0, 255], VT.UINT8), ("a.i8", [-128, 127], VT.INT8), ("a.u16", [1, 65535], VT.UINT16),
        ("a.i16", [-5, 5], VT.INT16), ("a.u32", [7, 2**32 - 1], VT.UINT32), ("a.i32", [-7, 7], VT.INT32),
        ("a.f32", [0.5, -2.25], VT.FLOAT32), ("a.bool", [True, False, True], VT.BOOL),
        ("a.str", ["a", "", "ü"], VT.STRING), ("a.u64", [2**64 - 1], VT.UINT64),
        ("a.i64", [-(2**63)], VT.INT64), ("a.f64", [1e300, -1e-300], VT.FLOAT64),
    ]  # fmt: skip

    def setup(w: gguf.GGUFWriter) -> None:
        for key, val, vt in scalars:
            w.add_key_value(key, val, vt)
        for key, val, vt in arrays:
            w.add_key_value(key, val, VT.ARRAY, sub_type=vt)
        w.add_key_value("n.ints", [[1, 2], [3, 4, 5]], VT.ARRAY, sub_type=VT.ARRAY)
        w.add_key_value("n.strs", [["x", "y"], ["z"]], VT.ARRAY, sub_type=VT.ARRAY)
        w.add_key_value("n.deep", [[[1], [2, 3]], [[4]]], VT.ARRAY, sub_type=VT.ARRAY)
        w.add_key_value("big.i32", list(range(NUMPY_ARRAY_THRESHOLD + 10)), VT.ARRAY, sub_type=VT.INT32)
        w.add_key_value("big.f32", [0.25] * NUMPY_ARRAY_THRESHOLD, VT.ARRAY, sub_type=VT.FLOAT32)
        w.add_key_value("big.bool", [True, False] * NUMPY_ARRAY_THRESHOLD, VT.ARRAY, sub_type=VT.BOOL)
        w.add_key_value("bad.utf8", b"ok\xff\xfe!", VT.STRING)

    m = read_metadata_file(write_gguf(tmp_path / "types.gguf", setup))
    for key, val, vt in scalars:
        got = m.kv[key]
        assert got == pytest.approx(val) if vt == VT.FLOAT32 else got == val, key
        assert type(got) is type(val), key
    for key, val, vt in arrays:
        assert isinstance(m.kv[key], list), key
        assert m.kv[key] == (pytest.approx(val) if vt == VT.FLOAT32 else val), key
    assert m.kv["n.ints"] == [[1, 2], [3, 4, 5]]
    assert m.kv["n.strs"] == [["x", "y"], ["z"]]
    assert m.kv["n.deep"] == [[[1], [2, 3]], [[4]]]
    big = m.kv["big.i32"]
    assert isinstance(big, np.ndarray) and big.dtype == np.int32
    assert big.tolist() == list(range(NUMPY_ARRAY_THRESHOLD + 10))
    assert m.kv["big.f32"].dtype == np.float32 and float(m.kv["big.f32"].sum()) == NUMPY_ARRAY_THRESHOLD / 4
    assert m.kv["big.bool"].dtype == np.bool_ and int(m.kv["big.bool"].sum()) == NUMPY_ARRAY_THRESHOLD
    assert m.kv["bad.utf8"] == "ok\ufffd\ufffd!"
    assert m.architecture == "llama"
    assert m.kv["general.architecture"] == "llama"


def test_v3_header_and_convenience_properties(model_file: Path) -> None:
    m = read_metadata_file(model_file)
    assert m.version == 3
    assert m.n_tensors == 1
    assert m.tensors is None and m.data_offset is None
    assert m.architecture == "llama"
    assert m.name == "Tiny Test"
    assert m.context_length == 4096
    assert m.block_count == 2
    assert m.embedding_length == 64
    assert m.head_count == 8
    assert m.head_count_kv == 8  # absent -> head_count, like llama.cpp
    assert m.key_length == 8 and m.value_length == 8  # absent -> embedding_length / head_count
    assert m.vocab_size == len(TOKENS)
    assert m.tokens == TOKENS
    assert m.tokenizer_model == "llama"
    assert m.file_type == 15
    assert m.chat_template == "{{ messages }}"
    assert 0 < m.bytes_read < model_file.stat().st_size
    with pytest.raises(TypeError):
        m.kv["x"] = 1  # type: ignore[index]


def test_explicit_head_sizes_and_kv_heads(tmp_path: Path) -> None:
    def setup(w: gguf.GGUFWriter) -> None:
        w.add_embedding_length(64)
        w.add_head_count(8)
        w.add_head_count_kv(2)
        w.add_key_length(128)
        w.add_value_length(96)
        w.add_vocab_size(1000)

    m = read_metadata_file(write_gguf(tmp_path / "h.gguf", setup))
    assert (m.head_count_kv, m.key_length, m.value_length) == (2, 128, 96)
    assert m.vocab_size == 1000  # no token list -> <arch>.vocab_size
    assert m.name is None and m.chat_template is None and m.context_length is None


def test_v2_file_is_read(model_file: Path) -> None:
    data = bytearray(model_file.read_bytes())
    data[4:8] = struct.pack("<I", 2)  # v2 and v3 share the same little-endian layout
    m = read_metadata(io.BytesIO(bytes(data)))
    assert m.version == 2
    assert m.tokens == TOKENS


@pytest.mark.parametrize(("version", "match"), [(1, "version 1"), (4, "unsupported GGUF version 4")])
def test_unsupported_versions(model_file: Path, version: int, match: str) -> None:
    data = bytearray(model_file.read_bytes())
    data[4:8] = struct.pack("<I", version)
    with pytest.raises(GGUFUnsupportedError, match=match):
        read_metadata(io.BytesIO(bytes(data)))


def test_big_endian_is_rejected(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "be.gguf", model_setup, endianess=gguf.GGUFEndian.BIG)
    with pytest.raises(GGUFUnsupportedError, match="big-endian"):
        read_metadata_file(path)


def test_tensor_infos(tmp_path: Path) -> None:
    tensors = {
        "token_embd.weight": np.zeros((10, 16), dtype=np.float32),
        "blk.0.attn_norm.weight": np.ones(16, dtype=np.float16),
        "output.weight": np.zeros((3, 4, 5), dtype=np.float32),
    }
    path = write_gguf(tmp_path / "t.gguf", model_setup, tensors=tensors)
    m = read_metadata_file(path, tensor_infos=True)
    assert m.n_tensors == 3 and m.tensors is not None
    names = [t.name for t in m.tensors]
    assert names == list(tensors)
    ref = gguf.GGUFReader(path)
    assert m.data_offset == ref.data_offset
    assert m.data_offset % 32 == 0 and m.data_offset >= m.bytes_read
    for info, rt in zip(m.tensors, ref.tensors, strict=True):
        assert info.shape == tuple(int(x) for x in rt.shape)  # ggml order: ne[0] first
        assert info.type == int(rt.tensor_type)
        assert m.data_offset + info.offset == rt.data_offset
        assert info.n_bytes == rt.n_bytes
    emb = m.tensors[0]
    assert emb.shape == (16, 10) and emb.type_name == "F32" and emb.n_elements == 160
    assert m.tensors[1].type_name == "F16" and m.tensors[1].n_bytes == 32
    # without tensor infos the parse stops earlier, after the KV section
    assert read_metadata_file(path).bytes_read < m.bytes_read


# ------------------------------------------------------------------------------------- bounded reading


def test_reads_only_the_header_of_a_big_file(tmp_path: Path) -> None:
    big = np.zeros(2 * 1024 * 1024, dtype=np.float32)  # 8 MiB of tensor data
    path = write_gguf(tmp_path / "big.gguf", model_setup, tensors={"big": big})
    size = path.stat().st_size
    assert size > 8 * 1024 * 1024

    with open(path, "rb") as f:
        counter = CountingReader(f)  # type: ignore[arg-type]
        m = read_metadata(counter)
    header = m.bytes_read
    assert header < 8 * 1024  # ~300 tokens + a few keys
    assert header <= counter.bytes_read <= header + DEFAULT_READ_AHEAD
    assert counter.bytes_read < size / 100

    with open(path, "rb") as f:
        counter = CountingReader(f)  # type: ignore[arg-type]
        m2 = read_metadata(counter, tensor_infos=True, read_ahead=0)
    assert counter.bytes_read == m2.bytes_read  # no read-ahead at all
    assert m2.tensors is not None and m2.tensors[0].shape == (2 * 1024 * 1024,)


def test_trickling_stream(model_file: Path) -> None:
    r = Trickle(model_file.read_bytes())
    m = read_metadata(r, tensor_infos=True)
    assert m.tokens == TOKENS and m.tensors is not None
    assert r.calls > 100


def test_max_bytes(model_file: Path) -> None:
    data = model_file.read_bytes()
    full = read_metadata(io.BytesIO(data))
    # exactly enough
    assert read_metadata(io.BytesIO(data), max_bytes=full.bytes_read).tokens == TOKENS
    # too little: stops inside the token list, never reads past the limit
    limit = kv_offsets(data, "tokenizer.ggml.tokens") + 200
    counter = CountingReader(data)
    with pytest.raises(GGUFLimitError, match=r"max_bytes=\d+.*tokenizer\.ggml\.tokens"):
        read_metadata(counter, max_bytes=limit)
    assert counter.bytes_read <= limit
    with pytest.raises(GGUFLimitError):
        read_metadata(io.BytesIO(data), max_bytes=10)
    with pytest.raises(GGUFLimitError):
        read_metadata(io.BytesIO(data), max_bytes=0)


def test_vocab_of_152k_strings_is_fast() -> None:
    """A Qwen-sized vocabulary (~152k token strings) parses well under a second (target < 0.3 s)."""
    toks = [f"Ġtoken_{i}".encode() for i in range(152_000)]
    body = b"".join(struct.pack("<Q", len(t)) + t for t in toks)
    key = b"tokenizer.ggml.tokens"
    data = (
        struct.pack("<4sIQQ", b"GGUF", 3, 0, 1)
        + struct.pack("<Q", len(key)) + key
        + struct.pack("<IIQ", VT.ARRAY, VT.STRING, len(toks)) + body
    )  # fmt: skip
    best = math.inf
    for _ in range(3):
        t0 = time.perf_counter()
        m = read_metadata(CountingReader(data))
        best = min(best, time.perf_counter() - t0)
    assert m.vocab_size == 152_000 and m.tokens is not None and m.tokens[-1] == "Ġtoken_151999"
    assert best < 1.0, f"152k strings took {best:.3f} s"


# -------------------------------------------------------------------------------------------- errors


def test_missing_file(tmp_path: Path) -> None:
    p = tmp_path / "nope.gguf"
    with pytest.raises(FileNotFoundError, match=r"nope\.gguf"):
        read_metadata_file(p)


def test_empty_file(tmp_path: Path) -> None:
    p = tmp_path / "empty.gguf"
    p.write_bytes(b"")
    with pytest.raises(GGUFEmptyFileError, match="empty"):
        read_metadata_file(p)
    with pytest.raises(GGUFEmptyFileError):
        read_metadata(CountingReader(b""))


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (b"hello world, this is text\n", r"not a GGUF file.*b'hell'"),
        (b"version https://git-lfs.github.com/spec/v1\noid sha256:abc\n", "Git LFS pointer"),
        (b"<!DOCTYPE html><html>", "HTML"),
        (b"ab", "not a GGUF file: only 2 bytes"),
        (b"\x00\x01\x02\x03\x04\x05\x06\x07", "hex 00 01 02 03"),
    ],
)
def test_not_a_gguf_file(tmp_path: Path, content: bytes, match: str) -> None:
    p = tmp_path / "x.gguf"
    p.write_bytes(content)
    with pytest.raises(GGUFNotGGUFError, match=match):
        read_metadata_file(p)
    with pytest.raises(GGUFNotGGUFError, match=match):
        read_metadata(CountingReader(content))


def _truncation_points(data: bytes) -> dict[str, tuple[int, str]]:
    """Cut offsets, and a regex the error must match (seekable streams can tell from the file size that a
    declared count no longer fits, so they may fail one level earlier)."""
    tok = kv_offsets(data, "tokenizer.ggml.tokens")
    tok_end = data.index(b"tok299") + len(b"tok299")
    tmpl = kv_offsets(data, "tokenizer.chat_template")
    return {
        "in magic": (2, "header"),
        "in header": (13, "header"),
        "after header": (24, "key #0|key/value count"),
        "in a key name": (24 + 8 + 3, "key #0|key/value count"),
        "in value type": (tok + 2, "tokenizer.ggml.tokens"),
        "in array count": (tok + 4 + 4 + 3, "tokenizer.ggml.tokens"),
        "in the token list": (
            tok + (tok_end - tok) * 4 // 5,
            r"tokenizer\.ggml\.tokens', element \d+ of 300",
        ),
        "in a string value": (tmpl + 4 + 8 + 5, "tokenizer.chat_template"),
    }


@pytest.mark.parametrize("point", ["in magic", "in header", "after header", "in a key name", "in value type",
                                   "in array count", "in the token list", "in a string value"])  # fmt: skip
@pytest.mark.parametrize("seekable", [True, False])
def test_truncated(model_file: Path, point: str, seekable: bool) -> None:
    data = model_file.read_bytes()
    cut, what = _truncation_points(data)[point]
    stream = io.BytesIO(data[:cut]) if seekable else CountingReader(data[:cut])
    with pytest.raises(GGUFTruncatedError, match="truncated") as ei:
        read_metadata(stream)
    msg = str(ei.value)
    assert "offset" in msg
    if point != "in magic":
        assert re.search(what, msg), msg


def test_truncated_file_on_disk_names_path(model_file: Path, tmp_path: Path) -> None:
    data = model_file.read_bytes()
    p = tmp_path / "cut.gguf"
    p.write_bytes(data[: kv_offsets(data, "tokenizer.ggml.tokens") + 500])
    with pytest.raises(GGUFTruncatedError, match=r"cut\.gguf.*tokenizer\.ggml\.tokens"):
        read_metadata_file(p)


def test_every_truncation_raises_a_gguf_error(tmp_path: Path) -> None:
    def setup(w: gguf.GGUFWriter) -> None:
        w.add_token_list(TOKENS[:20])
        w.add_key_value("n.strs", [["x", "y"], ["z"]], VT.ARRAY, sub_type=VT.ARRAY)
        w.add_key_value("a.f64", [1.0, 2.0], VT.ARRAY, sub_type=VT.FLOAT64)
        w.add_bool("b", True)

    data = write_gguf(tmp_path / "small.gguf", setup).read_bytes()
    end = read_metadata(io.BytesIO(data), tensor_infos=True).bytes_read
    for cut in range(end):
        for stream in (io.BytesIO(data[:cut]), CountingReader(data[:cut])):
            with pytest.raises(GGUFError):
                read_metadata(stream, tensor_infos=True)


@pytest.mark.parametrize("seekable", [True, False])
def test_absurd_string_length(model_file: Path, seekable: bool) -> None:
    data = bytearray(model_file.read_bytes())
    at = kv_offsets(bytes(data), "tokenizer.chat_template") + 4  # u32 type, then u64 length
    data[at : at + 8] = struct.pack("<Q", 2**62)
    stream = io.BytesIO(bytes(data)) if seekable else CountingReader(bytes(data))
    with pytest.raises(GGUFCorruptError, match=r"absurd string length.*\b4611686018427387904 bytes") as ei:
        read_metadata(stream)
    assert not isinstance(ei.value, GGUFTruncatedError)
    assert "tokenizer.chat_template" in str(ei.value)


@pytest.mark.parametrize("seekable", [True, False])
def test_absurd_array_count(model_file: Path, seekable: bool) -> None:
    data = bytearray(model_file.read_bytes())
    at = kv_offsets(bytes(data), "tokenizer.ggml.tokens") + 8  # u32 type, u32 element type, u64 count
    data[at : at + 8] = struct.pack("<Q", 2**61)
    stream = io.BytesIO(bytes(data)) if seekable else CountingReader(bytes(data))
    with pytest.raises(
        GGUFCorruptError, match=r"tokenizer\.ggml\.tokens.*absurd array of 2305843009213693952"
    ):
        read_metadata(stream)


def test_absurd_kv_count(model_file: Path) -> None:
    data = bytearray(model_file.read_bytes())
    data[16:24] = struct.pack("<Q", 2**60)
    with pytest.raises(GGUFCorruptError, match="key/value count"):
        read_metadata(io.BytesIO(bytes(data)))


def _raw_gguf(*kvs: tuple[str, int, bytes], n_tensors: int = 0) -> bytes:
    out = struct.pack("<4sIQQ", b"GGUF", 3, n_tensors, len(kvs))
    for key, vtype, payload in kvs:
        k = key.encode()
        out += struct.pack("<Q", len(k)) + k + struct.pack("<I", vtype) + payload
    return out


def test_unknown_value_type_and_duplicate_key() -> None:
    with pytest.raises(GGUFCorruptError, match="unknown value type 13"):
        read_metadata(io.BytesIO(_raw_gguf(("a", 13, b"\0" * 8))))
    with pytest.raises(GGUFCorruptError, match="unknown array element type 99"):
        read_metadata(io.BytesIO(_raw_gguf(("a", VT.ARRAY, struct.pack("<IQ", 99, 1)))))
    u8 = struct.pack("<B", 1)
    with pytest.raises(GGUFCorruptError, match="duplicate key 'a'"):
        read_metadata(io.BytesIO(_raw_gguf(("a", VT.UINT8, u8), ("a", VT.UINT8, u8))))


def test_empty_arrays_and_stream_offset() -> None:
    raw = _raw_gguf(
        ("e.str", VT.ARRAY, struct.pack("<IQ", VT.STRING, 0)),
        ("e.i32", VT.ARRAY, struct.pack("<IQ", VT.INT32, 0)),
    )
    stream = io.BytesIO(b"JUNK" + raw + b"tensor data")
    stream.seek(4)  # parsing starts at the current position
    m = read_metadata(stream)
    assert m.kv == {"e.str": [], "e.i32": []}
    assert m.bytes_read == len(raw)
