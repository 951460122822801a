"""CLI handlers of the registry: download, models catalog/list/fit, and model references."""

from __future__ import annotations

import json
import os
from pathlib import Path

import psutil
import pytest

from fakehub import FakeHub
from models_registry import bandwidth, cli, fit, refs
from models_registry.catalog import default_catalog
from models_registry.fit import Gpu, Machine
from models_registry.measured import SpeedStore
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
    assert data["pairs"][0].keys() == {"id", "target", "draft", "n_max", "p_min", "good_for", "drafting"}
    assert data["pairs"][0]["drafting"]["sources"] == ["draft model", "prompt lookup", "drafting history"]
    assert {"memory", "rollback", "moe", "active_params", "kv_layers", "sources"} <= set(
        data["models"]["qwen2.5-coder-7b-instruct"]
    )
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


@pytest.fixture
def fit_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """A data folder of its own and a bandwidth of 25 GB/s "measured before" (the remeasure flags seen)."""
    monkeypatch.setenv("TANDEM_DATA_DIR", str(tmp_path))
    asked: list[bool] = []

    def cpu_bandwidth(*, remeasure: bool = False) -> bandwidth.Bandwidth:
        asked.append(remeasure)
        return bandwidth.Bandwidth(25e9, "measured" if remeasure else "cached", "2026-11-24T12:00:00+00:00")

    monkeypatch.setattr(bandwidth, "cpu_bandwidth", cpu_bandwidth)
    return asked


def test_models_fit(fit_env: list[bool], capsys: pytest.CaptureFixture[str]) -> None:
    gpus = (Gpu("NVIDIA GeForce RTX 4070", "cuda", 12 * GiB, 11 * GiB),)
    args = cli.build_parser().parse_args(["models", "fit", "--ctx", "8192"])
    args.gpus = gpus  # as tandem passes them, from the engine's devices
    assert cli.run(args) == 0
    out = capsys.readouterr().out
    assert "context: 8192 tokens; usable from 15 tokens/s" in out and "fits fully on GPU" in out
    assert "memory bandwidth 25.0 GB/s (measured before)" in out
    assert "NVIDIA GeForce RTX 4070 (12.9 GB, 504 GB/s) (the engine's devices)" in out
    assert "does not fit" in out  # the 70B pair
    assert "recommended: " in out and "tokens/s (the largest model that reaches 15 tokens/s here)" in out
    assert cli.main(["models", "fit", "--ctx", "0"]) == 2
    assert cli.main(["models", "fit", "--min-speed", "-1"]) == 2


def test_models_fit_json_on_a_two_core_machine_without_gpu(
    fit_env: list[bool], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the 1.5B target's default file, measured by a plain run before
    target = default_catalog().model("qwen2.5-coder-1.5b-instruct").file()
    SpeedStore().record(target.file, target.size, 17.5)
    epyc = Machine(24 * GiB, 23 * GiB, 2, cpu_bandwidth=25e9, bandwidth_source="cached", cpu="AMD EPYC")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fit, "detect_machine", lambda gpus, bandwidth: epyc)
        assert cli.main(["models", "fit", "--json", "--measure-bandwidth"]) == 0
    assert fit_env == [True]
    data = json.loads(capsys.readouterr().out)
    assert data["machine"] == {
        "total_ram": 24 * GiB, "available_ram": 23 * GiB, "physical_cores": 2, "cpu": "AMD EPYC",
        "cpu_bandwidth": 25e9, "bandwidth_measured": True, "bandwidth_source": "cached", "gpus_from": "given",
        "gpus": [],
    }  # fmt: skip
    assert (data["context"], data["min_speed"]) == (4096, 15.0)
    cat = default_catalog()
    pairs = {p["id"]: p for p in data["pairs"]}
    assert list(pairs) == [p.id for p in cat.pairs]
    rec = data["recommended"]
    assert rec["pair"] in pairs and pairs[rec["pair"]]["recommended"]
    assert cat.model(pairs[rec["pair"]]["target"]).params <= 4_000_000_000
    for p in pairs.values():
        assert p["plain_tokens_per_second"] > 0 and p["speculative_tokens_per_second"] > 0
        assert p["expected_tokens_per_second"] == max(
            p["plain_tokens_per_second"], p["speculative_tokens_per_second"]
        )
        assert p["verdict"] in ("cpu", "none") and p["target_gpu_layers"] == 0
    small = pairs["qwen2.5-coder-1.5b+0.5b"]
    assert (small["plain_tokens_per_second"], small["plain_measured"]) == (17.5, True)
    assert not small["speculative_measured"] and not pairs["qwen2.5-coder-7b+0.5b"]["plain_measured"]
    assert rec["pair"] == "qwen2.5-coder-1.5b+0.5b" and rec["measured"] and "reaches 15" in rec["why"]


def test_tandem_models_fit_asks_the_engine_for_the_gpus(tmp_path: Path) -> None:
    """End to end: ``tandem models fit --json`` lists the GPUs the engine process reports (none here
    unless the build offloads to one), with a bandwidth cached for this CPU."""
    import subprocess
    import sys

    (tmp_path / "bandwidth.json").write_text(json.dumps({
        "cpu": bandwidth.cpu_name(), "cores": psutil.cpu_count(logical=False) or os.cpu_count(),
        "bytes_per_second": 21e9, "measured_at": "2026-11-24T12:00:00+00:00",
    }))  # fmt: skip
    env = {**os.environ, "TANDEM_DATA_DIR": str(tmp_path)}
    res = subprocess.run(
        [sys.executable, "-m", "app", "models", "fit", "--json", "--min-speed", "5"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["machine"]["gpus_from"] == "engine" and data["min_speed"] == 5
    assert (data["machine"]["cpu_bandwidth"], data["machine"]["bandwidth_source"]) == (21e9, "cached")
    assert all(g["kind"] for g in data["machine"]["gpus"])


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
    fit_args = parser.parse_args(["models", "fit", "--min-speed", "8", "--json", "--measure-bandwidth"])
    assert (fit_args.min_speed, fit_args.json, fit_args.measure_bandwidth) == (8.0, True, True)
    assert parser.parse_args(["models", "fit"]).min_speed == fit.MIN_SPEED
