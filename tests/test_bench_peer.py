"""``bench.peer``: the servers it starts, a whole run through ``tandem serve`` on a tiny real model with a
real template (llama.cpp's ``llama-server`` is not built here: its command lines are checked as data), and
the summary of speeds over the peer's plain decoding."""

from __future__ import annotations

import pytest
from tool_server import write_variant

from bench import peer

pytestmark = pytest.mark.timeout(180)


def test_the_servers_get_the_same_models_context_and_threads() -> None:
    setup = peer.Setup("t.gguf", "d.gguf", 2048, 2, "/opt/llama-server", ("-ngl", "99"))
    cmds = peer.servers(setup, ["draft8=-md d.gguf --spec-draft-n-max 8"])
    assert list(cmds) == [
        "tandem-plain",
        "tandem-auto",
        "llama-plain",
        "llama-draft",
        "llama-ngram",
        "llama-both",
        "llama-draft8",
    ]
    for name, cmd in cmds.items():
        assert cmd[cmd.index("--model" if name.startswith("tandem") else "-m") + 1] == "t.gguf"
        assert cmd[cmd.index("--ctx" if name.startswith("tandem") else "-c") + 1] == "2048"
        assert cmd[cmd.index("--threads" if name.startswith("tandem") else "-t") + 1] == "2"
    assert cmds["tandem-auto"][-2:] == ["--mode", "auto"] and "--no-history" not in cmds["tandem-auto"]
    assert cmds["llama-draft"][-6:] == ["-md", "d.gguf", "-td", "2", "--spec-type", "draft-simple"]
    assert (
        cmds["llama-both"][-2:] == ["--spec-type", "ngram-mod,draft-simple"] and "-md" in cmds["llama-both"]
    )
    assert cmds["llama-ngram"][-2:] == ["--spec-type", "ngram-mod"]
    assert cmds["llama-plain"][-2:] == ["-ngl", "99"] and "-np" in cmds["llama-plain"]
    assert cmds["llama-draft8"][-2:] == ["--spec-draft-n-max", "8"]
    assert list(peer.servers(peer.Setup("t.gguf", None, 512, 1))) == ["tandem-plain"]


def test_a_run_through_tandem_serve(tiny_pair, tmp_path) -> None:
    target = write_variant(tmp_path, "qwen25")
    setup = peer.Setup(str(target), str(tiny_pair.draft), 1024, 1)
    prompts = [
        {"id": "a", "category": "code", "prompt": "Write a loop."},
        {"id": "b", "category": "chat", "prompt": "Hello there."},
    ]
    data = peer.run(setup, prompts, repeats=2, max_tokens=24, log_dir=tmp_path)
    rows = data["rows"]
    # every repeat from servers started afresh: two loads each
    assert (tmp_path / "tandem-auto.log").read_text().count("loading") == 2
    assert len(rows) == 2 * 2 * 2
    assert {r["server"] for r in rows} == {"tandem-plain", "tandem-auto"}
    assert all(r["tokens"] > 1 and r["decode_s"] > 0 and r["ttft_s"] > 0 and r["text"] for r in rows)
    # the order rotates with prompt and repeat
    firsts = [rows[i]["server"] for i in range(0, len(rows), 2)]
    assert firsts == ["tandem-plain", "tandem-auto", "tandem-auto", "tandem-plain"]
    summary = peer.summarize(rows)
    assert summary["baseline"] == "tandem-plain"
    assert set(summary["categories"]) == {"code", "chat", "all"}
    assert summary["categories"]["all"]["servers"]["tandem-plain"]["ratio"] == pytest.approx(1.0)
    assert summary["same_as_plain"]["tandem-auto"] == [4, 4]  # greedy and lossless
    assert "tandem-auto" in peer.report(summary)


def _row(server: str, cat: str, rep: int, tokens: int, seconds: float, text: str = "x") -> dict:
    return {
        "id": f"{cat}-1",
        "category": cat,
        "repeat": rep,
        "server": server,
        "text": text,
        "tokens": tokens,
        "decode_s": seconds,
    }


def test_the_summary_holds_auto_to_the_best_peer() -> None:
    rows = []
    for rep, noise in enumerate((1.0, 1.2, 0.9)):  # a busy repeat slows every server alike
        for server, seconds in (
            ("llama-plain", 10.0),
            ("llama-draft", 8.0),
            ("llama-ngram", 12.5),
            ("tandem-plain", 10.0),
            ("tandem-auto", 6.4),
        ):
            rows.append(
                _row(server, "code", rep, 101, seconds * noise, "y" if server == "llama-ngram" else "x")
            )
    s = peer.summarize(rows)
    code = s["categories"]["code"]
    assert s["baseline"] == "llama-plain"
    assert code["servers"]["llama-draft"]["ratio"] == pytest.approx(1.25)
    assert code["servers"]["llama-ngram"]["low"] == pytest.approx(0.8)
    assert code["best_peer"] == "llama-draft"
    assert code["auto_over_best_peer"] == pytest.approx(1.25)
    assert code["servers"]["tandem-auto"]["tok_s"] == pytest.approx(100 / 6.4)
    assert s["same_as_plain"]["llama-ngram"] == [0, 3] and s["same_as_plain"]["tandem-auto"] == [3, 3]
    assert "1.25x of llama-draft" in peer.report(s)
