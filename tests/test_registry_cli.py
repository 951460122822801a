"""CLI handlers of the registry: download, models catalog/list/fit, and model references."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fakehub import FakeHub
from models_registry import cli, fit, refs
from models_registry.fit import Gpu, Machine
from models_registry.remote import HfRef

GiB = 1024**3


def test_download_prints_path_and_progress(fake_hub: FakeHub, capsys: pytest.CaptureFixture[str]) -> None:
    data = os.urandom(1_500_000)
    fake_hub.add_file("acme/Tiny-GGUF", "tiny.gguf", data)
    assert cli.main(["download", "acme/Tiny-GGUF", "tiny.gguf"]) == 0
    out, err = capsys.readouterr()
    path = Path(out.strip())
    assert path.read_bytes() == data and "/snapshots/" in str(path)
    assert "tiny.gguf [" in err and "100.0%" in err


def test_download_errors_exit_nonzero(fake_hub: FakeHub, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["download", "acme/Missing-GGUF", "x.gguf", "--revision", "main"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and "tandem: error: repository 'acme/Missing-GGUF' not found" in err


def test_models_catalog(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["models", "catalog"]) == 0
    out = capsys.readouterr().out
    assert "qwen2.5-coder-7b+0.5b" in out and "Qwen/Qwen2.5-Coder-7B-Instruct-GGUF" in out
    assert cli.main(["models", "catalog", "--json"]) == 0
    assert '"pairs"' in capsys.readouterr().out


def test_models_fit(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    machine = Machine(32 * GiB, 28 * GiB, 8, (Gpu("RTX 4070", "cuda", 12 * GiB, 11 * GiB),))
    monkeypatch.setattr(fit, "detect_machine", lambda: machine)
    assert cli.main(["models", "fit", "--ctx", "8192"]) == 0
    out = capsys.readouterr().out
    assert "context: 8192 tokens" in out and "fits fully on GPU" in out and "recommended: " in out
    assert "does not fit" in out  # the 70B pair
    assert cli.main(["models", "fit", "--ctx", "0"]) == 2


def test_models_list(fake_hub: FakeHub, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["models", "list", "--folder", str(tmp_path)]) == 0
    assert "no GGUF models found" in capsys.readouterr().out
    (tmp_path / "Qwen3-8B-Q4_K_M.gguf").write_bytes(b"GGUF")
    assert cli.main(["models", "list", "--folder", str(tmp_path)]) == 0
    assert "[qwen3-8b Q4_K_M]" in capsys.readouterr().out


def test_resolve_and_check_refs(fake_hub: FakeHub, tiny_pair, tiny_incompatible_draft: Path) -> None:
    fake_hub.add_file("acme/Tiny-GGUF", "tiny-target.gguf", tiny_pair.target.read_bytes())
    assert refs.resolve_model_ref(str(tiny_pair.draft)) == tiny_pair.draft
    assert refs.resolve_model_ref("hf://acme/Tiny-GGUF/tiny-target.gguf") == HfRef(
        "acme/Tiny-GGUF", "tiny-target.gguf"
    )
    ref = refs.resolve_model_ref("qwen3-8b:Q8_0")
    assert ref == HfRef("Qwen/Qwen3-8B-GGUF", "Qwen3-8B-Q8_0.gguf")
    with pytest.raises(ValueError, match="no such file"):
        refs.resolve_model_ref("does/not/exist.gguf")
    with pytest.raises(ValueError, match="has no Q2_K file"):
        refs.resolve_model_ref("qwen3-8b:Q2_K")

    assert refs.check_refs("hf://acme/Tiny-GGUF/tiny-target.gguf", str(tiny_pair.draft)).ok
    assert not refs.check_refs("hf://acme/Tiny-GGUF/tiny-target.gguf", str(tiny_incompatible_draft)).ok

    # once downloaded, the hf:// reference resolves to the cached file
    assert cli.main(["download", "acme/Tiny-GGUF", "tiny-target.gguf"]) == 0
    local = refs.resolve_model_ref("hf://acme/Tiny-GGUF/tiny-target.gguf")
    assert isinstance(local, Path) and local.read_bytes() == tiny_pair.target.read_bytes()


def test_add_subcommands_usage() -> None:
    parser = cli.build_parser()
    args = parser.parse_args(["download", "a/b", "c.gguf", "--revision", "v1"])
    assert (args.repo, args.file, args.revision, args.handler) == ("a/b", "c.gguf", "v1", cli.cmd_download)
    assert parser.parse_args(["models", "fit"]).ctx == 4096
