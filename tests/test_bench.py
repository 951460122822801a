"""``tandem bench`` and ``bench.combine`` end to end on the tiny GGUF pair (real llama.cpp)."""

from __future__ import annotations

import argparse
import json
from collections import Counter
from itertools import pairwise

import pytest

from app.engine.auto import LOOKUP_MAX
from bench import combine, first_use
from bench import run as bench_run


def bench_args(tiny_pair, tmp_path, out: str) -> argparse.Namespace:
    prompts = tmp_path / "prompts.jsonl"
    rows = [
        {"id": "p0", "category": "code_edit", "prompt": "one two three one two three one two"},
        {"id": "p1", "category": "chat", "prompt": "The quick brown fox"},
    ]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    p = argparse.ArgumentParser()
    bench_run.add_arguments(p)
    return p.parse_args(
        [
            "--target", str(tiny_pair.target), "--draft", str(tiny_pair.draft),
            "--prompts", str(prompts), "--modes", "plain,spec3,lookup,auto", "--max-tokens", "12",
            "--ctx", "512", "--no-rss", "--out", str(tmp_path / out),
        ]
    )  # fmt: skip


def test_bench_runs_every_mode_and_combine_reports_medians(tiny_pair, tmp_path, capsys) -> None:
    for shift, name in enumerate(("a.json", "b.json")):
        args = bench_args(tiny_pair, tmp_path, name)
        args.shift = shift
        assert bench_run.main(args) == 0
    printed = capsys.readouterr().out
    assert "| category | plain tok/s | spec3 | lookup | auto |" in printed
    data = json.loads((tmp_path / "a.json").read_text())
    assert {r["mode"] for r in data["runs"]} == {"plain", "spec3", "lookup", "auto"}
    assert all(r["same_as_plain"] or r["top2_gap_at_difference"] < 1e-3 for r in data["runs"])
    assert data["summary"]["all"]["plain"]["speedup"] == 1.0
    # over the whole reply too: the prompt's processing (the draft's with the target's) and the decode
    assert "| category | spec3: prompt time, whole reply | lookup: prompt time, whole reply |" in printed
    runs = [r for r in data["runs"] if r["category"] == "chat"]
    t = {
        m: sum(r["stats"]["t_prompt_s"] + r["stats"]["t_decode_s"] for r in runs if r["mode"] == m)
        for m in ("plain", "spec3")
    }
    assert data["summary"]["chat"]["spec3"]["reply_speedup"] == pytest.approx(t["plain"] / t["spec3"])
    # each prompt takes the next row of the balanced orders; a run's shift moves every prompt on a row
    second = json.loads((tmp_path / "b.json").read_text())
    place = {(r["id"], r["mode"]): r["position"] for r in data["runs"]}
    moved = {(r["id"], r["mode"]): r["position"] for r in second["runs"]}
    assert [place[("p0", m)] for m in ("plain", "spec3", "lookup", "auto")] == [0, 1, 3, 2]
    assert [place[("p1", m)] for m in ("plain", "spec3", "lookup", "auto")] == [2, 0, 1, 3]
    assert [moved[("p0", m)] for m in ("plain", "spec3", "lookup", "auto")] == [2, 0, 1, 3]
    assert second["settings"]["shift"] == 1
    ratios = data["settings"]["verify_ratios"]  # the costs auto mode measured, for bench.replay
    assert len(ratios) == LOOKUP_MAX + 1 and ratios[0] == 1.0

    assert combine.main([str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 0
    report = capsys.readouterr().out
    assert "Median over 2 runs" in report
    assert "| code_edit |" in report and "| chat |" in report
    assert "| category | auto | best fixed mode | auto / best |" in report
    assert "code_edit, best of lookup and auto:" in report
    assert "lookup bound" in report
    assert "Median over 2 runs" in report
    assert "Per prompt: each prompt's pair of replies" in report
    assert "The same on generation time" in report


def test_repeats_run_each_prompt_in_another_order(tiny_pair, tmp_path) -> None:
    """With as many prompts as orders of the modes, a repeat still moves every prompt to another order
    (the prompt's place in the run alone would repeat its order: any carry-over would land on the same
    mode in every repeat)."""
    args = bench_args(tiny_pair, tmp_path, "r.json")
    rows = [{"id": f"p{i}", "category": "chat", "prompt": f"The quick brown fox {i}"} for i in range(4)]
    args.prompts.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    args.modes, args.max_tokens, args.repeats = "plain,lookup", 4, 2
    assert bench_run.main(args) == 0
    runs = json.loads((tmp_path / "r.json").read_text())["runs"]
    place = {(r["id"], r["repeat"], r["mode"]): r["position"] for r in runs}
    for i in range(4):
        assert place[(f"p{i}", 0, "plain")] != place[(f"p{i}", 1, "plain")]


def test_sampled_bench_draws_each_prompt_with_one_seed_and_compares_speed_only(tiny_pair, tmp_path) -> None:
    """At a temperature the modes draw from the target's law, not its greedy text: each prompt's modes
    share a seed in a repeat (plain's text is the same run after run), and no reply is held to plain's."""
    texts = []
    for name in ("s1.json", "s2.json"):
        args = bench_args(tiny_pair, tmp_path, name)
        args.temperature, args.modes = 0.9, "plain,lookup,auto"
        assert bench_run.main(args) == 0
        data = json.loads((tmp_path / name).read_text())
        assert data["settings"]["temperature"] == 0.9
        assert data["settings"]["sampling"] == {"top_k": 40, "top_p": 0.95, "min_p": 0.05}
        assert all(r["same_as_plain"] is None for r in data["runs"])
        assert data["summary"]["all"]["plain"]["speedup"] == 1.0
        texts.append({r["id"]: r["tokens"] for r in data["runs"] if r["mode"] == "plain"})
    assert texts[0] == texts[1]
    greedy = bench_args(tiny_pair, tmp_path, "g.json")
    assert greedy.temperature == 0.0 and bench_run.sampling(0.0, seed=3) == {}
    parser = argparse.ArgumentParser()
    bench_run.add_arguments(parser)
    for bad in ("-0.5", "nan", "warm"):
        with pytest.raises(SystemExit):
            parser.parse_args(["--target", "t.gguf", "--temperature", bad])


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6, 7])
def test_balanced_orders_put_every_mode_in_every_place_and_after_every_other_mode(n) -> None:
    """A rotation would always run auto right after lookup; a Williams design spreads any carry-over."""
    rows = [bench_run.balanced_order(list(range(n)), r) for r in range(n if n % 2 == 0 else 2 * n)]
    assert all(sorted(row) == list(range(n)) for row in rows)
    places = Counter((x, j) for row in rows for j, x in enumerate(row))
    assert len(places) == n * n and len(set(places.values())) == 1
    after = Counter((a, b) for row in rows for a, b in pairwise(row))
    assert len(after) == n * (n - 1) and len(set(after.values())) == 1
    assert bench_run.balanced_order(list(range(n)), len(rows)) == rows[0]  # rows repeat


def test_combine_pools_generation_time_charging_the_drafts_prompt_work() -> None:
    """A draft model that evaluates the prompt up front does that work before decode time starts:
    on decode time it looks free, on generation time it is charged."""

    def rec(mode: str, decode: float, draft_prompt: float = 0.0) -> dict:
        stats = {"n_generated": 10, "t_decode_s": decode, "t_draft_prompt_s": draft_prompt}
        return {"id": "a", "category": "extract", "mode": mode, "stats": stats}

    runs = [{"_runs": [rec("plain", 1.0), rec("spec3", 0.8, 0.4), rec("auto", 0.9)]}]
    decode, gen = combine.pooled(runs), combine.pooled(runs, gen=True)
    assert decode["extract"]["spec3"][0] == pytest.approx(1.25)
    assert gen["extract"]["spec3"][0] == pytest.approx(1 / 1.2)
    assert gen["extract"]["auto"][0] == decode["extract"]["auto"][0] == pytest.approx(1 / 0.9)


def test_combine_per_prompt_takes_each_prompts_median_run() -> None:
    """A slowdown that hits one prompt in one run and the other prompt in another run drags both
    runs' category figures down; each prompt's median run does not see it."""

    def rec(pid: str, mode: str, seconds: float) -> dict:
        return {
            "id": pid,
            "category": "chat",
            "mode": mode,
            "stats": {"n_generated": 10, "t_decode_s": seconds},
        }

    def run(slow: str) -> dict:
        recs = []
        for pid in ("a", "b"):
            recs += [rec(pid, "plain", 1.0), rec(pid, "auto", 2.0 if pid == slow else 1.0)]
        return {"_runs": recs}

    table = combine.per_prompt([run("a"), run("b"), run("")])
    assert table["chat"]["auto"] == table["all"]["auto"] == 1.0
    assert table["chat"]["plain"] == 1.0


def test_combine_pools_every_repeat_and_measures_the_noise_where_auto_drafted_nothing() -> None:
    """Two runs of two repeats: each mode against plain in the same repeat, pooled, with the range
    over the four repeats; a mode run only in one run pools that run's repeats alone."""

    def rec(rep: int, mode: str, seconds: float, drafted: int = 0) -> dict:
        stats = {"n_generated": 10, "t_decode_s": seconds, "n_drafted": drafted}
        return {"id": "a", "category": "chat", "mode": mode, "repeat": rep, "stats": stats}

    first = {
        "_runs": [rec(0, "plain", 1.0), rec(0, "auto", 1.0), rec(1, "plain", 1.0), rec(1, "auto", 0.5, 4)]
    }
    first["_runs"] += [rec(0, "spec3", 2.0), rec(1, "spec3", 2.0)]
    second = {"_runs": [rec(0, "plain", 2.0), rec(0, "auto", 2.5), rec(1, "plain", 1.0), rec(1, "auto", 0.8)]}
    table = combine.pooled([first, second])
    speedup, low, high = table["chat"]["auto"]
    assert speedup == pytest.approx(5.0 / 4.8) and (low, high) == (pytest.approx(0.8), pytest.approx(2.0))
    assert table["all"]["auto"] == table["chat"]["auto"]
    assert table["chat"]["spec3"] == (
        pytest.approx(0.5),
        pytest.approx(0.5),
        pytest.approx(0.5),
    )  # first run only
    # auto drafted nothing in three replies: 1.0x, 0.8x and 1.25x of plain in the same repeat
    assert sorted(combine.undrafted([first, second])) == [pytest.approx(0.8), 1.0, pytest.approx(1.25)]


def test_combine_adds_runs_of_some_categories_to_their_medians_only(tmp_path, capsys) -> None:
    """A run with ``--categories`` counts for its categories, not for the others nor for "all"."""

    def rec(pid: str, cat: str, mode: str, seconds: float) -> dict:
        stats = {
            "n_generated": 10, "t_decode_s": seconds, "t_llama_s": seconds, "n_drafted": 0,
            "n_accepted": 0, "rounds_drafted": 0,
        }  # fmt: skip
        return {"id": pid, "category": cat, "mode": mode, "stats": stats, "mean_k": 0.0, "same_as_plain": 1}

    def write(name: str, cats: dict[str, float]) -> str:
        runs = [r for cat, t in cats.items() for r in (rec(cat, cat, "plain", 1.0), rec(cat, cat, "auto", t))]
        (tmp_path / name).write_text(json.dumps({"runs": runs}), encoding="utf-8")
        return str(tmp_path / name)

    full = [write(f"{i}.json", {"chat": 1.0, "code": 0.5}) for i in range(2)]  # auto 1.0x and 2.0x
    part = [write(f"p{i}.json", {"chat": 2.0}) for i in range(3)]  # auto 0.5x on chat
    assert combine.main(full + part) == 0
    report = capsys.readouterr().out
    assert "Median over 5 runs" in report and "Runs per category where fewer: code 2, all 2." in report
    assert "| chat | 10.00 | 0.50x (0.50-1.00) |" in report  # five runs
    assert "| code | 10.00 | 2.00x (2.00-2.00) |" in report  # two
    assert "| all | 10.00 | 1.33x (1.33-1.33) |" in report  # the two full runs only


def test_peak_rss_of_a_child_does_not_count_its_parent() -> None:
    """Linux keeps a forked parent's peak in the child's ru_maxrss across exec; VmHWM does not."""
    import subprocess
    import sys
    from pathlib import Path

    big = bytearray(400 * 2**20)
    big[::4096] = b"\x01" * len(big[::4096])  # touch every page
    code = "from bench.rss import peak_rss_mb; print(peak_rss_mb())"
    repo = Path(bench_run.__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=repo, check=True)
    assert float(out.stdout) < 200, out.stdout
    del big


def test_combine_answers_bad_input_with_one_line(tmp_path) -> None:
    import pytest

    (tmp_path / "x.json").write_text('{"a": 1}', encoding="utf-8")
    for name, says in (("missing.json", "cannot read"), ("x.json", "not a file written by tandem bench")):
        with pytest.raises(SystemExit, match=says):
            combine.main([str(tmp_path / name)])


def test_lookup_bound_drafts_as_far_as_auto_modes_lookup_may() -> None:
    """The bound copies as far as the target accepts, up to auto mode's lookup cap (not n_max)."""
    source = list(range(100, 100 + 2 + 3 * (LOOKUP_MAX + 1)))
    prompt, reply = [1, 2, *source, 3], source

    def cheap(b: int) -> float:  # a GPU: each extra batch token costs a tenth of a step
        return 1 + 0.1 * (b - 1)

    n, cost = bench_run.lookup_bound(prompt, reply, cheap)
    n8, cost8 = bench_run.lookup_bound(prompt, reply, cheap, n_max=8)
    assert n == n8 == len(reply) - 1  # the first token comes with the prompt's batch
    assert cost < cost8  # rounds of LOOKUP_MAX + 1 tokens against rounds of 9
    # after the first token, one plain step until "100 101" matches the prompt, then three rounds of
    # the whole cap
    assert cost == pytest.approx(1 + 3 * cheap(LOOKUP_MAX + 1))


def test_replay_models_auto_modes_lookup_policy_on_recorded_replies() -> None:
    """A reply that copies its prompt: the replayed policy drafts, and no policy beats the bound."""
    from bench.replay import Reply, TableCosts, replay_auto, replay_bound

    source = list(range(100, 180))
    copy = Reply("c", "code_edit", [1, 2, *source, 3], source[:60], [1.0] * 60)
    prose = Reply("p", "chat", [1, 2, 3, 4], list(range(500, 560)), [0.5] * 60)  # nothing to copy
    costs = TableCosts([1.0, 1.55, 2.02, 2.05, 2.65, 3.0, 3.63, 4.39, 4.86])
    assert costs.ratio(4) == 2.05 and costs.ratio(11) == pytest.approx(4.86 + 2 * 3.86 / 8)
    auto = replay_auto([copy, prose], costs, max_tokens=96)
    bound = replay_bound([copy, prose], costs)
    n, cost = auto["code_edit"]
    # the tokens after the first, which comes with the prompt's batch
    assert n == 59 and 1.3 < n / cost <= bound["code_edit"][0] / bound["code_edit"][1]
    assert auto["chat"] == (59, 59.0)  # plain decoding: one step per token
    assert replay_auto([copy, prose], costs, max_tokens=96) == auto  # deterministic


def test_replay_models_the_draft_model_from_its_predictions_along_the_reply() -> None:
    """A draft model that predicts the reply pays at every fixed length and auto mode drafts with it;
    one that never does makes fixed drafting lose and auto mode stays at plain decoding's speed."""
    from bench.replay import ReplayDraft, Reply, TableCosts, replay_auto, replay_auto_replies, replay_fixed

    tokens = list(range(500, 590))
    right = Reply("r", "math", [1, 2, 3, 4], tokens, [0.999] * 90, tuple(tokens), (0.99,) * 90)
    wrong = Reply("w", "chat", [1, 2, 3, 5], tokens, [0.4] * 90, tuple(t + 1 for t in tokens), (0.6,) * 90)
    verify = [1.0, 1.15, 1.3, 1.45, 1.6, 1.75, 1.9, 2.05, 2.2]
    costs = TableCosts(verify, [0.2, 0.25, 0.3, 0.35])
    assert costs.draft_batch(6) == pytest.approx(0.35 + 2 * 0.15 / 3)  # past the table: its mean slope
    for k in (3, 5):
        fixed, per = replay_fixed([right, wrong], costs, k, max_tokens=96)
        assert per["r"] > 1.5 and per["w"] < 0.8
        n, cost = fixed["math"]
        # every full round drafts k tokens, all accepted, plus the target's own: a catch-up of 2 tokens,
        # k - 1 draft steps, the draft's Python per token, and a batch of k + 1
        full = 90 // (k + 1) - 1  # the first catches up 1 token, the last is short
        assert n == 89 and cost > full * (0.25 + (k - 1) * 0.2 + verify[k])  # (the first with the prompt)
    auto, per = replay_auto_replies([wrong, right], costs, max_tokens=96, model=True)
    assert per["r"] > 1.5  # learned from its own rounds in this reply
    assert per["w"] > 0.9  # where the draft is always wrong, it stops drafting
    assert replay_auto([wrong, right], costs, max_tokens=96, model=True) == auto  # deterministic
    draft = ReplayDraft(costs)
    draft.start(right)
    draft.begin(right.prompt)
    assert draft.pending([*right.prompt, *tokens[:5]]) == 6  # five decoded without it, and the prompt's last
    with pytest.raises(ValueError, match="no draft model predictions"):
        draft.start(Reply("x", "chat", [1], tokens, [0.5] * 90))


def test_replay_charges_the_draft_model_the_prompt_it_evaluates() -> None:
    """Up front (a fixed setting, or auto mode while the draft drafts in most replies) or caught up
    when it drafts: the draft's prompt processing is part of what drafting costs a reply (the
    target's is the same in every mode, and left out)."""
    from bench.replay import Reply, TableCosts, replay_fixed

    tokens = list(range(500, 520))
    costs = TableCosts([1.0, 1.15, 1.3, 1.45], [0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55])
    short = Reply("s", "math", [1, 2], tokens, [0.999] * 20, tuple(tokens), (0.99,) * 20)
    long = Reply("l", "math", list(range(1, 9)), tokens, [0.999] * 20, tuple(tokens), (0.99,) * 20)
    (_, a), (_, b) = (replay_fixed([r], costs, 1, max_tokens=96)[0]["math"] for r in (short, long))
    # a prompt of 2 evaluates 1 token up front, one of 8 evaluates 7: a batch of 7 for the draft
    assert b - a == pytest.approx(0.5 - 0.2)


def test_replay_charges_a_draft_cut_to_nothing_and_learns_from_its_token() -> None:
    """A draft made and then not verified (too unsure to be worth a batch) cost its drafting, as it
    does live; its cut token is judged by the reply, so a draft whose doubts are unfounded is
    learned to be right and drafts on."""
    from bench.replay import Reply, TableCosts, replay_auto_replies

    tokens = list(range(500, 590))
    costs = TableCosts([1.0, 1.45, 1.8, 2.1, 2.4], [0.4, 0.45, 0.5])
    wrong = Reply("w", "chat", [1, 2, 3, 4], tokens, [0.999] * 90, tuple(t + 1 for t in tokens), (0.05,) * 90)
    right = Reply("r", "chat", [1, 2, 3, 4], tokens, [0.999] * 90, tuple(tokens), (0.05,) * 90)
    _, per = replay_auto_replies([wrong], costs, max_tokens=96, model=True)
    assert 0.95 < per["w"] < 1.0  # cut at once, charged, and then left alone
    _, per = replay_auto_replies([right], costs, max_tokens=96, model=True)
    assert per["r"] > 1.1


def test_replay_reads_a_bench_run_and_prints_its_table(tiny_pair, tmp_path, capsys) -> None:
    from bench import replay

    args = bench_args(tiny_pair, tmp_path, "run.json")
    assert bench_run.main(args) == 0
    capsys.readouterr()
    ratios = "1,1.5,1.9,2.1"
    assert replay.main([str(tmp_path / "run.json"), "--ratios", ratios, "--no-draft"]) == 0
    first = capsys.readouterr().out
    assert "| category | auto (lookup) | lookup bound |" in first and "| all |" in first
    assert f"--ratios {ratios}" in first
    assert replay.main([str(tmp_path / "run.json"), "--ratios", ratios, "--no-draft"]) == 0
    assert capsys.readouterr().out == first  # the same replies and costs: the same figures
    # with the run's draft model: its costs measured now, then given
    assert replay.main([str(tmp_path / "run.json"), "--ratios", ratios, "--orders", "2"]) == 0
    printed = capsys.readouterr().out
    assert "| category | auto (lookup) | auto | spec3 | spec5 | lookup bound | spec3 (measured) |" in printed
    assert "in 2 orders" in printed
    draft_ratios = printed.split("--draft-ratios ")[1].split()[0].split(",")
    assert len(draft_ratios) == 32 and all(float(x) > 0 for x in draft_ratios)
    given = [str(tmp_path / "run.json"), "--ratios", ratios, "--draft-ratios", "0.3,0.35,0.4"]
    assert replay.main(given) == 0
    again = capsys.readouterr().out
    assert replay.main(given) == 0
    assert capsys.readouterr().out == again
    with pytest.raises(SystemExit, match="cannot read"):
        replay.main([str(tmp_path / "missing.json")])
    with pytest.raises(SystemExit, match="numbers separated by commas"):
        replay.main([str(tmp_path / "run.json"), "--draft-ratios", "0.3,fast"])
    with pytest.raises(SystemExit, match="starts with a batch of 1"):
        replay.main([str(tmp_path / "run.json"), "--ratios", "2,3"])


def test_first_use_times_each_batch_size_first_and_later(tiny_pair, tmp_path, capsys) -> None:
    """``bench.first_use`` reads what a warm-up that times a size once would, beside later timings."""
    out = tmp_path / "first-use.json"
    assert first_use.main([str(tiny_pair.target), "--repeats", "1", "--out", str(out)]) == 0
    result = json.loads(out.read_text(encoding="utf-8"))
    assert result["sizes"] == list(first_use.SIZES) and result["backend"] == "CPU"
    assert len(result["first"]) == len(result["later"]) == len(first_use.SIZES)
    assert all(x > 0 for x in result["first"] + result["later"])
    assert "batch  64: first" in capsys.readouterr().out


def test_replay_calibration_tallies_what_auto_expected_against_what_its_rounds_delivered(capsys) -> None:
    """A draft that is always right: auto drafts with it, and every drafted round is tallied with the
    speedup it expected and the tokens it delivered (all it drafted, and the target's own)."""
    from bench import replay_calibration
    from bench.replay import Reply, TableCosts

    tokens = list(range(500, 590))
    right = Reply("r", "math", [1, 2, 3, 4], tokens, [0.999] * 90, tuple(tokens), (0.99,) * 90)
    costs = TableCosts([1.0, 1.15, 1.3, 1.45, 1.6, 1.75, 1.9, 2.05, 2.2], [0.2, 0.25, 0.3, 0.35])
    cal = replay_calibration.calibrate([([right], 96)], costs, n_orders=1)
    model = cal.all["model"]
    assert model.rounds > 5 and model.tokens / model.steps > 1.5 and model.expected / model.steps > 1.0
    assert cal.margin.get("model", replay_calibration.Tally()).rounds < model.rounds
    assert replay_calibration.main(["--tables", "epyc", "--orders", "1"]) == 0
    out = capsys.readouterr().out
    assert "| epyc | lookup |" in out and "| table | source |" in out
