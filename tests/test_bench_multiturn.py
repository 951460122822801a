"""``bench.multiturn`` end to end on the tiny GGUF pair (real llama.cpp), and its replay."""

from __future__ import annotations

import argparse
import json

import pytest

from app.engine.auto import LOOKUP_MAX
from bench import multiturn


def multiturn_args(tiny_pair, tmp_path, *extra: str) -> argparse.Namespace:
    conversations = tmp_path / "conversations.jsonl"
    rows = [
        {"id": "c1", "kind": "code", "turns": ["one two three one two three", "again, all of it"]},
        {"id": "a1", "kind": "agent", "turns": ["file: alpha beta gamma", "file: alpha beta gamma delta"]},
    ]
    conversations.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    p = argparse.ArgumentParser()
    multiturn.add_arguments(p)
    return p.parse_args(
        [
            "--target", str(tiny_pair.target), "--draft", str(tiny_pair.draft),
            "--conversations", str(conversations), "--max-tokens", "16", "--ctx", "1024",
            "--repeats", "2", "--out", str(tmp_path / "mt.json"), *extra,
        ]
    )  # fmt: skip


def test_multiturn_reports_first_and_revision_turns_apart(tiny_pair, tmp_path, capsys) -> None:
    args = multiturn_args(tiny_pair, tmp_path, "--modes", "plain,auto")
    assert multiturn.main(args) == 0
    printed = capsys.readouterr().out
    assert "| auto | first (2) |" in printed and "| auto | revision (2) |" in printed
    data = json.loads((tmp_path / "mt.json").read_text())
    runs = data["runs"]
    assert {r["mode"] for r in runs} == {"plain", "auto"}
    assert len(runs) == 2 * 4 * 2  # modes x turns x repeats
    assert {r["category"] for r in runs if r["turn"] == 1} == {"first"}
    assert {r["category"] for r in runs if r["turn"] > 1} == {"revision"}
    # greedy auto mode writes plain decoding's text (or leaves it only at a numerical tie)
    auto = [r for r in runs if r["mode"] == "auto"]
    assert all(r["same_as_plain"] or r["top2_gap_at_difference"] < 1e-3 for r in auto)
    summary = data["summary"]
    for group, turns in (("first", 2), ("revision", 2), ("all", 4), ("code/first", 1), ("agent/revision", 1)):
        assert summary[group]["plain"]["speedup"] == 1.0
        assert summary[group]["auto"]["speedup_over_turns"]["n"] == turns  # each turn's median over repeats
    # the history each turn answered is the chat so far: plain decoding's earlier replies
    c1 = [r for r in runs if r["mode"] == "plain" and r["conversation"] == "c1" and r["repeat"] == 0]
    first, second = sorted(c1, key=lambda r: r["turn"])
    assert [m["role"] for m in second["messages"]] == ["user", "assistant", "user"]
    assert second["messages"][1]["content"] == first["text"]
    # each turn runs its modes in the other order in the next turn and in the next repeat
    place = {(r["id"], r["repeat"]): r["position"] for r in auto}
    assert place[("c1/1", 0)] != place[("c1/2", 0)] and place[("c1/1", 0)] != place[("c1/1", 1)]
    assert data["settings"]["passes"] == 1 and len(data["settings"]["verify_ratios"]) == LOOKUP_MAX + 1


def test_multiturn_results_replay_with_bench_replay(tiny_pair, tmp_path, capsys) -> None:
    """bench.replay reads the chats the plain replies answered, each reply once over the repeats."""
    from bench import replay

    assert multiturn.main(multiturn_args(tiny_pair, tmp_path, "--modes", "plain,auto")) == 0
    capsys.readouterr()
    assert replay.main([str(tmp_path / "mt.json"), "--ratios", "1,1.02,1.04,1.06", "--no-draft"]) == 0
    printed = capsys.readouterr().out
    assert "Replay of 4 plain replies" in printed
    assert "| first |" in printed and "| revision |" in printed and "| all |" in printed
    assert "auto-history (pass 1) | auto-history (pass 2) |" in printed  # the history, replayed


def test_multiturn_auto_history_runs_when_the_engine_keeps_a_history(tiny_pair, tmp_path, capsys) -> None:
    """With the history fields, auto-history runs in two passes; without them it is skipped, said."""
    extra = ("--repeats", "1", "--history-dir", str(tmp_path / "h"), "--timing-tokens", "20000")
    args = multiturn_args(tiny_pair, tmp_path, *extra)
    assert multiturn.main(args) == 0
    out = capsys.readouterr()
    data = json.loads((tmp_path / "mt.json").read_text())
    modes = {r["mode"] for r in data["runs"]}
    if not multiturn.history_supported():
        assert modes == {"plain", "auto"} and "auto-history skipped" in out.err
        return
    assert modes == {"plain", "auto", "auto-history"}
    assert {r["pass"] for r in data["runs"]} == {1, 2} and data["settings"]["passes"] == 2
    assert "auto-history (pass 2)" in data["summary"]["revision"]
    hist = [r for r in data["runs"] if r["mode"] == "auto-history"]
    # the second pass writes new documents: the first pass's conversations stay whole in the history
    assert {r["history_doc"] for r in hist if r["pass"] == 1} == {"c1", "a1"}
    assert {r["history_doc"] for r in hist if r["pass"] == 2} == {"c1 (pass 2)", "a1 (pass 2)"}
    assert data["complete"] is True
    assert all(r["same_as_plain"] or r["top2_gap_at_difference"] < 1e-3 for r in hist)
    assert (tmp_path / "h" / "repeat-0").is_dir()
    # what the history's calls cost, against a decode step, in the output
    assert "history, per call on a 20,000-token index: add a token" in out.out
    assert "a decode step here" in out.out
    assert data["history_timing"]["lookup"] > 0
    loads = data["loads"]
    assert len(loads) == 2 and loads[1]["history_before"]["tokens"] > 0  # the first pass's, reloaded


def test_a_turn_other_processes_slowed_runs_again(tiny_pair, tmp_path, monkeypatch, capsys) -> None:
    """--retry-busy: a turn stopped because other processes took the CPU runs again, and only its
    last try is kept."""
    calls = {"watch": 0, "quiet": 0}

    class Busy:  # the first turn's first watch sees other processes at once
        def __init__(self) -> None:
            calls["watch"] += 1
            self.busy = 1.5 if calls["watch"] == 1 else 0.0

        def __call__(self) -> bool:
            return bool(self.busy)

    def quiet(limit: float) -> float:
        calls["quiet"] += 1
        return 0.0

    monkeypatch.setattr(multiturn, "BusyWatch", Busy)
    monkeypatch.setattr(multiturn, "wait_quiet", quiet)
    args = multiturn_args(tiny_pair, tmp_path, "--modes", "plain,auto", "--repeats", "1", "--retry-busy", "2")
    assert multiturn.main(args) == 0
    said = capsys.readouterr().err
    assert "c1 turn 1: other processes took the CPU (1.5 cores); the turn runs again" in said
    runs = json.loads((tmp_path / "mt.json").read_text())["runs"]
    assert len(runs) == 2 * 4  # modes x turns: the stopped try is not kept
    assert {r["tries"] for r in runs if r["id"] == "c1/1"} == {2}
    assert {r["tries"] for r in runs if r["id"] != "c1/1"} == {1}
    assert all(r["finish"] != "cancelled" for r in runs)
    assert calls["quiet"] == 1  # before the second try only


def test_conversations_file_is_checked(tmp_path) -> None:
    bad = tmp_path / "c.jsonl"
    bad.write_text('{"id": "x", "kind": "poem", "turns": ["hi"]}\n', encoding="utf-8")
    with pytest.raises(SystemExit, match="need an id, a kind"):
        multiturn.load_conversations(bad)
    rows = multiturn.load_conversations(multiturn.DEFAULT_CONVERSATIONS)
    assert len(rows) >= 8 and {r["kind"] for r in rows} == set(multiturn.KINDS)
    assert all(3 <= len(r["turns"]) <= 4 for r in rows)
