"""``bench.agent``: the project's tools and test sandbox, the step kinds, and the whole loop on a tiny real
model with a real template (Qwen 2.5's, whose tools it renders) through ``tandem serve`` subprocesses:
plain and auto mode asked the same steps (the calls forced by ``tool_choice``, since a tiny model does
not choose tools sensibly), the same replies, the history kept across the restart, and the report."""

from __future__ import annotations

import argparse
import json

import pytest
from tool_server import write_variant

from bench import agent
from bench.agent_project import FILES, STATS, Project, Task, repeated_share, step_kind, tool_schemas

pytestmark = pytest.mark.timeout(120)


def test_tools_read_write_and_refuse() -> None:
    p = Project()
    assert p.call("list_files", "{}").splitlines() == sorted(FILES)
    assert json.loads(p.call("read_file", '{"path": "shop/stats.py"}')) == {
        "path": "shop/stats.py",
        "content": STATS,
    }
    assert p.call("read_file", '{"path": "nope.py"}') == "error: no such file: nope.py"
    assert p.call("read_file", "{not json").startswith("error: the arguments are not JSON")
    assert (
        p.call("write_file", '{"path": "../x.py", "content": ""}') == "error: ../x.py is outside the project"
    )
    assert p.call("write_file", '{"path": "a.py"}').startswith("error: write_file needs")
    assert p.call("delete", "{}") == "error: no tool named delete"
    assert p.call("write_file", json.dumps({"path": "a.py", "content": "x = 1\n"})) == "wrote a.py (1 lines)"
    assert p.files["a.py"] == "x = 1\n" and "a.py" not in FILES  # the project's own copy
    names = [t["function"]["name"] for t in tool_schemas(list(FILES))]
    assert names == ["list_files", "read_file", "write_file", "run_tests", "finish"]
    assert p.call("finish", '{"summary": "x"}') == "done"


def test_tests_run_in_a_sandbox_and_read_the_same_each_time() -> None:
    p = Project()
    failed = p.call("run_tests", "{}")
    assert failed.startswith("tests failed") and "test_median_even" in failed
    assert failed == p.call("run_tests", "{}")  # no temporary path, no duration
    assert "/tmp" not in failed
    fixed = STATS.replace("ordered[middle + 1]", "ordered[middle - 1]")
    p.call("write_file", json.dumps({"path": "shop/stats.py", "content": fixed}))
    assert p.call("run_tests", "{}").startswith("tests passed")
    p.call("write_file", json.dumps({"path": "tests/test_loop.py", "content": "while True:\n    pass\n"}))
    agent_project = __import__("bench.agent_project", fromlist=["TEST_TIMEOUT_S"])
    old = agent_project.TEST_TIMEOUT_S
    agent_project.TEST_TIMEOUT_S = 2.0
    try:
        assert p.call("run_tests", "{}") == "error: the tests ran over 2 s"
    finally:
        agent_project.TEST_TIMEOUT_S = old


def test_step_kinds() -> None:
    fixed = STATS.replace("ordered[middle + 1]", "ordered[middle - 1]")
    write = ("write_file", json.dumps({"path": "shop/stats.py", "content": fixed}))
    assert repeated_share(STATS, fixed) > 0.95
    assert step_kind([write], FILES) == "rewrite"
    assert step_kind([("read_file", '{"path": "shop/stats.py"}'), write], FILES) == "rewrite"
    new = ("write_file", json.dumps({"path": "shop/stats.py", "content": "print('all new')\n"}))
    assert step_kind([new], FILES) == "call"
    part = ("write_file", json.dumps({"path": "shop/stats.py", "content": STATS[:200]}))
    assert step_kind([part], FILES) == "call"  # a fragment of the file is not a rewrite
    assert step_kind([("write_file", json.dumps({"path": "new.py", "content": fixed}))], FILES) == "call"
    assert step_kind([("run_tests", "{}")], FILES) == "call"
    assert step_kind([], FILES) == "answer"


def test_the_loop_on_servers_interleaves_restarts_and_reports(tiny_pair, tmp_path, capsys) -> None:
    target = write_variant(tmp_path, "qwen25")
    args = argparse.Namespace(
        target=target,
        draft=tiny_pair.draft,
        modes="auto,plain,spec2",
        ctx=8192,
        threads=1,
        repeats=1,
        max_steps=4,
        max_tokens=96,
        no_second_pass=False,
    )
    # calls without a choice in their arguments: a random tiny model's choice between two paths can be a
    # near tie, which auto mode's batches of another shape may break the other way (seen once, pass 2)
    task = Task("forced", "Run the tests, then list the files.", forced=("run_tests", "list_files", "none"))
    data = agent.run(args, (task,))
    meta, steps = data["meta"], data["steps"]
    assert meta["modes"] == ["plain", "auto", "spec2"] and meta["passes"] == 2
    assert [(s["pass"], s["step"], s["calls"]) for s in steps] == [
        (p, i, c) for p in (1, 2) for i, c in enumerate((["run_tests"], ["list_files"], []))
    ]
    assert all(s["same"] for s in steps)  # greedy and lossless: auto writes plain's replies
    assert [s["kind"] for s in steps[:3]] == ["call", "call", "answer"]
    for s in steps:
        for r in s["replies"].values():
            assert r["tokens"] > 0 and r["decode_s"] > 0 and r["wall_s"] > 0
        assert s["replies"]["plain"]["drafted"] == 0 and s["replies"]["spec2"]["drafted"] > 0
    # auto mode keeps its history in its own data folder, kept across the restart and grown by pass 2
    hist = {(h["pass"], h["mode"]): h["files"] for h in meta["history"]}
    assert set(hist) == {(1, "auto"), (2, "auto")}
    ((name, size1),) = [(n, s) for n, s in hist[1, "auto"].items() if n.endswith(".bin")]
    assert hist[2, "auto"][name] > size1
    summary = agent.summarize(data)
    assert set(summary) == {"pass 1", "pass 2"}
    assert set(summary["pass 1"]) == {"other", "all"}  # no rewrite here
    row = summary["pass 1"]["all"]["plain"]
    assert row["steps"] == 3 and row["ratio"] == 1.0 and row["ratio_min"] == row["ratio_max"] == 1.0
    assert summary["pass 2"]["all"]["auto"]["differs"] == 0
    # auto held to the best fixed setting of the run (plain or the draft model at 2 tokens a round)
    auto = summary["pass 1"]["all"]["auto"]
    best = summary["pass 1"]["all"][auto["best_fixed"]]
    assert (
        auto["best_fixed"] in ("plain", "spec2")
        and best["tok_s"] >= summary["pass 1"]["all"]["plain"]["tok_s"]
    )
    assert auto["vs_best"] == round(auto["tok_s"] / best["tok_s"], 3)
    # on generation time too: spec2's draft evaluated each prompt up front, which the server reports
    assert all(s["replies"]["spec2"]["draft_prompt_s"] > 0 for s in data["steps"])
    assert all(s["replies"]["plain"]["draft_prompt_s"] == 0 for s in data["steps"])
    spec2 = summary["pass 1"]["all"]["spec2"]
    assert spec2["tok_s_gen"] < spec2["tok_s"]
    gen_best = summary["pass 1"]["all"][auto["best_fixed_gen"]]
    assert auto["vs_best_gen"] == round(auto["tok_s_gen"] / gen_best["tok_s_gen"], 3)
    assert "best_fixed" not in summary["pass 1"]["all"]["spec2"]
    table = agent.markdown(summary, meta["modes"])
    assert "| pass 1 | other (3) | auto |" in table and "| pass 2 | all (3) | plain |" in table
    assert f"| pass 1 | all | auto | {best['ratio']:.2f}x ({auto['best_fixed']}) |" in table
    assert "step 1: call ['list_files']" in capsys.readouterr().err
