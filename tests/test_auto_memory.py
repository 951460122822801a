"""Auto mode's memory: what it learned for a pair on a machine, kept across restarts."""

from __future__ import annotations

import json
import logging
import os

import pytest

from app.engine.auto import LOOKUP_CLASSES, Acceptance, AutoDrafter, AutoMemory, MeasuredCosts
from app.engine.drafting import LookupDrafter
from app.engine.engine import Engine, GenerationSettings, LoadSettings
from app.engine.events import Source

pytestmark = pytest.mark.timeout(120)


def test_saved_state_is_read_back_and_a_bad_file_is_ignored(tmp_path, caplog) -> None:
    memory = AutoMemory(tmp_path, "target.gguf:1 | draft.gguf:2 | cpu | 2 | CPU")
    assert memory.load() is None  # no file yet
    memory.save({"costs": {"ratios": {"4": 1.5}}})
    assert memory.load() == {"costs": {"ratios": {"4": 1.5}}}
    assert AutoMemory(tmp_path, "another pair").load() is None  # another file, by the key's hash
    body = json.loads(memory.path.read_text())
    caplog.set_level(logging.WARNING, logger="tandem.auto")
    for bad, why in (
        ("{not json", "ignored"),
        (json.dumps({**body, "version": 99}), "version 99"),
        (json.dumps({**body, "key": "another machine"}), "belongs to"),
    ):
        memory.path.write_text(bad)
        assert memory.load() is None
        assert why in caplog.text
    memory.path.unlink()
    os.mkfifo(memory.path)  # not a regular file: refused without blocking
    assert memory.load() is None
    assert "not a regular file" in caplog.text
    memory.path.unlink()
    memory.save({"x": 1})  # and replaced at the next save
    assert memory.load() == {"x": 1}


def test_costs_and_acceptance_restore_what_they_saved() -> None:
    costs = MeasuredCosts()
    for batch, seconds in ((1, 0.1), (4, 0.15), (8, 0.3)):
        costs.observe_verify(batch, seconds)
    costs.observe_draft(1, 0.04)
    again = MeasuredCosts()
    again.restore(costs.state())
    again.observe_verify(1, 0.2)  # another session: a slower step, a batch of 4 timed slowly once
    again.observe_verify(4, 2.0)
    assert again.ratio(4) == pytest.approx(1.5)  # one slow timing does not outvote the saved figure
    assert again.ratio(8) == pytest.approx(3.0)
    assert again.draft_step() == pytest.approx(0.4 * 0.2)
    again.restore({"ratios": {"2": "fast", "3": -1.0, "1": 9.0}, "draft": None})  # skipped, not raised

    auto = AutoDrafter(None, LookupDrafter(), costs=costs)
    model = auto.evidence.predicted[Source.MODEL][0]
    model.observe(4, 1, ())
    copy = auto.evidence.pooled(Source.LOOKUP, 2, 1)
    copy.observe(6, 6, ())
    fresh = AutoDrafter(None, LookupDrafter(), costs=costs)
    fresh.restore(json.loads(json.dumps(auto.state())))  # as the file keeps it
    assert fresh.evidence.predicted[Source.MODEL][0].overall() == pytest.approx(model.overall())
    assert fresh.evidence.pooled(Source.LOOKUP, 2, 1).alpha(5) == pytest.approx(copy.alpha(5))
    other = Acceptance(3)
    assert not other.restore(model.state())  # another shape: the prior stays
    # copies saved when they were split by the target's sureness (as "copied") keep their priors
    older = json.loads(json.dumps(auto.state()))
    older["evidence"]["copied"] = older["evidence"].pop("copies")
    before = AutoDrafter(None, LookupDrafter(), costs=costs)
    before.restore(older)
    assert before.evidence.pooled(Source.LOOKUP, 2, 1).alpha(5) == pytest.approx(LOOKUP_CLASSES[2][1][1])
    assert before.evidence.predicted[Source.MODEL][0].overall() == pytest.approx(model.overall())
    fresh.restore({"evidence": {"predicted": {"model": "nonsense"}}, "model": {"overrun": "x"}})


def test_a_second_session_starts_where_the_first_ended(tiny_pair, tmp_path) -> None:
    load = LoadSettings(
        target=str(tiny_pair.target),
        draft=str(tiny_pair.draft),
        n_ctx=512,
        n_threads=1,
        history_dir=str(tmp_path),
    )
    with Engine(load) as eng:
        ids = eng.tokenize("def add(a, b):\n    return a + b\n\ndef add(a, b):")
        eng.run(ids, GenerationSettings(mode="auto", max_tokens=24))
        first = eng._drafter(GenerationSettings(mode="auto"))
        assert first.rounds is not None
        first.rounds.probes = [1.0, 3.0]  # as if three probes had been made, one finding drafting paying
        first.rounds.probe_loss.add(0.02)
        learned = first.state()
        ratios = eng.costs.state()["ratios"]
    files = list(tmp_path.glob("auto-*.json"))
    assert len(files) == 1
    with Engine(load) as eng:
        auto = eng._drafter(GenerationSettings(mode="auto"))
        assert auto.state()["evidence"] == learned["evidence"]  # before any reply
        for key in ("probes", "probe_loss"):  # the probes' record and price
            assert auto.state()["model"][key] == learned["model"][key]
        # what model rounds took over their prediction (where they drafted), within the bounds a restore keeps
        for key in ("overrun", "overrun_low"):  # (and over the lowest costs, which a probe hopes on)
            saved, kept = learned["model"][key], auto.state()["model"][key]
            assert kept == (None if saved is None else pytest.approx(min(4.0, max(0.5, saved))))
        assert set(eng.costs.state()["ratios"]) == set(ratios)
        eng.run(ids, GenerationSettings(mode="auto", max_tokens=24))
        auto.evidence.predicted[Source.MODEL][0].observe(3, 2, ())  # this session learns on...
        after = auto.state()
        assert after["evidence"] != learned["evidence"]
        # ...and the next reply goes on from there (the saved state is read once, not each reply)
        assert eng._drafter(GenerationSettings(mode="auto")).state() == after
    without = LoadSettings(target=str(tiny_pair.target), draft=str(tiny_pair.draft), n_ctx=512)
    with Engine(without) as eng:  # no data folder: nothing kept
        eng.run(ids, GenerationSettings(mode="auto", max_tokens=8))
    assert list(tmp_path.glob("auto-*.json")) == files
