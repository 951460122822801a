"""The GPU check's walk pair (bench.gpu_models.write_walk_models), loaded by the real llama.cpp: a target
that writes a known walk through the vocabulary and drafts right at a chosen rate per token, and the
acceptance step that holds auto mode to every fixed setting with them."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.engine import GenerationSettings, LoadSettings
from app.engine.engine import Engine
from app.engine.events import Finished
from bench import gpu_check
from bench.gpu_engine import TRACE_FIELDS, run_acceptance
from bench.gpu_models import TINY_TARGET_SHAPE, walk_next, write_walk_models

PROMPT = [5, 17, 99, 300]


@pytest.fixture(scope="module")
def walk(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return write_walk_models(tmp_path_factory.mktemp("walk"), "tiny", acceptance=(1.0, 0.5))


def reply(engine: Engine, **settings: object) -> Finished:
    fin = [e for e in engine.generate(PROMPT, GenerationSettings(max_tokens=96, **settings))]
    return next(e for e in fin if isinstance(e, Finished))


def test_the_walk_never_repeats_and_never_reaches_a_control_token() -> None:
    nxt = walk_next(TINY_TARGET_SHAPE["n_vocab"])
    t, seen = 300, []
    for _ in range(2000):
        t = int(nxt[t])
        seen.append(t)
    assert len(set(seen)) == len(seen)
    assert not {506, 507, 508} & set(seen)  # the tiny tokenizer's control tokens


def test_the_target_writes_the_walk_and_each_draft_is_right_at_its_rate(walk: dict) -> None:
    nxt = walk_next(TINY_TARGET_SHAPE["n_vocab"])
    expected = [int(nxt[PROMPT[-1]])]
    while len(expected) < 96:
        expected.append(int(nxt[expected[-1]]))
    right = {q: d["right"] for q, d in walk["drafts"].items()}
    assert right["1.0"] == 1.0 and 0.45 < right["0.5"] < 0.55
    for q, draft in walk["drafts"].items():
        with Engine(LoadSettings(walk["target"]["path"], draft["path"], n_ctx=512, n_threads=1)) as engine:
            assert list(reply(engine, mode="plain").tokens) == expected
            spec = reply(engine, mode="speculative", n_max=1, adaptive=False)
            assert list(spec.tokens) == expected
            if q == "1.0":
                assert spec.stats.n_accepted == spec.stats.n_drafted > 40  # every draft right
            else:  # each token's draft right with chance 0.5: about half accepted
                assert 0.3 < spec.stats.n_accepted / spec.stats.n_drafted < 0.7


def test_acceptance_step_holds_auto_to_the_fixed_settings(walk: dict, tmp_path: Path) -> None:
    seen: list[list[str]] = []
    a = run_acceptance(
        walk, modes="plain,spec2,auto", max_tokens=24, repeats=2, n_ctx=512, allow_cpu=True, threads=1,
        trace=True, on_pair=lambda partial: seen.append([q for q in partial if q in ("1.0", "0.5")]),
    )  # fmt: skip
    assert seen == [["1.0"], ["1.0", "0.5"]]  # each pair's result as it ends
    for q in ("1.0", "0.5"):
        x = a[q]
        assert x["same_as_plain"]
        assert x["queued_wasted"]["plain"] == [(0, 0), (0, 0)]  # a CPU queues nothing
        assert x["auto_costs"] and x["auto_costs"]["ratios"]
        assert x["loaded_costs"]["ratios"] and x["loaded_costs"]["draft"] > 0  # read from the engine at load
        assert set(x["auto_learned"]) >= {"overrun", "overrun_low", "probes", "probe_loss"}
        traced = x["trace"]["spec2"]
        assert len(traced) == 2 and all(len(row) == len(TRACE_FIELDS) for rows in traced for row in rows)
        assert sum(len(rows) for rows in traced) == sum(r[1] for r in x["rounds_drafted"]["spec2"])
        began = [row[TRACE_FIELDS.index("began_ms")] for row in traced[0]]
        assert began[0] == 0.0 and began == sorted(began)
        assert [len(v) for v in x["tokens_per_second"].values()] == [2, 2, 2]
        assert x["best_fixed"] in ("plain", "spec2") and len(x["auto_over_best"]) == 2
        assert [rounds for rounds, *_ in x["rounds_drafted"]["spec2"]] and x["spec1_acceptance"] is None
    lines = gpu_check.summary_lines({"acceptance": a})
    at = next(i for i, line in enumerate(lines) if line.startswith("acceptance"))
    assert "draft right 100% per token" in lines[at + 1] and "draft right 50% per token" in lines[at + 3]
    assert "of the best" in lines[at + 3] and "same as plain: True" in lines[at + 3]
    for i in (at + 2, at + 4):  # each acceptance's line is followed by what auto did per repeat
        assert lines[i].strip().startswith("auto per repeat: rounds drafted") and "probes" in lines[i]


def test_bad_settings_are_refused_before_anything_is_written_or_loaded(tmp_path: Path, walk: dict) -> None:
    with pytest.raises(ValueError, match="acceptance"):
        write_walk_models(tmp_path, "tiny", acceptance=(0.5, 1.5))
    with pytest.raises(ValueError, match="plain, auto and a fixed drafting setting"):
        run_acceptance(walk, modes="plain,auto", allow_cpu=True)
    assert not list(tmp_path.iterdir())
