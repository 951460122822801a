"""The benchmarks' mode table, auto held to the best fixed setting, and the recorded tables replayed."""

from __future__ import annotations

import json

import pytest
from test_bench import bench_args

from bench import modes, multiturn, replay_tables
from bench import run as bench_run


def test_mode_table_names_every_fixed_setting() -> None:
    assert [m.name for m in modes.parse_modes("plain,spec,lookup,auto")] == [
        "plain", "spec1", "spec2", "spec3", "spec4", "spec6", "spec8", "lookup", "auto",
    ]  # fmt: skip
    assert modes.MODES["spec5"].n_max == 5 and not modes.MODES["spec5"].adaptive
    assert set(modes.FIXED) == {"plain", "lookup", *(f"spec{n}" for n in range(1, 9))}
    assert not modes.MODES["auto"].fixed and not modes.MODES["adaptive"].fixed
    assert modes.best_fixed({"plain": 10.0, "spec3": 12.0, "auto": 20.0}) == ("spec3", 12.0)
    assert modes.best_fixed({"auto": 20.0}) is None
    with pytest.raises(SystemExit, match="unknown modes: spec9"):
        modes.parse_modes("plain,spec9")
    gs = modes.MODES["auto-history"].settings(32, history_doc="c1")
    assert (gs.mode, gs.max_tokens, gs.history_doc) == ("auto", 32, "c1")


def test_bench_reports_auto_against_the_best_fixed_setting_over_repeats(tiny_pair, tmp_path, capsys) -> None:
    args = bench_args(tiny_pair, tmp_path, "r.json")
    args.modes, args.repeats = "plain,spec2,spec3,lookup,auto", 2
    assert bench_run.main(args) == 0
    printed = capsys.readouterr().out
    assert "auto against the best fixed setting of the run" in printed
    assert "| category | best fixed setting | its speedup | auto speedup | auto / best fixed |" in printed
    data = json.loads((tmp_path / "r.json").read_text())
    assert {r["repeat"] for r in data["runs"]} == {0, 1} and data["settings"]["repeats"] == 2
    # each prompt runs its modes in another order in the second repeat
    order = {(r["id"], r["repeat"], r["mode"]): r["position"] for r in data["runs"]}
    assert any(order[("p0", 0, m)] != order[("p0", 1, m)] for m in ("plain", "auto"))
    for cat, row in data["summary"].items():
        auto, best = row["auto"], row[row["auto"]["best_fixed"]]
        assert row["auto"]["best_fixed"] in modes.FIXED
        assert best["tok_s"] == max(row[m]["tok_s"] for m in row if m in modes.FIXED), cat
        assert auto["vs_best"] == pytest.approx(auto["tok_s"] / best["tok_s"])
        low, high = auto["vs_best_range"]
        assert low <= high and len(auto["speedup_range"]) == 2
        gen = row[auto["best_fixed_gen"]]
        assert gen["tok_s_gen"] == max(row[m]["tok_s_gen"] for m in row if m in modes.FIXED), cat
        assert auto["vs_best_gen"] == pytest.approx(auto["tok_s_gen"] / gen["tok_s_gen"])
    assert "and on generation time" in printed
    # the draft model's work on the prompt is timed apart: none in plain decoding, some in spec3's
    by_mode = {
        m: [r["stats"]["t_draft_prompt_s"] for r in data["runs"] if r["mode"] == m]
        for m in ("plain", "spec3")
    }
    assert all(t == 0.0 for t in by_mode["plain"]) and all(t > 0.0 for t in by_mode["spec3"])


def test_generation_time_charges_the_draft_model_its_prompt() -> None:
    """Decode time leaves out a draft model evaluating the prompt: a setting faster on decode time but
    slower once that is counted is not the best fixed setting on generation time."""
    from bench.summary import best_fixed_table, summarize

    def run(mode: str, decode: float, draft_prompt: float, repeat: int) -> dict:
        stats = {
            "n_generated": 100,
            "t_decode_s": decode,
            "t_draft_prompt_s": draft_prompt,
            "t_prompt_s": 1.0,
        }
        stats |= {"n_drafted": 0, "n_accepted": 0, "rounds": 10, "rounds_drafted": 0, "t_llama_s": decode}
        return {"id": "p", "category": "extract", "mode": mode, "repeat": repeat, "stats": stats,
                "mean_k": 0.0, "same_as_plain": None}  # fmt: skip

    runs = []
    for rep in (0, 1):
        runs += [run("plain", 10.0, 0.0, rep), run("spec3", 8.0, 4.0, rep), run("lookup", 9.5, 0.01, rep)]
        runs += [run("auto", 9.0, 0.5, rep)]
    summary = summarize({"runs": runs})
    auto = summary["extract"]["auto"]
    assert auto["best_fixed"] == "spec3" and auto["vs_best"] == pytest.approx(8.0 / 9.0)
    assert auto["best_fixed_gen"] == "lookup"
    assert auto["vs_best_gen"] == pytest.approx(9.51 / 9.5)
    assert summary["extract"]["spec3"]["speedup_gen"] == pytest.approx(10.0 / 12.0)
    assert "| extract | lookup | 1.05x | 1.05x | 1.00x |" in best_fixed_table(summary, gen=True)


def test_multiturn_reports_auto_against_the_best_fixed_setting() -> None:
    """On decode time and on generation time: there a draft model that evaluated each prompt up front
    (spec3, 0.4 s a turn) is charged that work, and plain decoding is the best fixed setting."""

    def run(mode: str, speed: float) -> dict:
        stats = {"n_generated": 10, "t_decode_s": 10 / speed, "n_drafted": 0, "n_accepted": 0, "rounds": 10}
        stats |= {"t_llama_s": 0.0, "decode_tokens_per_second": speed}
        stats |= {"t_draft_prompt_s": 0.4 if mode == "spec3" else 0.0}
        return {
            "id": "c/1", "kind": "code", "category": "first", "mode": mode, "repeat": 0, "pass": 1,
            "stats": stats, "mean_k": 0.0, "drafters": {}, "same_as_plain": None,
        }  # fmt: skip

    data = {"runs": [run("plain", 10.0), run("spec3", 12.0), run("lookup", 9.0), run("auto", 11.4)]}
    summary = multiturn.summarize(data)
    assert summary["first"]["auto"]["best_fixed"] == "spec3"
    assert summary["first"]["auto"]["vs_best"] == pytest.approx(0.95)
    assert "best_fixed" not in summary["first"]["spec3"]
    lines = multiturn.best_fixed_lines(summary, ["first"])
    assert summary["first"]["auto"]["best_fixed_gen"] == "plain"
    assert summary["first"]["spec3"]["speedup_gen"] == pytest.approx(1 / (1 / 1.2 + 0.4))
    assert lines == [
        "first: auto 1.14x of plain, 0.95x of the best fixed setting (spec3, 1.20x of plain); "
        "on generation time 1.14x, 1.14x of plain (1.00x)"
    ]


def test_recorded_tables_replay_auto_against_every_fixed_setting(tmp_path, capsys) -> None:
    out = tmp_path / "tables.json"
    code = replay_tables.main(["--orders", "1", "--sets", "multi-turn", "--json", str(out)])
    printed = capsys.readouterr().out
    assert code in (0, 1)  # 1: some category misses the bar (printed as such)
    assert "| category | best fixed | its speedup | auto | auto / best fixed | worst order | bar |" in printed
    figures = json.loads(out.read_text())
    # the last three: recorded GPU checks' (an H100's CUDA and Vulkan builds, an H200's CUDA build)
    tables = ("epyc", "xeon", "xeon-later", "xeon-11-28", "gpu", "h100-cuda", "h100-vulkan", "h200-cuda")
    assert set(figures) == {f"multi-turn/{t}" for t in tables}
    for rows in figures.values():
        fixed = rows["all"]["fixed"]
        assert {"plain", "lookup", *(f"spec{n}" for n in range(1, 9))} == set(fixed)
        assert fixed["plain"] == pytest.approx(1.0)
        assert rows["all"]["best"] == max(fixed, key=lambda n: fixed[n])
        assert 0.0 <= rows["exploring_cost"]["all"] < 1.0
    assert figures["multi-turn/epyc"]["exploring_cost"]["all"] == 0.0  # the draft cannot pay there


def test_recorded_tables_replay_a_second_session_from_the_memory_the_first_left(capsys) -> None:
    from bench.gpu_replay import SETS, load_prepared
    from bench.replay import TableCosts, session_memory

    meta, replies = load_prepared(SETS["single-turn"])
    costs = TableCosts(*replay_tables.tables()["xeon"][:2])
    memory = session_memory(replies, costs, int(meta["max_tokens"]))
    # what the engine keeps in its memory file: pooled evidence, model rounds' record, reply lengths
    assert memory["evidence"] and "probes" in memory["model"] and len(memory["lengths"]) == len(replies)
    code = replay_tables.main(["--orders", "1", "--sets", "multi-turn", "--tables", "xeon", "--remember"])
    assert code in (0, 1)
    assert (
        "multi-turn replies (11), after a session over the single-turn replies, xeon costs"
        in capsys.readouterr().out
    )
