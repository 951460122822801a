"""Auto mode: the draft-length choice from a cost model, and losslessness on real tiny models."""

from __future__ import annotations

import json

import pytest

from app.engine.auto import (
    LOOKUP_CLASSES,
    LOOKUP_MAX,
    MODEL_CLASSES,
    REPLY_MIN,
    Acceptance,
    AutoDrafter,
    MeasuredCosts,
    best_length,
    lookup_class,
    model_class,
)
from app.engine.auto.copies import CopyRounds
from app.engine.auto.evidence import PLAIN
from app.engine.auto.planner import continue_rule
from app.engine.drafting import EMPTY, LookupDrafter, Outcome, Proposal, common_prefix
from app.engine.engine import Engine, GenerationSettings, LoadSettings
from app.engine.events import Action, Declined, Policy, Source, Step


class SyntheticCosts:
    """A fixed cost model: verify(b) = base + slope * (b - 1); draft = draft seconds per token."""

    def __init__(self, base: float, slope: float, draft: float):
        self.base, self.slope, self.draft = base, slope, draft

    def verify(self, batch: int) -> float:
        return self.base + self.slope * (batch - 1)

    def draft_step(self) -> float:
        return self.draft

    def observe_verify(self, batch: int, seconds: float) -> None:
        pass

    def observe_draft(self, n_tokens: int, seconds: float) -> None:
        pass


GPU_LIKE = SyntheticCosts(base=0.010, slope=0.0002, draft=0.0005)  # verify is nearly free per token
CPU_LIKE = SyntheticCosts(base=0.100, slope=0.033, draft=0.050)  # batch of 4 costs 2x; draft is half
EXPENSIVE = SyntheticCosts(base=0.100, slope=0.100, draft=0.050)  # verifying b tokens costs b steps


def test_cheap_verify_drafts_long() -> None:
    acc = Acceptance(8, prior=0.9, weight=1e6)  # 90% per token, held fixed
    assert best_length(acc, GPU_LIKE, GPU_LIKE.draft_step(), 8, 0.03).k == 8
    assert best_length(acc, GPU_LIKE, GPU_LIKE.draft_step(), 3, 0.03).k == 3  # never past the limit


def test_expensive_verify_does_not_draft() -> None:
    acc = Acceptance(8, prior=0.8, weight=1e6)
    assert best_length(acc, EXPENSIVE, EXPENSIVE.draft_step(), 8, 0.03).k == 0


def test_cpu_like_costs_draft_only_with_high_acceptance_and_short() -> None:
    high = Acceptance(8, prior=0.95, weight=1e6)
    low = Acceptance(8, prior=0.6, weight=1e6)
    free_draft = 0.0  # prompt lookup costs nothing to draft
    assert best_length(low, CPU_LIKE, CPU_LIKE.draft_step(), 8, 0.03).k == 0
    k_high = best_length(high, CPU_LIKE, CPU_LIKE.draft_step(), 8, 0.03).k
    assert 1 <= k_high <= 8
    assert best_length(low, CPU_LIKE, free_draft, 8, 0.03).k >= 1


def test_measured_costs_interpolate_and_resist_spikes() -> None:
    costs = MeasuredCosts()
    assert costs.verify(1) is None
    for t in (0.10, 0.10, 0.11, 5.0, 0.10):  # one spike from a busy machine
        costs.observe_verify(1, t)
    assert costs.verify(1) == pytest.approx(0.10)
    assert costs.verify(4) == pytest.approx(0.10 * (1 + 3 * costs.prior_slope) / 1)
    for t in (0.2, 0.2, 0.2):
        costs.observe_verify(4, t)
    assert costs.verify(4) == pytest.approx(0.2)
    assert costs.verify(7) == pytest.approx(0.3, rel=0.05)  # the line through (1, 0.1) and (4, 0.2)


def test_measured_costs_follow_a_machine_that_slows_down() -> None:
    """Batch costs are kept relative to one step measured at about the same time."""
    costs = MeasuredCosts(window=5)
    for _ in range(5):
        costs.observe_verify(1, 0.10)
    for b, r in ((2, 1.5), (3, 2.1), (4, 2.1), (6, 3.0)):  # not a straight line: kernels change
        costs.observe_verify(b, 0.10 * r)
    costs.observe_draft(1, 0.05)
    assert costs.verify(3) == pytest.approx(0.21)
    assert costs.verify(5) == pytest.approx(0.10 * 2.55)  # between the measured 4 and 6
    assert costs.verify(8) == pytest.approx(0.10 * (3.0 + 2 * (3.0 - 1) / 5))  # 6's mean slope goes on
    for _ in range(5):  # the machine gets busy: every step now takes 50% longer
        costs.observe_verify(1, 0.15)
    assert costs.verify(4) == pytest.approx(0.15 * 2.1)  # the batches follow without new samples
    assert costs.draft_step() == pytest.approx(0.075)


def test_measured_costs_recover_from_steps_timed_beside_another_program() -> None:
    """Steps timed while another program loaded beside this one (tens of times slower) must not
    make every batch look cheaper than one step: a batch timed faster than every recent step drops
    those steps until one is timed again, and a batch costs at least one step."""
    costs = MeasuredCosts()
    for _ in range(9):  # steps on a busy machine
        costs.observe_verify(1, 4.0)
    for b, t in ((2, 0.15), (16, 0.49), (64, 1.44)):  # batches once it was quiet
        costs.observe_verify(b, t)
    assert costs.verify(1) is None  # the step is timed again (auto mode's next round is plain)
    costs.observe_verify(1, 0.1)
    assert costs.verify(1) == pytest.approx(0.1)
    assert [costs.ratio(b) for b in (2, 16, 64)] == pytest.approx([1.5, 4.9, 14.4])
    costs.restore({"ratios": {"3": 0.106, "32": 0.2}})  # figures saved by a session that had it wrong
    assert costs.ratio(3) >= 1.0 and costs.ratio(32) >= 1.0


def test_load_timings_are_taken_relative_to_the_steps_beside_them() -> None:
    """Another program stopping while the batch sizes are timed at load (every timing tens of times
    faster from then on) leaves each batch's cost in steps as it was."""
    from app.engine.loading import relative_to_neighbours

    busy, quiet = 4.0, 0.1
    timed = [(1, busy), (2, 1.5 * busy), (4, 1.9 * busy), (1, busy), (1, quiet), (16, 4.9 * quiet)]
    timed += [(64, 14.4 * quiet), (1, quiet)]
    costs = MeasuredCosts()
    for batch, seconds in relative_to_neighbours(timed):
        costs.observe_verify(batch, seconds)
    assert [costs.ratio(b) for b in (2, 4, 16, 64)] == pytest.approx([1.5, 1.9, 4.9, 14.4])
    assert costs.verify(1) == pytest.approx(quiet)  # the step as the machine is now


def test_measured_costs_keep_samples_taken_before_the_first_step() -> None:
    costs = MeasuredCosts()
    costs.observe_verify(4, 0.2)
    costs.observe_draft(2, 0.1)
    assert costs.verify(4) is None and costs.draft_step() is None
    costs.observe_verify(1, 0.1)
    assert costs.verify(4) == pytest.approx(0.2) and costs.draft_step() == pytest.approx(0.05)


def test_lookup_reports_the_longest_recent_match() -> None:
    lk = LookupDrafter()
    text = [1, 2, 3, 9, 7, 7, 5, 6, 1, 2, 3, 4, 8, 8]  # "2 3" occurs twice; "1 2 3" twice
    lk.begin(text)
    prop = lk.propose([*text, 5, 6, 1, 2, 3], 4, None, None)  # type: ignore[arg-type]
    # "5 6 1 2 3" matched the copy starting at index 6 (5 tokens), not the first "1 2 3" (3 tokens)
    assert prop.match == 5 and prop.tokens == (4, 8, 8, 5)
    short = lk.propose([*text, 5, 6, 1, 2, 3, 4, 8, 0, 3, 9], 2, None, None)  # type: ignore[arg-type]
    assert short.match == 2 and short.tokens == (7, 7)


def test_lookup_prefers_the_match_nearest_the_copy_in_progress() -> None:
    """Of equally long matches, the one on the diagonal of the copy in progress: text the reply
    inserted into its copy (type hints) shifts it, and the source repeats the same words elsewhere."""
    prompt = [10, 11, 12, 13, 14, 20, 21, 30, 31, 32, 33, 20, 21, 40, 41]
    lk = LookupDrafter()
    lk.begin(prompt)
    reply = [10, 11, 12, 13, 14, 99, 20, 21]  # copies the start, inserts 99, goes on
    for n in range(2, len(reply)):
        lk.propose([*prompt, *reply[:n]], 4, None, None)  # type: ignore[arg-type]
    prop = lk.propose([*prompt, *reply], 2, None, None)  # type: ignore[arg-type]
    assert prop.match == 2 and prop.tokens == (30, 31)  # not the later "20 21 40 41"
    fresh = LookupDrafter()  # with no copy in progress, the most recent occurrence
    fresh.begin([*prompt, *reply])
    assert fresh.propose([*prompt, *reply], 2, None, None).tokens == (40, 41)  # type: ignore[arg-type]


def test_lookup_makes_a_rename_the_reply_made_twice() -> None:
    """A reply that renames a token of the text it copies: after two renamed occurrences (each where
    the copy resumed after it), copies are offered renamed and renamed text is looked up as it was;
    where the copy keeps the old token, the rename is dropped."""
    from app.engine.drafting.lookup import EDIT_SEEN

    old, new = 50, 60
    source = [1, 2, old, 3, 4, 5, 6, old, 7, 8, 9, 10, old, 11, 12, 13, 14, old, 15, 16, 17, 18]
    prompt = [90, 91, *source, 92]
    reply = [new if t == old else t for t in source]
    first, second, third = [i for i, t in enumerate(source) if t == old][:3]

    def offers(lk: LookupDrafter, text: list[int], start: int) -> list[tuple[int, ...]]:
        """What ``lk`` offers after each of ``text[:start]``, ``text[:start + 1]``, ..."""
        ends = range(start, len(text) + 1)
        return [lk.propose([*prompt, *text[:n]], 15, None, None).tokens for n in ends]  # type: ignore[arg-type]

    lk = LookupDrafter()
    lk.begin(prompt)
    offered = offers(lk, reply, 0)  # offered[n]: after the reply's first n tokens
    assert EDIT_SEEN == 2 and lk.replaced == {old: new}
    assert offered[first][0] == offered[second][0] == old  # renamed at most once: as the text stood
    assert offered[third][:2] == (new, 11)  # renamed twice: the third occurrence is offered renamed
    assert offered[third + 1][:3] == (11, 12, 13)  # the context ends "10 60": looked up as "10 50"
    # the reply keeps the old token where the copy resumes: the rename is dropped
    kept = [*reply, 99, 3, 4, 5, old, 7, 8, 9]
    offers(lk, kept, len(reply) + 1)
    assert lk.replaced == {}


def test_a_lookup_copy_ends_before_a_control_token() -> None:
    """The text a copy comes from may run on into the chat template (the end of the user's turn, the
    assistant's header), which a reply never writes as text: the copy ends before it."""
    end_turn, start_turn = 900, 901
    prompt = [start_turn, 5, 1, 2, 3, 4, end_turn, start_turn, 6]
    lk = LookupDrafter(stops={end_turn, start_turn})
    lk.begin(prompt)
    assert lk.propose([*prompt, 1, 2], 8, None, None).tokens == (3, 4)  # type: ignore[arg-type]
    assert lk.propose([*prompt, 1, 2, 3, 4], 8, None, None).tokens == ()  # type: ignore[arg-type]
    unaware = LookupDrafter()
    unaware.begin(prompt)
    assert unaware.propose([*prompt, 1, 2], 8, None, None).tokens[:3] == (3, 4, end_turn)  # type: ignore[arg-type]


def test_the_engines_lookup_drafters_stop_at_the_models_control_tokens(tiny_pair) -> None:
    from app.tiny_gguf import SPECIAL_TOKENS

    with Engine(LoadSettings(str(tiny_pair.target), n_ctx=512), costs=GPU_LIKE) as eng:
        control = eng.target.control_tokens
        assert {eng.target.token_text(t) for t in control} == set(SPECIAL_TOKENS)
        assert eng._drafter(GenerationSettings(mode="lookup")).stops == control
        assert eng._drafter(GenerationSettings(mode="auto")).lookup.stops == control


def test_long_lookup_matches_draft_longer_than_short_ones() -> None:
    """A short n-gram match is often a coincidence; a long one is a copy in progress."""
    cpu = SyntheticCosts(base=0.100, slope=0.04, draft=0.05)
    auto = AutoDrafter(None, LookupDrafter(), n_max=8, costs=cpu)
    for sure in (0, 1):
        k = [
            best_length(auto.evidence.copied[Source.LOOKUP][lookup_class(m)][sure], cpu, 0.0, 63, 0.03).k
            for m in (2, 4, 7, 12, 20, 40)
        ]
        assert k == sorted(k) and k[0] < k[-1]
    unsure_short, sure_short = (
        best_length(a, cpu, 0.0, 8, 0.03).k for a in auto.evidence.copied[Source.LOOKUP][1]
    )
    assert unsure_short < sure_short  # a short match in hesitant prose is a coincidence more often
    assert [lookup_class(m) for m in (2, 3, 5, 6, 9, 16, 31, 32, 64)] == [0, 1, 1, 2, 3, 4, 4, 5, 5]
    assert (
        len(auto.evidence.copied[Source.LOOKUP]) == len(LOOKUP_CLASSES) + 1
    )  # and the class of a resumed copy


def test_a_pessimistic_lookup_class_is_tried_again_in_time() -> None:
    acc = Acceptance(4, prior=0.8, weight=3.0)
    for _ in range(20):
        acc.observe(3, 0, [1.0] * 3)
    assert acc.alpha(0) < 0.2
    for _ in range(1000):
        acc.relax(0.995)
    assert acc.alpha(0) > 0.7  # back near the prior


def test_lookup_acceptance_judges_the_first_token_apart_from_the_rest() -> None:
    """A lookup draft is a copy (it goes on) or a coincidence (it fails at once): two priors."""
    acc = Acceptance(8, prior=0.5, prior_rest=0.85, weight=3.0)
    assert acc.alpha(0) == pytest.approx(0.5) and acc.alpha(5) == pytest.approx(0.85)
    for _ in range(10):
        acc.observe(4, 4, [1.0] * 4)  # copies of 4 accepted whole
    assert acc.alpha(0) > 0.85 and acc.alpha(3) > 0.9
    assert acc.alpha(7) == pytest.approx(0.85)  # untested: a copy may end at the next edit
    flat = Acceptance(8, prior=0.5, weight=3.0)  # one prior: evidence pooled over all positions
    assert flat.alpha(0) == flat.alpha(5) == pytest.approx(0.5)
    costs = MeasuredCpu(0.1, 0.0, 0.05)  # a batch of 4 costs 2.05 steps: pays from 2.1 tokens a round
    short_sure = AutoDrafter(None, LookupDrafter(), costs=costs).evidence.copied[Source.LOOKUP][0][1]
    assert best_length(short_sure, costs, 0.0, 8, 0.03).k == 3
    assert best_length(flat, costs, 0.0, 8, 0.03).k == 0


def test_acceptance_calibration_by_confidence() -> None:
    acc = Acceptance(4, weight=1.0)
    for _ in range(100):
        acc.observe(2, 1, [0.95, 0.15])  # confident tokens accepted, unconfident rejected
    assert acc.calibrated(0.95) > 0.9
    assert acc.calibrated(0.15) < 0.1
    assert acc.alpha(0) > 0.9 and acc.alpha(1) < 0.1


@pytest.fixture(scope="module")
def engines(tiny_pair):
    cheap = Engine(LoadSettings(str(tiny_pair.target), str(tiny_pair.draft), n_ctx=512), costs=GPU_LIKE)
    dear = Engine(LoadSettings(str(tiny_pair.target), str(tiny_pair.draft), n_ctx=512), costs=EXPENSIVE)
    yield cheap, dear
    cheap.close()
    dear.close()


PROMPTS = ["def add(a, b):", "The quick brown fox", "One, two, three, one, two, three, one, two,"]


def steps(engine: Engine, prompt: str, **kw) -> list[Step]:
    gs = GenerationSettings(mode="auto", **{"max_tokens": 48, **kw})
    return [e for e in engine.generate(engine.tokenize(prompt), gs) if isinstance(e, Step)]


def test_auto_with_cheap_verify_drafts_with_the_model(engines) -> None:
    cheap, _ = engines
    st = [s for p in PROMPTS for s in steps(cheap, p, n_max=6)]
    model_rounds = [s for s in st if s.drafter == "model"]
    assert model_rounds, "cheap verification should make auto mode draft with the model"
    assert max(s.k for s in model_rounds) >= 3
    assert all(s.decision.policy is Policy.AUTO for s in st)
    assert all(s.decision.source is Source.MODEL for s in model_rounds)


def test_auto_with_expensive_verify_pauses_drafting_and_says_why(engines) -> None:
    _, dear = engines
    st = [s for p in PROMPTS for s in steps(dear, p, n_max=6)]
    paused = [s for s in st if s.decision.action is Action.PAUSED]
    assert paused and all(s.k == 0 and s.n_drafted == 0 for s in paused)
    # verifying b tokens costs b plain steps: the model cannot pay even at 98% acceptance, so it is
    # never run (not even to probe)
    assert not [s for s in st if s.drafter == "model"]


class StaleDraft:
    """Stands in for the draft model in probe decisions: how far behind the text it is."""

    def __init__(self, pending: int):
        self.n = pending

    def pending(self, tokens) -> int:
        return self.n


def test_probes_only_when_finding_out_can_pay_for_the_catch_up() -> None:
    from app.engine.drafting import LookupDrafter

    maybe = SyntheticCosts(base=0.010, slope=0.0002, draft=0.0005)  # drafting would pay a lot...
    auto = AutoDrafter(StaleDraft(20), LookupDrafter(), n_max=6, costs=maybe)  # type: ignore[arg-type]
    auto.rounds.since = 10**6  # the back-off interval has passed
    auto.rest = 400
    assert auto.rounds.probe_due([], maybe.draft_step(), 6, auto.rest)  # ...and the catch-up is cheap: probe
    auto.rounds.model = StaleDraft(2000)  # type: ignore[assignment]
    auto.rest = 3
    assert not auto.rounds.probe_due(
        [], maybe.draft_step(), 6, auto.rest
    )  # a long catch-up for a short gain: wait
    auto.rest = 10**5
    assert auto.rounds.probe_due(
        [], maybe.draft_step(), 6, auto.rest
    )  # worth it when much of the reply is left
    auto = AutoDrafter(StaleDraft(150), LookupDrafter(), n_max=6, costs=CPU_LIKE)  # type: ignore[arg-type]
    auto.rounds.since = 10**6
    auto.rest = 96
    # CPU-like: even a 95 %-accurate draft gains a few percent; catching up 150 tokens costs more
    assert not auto.rounds.probe_due([], CPU_LIKE.draft_step(), 6, auto.rest)
    auto.rounds.since = 0
    assert not auto.rounds.probe_due(
        [], CPU_LIKE.draft_step(), 6, auto.rest
    )  # never before the back-off interval
    auto = AutoDrafter(StaleDraft(1), LookupDrafter(), n_max=6, costs=EXPENSIVE)  # type: ignore[arg-type]
    auto.rounds.since, auto.rest = 10**6, 10**6
    assert not auto.rounds.probe_due(
        [], EXPENSIVE.draft_step(), 6, auto.rest
    )  # cannot pay even at 98 % acceptance


def test_probes_only_where_the_target_is_sure_enough_for_the_draft_to_pay() -> None:
    """A probe hopes for its class's acceptance halfway to 1. Where the target hesitates the draft
    agrees 75 % of the time: with CPU-like costs even 87.5 % cannot pay, so no probe is wasted there;
    where the target is sure (97 %) a probe may find the draft paying."""
    from app.engine.drafting import LookupDrafter

    auto = AutoDrafter(StaleDraft(5), LookupDrafter(), n_max=6, costs=CPU_LIKE)  # type: ignore[arg-type]
    auto.rounds.since, auto.rest = 10**6, 10**5
    auto.rounds.cls = 0
    assert not auto.rounds.probe_due([], CPU_LIKE.draft_step(), 6, auto.rest)
    auto.rounds.cls = len(MODEL_CLASSES) - 1
    assert auto.rounds.probe_due([], CPU_LIKE.draft_step(), 6, auto.rest)


def test_a_probes_own_round_is_part_of_its_price() -> None:
    """With the draft in step (no catch-up) a probe still drafts and verifies a batch that a class
    whose drafts keep failing is expected to lose on: in the few tokens a short reply has left,
    finding out cannot repay that; over a long rest it can."""
    from app.engine.drafting import LookupDrafter

    auto = AutoDrafter(StaleDraft(0), LookupDrafter(), n_max=6, costs=CPU_LIKE)  # type: ignore[arg-type]
    auto.rounds.since = 10**6
    auto.rounds.cls = len(MODEL_CLASSES) - 1  # where a probe hopes for 98 %...
    for _ in range(30):
        auto.evidence.predicted[Source.MODEL][-1].observe(
            2, 0, ()
        )  # ...but this draft has been rejected at once lately
    auto.rest = REPLY_MIN
    assert not auto.rounds.probe_due([], CPU_LIKE.draft_step(), 6, auto.rest)
    auto.rest = 2000
    assert auto.rounds.probe_due([], CPU_LIKE.draft_step(), 6, auto.rest)


def test_auto_probes_a_paused_draft_in_a_long_reply(tiny_pair) -> None:
    """Verify costs where a draft of the usual quality would pay (a batch of 4 costs 1.6 steps, a
    draft token 0.2), but this draft model has rarely helped lately: auto pauses it, then re-probes
    where the reply so far promises enough of a rest to repay a probe's catch-up."""
    poor = SyntheticCosts(base=0.010, slope=0.002, draft=0.002)
    with Engine(LoadSettings(str(tiny_pair.target), str(tiny_pair.draft), n_ctx=2048), costs=poor) as eng:
        auto = eng._drafter(GenerationSettings(mode="auto", n_max=6))
        auto.evidence.predicted[Source.MODEL] = [Acceptance(6, prior=p, weight=3.0) for _, p in MODEL_CLASSES]
        for acc in auto.evidence.predicted[Source.MODEL]:
            for _ in range(30):
                acc.observe(6, 0, ())  # rejected at once, again and again
        # a catch-up in the synthetic costs' units: the tiny draft's real timing is not in them (on a
        # busy machine it would outweigh any gain the synthetic costs promise)
        auto.rounds.sync_per_token = lambda draft_cost: 0.35 * draft_cost  # type: ignore[method-assign]
        st = steps(eng, PROMPTS[1], n_max=6, max_tokens=400)
    probes = [s for s in st if s.decision.action is Action.PROBE]
    assert any(s.decision.action is Action.PAUSED for s in st)
    assert probes and all(s.n_drafted <= 2 for s in probes)


@pytest.mark.parametrize("which", ["cheap", "expensive", "measured"])
def test_auto_mode_is_lossless(engines, tiny_pair, which: str) -> None:
    if which == "measured":
        eng = Engine(LoadSettings(str(tiny_pair.target), str(tiny_pair.draft), n_ctx=512))
    else:
        eng = engines[0 if which == "cheap" else 1]
    try:
        for p in PROMPTS:
            ids = eng.tokenize(p)
            plain = eng.run(ids, GenerationSettings(mode="plain", max_tokens=48))
            auto = eng.run(ids, GenerationSettings(mode="auto", max_tokens=48))
            assert auto.tokens == plain.tokens, p
    finally:
        if which == "measured":
            eng.close()


def test_auto_without_draft_model_uses_lookup_only(tiny_pair) -> None:
    with Engine(LoadSettings(str(tiny_pair.target), n_ctx=512), costs=GPU_LIKE) as eng:
        st = steps(eng, PROMPTS[2])
        assert {s.drafter for s in st} <= {"lookup", "none"}
        plain = eng.run(eng.tokenize(PROMPTS[2]), GenerationSettings(mode="plain", max_tokens=48))
        assert tuple(t for s in st for t in s.tokens) == plain.tokens


class RecordingDraft(StaleDraft):
    """Records how auto mode asked the draft model to begin a reply."""

    def __init__(self):
        super().__init__(1)
        self.evaluate: list[bool] = []

    def begin(self, prompt, *, evaluate: bool = True) -> float:
        self.evaluate.append(evaluate)
        return 0.0


def test_draft_evaluates_the_prompt_up_front_only_while_it_could_pay() -> None:
    for costs, eager in ((GPU_LIKE, True), (CPU_LIKE, True), (EXPENSIVE, False)):
        draft = RecordingDraft()
        auto = AutoDrafter(draft, LookupDrafter(), n_max=6, costs=costs)  # type: ignore[arg-type]
        auto.begin([1, 2, 3])
        assert draft.evaluate == [eager], costs
    # model rounds that lost in the last reply do not keep the next one from trying the draft again
    # (each reply judges it afresh) ...
    draft = RecordingDraft()
    auto = AutoDrafter(draft, LookupDrafter(), n_max=6, costs=CPU_LIKE)  # type: ignore[arg-type]
    for _ in range(3):
        for c in range(len(MODEL_CLASSES)):
            auto.evidence.realized[(Source.MODEL, c)].add(1, 1.0)
        auto.evidence.realized[PLAIN].add(1, 0.1)
    auto.begin([1, 2, 3])
    assert draft.evaluate == [True]
    assert not any(auto.evidence.losing((Source.MODEL, c)) for c in range(len(MODEL_CLASSES)))
    # ... but where every class has shown an acceptance at which the costs say it cannot pay, it is out
    for c in range(len(MODEL_CLASSES)):
        auto.evidence.predicted[Source.MODEL][c] = Acceptance(6, prior=0.2, weight=1e6)
    auto.begin([1, 2, 3])
    assert draft.evaluate == [True, False]


def test_the_losing_guard_weighs_the_rounds_spread() -> None:
    """Rounds of a kind are losing when they delivered less than plain rounds by more than the noise
    of a few rounds: a draft at break-even that drew one early rejection goes on; one that falls
    short every round (by little or by much) stops."""

    def losing(rounds: list[tuple[int, float]]) -> bool:
        auto = AutoDrafter(RecordingDraft(), LookupDrafter(), n_max=6, costs=CPU_LIKE)  # type: ignore[arg-type]
        for seconds in (1.0, 1.02, 0.98, 1.0):
            auto.evidence.realized[PLAIN].add(1, seconds)
        for tokens, seconds in rounds:
            auto.evidence.realized[(Source.MODEL, 1)].add(tokens, seconds)
        return auto.evidence.losing((Source.MODEL, 1))

    assert not losing([(4, 3.0), (3, 3.0), (1, 3.0)])  # 0.89 of plain, within the rounds' spread
    assert losing([(2, 3.0), (2, 3.1), (2, 2.9)])  # 0.67 of plain every round
    assert losing([(1, 3.0), (1, 3.0), (1, 3.0)])  # never right
    assert not losing([(4, 3.0), (4, 3.0)])  # too few rounds to judge
    assert not losing([(4, 3.0), (3, 3.0), (4, 3.0)])  # winning


def test_probe_rounds_are_not_judged_and_a_good_probe_clears_the_guard() -> None:
    from app.engine.drafting import Proposal

    auto = AutoDrafter(RecordingDraft(), LookupDrafter(), n_max=6, costs=GPU_LIKE)  # type: ignore[arg-type]
    for _ in range(3):
        auto.evidence.realized[(Source.MODEL, 0)].add(1, 1.0)
        auto.evidence.realized[PLAIN].add(1, 0.1)
    assert auto.evidence.losing((Source.MODEL, 0))
    auto.evidence.predicted[Source.MODEL][0] = Acceptance(
        6, prior=0.95, weight=1e6
    )  # the probe finds the draft right again
    auto.rounds.probing = True
    probe = Proposal((5, 6), (None, None), (0.9, 0.9), Source.MODEL, 0.01, n_steps=1, t_steps=0.001)
    auto.observe(probe, Outcome(Source.MODEL, 2, 2, 3, 0.01, 0.02))
    assert auto.evidence.realized[(Source.MODEL, 0)].n == 0  # judged afresh from the next real rounds
    assert not auto.evidence.losing((Source.MODEL, 0))


def test_a_probe_right_in_full_keeps_its_interval_and_a_wrong_one_backs_off() -> None:
    """A probe whose tokens were all accepted is evidence for the draft even when it is not yet
    enough to plan real rounds: the next probe comes as soon as the first did (a short reply would
    otherwise never learn that its draft pays). A probe that was wrong doubles the interval."""
    from app.engine.drafting import Proposal

    auto = AutoDrafter(RecordingDraft(), LookupDrafter(), n_max=6, costs=CPU_LIKE)  # type: ignore[arg-type]
    # the class is known to be poor, so one good probe does not make real rounds pay yet
    auto.evidence.predicted[Source.MODEL][0] = Acceptance(6, prior=0.3, weight=1e6)
    probe = Proposal((5, 6), (None, None), (0.9, 0.9), Source.MODEL, 0.01, n_steps=1, t_steps=0.001)
    auto.rounds.probing = True
    auto.observe(probe, Outcome(Source.MODEL, 2, 2, 3, 0.01, 0.02))
    assert auto.rounds._probe_interval == auto.rounds.probe_every
    auto.rounds.probing = True
    auto.observe(probe, Outcome(Source.MODEL, 2, 0, 3, 0.01, 0.02))
    assert auto.rounds._probe_interval == 2 * auto.rounds.probe_every


def test_losing_short_lookup_matches_do_not_stop_long_ones() -> None:
    auto = AutoDrafter(None, LookupDrafter(), n_max=6, costs=CPU_LIKE)

    def short_matches_lose() -> None:
        for _ in range(3):  # coincidental 2-token matches have been losing in this reply
            auto.evidence.realized[(Source.LOOKUP, 0)].add(1, 1.0)
            auto.evidence.realized[PLAIN].add(1, 0.1)

    text = list(range(100, 120))
    auto.begin(text)
    short_matches_lose()
    copy = auto.propose([*text, *range(100, 112)], 6, None, None)  # type: ignore[arg-type]
    assert copy.source == "lookup" and copy.match >= 9 and len(copy.tokens) >= 1
    short = [1, 2, 9, 7, 7, 1, 2]
    auto.begin(short)
    auto.target_confidence.extend([1.0] * 3)  # where the target is sure, short matches are worth a try
    short_matches_lose()
    tried = [bool(auto.propose(short, 6, None, None).tokens) for _ in range(7)]  # type: ignore[arg-type]
    assert tried == [True, False, True, False, False, False, True]  # the losing class backs off
    auto.begin(short)  # the next reply judges prompt lookup afresh
    auto.target_confidence.extend([1.0] * 3)
    assert auto.propose(short, 6, None, None).tokens  # type: ignore[arg-type]


def test_a_short_match_that_resumes_the_last_copy_after_an_edit_is_drafted() -> None:
    """A reply rewriting its input picks the copy up again after each edit with a 2-token match."""
    from app.engine.auto.priors import RESUME

    source = list(range(100, 140))
    prompt = [1, 2, *source, 3]
    edited = [*prompt, *source[:16], 999, *source[17:19]]  # one token changed, then the copy goes on

    def resumed_draft(copied_before: bool) -> Proposal:
        auto = AutoDrafter(None, LookupDrafter(), n_max=6, costs=MeasuredCpu(0.1, 0.0, 0.05))
        auto.begin(prompt)
        if copied_before:
            copy = auto.propose([*prompt, *source[:12]], 6, None, None)  # type: ignore[arg-type]
            assert copy.match >= 9 and copy.tokens
            n = len(copy.tokens)
            auto.observe(copy, Outcome(Source.LOOKUP, n, n, n + 1, 0.2))  # all of it accepted
        found = auto.lookup.propose(edited, 6, None, None)  # type: ignore[arg-type]
        assert found.match == 2 and found.tokens[:2] == tuple(source[19:21])
        if copied_before:
            assert auto.copies.lookup_class(found.match, len(edited) - found.origin) == RESUME
            assert auto.copies.lookup_class(found.match, len(edited) - found.origin + 5) == 0  # another place
        return auto.propose(edited, 6, None, None)  # type: ignore[arg-type]

    assert not resumed_draft(copied_before=False).tokens  # a lone 2-token match: a coincidence
    resumed = resumed_draft(copied_before=True)
    assert resumed.source == "lookup" and len(resumed.tokens) >= 2 and resumed.decision.resumes_copy


class MeasuredCpu(SyntheticCosts):
    """Verify costs as measured on a 2-core CPU (Qwen2.5 1.5B Q4_K_M): lumpy, 16 cheap per token."""

    def verify(self, batch: int) -> float:
        ratio = {1: 1.0, 2: 1.55, 3: 2.02, 4: 2.05, 5: 2.65, 6: 3.0, 7: 3.63, 8: 4.39, 9: 4.86, 16: 5.73}
        r = ratio.get(batch) or (4.86 + (5.73 - 4.86) * (batch - 9) / 7 if batch < 16 else 5.73)
        return 0.1 * r


def test_a_long_copy_the_target_keeps_accepting_is_drafted_past_n_max() -> None:
    """Prompt lookup drafts cost nothing: their length follows verify costs, not n_max."""
    from app.engine.auto import LOOKUP_MAX

    costs = MeasuredCpu(0.1, 0.0, 0.05)
    source = list(range(100, 180))
    prompt = [1, 2, *source, 3]
    auto = AutoDrafter(None, LookupDrafter(), n_max=6, costs=costs)
    auto.begin(prompt)
    first = auto.propose([*prompt, *source[:12]], 200, None, None)  # type: ignore[arg-type]
    # a fresh copy: right about 9 times in 10 per token, so a batch of 4 pays best on this CPU
    assert first.source == "lookup" and len(first.tokens) == 3
    done = 12
    for _ in range(4):  # the target accepts the copy again and again
        prop = auto.propose([*prompt, *source[:done]], 200, None, None)  # type: ignore[arg-type]
        n = len(prop.tokens)
        auto.observe(prop, Outcome(Source.LOOKUP, n, n, n + 1, costs.verify(n + 1), costs.verify(n + 1)))
        done += n + 1
    long = auto.propose([*prompt, *source[:done]], 200, None, None)  # type: ignore[arg-type]
    assert long.source == "lookup" and len(long.tokens) == LOOKUP_MAX > auto.n_max
    assert long.decision.action is Action.DRAFT and long.decision.match == long.match > 0
    # the draft model's drafts stay within n_max
    sure = AutoDrafter(SureDraft(), LookupDrafter(), n_max=6, costs=GPU_LIKE)  # type: ignore[arg-type]
    sure.begin([5, 6, 7])
    sure.target_confidence.extend([1.0] * 3)
    drafted = sure.propose([5, 6, 7], 200, None, None)  # type: ignore[arg-type]
    assert drafted.source == "model" and 1 <= len(drafted.tokens) <= 6


class Avx512Cpu(SyntheticCosts):
    """Verify costs measured with the AVX-512 build on this 2-core CPU (Qwen2.5 1.5B Q4_K_M)."""

    RATIOS = (1, 1.55, 1.99, 1.66, 2.11, 2.68, 3.11, 3.08, 3.49, 3.95, 4.18, 4.06, 4.52, 4.67, 4.89, 4.03)

    def verify(self, batch: int) -> float:
        return 0.1 * self.RATIOS[min(batch, len(self.RATIOS)) - 1]


def test_a_copy_that_goes_on_in_this_reply_is_drafted_further() -> None:
    """Positions a reply has not drafted yet follow the deepest it has: copies that keep going at
    positions 1-2 are drafted long, copies that stop there are not, and the draft model is not."""
    from app.engine.auto.acceptance import ReplyAcceptance

    costs = Avx512Cpu(0.1, 0.0, 0.05)
    first, rest = LOOKUP_CLASSES[1][1]  # a 3-5 token match where the target was sure

    def pooled() -> Acceptance:
        return Acceptance(LOOKUP_MAX, prior=first, prior_rest=rest, weight=1e6)

    def planned(acc: ReplyAcceptance) -> int:
        return best_length(acc, costs, 0.0, LOOKUP_MAX, 0.03).k

    fresh = ReplyAcceptance(pooled(), copies=True)
    assert 1 <= planned(fresh) <= 3  # the pooled view: copies end soon, draft a batch of 4
    running, stopping, model = (ReplyAcceptance(pooled(), copies=c) for c in (True, True, False))
    for _ in range(2):
        running.observe(3, 3)  # the copy went on through all 3 drafted tokens
        stopping.observe(3, 1)  # each copy stopped at the second token
        model.observe(3, 3)
    assert planned(running) == LOOKUP_MAX
    assert running.alpha(10) > rest and running.pooled.alpha(10) == pytest.approx(rest)
    assert planned(stopping) <= 3 and stopping.alpha(10) == pytest.approx(rest)
    assert model.alpha(10) == pytest.approx(rest) and planned(model) <= 3
    once = ReplyAcceptance(pooled(), copies=True)
    once.observe(3, 3)  # one round says little yet
    assert once.alpha(10) == pytest.approx(rest)


def test_model_rounds_that_take_longer_than_predicted_correct_the_plan() -> None:

    auto = AutoDrafter(SureDraft(), LookupDrafter(), n_max=6, costs=CPU_LIKE)  # type: ignore[arg-type]
    assert auto.rounds.overrun() == 1.0
    round_ = Proposal((7, 7, 7), (None,) * 3, (0.99,) * 3, Source.MODEL, 0.0, n_steps=3, t_steps=0.15)
    predicted = 3 * CPU_LIKE.draft_step() + CPU_LIKE.verify(4)
    for _ in range(5):  # model rounds take 30 % longer than their parts timed alone
        auto.observe(round_, Outcome(Source.MODEL, 3, 3, 4, CPU_LIKE.verify(4), 1.3 * predicted))
    assert auto.rounds.overrun() == pytest.approx(1.3)
    sure = Acceptance(6, prior=0.97, weight=1e6)
    assert best_length(sure, CPU_LIKE, CPU_LIKE.draft_step(), 6, 0.03).k > 0
    assert best_length(sure, CPU_LIKE, CPU_LIKE.draft_step(), 6, 0.03, scale=auto.rounds.overrun()).k == 0


class SureDraft(StaleDraft):
    """A draft model stand-in that proposes ``len`` tokens, each with the given confidence."""

    name = "model"

    def __init__(self, pending: int = 1, confidence: float = 0.99):
        super().__init__(pending)
        self.confidence = confidence
        self.asked: list[int] = []

    def begin(self, prompt, *, evaluate: bool = True) -> float:
        return 0.0

    def propose(self, tokens, k, params, rng, *, keep_going=None):
        from app.engine.drafting import Proposal

        ids: list[int] = []
        for j in range(k):
            ids.append(7)
            if keep_going is not None and not keep_going(j, [self.confidence] * len(ids)):
                break
        self.asked.append(k)
        n = len(ids)
        return Proposal(
            tuple(ids), (None,) * n, (self.confidence,) * n, Source.MODEL, 0.0, n_steps=n, t_steps=0.0
        )


def test_model_class_follows_the_targets_confidence() -> None:
    assert model_class([]) == 0  # nothing known yet: the most cautious class
    assert model_class([1.0, 0.4, 1.0]) == 0  # one hesitant token is enough to hesitate
    assert model_class([0.95, 1.0, 0.999]) == 1
    assert model_class([1.0, 0.995, 0.999]) == len(MODEL_CLASSES) - 1
    priors = [p for _, p in MODEL_CLASSES]
    assert priors == sorted(priors)  # the surer the target, the likelier the draft agrees


def test_auto_drafts_with_the_model_only_where_the_target_is_sure() -> None:

    text = list(range(200, 260))  # no n-gram repeats: prompt lookup has nothing to offer
    auto = AutoDrafter(SureDraft(), LookupDrafter(), n_max=6, costs=CPU_LIKE)  # type: ignore[arg-type]
    auto.begin(text)
    auto.observe(EMPTY, Outcome(Source.NONE, 0, 0, 1, 0.1, 0.1, confidence=(0.6,)))
    hesitant = auto.propose(text, 6, None, None)  # type: ignore[arg-type]
    assert not hesitant.tokens and hesitant.decision.action is Action.PAUSED
    assert hesitant.decision.declined is None  # no match to name
    for _ in range(3):
        auto.observe(EMPTY, Outcome(Source.NONE, 0, 0, 1, 0.1, 0.1, confidence=(1.0,)))
    sure = auto.propose(text, 6, None, None)  # type: ignore[arg-type]
    assert sure.source == "model" and len(sure.tokens) >= 2, sure.decision
    assert sure.decision.target_sure == 1.0


def test_a_draft_is_verified_only_as_far_as_verifying_it_pays() -> None:
    """What drafting cost is spent: a draft that stopped at one token the draft itself doubts is not
    worth a batch of 2 where that batch costs more than the token is likely to bring (a CPU); where
    a batch costs about a step (a GPU) it is verified."""
    text = list(range(200, 260))  # no n-gram repeats: prompt lookup has nothing to offer
    for costs, kept in ((CPU_LIKE, False), (GPU_LIKE, True)):
        auto = AutoDrafter(SureDraft(confidence=0.2), LookupDrafter(), n_max=6, costs=costs)  # type: ignore[arg-type]
        auto.begin(text)
        for _ in range(3):
            auto.observe(EMPTY, Outcome(Source.NONE, 0, 0, 1, 0.1, 0.1, confidence=(1.0,)))
        prop = auto.propose(text, 6, None, None)  # type: ignore[arg-type]
        assert bool(prop.tokens) == kept, (costs, prop.decision)
        if not kept:
            assert prop.source is Source.MODEL and prop.decision.action is Action.DRAFT
    sure = AutoDrafter(SureDraft(confidence=0.99), LookupDrafter(), n_max=6, costs=CPU_LIKE)  # type: ignore[arg-type]
    sure.begin(text)
    for _ in range(3):
        sure.observe(EMPTY, Outcome(Source.NONE, 0, 0, 1, 0.1, 0.1, confidence=(1.0,)))
    assert len(sure.propose(text, 6, None, None).tokens) >= 2  # type: ignore[arg-type]


def test_a_draft_cut_to_nothing_is_judged_by_the_token_the_target_chose_and_counts_as_its_round() -> None:
    """The cut token's fate is known a round later (the target decoded that position plainly): it is
    evidence for the class and the draft's calibration, and the round (its drafting spent) is one of
    the model's rounds, not a plain one."""
    text = list(range(200, 260))  # no n-gram repeats: prompt lookup has nothing to offer
    for target_token, hit in ((7, 1.0), (8, 0.0)):  # SureDraft drafts token 7
        auto = AutoDrafter(SureDraft(confidence=0.2), LookupDrafter(), n_max=6, costs=CPU_LIKE)  # type: ignore[arg-type]
        auto.begin(text)
        for _ in range(3):
            auto.observe(EMPTY, Outcome(Source.NONE, 0, 0, 1, 0.1, 0.1, confidence=(1.0,)))
        cls = model_class(auto.target_confidence)
        prop = auto.propose(text, 6, None, None)  # type: ignore[arg-type]
        assert not prop.tokens and prop.source is Source.MODEL and auto.rounds.cut
        auto.observe(prop, Outcome(Source.MODEL, 0, 0, 1, 0.1, 0.13, confidence=(1.0,)))
        assert auto.evidence.realized[(Source.MODEL, cls)].n == 1
        pooled = auto.evidence.pooled(Source.MODEL, cls)
        calibration = auto.evidence.calibration[Source.MODEL]
        trials, bin_trials = pooled.trials[0], calibration.bin_trials[2]
        auto.propose([*text, target_token], 6, None, None)  # type: ignore[arg-type]
        assert pooled.trials[0] == trials + 1 and pooled.hits[0] == pytest.approx(hit)
        assert calibration.bin_trials[2] == bin_trials + 1 and calibration.bin_hits[2] == pytest.approx(hit)
    # a token cut at the end of a reply is not judged by the next reply's text
    auto = AutoDrafter(SureDraft(confidence=0.2), LookupDrafter(), n_max=6, costs=CPU_LIKE)  # type: ignore[arg-type]
    auto.begin(text)
    for _ in range(3):
        auto.observe(EMPTY, Outcome(Source.NONE, 0, 0, 1, 0.1, 0.1, confidence=(1.0,)))
    auto.propose(text, 6, None, None)  # type: ignore[arg-type]
    assert auto.rounds.cut
    auto.observe(EMPTY, Outcome(Source.MODEL, 0, 0, 1, 0.1, 0.13, confidence=(1.0,)))
    trials = auto.evidence.calibration[Source.MODEL].bin_trials.sum()
    auto.begin([*text, 7])
    auto.propose([*text, 7, 7], 6, None, None)  # type: ignore[arg-type]
    assert auto.evidence.calibration[Source.MODEL].bin_trials.sum() == trials


def test_model_drafts_on_past_a_costly_batch_size_when_cheaper_ones_follow() -> None:
    """On a CPU a batch of 4 can cost what a batch of 3 does: judge the whole draft, not one step."""

    class Lumpy(SyntheticCosts):
        def verify(self, batch: int) -> float:
            return {1: 0.1, 2: 0.15, 3: 0.21, 4: 0.21, 5: 0.25}.get(batch, 0.25 + 0.05 * (batch - 5))

    auto = AutoDrafter(SureDraft(), LookupDrafter(), n_max=6, costs=Lumpy(0.1, 0.0, 0.045))  # type: ignore[arg-type]
    keep_going = continue_rule(
        auto.costs,
        auto.evidence.calibration[Source.MODEL],
        auto.evidence.predicted[Source.MODEL][-1],
        auto.costs.draft_step(),
        6,
    )
    assert keep_going(1, [0.99, 0.99])  # a 3rd token costs 0.06 s more, but a 4th is then nearly free
    assert not keep_going(1, [0.99, 0.2])  # an unlikely 2nd token: more drafting cannot pay


def test_the_rest_of_a_reply_is_expected_to_be_as_long_as_the_reply_so_far() -> None:
    """Within the token budget, and at least REPLY_MIN tokens: a reply n tokens long is as likely
    to be past its middle as not."""
    text = list(range(300, 700))  # no n-gram repeats
    auto = AutoDrafter(None, LookupDrafter(), n_max=6, costs=CPU_LIKE)
    for prompt_len, budget, rest in ((396, 1000, REPLY_MIN), (100, 1000, 300), (100, 50, 51), (400, 9, 10)):
        auto.begin(text[:prompt_len])
        auto.propose(text, budget, None, None)  # type: ignore[arg-type]
        assert auto.rest == rest


def test_catching_up_the_draft_is_spread_over_the_reply_expected_to_be_left() -> None:
    """A reply is expected to go on for as long as it has gone so far (within its token budget)."""
    text = list(range(300, 700))
    far_behind = SureDraft(pending=40)

    def first_round(prompt_len: int, budget: int) -> Proposal:
        auto = AutoDrafter(far_behind, LookupDrafter(), n_max=6, costs=CPU_LIKE)  # type: ignore[arg-type]
        auto.begin(text[:prompt_len])
        auto.target_confidence.extend([1.0] * 3)
        return auto.propose(text, budget, None, None)  # type: ignore[arg-type]

    assert first_round(10, 200).source == "model"  # 390 tokens so far, 200 to go: a long reply left
    assert not first_round(10, 4).tokens  # a few tokens of budget left: not worth it
    assert not first_round(396, 200).tokens  # 4 tokens so far: it may well end soon (a translation)


def test_a_catch_up_is_charged_to_the_model_rounds_it_serves() -> None:
    """Where copies and model rounds take turns (a JSON reply), each model round needs its own
    catch-up: once the reply shows that, a catch-up is no longer spread over the rest of the reply."""
    from dataclasses import replace

    costs = SyntheticCosts(base=0.1, slope=0.02, draft=0.03)  # a sure draft pays well when it keeps up
    text = list(range(300, 400))

    def reply(rounds_per_catch_up: int) -> Proposal:
        auto = AutoDrafter(SureDraft(pending=30), LookupDrafter(), n_max=6, costs=costs)  # type: ignore[arg-type]
        auto.begin(text[:10])
        auto.target_confidence.extend([1.0] * 3)
        first = auto.propose(text, 200, None, None)  # type: ignore[arg-type]
        assert first.source == "model"  # a long reply so far and left: the catch-up is spread over it
        n = len(first.tokens)
        for i in range(3 * rounds_per_catch_up):  # catch-ups of 28 tokens, each serving this many rounds
            n_sync = 30 if i % rounds_per_catch_up == 0 else 2  # 2: the round's own tokens
            t_sync = 0.0175 * n_sync
            t_round = n * costs.draft + costs.verify(n + 1) + t_sync
            prop = replace(first, n_sync=n_sync, t_sync=t_sync)
            auto.observe(prop, Outcome(Source.MODEL, n, n, n + 1, costs.verify(n + 1), t_round))
        return auto.propose(text, 200, None, None)  # type: ignore[arg-type]

    assert not reply(rounds_per_catch_up=1).tokens  # half a second of catching up for one round: no
    assert reply(rounds_per_catch_up=8).source == "model"


def test_a_catch_up_is_spread_only_over_rounds_before_lookup_drafts_again() -> None:
    """In a code edit prompt lookup copies every few rounds and leaves the draft behind each time:
    a catch-up serves the model rounds until the next copy, not the rest of the reply. Replayed
    on the benchmark's replies, spreading it over the reply cost ``code_edit`` 6 % against prompt
    lookup alone (a catch-up of 28 tokens, 6 decode steps, for one round of 4 tokens)."""
    costs = SyntheticCosts(base=0.1, slope=0.025, draft=0.04)  # a sure draft pays 1.3x when in step
    text = list(range(300, 400))

    def catch_up_round(copies: int) -> Proposal:
        auto = AutoDrafter(SureDraft(pending=30), LookupDrafter(), n_max=6, costs=costs)  # type: ignore[arg-type]
        auto.rounds.sync_cost.add(0.0175)  # catching up costs 17.5 ms a token: 0.5 s for these 28
        auto.begin(text[:10])
        for _ in range(copies):  # lookup rounds earlier in this reply
            auto.copies.share = 0.9 * auto.copies.share + 0.1
        auto.target_confidence.extend([1.0] * 3)
        return auto.propose(text, 200, None, None)  # type: ignore[arg-type]

    assert catch_up_round(copies=0).source == "model"
    assert not catch_up_round(copies=8).tokens  # every other round or so is a copy: one round served


def test_a_catch_up_is_charged_as_catch_ups_served_in_earlier_replies_until_this_one_shows() -> None:
    """Catch-ups that served one model round each in the replies before are not spread over the
    rest of a new reply either, before that reply has shown what its own catch-ups serve."""
    from dataclasses import replace

    costs = SyntheticCosts(base=0.1, slope=0.02, draft=0.03)
    text = list(range(300, 400))
    auto = AutoDrafter(SureDraft(pending=30), LookupDrafter(), n_max=6, costs=costs)  # type: ignore[arg-type]
    auto.begin(text[:10])
    auto.target_confidence.extend([1.0] * 3)
    first = auto.propose(text, 200, None, None)  # type: ignore[arg-type]
    assert first.source == "model"
    n = len(first.tokens)
    for _ in range(3):  # three replies, each with three catch-ups that served one round each
        auto.begin(text[:10])
        for _ in range(3):
            t_round = n * costs.draft + costs.verify(n + 1) + 0.5
            prop = replace(first, n_sync=30, t_sync=0.5)
            auto.observe(prop, Outcome(Source.MODEL, n, n, n + 1, costs.verify(n + 1), t_round))
    auto.begin(text[:10])
    auto.target_confidence.extend([1.0] * 3)
    assert not auto.propose(text, 200, None, None).tokens  # type: ignore[arg-type]


def test_a_batch_size_timed_once_is_tried_again_when_nearly_the_best() -> None:
    """One slow timing at load must not keep a batch size out of plans for good."""
    costs = MeasuredCosts()
    costs.observe_verify(1, 0.1)
    for batch, seconds in ((2, 0.155), (3, 0.2), (5, 0.22)):
        for _ in range(5):
            costs.observe_verify(batch, seconds)
    costs.observe_verify(4, 0.21)  # timed once, slowly (about 0.17 on a quiet machine)
    acc = Acceptance(8, prior=0.5, prior_rest=0.86, weight=1e6)
    assert costs.samples(4) == 1 and costs.samples(5) == 5 and costs.samples(7) == 0
    assert best_length(acc, costs, 0.0, 4, 0.03).k == 3  # nearly the best: try it, and so time it
    for _ in range(2):
        costs.observe_verify(4, 0.21)
    assert best_length(acc, costs, 0.0, 4, 0.03).k == 4  # three timings say it really is dear


def test_loading_times_the_batch_sizes_verification_uses(tiny_pair) -> None:
    """Auto mode starts from measured costs, including a long prompt-lookup draft's batch."""
    with Engine(LoadSettings(str(tiny_pair.target), str(tiny_pair.draft), n_ctx=512)) as eng:
        costs = eng.costs
        assert isinstance(costs, MeasuredCosts)
        assert {b for b in Engine.WARM_UP_BATCHES if b > 1} <= {b for b in range(2, 65) if costs.samples(b)}
        assert max(Engine.WARM_UP_BATCHES) >= LOOKUP_MAX + 1
        assert costs.verify(1) and costs.draft_step()


def test_the_loop_reports_the_targets_confidence_to_auto_mode(tiny_pair) -> None:
    with Engine(LoadSettings(str(tiny_pair.target), str(tiny_pair.draft), n_ctx=2048)) as eng:
        auto = eng._drafter(GenerationSettings(mode="auto", n_max=6))
        seen: list[float] = []
        observe = auto.observe
        auto.observe = lambda p, o: (seen.extend(o.confidence), observe(p, o))[1]  # type: ignore[method-assign]
        steps(eng, PROMPTS[0], n_max=6, max_tokens=24)
    assert seen and all(0.0 < c <= 1.0 for c in seen)
    assert list(auto.target_confidence) == seen[-len(auto.target_confidence) :]


def test_a_reply_unlike_the_pool_is_followed_within_the_reply() -> None:
    from app.engine.auto.acceptance import ReplyAcceptance

    cpu = SyntheticCosts(base=0.100, slope=0.050, draft=0.050)  # a batch of 2 costs 1.5 steps
    settled = Acceptance(6, prior=0.83, weight=1e6)  # what many replies taught
    prose = ReplyAcceptance(settled)
    assert best_length(prose, cpu, 0.0, 6, 0.03).k > 0
    for _ in range(3):  # this reply's matches keep failing at the first token
        prose.observe(3, 0)
    assert best_length(prose, cpu, 0.0, 6, 0.03).k == 0
    assert settled.alpha(0) > 0.8  # the pooled estimate is untouched
    json_reply = ReplyAcceptance(Acceptance(6, prior=0.9, weight=1e6))
    for _ in range(4):
        json_reply.observe(5, 5)
    assert json_reply.alpha(0) > 0.94 and json_reply.overall() > 0.94

    auto = AutoDrafter(None, LookupDrafter(), n_max=6, costs=cpu)
    auto.begin([1, 2, 3])
    auto.evidence.estimate(Source.LOOKUP, 1).observe(3, 0)
    assert auto.evidence.estimate(Source.LOOKUP, 1).trials[0] == 1
    auto.begin([1, 2, 3])  # a new reply starts from the pooled estimate again
    assert auto.evidence.estimate(Source.LOOKUP, 1).trials[0] == 0


def test_accepted_draft_tokens_are_not_counted_as_catch_up(tiny_pair) -> None:
    """After a drafted round the draft lags by at most its last draft token and the target's token."""
    with Engine(LoadSettings(str(tiny_pair.target), str(tiny_pair.draft), n_ctx=2048)) as eng:
        model = eng._model_drafter
        assert model is not None
        prompt = eng.tokenize(PROMPTS[2])
        gs = GenerationSettings(mode="speculative", n_max=4, adaptive=False, max_tokens=24)
        evs = list(eng.generate(prompt, gs))
        drafted = [e for e in evs if isinstance(e, Step) and e.n_drafted]
        assert drafted and any(e.n_accepted for e in drafted)
        text = [*prompt, *evs[-1].tokens]
        keep = common_prefix(model.seq.tokens, text)
        assert model.pending(text) == max(1, len(text) - keep) <= 2


def test_a_copy_of_a_record_stops_where_the_record_broke_from_its_own_copy() -> None:
    """JSON records copy each other up to their values. Where this reply departed from a copy (checked
    whether it was drafted or not), a later copy of that stretch is judged at the breaks' own rate."""
    from app.engine.auto.acceptance import CopyBreaks
    from app.engine.auto.priors import BREAK_PRIOR

    costs = SyntheticCosts(base=0.1, slope=0.01, draft=0.05)  # a batch of 4: 1.3 steps
    keys, tail = [10, 11, 12, 13, 14, 15], [16, 17]

    def record(i: int) -> list[int]:
        return [*keys, 100 + i, *tail]  # the value 100 + i changes, the keys and the tail do not

    prompt = [1, 2, 3]
    auto = AutoDrafter(None, LookupDrafter(), costs=costs)
    auto.begin(prompt)
    # record 1 is decoded after record 0; lookup offers record 0's stretch, which breaks at the value
    text = [*prompt, *record(0), *keys]
    offered = auto.propose(text, 50, None, None)  # type: ignore[arg-type]
    n = len(offered.tokens)
    auto.observe(offered, Outcome(offered.source if n else Source.NONE, n, 0, n + 1, costs.verify(n + 1)))
    text.append(101)  # the target's value, not the copy's 100
    auto.propose(text, 50, None, None)  # type: ignore[arg-type]  # checks the last copy offered
    assert auto.copies.breaks.breaks == {len(text) - 1}
    text += tail
    # record 2: its keys again, copied from record 1 (the most recent occurrence) up to the value
    text += keys[:4]
    copy = auto.lookup.propose(text, 50, None, None)  # type: ignore[arg-type]
    value_at = copy.tokens.index(101)
    assert copy.origin + value_at in auto.copies.breaks.breaks
    drafted = auto.propose(text, 50, None, None)  # type: ignore[arg-type]
    assert drafted.source == "lookup" and 1 <= len(drafted.tokens) <= value_at
    assert drafted.decision.copy_broke_at == value_at + 1
    # the same copy with no break seen in this reply is drafted past the value
    fresh = AutoDrafter(None, LookupDrafter(), costs=costs)
    fresh.evidence.copied, fresh.evidence.realized = (
        auto.evidence.copied,
        auto.evidence.realized,
    )  # same pooled
    fresh.begin(prompt)
    assert len(fresh.propose(text, 50, None, None).tokens) > value_at  # type: ignore[arg-type]
    # a short match failing at once was a coincidence, not a copy the reply departed from
    coincidence = CopyBreaks()
    coincidence.offer(
        [0] * 8, Proposal((7, 8), (None, None), (1.0, 1.0), Source.LOOKUP, 0.0, match=2, origin=3)
    )
    coincidence.check([0] * 8 + [9])
    assert not coincidence.breaks
    # a reply whose copies hold at their breaks raises the rate
    breaks = CopyBreaks()
    assert breaks.rate() == pytest.approx(BREAK_PRIOR)
    breaks.breaks.add(5)
    for _ in range(10):
        breaks.offer([0] * 8, Proposal((7,), (None,), (1.0,), Source.LOOKUP, 0.0, origin=5))
        breaks.check([0] * 8 + [7])
    assert breaks.rate() > 0.8


class EpycCpu(SyntheticCosts):
    """Verify costs measured on a 2-core AMD EPYC (Qwen2.5 1.5B Q4_K_M): one step is fast, batches dear."""

    RATIOS = (1, 1.73, 2.24, 2.9, 3.44, 3.97, 4.42, 4.88, 5.37, 5.61, 5.86, 6.1, 6.03, 5.95, 5.88, 5.8)

    def verify(self, batch: int) -> float:
        return 0.03 * self.RATIOS[min(batch, len(self.RATIOS)) - 1]


def test_the_first_draft_of_a_class_of_copy_in_a_reply_is_short() -> None:
    """A 9-15 token match in a new reply is first drafted FIRST_LOOKUP tokens deep, whatever other
    replies taught the class; once the target accepted that, the copy is drafted long."""
    from app.engine.auto.priors import COPYING, FIRST_LOOKUP

    costs = EpycCpu(0.03, 0.0, 0.016)
    source = list(range(100, 400))
    prompt = [1, 2, *source, 3]
    auto = AutoDrafter(None, LookupDrafter(), costs=costs)
    for _ in range(2):  # the second reply starts with a pool that saw long copies accepted
        auto.begin(prompt)
        done = 12
        first = auto.propose([*prompt, *source[:done]], 200, None, None)  # type: ignore[arg-type]
        assert first.source == "lookup" and LOOKUP_CLASSES[3][0] <= first.match < COPYING
        assert 1 <= len(first.tokens) <= FIRST_LOOKUP < LOOKUP_MAX
        n = len(first.tokens)
        auto.observe(first, Outcome(Source.LOOKUP, n, n, n + 1, costs.verify(n + 1), costs.verify(n + 1)))
        done += n + 1
        for _ in range(3):  # the copy goes on
            prop = auto.propose([*prompt, *source[:done]], 200, None, None)  # type: ignore[arg-type]
            n = len(prop.tokens)
            auto.observe(prop, Outcome(Source.LOOKUP, n, n, n + 1, costs.verify(n + 1), costs.verify(n + 1)))
            done += n + 1
        assert n == LOOKUP_MAX


def test_a_copy_in_progress_is_drafted_long_from_its_first_round() -> None:
    """A match of COPYING tokens or more is a copy in progress: its first draft is not capped at
    FIRST_LOOKUP, and a batch of 64 that costs what a batch of 16 does (a CPU's batched kernels)
    is used to copy LOOKUP_MAX tokens at once."""
    from app.engine.auto.priors import COPYING

    costs = EpycCpu(0.03, 0.0, 0.016)
    source = list(range(100, 400))
    prompt = [1, 2, *source, 3]
    auto = AutoDrafter(None, LookupDrafter(), costs=costs)
    auto.begin(prompt)
    first = auto.propose([*prompt, *source[:40]], 200, None, None)  # type: ignore[arg-type]
    assert first.source == "lookup" and first.match >= COPYING
    assert len(first.tokens) == LOOKUP_MAX == 63


def test_a_draft_model_that_could_not_pay_even_if_always_right_is_neither_planned_nor_probed() -> None:
    """The shortcut for a machine where the draft model never pays: when even a draft that is always
    right, with nothing to catch up, would not beat plain decoding, no plan and no probe could choose
    it, so neither is computed. Checked against both over a grid of costs and overruns."""
    gated = open_ = 0
    for slope in (0.002, 0.01, 0.02, 0.03, 0.05):
        for draft in (0.001, 0.004, 0.01, 0.02):
            for overrun in (None, 0.8, 1.0, 1.5):
                costs = SyntheticCosts(base=0.03, slope=slope, draft=draft)
                auto = AutoDrafter(StaleDraft(0), LookupDrafter(), n_max=6, costs=costs)  # type: ignore[arg-type]
                for _ in range(3 if overrun else 0):
                    auto.rounds.overrun_window.add(overrun)
                auto.rounds.since, auto.rest = 10**6, 10**6
                for c in range(len(MODEL_CLASSES)):
                    auto.rounds.cls = c
                    if not auto.rounds.cannot_pay(draft, 6):
                        open_ += 1
                        continue
                    gated += 1
                    assert not auto.rounds.probe_due([], draft, 6, auto.rest)
                    scale = auto.rounds.overrun()
                    for p in (0.9, 0.99, 0.999):
                        acc = Acceptance(6, prior=p, weight=1e12)
                        assert best_length(acc, costs, draft, 6, auto.margin, 0.0, scale).k == 0
    assert gated and open_  # the grid has both kinds of machine

    sure_but_dear = AutoDrafter(SureDraft(), LookupDrafter(), n_max=6, costs=EXPENSIVE)  # type: ignore[arg-type]
    text = list(range(200, 260))  # no n-gram repeats: only the draft model could draft
    sure_but_dear.begin(text)

    for i in range(300):
        sure_but_dear.observe(EMPTY, Outcome(Source.NONE, 0, 0, 1, 0.1, 0.1, confidence=(1.0,)))
        prop = sure_but_dear.propose([*text, *range(300, 300 + i)], 6, None, None)  # type: ignore[arg-type]
        assert not prop.tokens and prop.decision.action in (Action.PAUSED, Action.MEASURE)
    assert sure_but_dear.model.asked == []  # type: ignore[union-attr]


def test_a_declined_lookup_match_is_named_in_the_decision() -> None:
    """A round that drafts nothing says why, and names the prompt lookup match it did not draft (the
    app shows it next to "drafting paused"), as data."""

    text = [*range(200, 260), 230, 231]  # ends with a 2-token match: a coincidence as often as not
    for model, costs in ((None, EXPENSIVE), (SureDraft(), EXPENSIVE)):
        auto = AutoDrafter(model, LookupDrafter(), n_max=6, costs=costs)  # type: ignore[arg-type]
        auto.begin(text[:60])
        auto.observe(EMPTY, Outcome(Source.NONE, 0, 0, 1, 0.1, 0.1, confidence=(1.0,)))
        prop = auto.propose(text, 6, None, None)  # type: ignore[arg-type]
        assert not prop.tokens
        named = Declined(Source.LOOKUP, match=2, losing=False)
        assert prop.decision.declined == named
        assert prop.decision.action is (Action.DECLINED if model is None else Action.PAUSED)
        no_match = auto.propose(list(range(300, 360)), 6, None, None)  # type: ignore[arg-type]
        assert no_match.decision.declined is None
        assert no_match.decision.action is (Action.NO_MATCH if model is None else Action.PAUSED)


class SlowBatchCpu(SyntheticCosts):
    """Verify costs the engine measured on the AMD EPYC in one run: batches of 2-4 dearer still."""

    RATIOS = (1, 1.9, 2.67, 3.1, 3.85, 4.25, 4.74, 5.22, 5.2, 5.35, 5.5, 5.65, 5.97, 6.3, 6.62, 5.24)

    def verify(self, batch: int) -> float:
        return 0.03 * self.RATIOS[min(batch, len(self.RATIOS)) - 1]


def decode_teacher_forced(auto: AutoDrafter, prompt: list[int], reply: list[int], costs) -> list[Proposal]:
    """Run ``reply`` through auto's rounds as greedy verification would accept it; the drafts."""

    auto.begin(prompt)
    drafts, done = [], 0
    while done < len(reply):
        prop = auto.propose([*prompt, *reply[:done]], len(reply) - done, None, None)  # type: ignore[arg-type]
        n = len(prop.tokens)
        ok = common_prefix(prop.tokens, reply[done : done + n])
        t = costs.verify(n + 1)
        auto.observe(prop, Outcome(prop.source if n else "none", n, ok, n + 1, t, t))
        if n:
            drafts.append(prop)
        done += ok + 1
    return drafts


def test_copies_offered_but_not_drafted_are_followed_as_evidence(monkeypatch) -> None:
    """Where short matches do not pay by their class's prior, a reply of records copies each earlier
    record undrafted. Each copy offered and not drafted is checked against the text that followed (at
    temperature 0, exactly what verifying it would have accepted), so the reply learns that its
    copies hold, and drafts the later records' copies."""
    costs = SlowBatchCpu(0.03, 0.0, 0.016)
    keys = [10, 11, 12, 13, 14, 15, 16, 17]

    def record(i: int) -> list[int]:
        return [20 + i, 21 + i, *keys]  # two new tokens, then the keys again

    prompt = [1, 2, 3, 4]
    reply = [t for i in range(12) for t in record(3 * i)]

    drafts = decode_teacher_forced(AutoDrafter(None, LookupDrafter(), costs=costs), prompt, reply, costs)
    assert drafts and all(p.source == "lookup" for p in drafts)
    assert sum(len(p.tokens) for p in drafts) >= 3 * len(keys)  # later records' keys are drafted
    monkeypatch.setattr(CopyRounds, "follow", lambda self, tokens, end=False: None)
    blind = decode_teacher_forced(AutoDrafter(None, LookupDrafter(), costs=costs), prompt, reply, costs)
    assert not blind, "without following undrafted copies, the prior alone never drafts them"


def test_costs_a_busy_moment_inflated_do_not_rule_the_draft_out_for_good() -> None:
    """A draft length or the draft model ruled out by timings a busy moment inflated is never run, so
    never timed again: what rules it out for good, and what a probe hopes for, is judged at each
    cost's lowest recent timing."""
    costs = MeasuredCosts()
    for batch, seconds in ((1, 0.1), (4, 0.40), (4, 0.41), (4, 0.13), (1, 0.1)):
        costs.observe_verify(batch, seconds)
    for seconds in (0.10, 0.09, 0.04):  # the draft's step: timed twice while the machine was busy
        costs.observe_draft(1, seconds)
    draft = costs.draft_step()
    assert draft == pytest.approx(0.09)
    always = Acceptance(8, prior=1.0, weight=1e12)
    assert best_length(always, costs, draft, 3, 0.03).k == 0  # by the medians: never, even always right
    low = costs.optimistic()
    assert low.draft_step() == pytest.approx(0.04) and low.verify(4) == pytest.approx(0.13)
    auto = AutoDrafter(StaleDraft(4), LookupDrafter(), n_max=3, costs=costs)  # type: ignore[arg-type]
    assert not auto.rounds.cannot_pay(draft, 3)  # so it is not ruled out for good...
    auto.rounds.since = 10**6
    assert auto.rounds.probe_due([], draft, 3, 10**4)  # ...and a probe times it again
    costs.observe_verify(4, 0.13)  # a new timing: the reading follows it
    assert costs.optimistic().verify(4) == pytest.approx(0.13)


class FixedDraft:
    """A predictor that drafts ``k`` tokens every time it is asked (for choosing between sources)."""

    def __init__(self, source: Source):
        self.source = source
        self.p_min = 0.0

    def pending(self, tokens) -> int:
        return 1

    def begin(self, prompt, *, evaluate: bool = True) -> float:
        return 0.0

    def propose(self, tokens, k, params, rng, *, keep_going=None, grammar=None):
        from app.engine.drafting import Proposal

        return Proposal(tuple(range(7, 7 + k)), (None,) * k, (0.99,) * k, self.source, 0.0, 0.0, k - 1, 0.0)


def _timed(costs: MeasuredCosts, mtp: float, model: float, auto: AutoDrafter) -> None:
    """A CPU-like machine: a batch of b costs 1 + 0.3 (b - 1) steps of 0.1 s; the draft model's and
    the MTP head's steps as given (in target steps)."""
    for _ in range(3):
        for b in range(1, 10):
            costs.observe_verify(b, 0.1 * (1 + 0.3 * (b - 1)))
        costs.observe_draft(1, 0.1 * model)
        auto.mtp_costs.observe_draft(1, 0.1 * mtp)


def test_auto_drafts_with_whichever_predictor_pays_more_and_says_which_paused() -> None:
    from app.engine.auto import MeasuredCosts
    from app.engine.drafting import LookupDrafter
    from app.engine.sampling import SamplingParams

    text = [1, 2, 3, 4, 5, 6]
    for mtp_step, model_step, chosen in ((0.1, 0.6, Source.MTP), (2.0, 0.1, Source.MODEL)):
        costs = MeasuredCosts()
        auto = AutoDrafter(
            FixedDraft(Source.MODEL),
            LookupDrafter(),
            mtp=FixedDraft(Source.MTP),
            n_max=4,
            costs=costs,  # type: ignore[arg-type]
        )
        _timed(costs, mtp_step, model_step, auto)
        auto.begin(text)
        prop = auto.propose(text, 4, SamplingParams(), None)
        assert prop.source is chosen and prop.decision.source is chosen
        assert auto.mtp_costs.draft_step() == pytest.approx(0.1 * mtp_step)  # each its own step cost
        assert costs.draft_step() == pytest.approx(0.1 * model_step)
    # a head whose step costs more than any draft of it could save is paused, and the round says so
    costs = MeasuredCosts()
    auto = AutoDrafter(None, LookupDrafter(), mtp=FixedDraft(Source.MTP), n_max=4, costs=costs)  # type: ignore[arg-type]
    _timed(costs, 2.0, 1.0, auto)
    auto.begin(text)
    prop = auto.propose(text, 4, SamplingParams(), None)
    assert not prop.tokens and prop.decision.action is Action.PAUSED and prop.decision.source is Source.MTP
    state = auto.state()
    assert state["mtp"]["draft"] == pytest.approx(2.0)  # the head's cost is remembered with the rest
    again = AutoDrafter(None, LookupDrafter(), mtp=FixedDraft(Source.MTP), n_max=4, costs=MeasuredCosts())  # type: ignore[arg-type]
    again.restore(json.loads(json.dumps(state)))
    assert again.mtp_costs.state()["draft"] == pytest.approx(2.0)


def test_a_reply_tries_the_draft_early_and_keeps_it_while_it_is_right() -> None:
    """Where the class's estimate alone says the draft cannot pay but a plausible acceptance could,
    a reply drafts on hope from its first rounds while every draft was accepted in full (arithmetic,
    a list of records: the draft shows it at once), and stops at the first draft it got wrong."""
    from app.engine.drafting import LookupDrafter
    from app.engine.sampling import SamplingParams

    cheap = SyntheticCosts(base=0.1, slope=0.02, draft=0.02)
    auto = AutoDrafter(FixedDraft(Source.MODEL), LookupDrafter(), n_max=6, costs=cheap)  # type: ignore[arg-type]
    for c in range(len(MODEL_CLASSES)):  # known to be poor: the estimate plans no draft
        auto.evidence.predicted[Source.MODEL][c] = Acceptance(6, prior=0.3, weight=1e6)
    text = [1, 2, 3, 4, 5, 6]

    def round_(accepted_all: bool) -> Proposal:
        prop = auto.propose(text, 6, SamplingParams(), None)
        if prop.tokens:
            n = len(prop.tokens)
            auto.observe(prop, Outcome(Source.MODEL, n, n if accepted_all else 0, n + 1, 0.1, 0.12))
        return prop

    auto.begin(text)
    first = round_(True)
    assert first.tokens and first.decision.action is Action.DRAFT and first.decision.source is Source.MODEL
    assert round_(False).tokens  # right in full so far: tried again (and this one is wrong)
    assert not round_(True).tokens  # the try is over: the estimate rules
    auto.begin(text)  # a new reply tries again
    assert round_(True).tokens
