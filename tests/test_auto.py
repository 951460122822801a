"""Auto mode's draft model rounds: when to draft, probe or pause, catch-ups, and losslessness on real
tiny models."""

from __future__ import annotations

import json

import pytest
from auto_doubles import (
    CPU_LIKE,
    EXPENSIVE,
    GPU_LIKE,
    FixedDraft,
    RecordingDraft,
    StaleDraft,
    SureDraft,
    SyntheticCosts,
)

from app.engine import sampling
from app.engine.auto import (
    MODEL_CLASSES,
    Acceptance,
    AutoDrafter,
    MeasuredCosts,
    best_length,
    model_class,
)
from app.engine.auto.evidence import PLAIN
from app.engine.drafting import EMPTY, LookupDrafter, Outcome, Proposal
from app.engine.engine import Engine, GenerationSettings, LoadSettings
from app.engine.events import Action, Policy, Source, Step


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


def test_auto_reads_the_targets_confidence_only_while_a_draft_could_pay(engines, monkeypatch) -> None:
    """The target's confidence only picks the draft model's class; where the next step is queued its
    rows are read before the queue (2 % of a step on a fast GPU). Priced out, the model needs none."""
    reads: list[int] = []
    real = sampling.top_probability
    monkeypatch.setattr(sampling, "top_probability", lambda *a, **kw: reads.append(1) or real(*a, **kw))
    cheap, dear = engines
    for p in PROMPTS:
        steps(dear, p, n_max=6)
    auto = dear._drafter(GenerationSettings(mode="auto", n_max=6))
    assert auto.wants_target_confidence == 0 and not auto.target_confidence and not reads
    st = steps(cheap, PROMPTS[0], n_max=6)
    auto = cheap._drafter(GenerationSettings(mode="auto", n_max=6))
    assert auto.wants_target_confidence > 0 and len(auto.target_confidence) == auto.wants_target_confidence
    assert len(reads) >= len(st)  # every round's last tokens (and the draft's own, where it drafted)


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
        # a long reply where this tiny draft is wrong from its first drafts on (in others it is right
        # in full for a while, and auto rightly drafts on)
        st = steps(eng, "Hello world, this is", n_max=6, max_tokens=400)
    probes = [s for s in st if s.decision.action is Action.PROBE]
    assert any(s.decision.action is Action.PAUSED for s in st)
    assert probes and all(s.n_drafted <= 2 for s in probes)
    # each says what finding the draft that good would deliver: the gain it probes for
    assert all(s.decision.expected_speedup > 1.0 and 0.0 < s.decision.acceptance <= 1.0 for s in probes)


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
    # 1.2 standard errors short: the errors of three rounds are themselves a guess (Student's t with
    # two degrees of freedom asks 1.32 for the confidence one error gives with many rounds); six
    # such rounds are losing
    assert not losing([(1, 3.2), (4, 3.2), (1, 3.2)])
    assert losing([(1, 3.2), (4, 3.2), (1, 3.2)] * 2)


def test_student_t_quantiles() -> None:
    from app.engine.auto.evidence import student_t

    # exact one-sided quantiles at the normal's one standard error (0.8413)
    for df, exact in ((2, 1.3213), (3, 1.1969), (5, 1.1105), (10, 1.0526), (30, 1.0169)):
        assert student_t(1.0, df) == pytest.approx(exact, abs=2e-3)
    assert student_t(1.0, 1e9) == pytest.approx(1.0)


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


def test_the_loop_reports_the_targets_confidence_to_auto_mode(tiny_pair) -> None:
    # at costs where the draft model could pay (priced out, it needs none: the test above)
    settings = LoadSettings(str(tiny_pair.target), str(tiny_pair.draft), n_ctx=2048)
    with Engine(settings, costs=GPU_LIKE) as eng:
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


def test_a_round_that_measures_the_draft_drafts_the_tokens_it_times() -> None:
    """A draft whose step is not yet timed is measured by a round that drafts 2 tokens (the step after
    the first is what is timed). Where batches are dear (a tiny model timed at load: a batch of 2 at 2
    steps) the rule that stops a draft early would stop it after one token, and the draft would be
    measured in every round for ever."""
    costs = MeasuredCosts()
    for b, seconds in ((1, 0.1), (2, 0.2), (3, 0.3), (4, 0.4)):
        costs.observe_verify(b, seconds)
    draft = SureDraft(confidence=0.5)
    auto = AutoDrafter(draft, LookupDrafter(), n_max=6, costs=costs)  # type: ignore[arg-type]
    text = list(range(200, 260))  # no n-gram repeats
    auto.begin(text)
    prop = auto.propose(text, 6, None, None)  # type: ignore[arg-type]
    assert prop.decision.action is Action.MEASURE and draft.asked == [2] and prop.n_steps == 2
    auto.observe(prop, Outcome(Source.MODEL, len(prop.tokens), 0, 1 + len(prop.tokens), 0.1, 0.2))
    assert costs.draft_step() is not None


def _timed(costs: MeasuredCosts, mtp: float, model: float, auto: AutoDrafter) -> None:
    """A CPU-like machine: a batch of b costs 1 + 0.3 (b - 1) steps of 0.1 s; the draft model's and
    the MTP head's steps as given (in target steps)."""
    for _ in range(3):
        for b in range(1, 10):
            costs.observe_verify(b, 0.1 * (1 + 0.3 * (b - 1)))
        costs.observe_draft(1, 0.1 * model)
        auto.mtp_costs.observe_draft(1, 0.1 * mtp)


def test_auto_drafts_with_whichever_predictor_pays_more_and_says_which_paused() -> None:
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


class BehindDraft(FixedDraft):
    """A :class:`FixedDraft` that can be left behind: ``lag`` tokens of the text it has not seen."""

    def __init__(self, source: Source):
        super().__init__(source)
        self.lag = 1

    def pending(self, tokens) -> int:
        return self.lag


def _poor_but_cheap(known: float = 0.3) -> tuple[AutoDrafter, BehindDraft]:
    """Auto mode with a draft model whose classes are known to be poor (``known`` per token: the
    estimate plans no draft) on costs where a plausible acceptance would pay."""
    cheap = SyntheticCosts(base=0.1, slope=0.02, draft=0.02)
    draft = BehindDraft(Source.MODEL)
    auto = AutoDrafter(draft, LookupDrafter(), n_max=6, costs=cheap)  # type: ignore[arg-type]
    for c in range(len(MODEL_CLASSES)):
        auto.evidence.predicted[Source.MODEL][c] = Acceptance(6, prior=known, weight=1e6)
    return auto, draft


def _round(auto: AutoDrafter, text: list[int], accepted_all: bool) -> Proposal:
    from app.engine.sampling import SamplingParams

    prop = auto.propose(text, 6, SamplingParams(), None)
    if prop.tokens:  # the round takes what its parts cost
        n, costs = len(prop.tokens), auto.costs
        verify = costs.verify(n + 1)
        seconds = n * costs.draft_step() + verify
        auto.observe(prop, Outcome(Source.MODEL, n, n if accepted_all else 0, n + 1, verify, seconds))
    return prop


def test_a_reply_tries_the_draft_early_and_keeps_it_while_it_is_right() -> None:
    """Where the class's estimate alone says the draft cannot pay but a plausible acceptance could,
    a reply drafts on hope from its first rounds while every draft was accepted in full (arithmetic,
    a list of records: the draft shows it at once), and the try ends at the first draft it got
    wrong: a draft left behind by then is not taken up again on hope."""
    auto, draft = _poor_but_cheap()
    text = [1, 2, 3, 4, 5, 6]
    auto.begin(text)
    first = _round(auto, text, True)
    assert first.tokens and first.decision.action is Action.DRAFT and first.decision.source is Source.MODEL
    assert _round(auto, text, False).tokens  # right in full so far: tried again (and this one is wrong)
    draft.lag = 12  # the text went on without it
    assert not _round(auto, text, True).tokens  # the try is over: the estimate rules
    draft.lag = 1
    auto.begin(text)  # a new reply (the draft in step with its prompt) tries again
    assert _round(auto, text, True).tokens


def test_a_draft_in_step_goes_on_while_this_replys_acceptance_could_still_pay() -> None:
    """Once the try is over, a draft model in step with the text (nothing to catch up) goes on while
    this reply's acceptance, ``ENGAGED_ERRORS`` standard errors above its estimate, says a round
    could pay: stopping at break-even leaves the draft behind, and each later round that needs it
    pays a catch-up. Every wrong draft narrows the bound, so a draft that keeps failing stops, and
    stays stopped (no new evidence); right drafts keep it going."""
    auto, _ = _poor_but_cheap(known=0.15)
    text = [1, 2, 3, 4, 5, 6]
    auto.begin(text)
    assert _round(auto, text, True).tokens and _round(auto, text, False).tokens  # the try, then over
    drafted = [bool(_round(auto, text, False).tokens) for _ in range(12)]
    assert drafted[0], "one wrong draft in two does not rule this reply out"
    assert not drafted[-1], "wrong every time: the reply's own evidence rules it out"
    assert drafted == sorted(drafted, reverse=True)  # stopped for good once stopped
    auto.begin(text)  # a reply where the draft is right keeps it going past a wrong draft
    _round(auto, text, True), _round(auto, text, False)
    assert all(_round(auto, text, True).tokens for _ in range(10))
