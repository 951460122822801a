"""The ``tandem`` command line, run as a real subprocess on the tiny models."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from arch_headers import hybrid_and_moe

from app.engine.engine import Engine, GenerationSettings, LoadSettings

REQUIRED_STATS = {
    "n_prompt_tokens",
    "n_generated",
    "n_drafted",
    "n_accepted",
    "acceptance_rate",
    "rounds",
    "decode_tokens_per_second",
    "prompt_tokens_per_second",
    "ttft_s",
}


def tandem(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app", *args], capture_output=True, text=True, input=stdin, timeout=120
    )


@pytest.mark.parametrize("mode", ["speculative", "plain", "lookup", "auto"])
def test_generate_json_matches_the_engine(tiny_pair, mode: str) -> None:
    res = tandem(
        "generate",
        "--target",
        str(tiny_pair.target),
        "--draft",
        str(tiny_pair.draft),
        "--mode",
        mode,
        "--chat",
        "--system",
        "Be brief.",
        "--prompt",
        "Write a haiku",
        "--max-tokens",
        "24",
        "--json",
    )
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert set(out["stats"]) >= REQUIRED_STATS
    assert out["stats"]["n_generated"] == len(out["tokens"])
    assert out["stats"]["n_prompt_tokens"] == len(out["prompt_tokens"])
    with Engine(LoadSettings(str(tiny_pair.target), n_ctx=4096)) as eng:
        ids = eng.chat_prompt(
            [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Write a haiku"}]
        )
        plain = eng.run(ids, GenerationSettings(mode="plain", max_tokens=24))
    assert out["prompt_tokens"] == ids
    assert out["tokens"] == list(plain.tokens)  # greedy: every mode says what plain decoding says
    assert out["text"] == plain.text


def test_generate_streams_text_and_reports_on_stderr(tiny_pair, tmp_path) -> None:
    prompt = tmp_path / "p.txt"
    prompt.write_text("def add(a, b):")
    res = tandem(
        "generate", "--target", str(tiny_pair.target), "--prompt-file", str(prompt), "--max-tokens", "16"
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip()
    assert "tok/s" in res.stderr and "finish:" in res.stderr
    piped = tandem(
        "generate",
        "--target",
        str(tiny_pair.target),
        "--prompt-file",
        "-",
        "--max-tokens",
        "16",
        stdin="def add(a, b):",
    )
    assert piped.returncode == 0 and piped.stdout == res.stdout


def test_check_exit_codes(tiny_pair, tiny_incompatible_draft) -> None:
    ok = tandem("check", str(tiny_pair.target), str(tiny_pair.draft))
    assert ok.returncode == 0 and ok.stdout.startswith("compatible")
    bad = tandem("check", str(tiny_pair.target), str(tiny_incompatible_draft))
    assert bad.returncode == 1 and "NOT compatible" in bad.stdout and "token" in bad.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--target", "/nonexistent/model.gguf", "--prompt", "hi"], "not found"),
        (["--prompt", "hi", "--n-max", "0"], "n_max"),
        (["--prompt", "hi", "--n-max", "-2"], "n_max"),
        (["--prompt", "hi", "--temperature", "-1"], "temperature"),
        (["--prompt", "hi", "--mode", "speculative"], "needs --draft"),
        (["--prompt-file", "/nonexistent/prompt.txt"], "cannot read prompt file"),
        (["--prompt", "word " * 5000, "--ctx", "256"], "context"),
    ],
)
def test_generate_bad_input_is_a_clear_error(tiny_pair, args: list[str], message: str) -> None:
    if "--target" not in args:
        args = ["--target", str(tiny_pair.target), *args]
    res = tandem("generate", *args)
    assert res.returncode == 2, res.stdout + res.stderr
    assert message in res.stderr and "Traceback" not in res.stderr


def test_unknown_mode_is_refused_by_the_parser(tiny_pair) -> None:
    res = tandem("generate", "--target", str(tiny_pair.target), "--prompt", "hi", "--mode", "turbo")
    assert res.returncode == 2 and "invalid choice" in res.stderr


def test_check_with_a_bad_file(tiny_pair, tmp_path) -> None:
    junk = tmp_path / "junk.gguf"
    junk.write_text("hello")
    res = tandem("check", str(tiny_pair.target), str(junk))
    assert res.returncode == 2 and "GGUF" in res.stderr and "Traceback" not in res.stderr


def test_version() -> None:
    from app import __version__

    res = tandem("--version")
    assert res.returncode == 0 and __version__ in res.stdout


def test_check_names_the_architectures_and_the_drafting(tmp_path) -> None:
    """A hybrid target rolls back by snapshots; a mixture of experts by trimming (headers only)."""
    hybrid, moe = hybrid_and_moe(tmp_path)
    res = tandem("check", str(hybrid), str(moe))
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].startswith("compatible")
    assert lines[1] == "target: qwen35: hybrid (recurrent + attention layers)"
    assert lines[2] == "draft:  qwen3moe: attention, mixture of 128 experts (8 per token)"
    assert lines[3].startswith("drafting: draft model, prompt lookup, drafting history; target rolls back by")
    assert "recurrent-state snapshots (up to 16 tokens a round; longer drafts by checkpoint" in lines[3]
    assert "the draft model by trimming its KV cache" in lines[3]
    res = tandem("check", str(moe), str(hybrid), "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["compatible"] and out["target"]["moe"]
    assert (out["target"]["experts"], out["target"]["experts_used"]) == (128, 8)
    assert (out["draft"]["memory"], out["draft"]["rollback"]) == ("hybrid", "snapshot")
    assert out["drafting"] == {
        "target_memory": "attention", "draft_memory": "hybrid", "target_rollback": "trim",
        "draft_rollback": "checkpoint", "longest_snapshot_draft": 0,
        "sources": ["draft model", "prompt lookup", "drafting history"],
        "draft_kind": "model", "target_mtp_layers": 0,
    }  # fmt: skip
