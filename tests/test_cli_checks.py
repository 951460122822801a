"""``app.cli_checks``: the command line's bounds, its one-line usage errors, binding a port, and the
GGUF check that runs before anything loads (in process, no engine)."""

from __future__ import annotations

import argparse
import errno
import shutil
import socket
from pathlib import Path

import pytest

from app.cli import build_parser, main
from app.cli_checks import (
    MAX_CTX,
    MAX_THREADS,
    MIN_CTX,
    OneLineParser,
    bind_socket,
    check_model_file,
    ctx_size,
    int_range,
    listen_error,
    port_number,
    thread_count,
)


@pytest.mark.parametrize(
    ("parse", "good", "bad"),
    [
        (
            ctx_size,
            [MIN_CTX, 4096, MAX_CTX],
            [0, 16, MIN_CTX - 1, MAX_CTX + 1, 1 << 32, (1 << 32) + 16, 1 << 40],
        ),
        (thread_count, [1, 8, MAX_THREADS], [0, -1, MAX_THREADS + 1, 100_000]),
        (port_number, [0, 1, 8080, 65535], [-1, 65536, 99999]),
    ],
)
def test_bounds(parse, good: list[int], bad: list[int]) -> None:
    for value in good:
        assert parse(str(value)) == value
    for value in bad:
        with pytest.raises(argparse.ArgumentTypeError, match=f"{value} is out of range"):
            parse(str(value))
    with pytest.raises(argparse.ArgumentTypeError, match="'4k' is not a whole number"):
        parse("4k")


def test_the_bounds_keep_llama_cpps_integers_whole() -> None:
    """A context llama.cpp takes as uint32 (and pads to 256) and positions it keeps as int32."""
    assert MAX_CTX + 256 < 1 << 31
    assert MIN_CTX % 256 == 0


def test_int_range_says_why() -> None:
    parse = int_range(1, 3, "three at most")
    with pytest.raises(argparse.ArgumentTypeError, match=r"^4 is out of range: give 1-3 \(three at most\)$"):
        parse("4")


def test_usage_errors_are_one_line_with_exit_code_2(capsys) -> None:
    for argv, says in [
        (["serve"], "tandem serve: error: the following arguments are required: --model"),
        (["serve", "--model", "m.gguf", "--port", "99999"], "tandem serve: error: argument --port: 99999"),
        (["generate", "--target", "m.gguf"], "tandem generate: error: one of the arguments --prompt"),
        (["nonsense"], "tandem: error: argument COMMAND: invalid choice: 'nonsense'"),
        (["models", "fit", "--ctx", "x"], "tandem models fit: error: argument --ctx"),
    ]:
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(says), err


def test_subcommands_share_the_one_line_parser() -> None:
    parser = build_parser()
    assert isinstance(parser, OneLineParser)
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert all(isinstance(p, OneLineParser) for p in subs.choices.values())


def test_help_names_tandem_debug(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "TANDEM_DEBUG=1" in capsys.readouterr().out


def test_bind_socket_and_its_errors() -> None:
    sock = bind_socket("127.0.0.1", 0)
    with sock:
        port = sock.getsockname()[1]
        assert port > 0
        with pytest.raises(OSError) as taken:
            bind_socket("127.0.0.1", port)
        assert taken.value.errno == errno.EADDRINUSE
        assert listen_error("127.0.0.1", port, taken.value) == (
            f"cannot listen on 127.0.0.1:{port}: the port is in use (another server?): choose another --port"
        )
        assert not sock.get_inheritable()  # the engine process (spawned) never holds the port
    with pytest.raises(OSError) as odd:
        bind_socket("host.invalid", 0)
    assert "host.invalid" in listen_error("host.invalid", 8080, odd.value)
    assert "\n" not in listen_error("::1", 80, OSError(errno.EACCES, "Permission denied"))
    assert listen_error("::1", 80, OSError(errno.EACCES, "Permission denied")).startswith(
        "cannot listen on [::1]:80: permission denied"
    )


def test_ipv6_loopback_binds_where_the_machine_has_it() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    try:
        sock = bind_socket("::1", 0)
    except OSError:
        pytest.skip("no ::1 here")
    with sock:
        assert sock.family == socket.AF_INET6


def test_check_model_file(tiny_pair, tmp_path: Path) -> None:
    check_model_file(tiny_pair.target)  # a whole model passes
    data = tiny_pair.target.read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[:-1])
    with pytest.raises(ValueError, match=r"cut.gguf: truncated or corrupt: tensor '.+' ends at byte"):
        check_model_file(tmp_path / "cut.gguf")
    with pytest.raises(ValueError, match="model file not found"):
        check_model_file(tmp_path / "missing.gguf")
    with pytest.raises(ValueError, match="not a file"):
        check_model_file(tmp_path)
    (tmp_path / "page.gguf").write_text("<html>404</html>")
    with pytest.raises(ValueError, match=r"not a GGUF file.*HTML"):
        check_model_file(tmp_path / "page.gguf")


def test_check_model_file_reads_every_part_of_a_split_model(tiny_pair, tmp_path: Path) -> None:
    first = tmp_path / "m-00001-of-00002.gguf"
    shutil.copy(tiny_pair.target, first)
    with pytest.raises(ValueError, match=r"part 2 of 2 of m-00001-of-00002\.gguf is missing"):
        check_model_file(first)
    second = tmp_path / "m-00002-of-00002.gguf"
    second.write_bytes(tiny_pair.target.read_bytes()[:1000])
    with pytest.raises(ValueError, match=r"m-00002-of-00002\.gguf"):
        check_model_file(first)
