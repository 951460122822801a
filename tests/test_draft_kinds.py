"""``tandem check`` and the engine on drafts of every kind: a draft model, a model with MTP layers, an
EAGLE-3 head, a Gemma 4 assistant (GGUF headers written here; the MTP model is a real tiny one)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from arch_headers import HYBRID, write_header

from app.engine.engine import Engine
from app.engine.errors import IncompatibleDraftError
from app.engine.settings import LoadSettings
from app.gguf.compat import check_files
from app.gguf.drafts import DraftKind, draft_facts, head_fits
from app.gguf.meta import read_metadata_file
from app.tiny_arch import write_tiny_model

GEMMA4 = {"block_count": 4, "embedding_length": 256, "attention.head_count": 4, "context_length": 4096}


def tandem(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "app", *args], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("kinds")

    def eagle3(name: str, layers: list[int], width: int) -> Path:
        return write_header(d / name, "eagle3", {"target_layers": layers, "target_hidden_size": width})

    def assistant(name: str, width: int) -> Path:
        keys = {"embedding_length": 128, "embedding_length_out": width}
        return write_header(d / name, "gemma4-assistant", keys)

    return {
        "hybrid": write_header(d / "hybrid.gguf", "qwen35", HYBRID),
        "hybrid_mtp": write_header(d / "hybrid-mtp.gguf", "qwen35", {**HYBRID, "nextn_predict_layers": 1}),
        "eagle3": eagle3("eagle3.gguf", [1, 3, 6], 256),
        "eagle3_wide": eagle3("eagle3-w.gguf", [1, 3, 6], 512),
        "eagle3_deep": eagle3("eagle3-d.gguf", [2, 10, 20], 256),
        "gemma4": write_header(d / "gemma4.gguf", "gemma4", GEMMA4),
        "assistant": assistant("assistant.gguf", 256),
        "assistant_wide": assistant("assistant-w.gguf", 512),
    }


def _meta(path: Path):
    return read_metadata_file(path)


def test_each_file_says_what_kind_of_draft_it_is(files) -> None:
    assert draft_facts(_meta(files["hybrid"])).kind is DraftKind.MODEL
    mtp = draft_facts(_meta(files["hybrid_mtp"]))
    assert (mtp.kind, mtp.mtp_layers) == (DraftKind.MTP, 1)
    head = draft_facts(_meta(files["eagle3"]))
    assert (head.kind, head.target_width, head.target_layers) == (DraftKind.EAGLE3, 256, (1, 3, 6))
    assistant = draft_facts(_meta(files["assistant"]))
    assert (assistant.kind, assistant.target_width) == (DraftKind.GEMMA4_ASSISTANT, 256)


def test_a_head_fits_only_the_target_it_was_made_for(files) -> None:
    hybrid, gemma4 = _meta(files["hybrid"]), _meta(files["gemma4"])
    assert head_fits(hybrid, _meta(files["eagle3"])) == (True, "")
    ok, why = head_fits(hybrid, _meta(files["eagle3_wide"]))
    assert not ok and "width 512, not 256" in why
    ok, why = head_fits(hybrid, _meta(files["eagle3_deep"]))
    assert not ok and "reads layer 20, the target has 8 layers" in why
    assert head_fits(gemma4, _meta(files["assistant"])) == (True, "")
    ok, why = head_fits(hybrid, _meta(files["assistant"]))
    assert not ok and "drafts for a Gemma 4" in why
    ok, why = head_fits(gemma4, _meta(files["assistant_wide"]))
    assert not ok and "width 512" in why


def test_tandem_check_names_the_kind_and_the_fit(files) -> None:
    res = tandem("check", str(files["hybrid"]), str(files["eagle3_wide"]))
    assert res.returncode == 1
    assert "NOT compatible: an EAGLE-3 head" in res.stdout and "does not match this target" in res.stdout
    res = tandem("check", str(files["gemma4"]), str(files["assistant"]))
    assert res.returncode == 0 and "compatible: a Gemma 4 assistant for a Gemma 4 of width 256" in res.stdout
    res = tandem("check", str(files["hybrid_mtp"]), str(files["hybrid"]), "--json")
    out = json.loads(res.stdout)
    assert out["compatible"] and out["draft"]["kind"] == "model" and out["target"]["mtp_layers"] == 1
    res = tandem("check", str(files["hybrid_mtp"]))
    assert res.returncode == 0 and "1 multi-token-prediction layer: --mode mtp" in res.stdout
    res = tandem("check", str(files["hybrid"]))
    assert res.returncode == 1 and "no multi-token-prediction layers" in res.stdout


def test_the_engine_refuses_a_head_as_a_draft_model_in_one_line(files, tmp_path) -> None:
    target = write_tiny_model(tmp_path / "t.gguf", "qwen35")
    assert not check_files(target, files["eagle3"]).ok
    with pytest.raises(IncompatibleDraftError, match="EAGLE-3 head"):
        Engine(LoadSettings(target=str(target), draft=str(files["eagle3"])))
