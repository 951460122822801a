"""``tandem generate`` keeps its decode speed for the speed estimate (a real subprocess, tiny models)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil

from models_registry.measured import SpeedStore


def generate(tmp_path: Path, tiny_pair, *args: str) -> dict:
    env = {**os.environ, "TANDEM_DATA_DIR": str(tmp_path)}
    res = subprocess.run(
        [sys.executable, "-m", "app", "generate", "--target", str(tiny_pair.target), "--draft",
         str(tiny_pair.draft), "--prompt", "Hello there", "--json", *args],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)["stats"]


def test_generate_records_the_speed_of_its_mode(tmp_path: Path, tiny_pair) -> None:
    store = SpeedStore(tmp_path / "speeds.json")
    target = (tiny_pair.target.name, tiny_pair.target.stat().st_size)
    draft = (tiny_pair.draft.name, tiny_pair.draft.stat().st_size)

    short = generate(tmp_path, tiny_pair, "--mode", "plain", "--max-tokens", "8")
    assert short["n_generated"] <= 8 and store.lookup(*target) is None  # too short to say

    plain = generate(tmp_path, tiny_pair, "--mode", "plain", "--max-tokens", "40")
    spec = generate(tmp_path, tiny_pair, "--mode", "speculative", "--max-tokens", "40")
    if (psutil.cpu_count(logical=False) or 1) > 1:  # fewer threads than cores: not kept
        generate(tmp_path, tiny_pair, "--mode", "plain", "--max-tokens", "40", "--threads", "1")
    m = store.lookup(*target, placement="cpu")
    assert m is not None and m.plain == plain["decode_tokens_per_second"]  # one run: its own figure
    if spec["n_generated"] >= 32:
        assert m.speed("speculative", draft) == spec["decode_tokens_per_second"]
        assert m.acceptance_with(draft) == spec["acceptance_rate"]
    assert m.speed("speculative") is None  # a mode that drafts with a model is kept with its draft
    assert store.lookup(*draft) is None  # the draft's own speed comes from its own plain runs
