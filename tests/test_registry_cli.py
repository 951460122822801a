"""CLI handlers of the registry: download, models catalog/list/fit, and model references."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fakehub import FakeHub
from models_registry import cli, fit, refs
from models_registry.catalog import default_catalog
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
    assert "qwen2.5-coder-7b-instruct-q4_k_m-00001-of-00002.gguf (Q4_K_M, 4.7 GB, 2 parts)" in out

    assert cli.main(["models", "catalog", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    cat = default_catalog()
    assert [p["id"] for p in data["pairs"]] == [p.id for p in cat.pairs]
    assert data["pairs"][0].keys() == {"id", "target", "draft", "n_max", "p_min", "good_for"}
    assert data["models"].keys() == cat.models.keys()
    q4 = data["models"]["qwen2.5-coder-7b-instruct"]["files"]["Q4_K_M"]
    assert q4["repo"] == "Qwen/Qwen2.5-Coder-7B-Instruct-GGUF" and q4["split"]
    assert q4["parts"] == [
        {"file": "qwen2.5-coder-7b-instruct-q4_k_m-00001-of-00002.gguf", "size": 3_993_201_376},
        {"file": "qwen2.5-coder-7b-instruct-q4_k_m-00002-of-00002.gguf", "size": 689_872_288},
    ]
    assert q4["file"] == q4["parts"][0]["file"] and q4["size"] == 4_683_073_664
    for mid, model in data["models"].items():
        assert model["n_layers"] == cat.model(mid).n_layers and model["files"]
        for quant, f in model["files"].items():
            assert (
                f["quant"] == quant
                and f["repo"] == model["repo"]
                and f["size"] == cat.model(mid).file(quant).size
            )
            assert f["size"] == sum(p["size"] for p in f["parts"]) and f["parts"][0]["file"] == f["file"]
            assert f["split"] == (len(f["parts"]) > 1)


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
