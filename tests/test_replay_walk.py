"""The GPU check's acceptance step replayed with the costs recorded live (``bench.replay_walk``)."""

from __future__ import annotations

import json

import pytest

from bench.replay import STEP, TableCosts, replay_fixed
from bench.replay_walk import RECORDED, LiveCosts, loaded_costs, main, replay_record, walk_reply


@pytest.mark.parametrize("q", [0.5, 0.9])
def test_the_walk_reply_is_the_acceptance_steps_and_its_draft_right_at_the_rate(q: float) -> None:
    reply = walk_reply(q, max_tokens=256)
    assert len(reply.prompt) == 200 and len(reply.tokens) == len(reply.draft) == 256
    assert len(set(reply.tokens)) == 256  # the walk never repeats: nothing to copy
    right = sum(d == t for d, t in zip(reply.draft, reply.tokens, strict=True)) / 256
    assert abs(right - q) < 0.06
    assert walk_reply(q, max_tokens=256) == reply


def test_live_costs_charge_what_a_gpu_adds_to_switching_between_plain_and_drafted_rounds() -> None:
    costs = LiveCosts([1.0, 1.1], [0.7, 0.9], overhead=0.03, wasted=1.0, cold=1.1, restart=0.6)
    in_batch, elsewhere = costs.switch(False, True)  # drafts after a queued plain round
    assert in_batch > 0 and in_batch + elsewhere == pytest.approx(2.1)
    assert costs.switch(True, True) == (0.0, 0.0)  # a run of drafted rounds
    assert costs.switch(True, False) == (0.0, 0.6)  # the first plain round after them
    assert costs.switch(False, False) == (0.0, 0.03)  # auto's plain rounds against plain's
    plain = TableCosts([1.0, 1.1], [0.7, 0.9])
    reply = walk_reply(0.9, max_tokens=64)
    n, steps = replay_fixed([reply], costs, 1, 64)[0]["walk"]
    n_plain, steps_plain = replay_fixed([reply], plain, 1, 64)[0]["walk"]
    # every round drafts but the last (no room left): it alone pays, as the first plain one after them
    assert n == n_plain and steps == pytest.approx(steps_plain + 0.6)


def test_the_engines_costs_at_load_seed_auto_when_recorded() -> None:
    table = TableCosts([1.0, 1.1, 1.2], [0.7, 0.9])
    assert loaded_costs(table).verify(2) == pytest.approx(1.1 * STEP)
    saved = loaded_costs(table, {"ratios": {"2": 1.5}, "draft": 0.4})
    assert saved.verify(2) == pytest.approx(1.5 * STEP) and saved.draft_step() == pytest.approx(0.4 * STEP)


def test_the_recorded_runs_replay_beside_what_was_measured(capsys: pytest.CaptureFixture[str]) -> None:
    record = json.loads((RECORDED / "gpu-acceptance-2026-11-27.json").read_text(encoding="utf-8"))
    out = replay_record(record["h200, after (3 modes, traced)"])
    assert set(out) == {"0.5", "0.75", "0.9"}
    for r in out.values():
        assert len(r["live"]["auto"]) == len(r["replayed"]["auto"]) == 3
        assert all(0.3 < x["auto"] < 1.5 for x in r["replayed"]["auto"])
        assert 0.3 < r["replayed"]["spec1"] < 1.5
    assert main(["--run", "h200, after (3 modes, traced)"]) == 0
    assert "| 90% |" in capsys.readouterr().out
