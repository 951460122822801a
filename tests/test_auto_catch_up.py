"""Auto mode's catch-ups of the draft model and its probes: what a round is charged for the text the draft
has not seen, and when finding out is worth that."""

from __future__ import annotations

import json

import pytest
from auto_doubles import (
    CPU_LIKE,
    EXPENSIVE,
    GPU_LIKE,
    RecordingDraft,
    StaleDraft,
    SureDraft,
    SyntheticCosts,
)

from app.engine.auto import (
    MODEL_CLASSES,
    REPLY_MIN,
    Acceptance,
    AutoDrafter,
)
from app.engine.auto.evidence import PLAIN
from app.engine.auto.priors import RELAX
from app.engine.drafting import EMPTY as EMPTY_PROPOSAL
from app.engine.drafting import LookupDrafter, Outcome, Proposal, common_prefix
from app.engine.engine import Engine, GenerationSettings, LoadSettings
from app.engine.events import Source, Step


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


def test_a_probe_is_worth_the_seconds_drafting_could_save_over_the_rest_of_the_reply() -> None:
    """The rest of a reply has its tokens whatever decodes them: drafting at S times plain decoding's
    speed saves ``1 - 1/S`` of their plain time (not ``S - 1`` of it: at 3x that would count three
    times what can be saved). A probe is due once that saving, at the odds that drafting pays, covers
    its catch-up."""
    from app.engine.auto.priors import SYNC_SHARE
    from app.engine.drafting import LookupDrafter

    behind = 2000
    auto = AutoDrafter(StaleDraft(behind), LookupDrafter(), n_max=6, costs=GPU_LIKE)  # type: ignore[arg-type]
    auto.rounds.since = 10**6
    d = GPU_LIKE.draft_step()

    def due(rest: int) -> bool:
        return auto.rounds.probe_due([], d, 6, rest)

    lo, hi = 1, 10**7
    assert not due(lo) and due(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if due(mid) else (mid, hi)
    speedup = auto.rounds.hoped[0]
    assert speedup > 2.0  # verifying is nearly free: the hoped speedup is large, and the two rules far apart
    catch_up = behind * SYNC_SHARE * d  # its own round costs less than the plain steps it replaces
    saved = auto.rounds.odds() * (1 - 1 / speedup) * hi * GPU_LIKE.verify(1)
    assert saved == pytest.approx(catch_up, rel=0.01)


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


def test_the_draft_never_evaluates_the_prompt_up_front() -> None:
    """Up front or caught up when a round first drafts with it, the draft's work on the prompt is the
    same; up front it is spent, before the first token, in every reply the draft then does not
    draft in. So the draft catches up when it drafts, wherever it could pay."""
    for costs in (GPU_LIKE, CPU_LIKE, EXPENSIVE):
        draft = RecordingDraft()
        auto = AutoDrafter(draft, LookupDrafter(), n_max=6, costs=costs)  # type: ignore[arg-type]
        auto.begin([1, 2, 3])
        auto.begin([1, 2, 3, 4])
        assert draft.evaluate == [False, False], costs


def test_the_rest_of_a_reply_is_expected_from_the_recent_replies() -> None:
    """Once replies have ended, a reply expects the rest that the recent replies longer than it so
    far had after that point (the Lindy guess weighing as one of them); the lengths are kept in the
    memory file."""
    text = list(range(300, 700))
    auto = AutoDrafter(None, LookupDrafter(), n_max=6, costs=CPU_LIKE)
    for n in (96, 96, 96, 20):  # four replies: three of 96 tokens, one of 20
        auto.begin(text[:10])
        for _ in range(n):
            auto.observe(EMPTY_PROPOSAL, Outcome(Source.NONE, 0, 0, 1, 0.1, 0.1))
    assert list(auto.lengths) == [96, 96, 96]  # the last is counted once the next reply begins...
    assert auto.state()["lengths"] == [96, 96, 96, 20]  # ...and saved as it ends
    auto.begin(text[:10])
    assert list(auto.lengths) == [96, 96, 96, 20]
    assert auto.expected_rest(0) == pytest.approx((96 * 3 + 20 + REPLY_MIN) / 5)
    assert auto.expected_rest(50) == pytest.approx((46 * 3 + 50) / 4)  # the 20-token reply is over
    assert auto.expected_rest(200) == 200  # longer than any: as long as so far
    saved = json.loads(json.dumps(auto.state()))
    assert saved["lengths"] == [96, 96, 96, 20]
    later = AutoDrafter(None, LookupDrafter(), n_max=6, costs=CPU_LIKE)
    later.restore(saved)
    assert later.expected_rest(0) == pytest.approx(auto.expected_rest(0))
    odd = AutoDrafter(None, LookupDrafter(), n_max=6, costs=CPU_LIKE)
    odd.restore({"lengths": [3, "x"]})  # a record that is not one is ignored
    assert odd.state()["lengths"] == []


def test_a_catch_up_token_costs_the_slope_of_catch_ups_once_their_sizes_differ() -> None:
    """On a GPU a catch-up batch of hundreds costs about what one of a few does: priced at what the
    few cost per token, catching up a long conversation would look tens of times dearer than it is."""
    from dataclasses import replace

    auto = AutoDrafter(SureDraft(pending=3), LookupDrafter(), n_max=6, costs=GPU_LIKE)  # type: ignore[arg-type]
    rounds = auto.rounds
    assert rounds is not None
    first = Proposal((5,), (None,), (0.9,), Source.MODEL, 0.01)
    outcome = Outcome(Source.MODEL, 1, 1, 2, 0.01, 0.012)
    for n in (3, 4, 3):  # small catch-ups only: their cost per token
        rounds.observe(replace(first, n_sync=n, t_sync=0.003 + 0.00001 * n), outcome, 0.012, 0.0)
    assert rounds.sync_per_token(0.002) == pytest.approx(rounds.sync_cost.value)
    rounds.observe(replace(first, n_sync=400, t_sync=0.003 + 0.00001 * 400), outcome, 0.012, 0.0)
    # the slope, 0.01 ms a token, at least what the largest batch cost per token
    assert rounds.sync_per_token(0.002) == pytest.approx((0.003 + 0.004) / 400)
    # kept in the memory file (in decode steps): the next session prices catch-ups so from its start
    again = AutoDrafter(SureDraft(pending=3), LookupDrafter(), n_max=6, costs=GPU_LIKE)  # type: ignore[arg-type]
    again.restore(json.loads(json.dumps(auto.state())))
    assert again.rounds is not None
    assert again.rounds.sync_per_token(0.002) == pytest.approx((0.003 + 0.004) / 400, rel=1e-3)
    again.restore({"model": {"syncs": [[400, "x"], [2, 1.0], "y"]}})  # not a record: skipped
    assert again.state()["model"]["syncs"] == auto.state()["model"]["syncs"]
    cpu = AutoDrafter(SureDraft(pending=3), LookupDrafter(), n_max=6, costs=CPU_LIKE)  # type: ignore[arg-type]
    assert cpu.rounds is not None
    for n in (3, 40, 4, 120):  # on a CPU the cost grows with the batch: the slope is about the mean
        cpu.rounds.observe(replace(first, n_sync=n, t_sync=0.01 * n), outcome, 0.1, 0.0)
    assert cpu.rounds.sync_per_token(0.02) == pytest.approx(0.01)


def test_the_rest_of_a_reply_is_expected_to_be_as_long_as_the_reply_so_far() -> None:
    """Before any reply has ended: within the token budget, and at least REPLY_MIN tokens, a reply n
    tokens long is as likely to be past its middle as not."""
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


def test_accepted_draft_tokens_are_not_counted_as_catch_up(tiny_pair) -> None:
    """After a drafted round the draft lags by at most its last draft token and the target's token."""
    with Engine(LoadSettings(str(tiny_pair.target), str(tiny_pair.draft), n_ctx=2048)) as eng:
        model = eng._model_drafter
        assert model is not None
        prompt = eng.tokenize("One, two, three, one, two, three, one, two,")
        gs = GenerationSettings(mode="speculative", n_max=4, adaptive=False, max_tokens=24)
        evs = list(eng.generate(prompt, gs))
        drafted = [e for e in evs if isinstance(e, Step) and e.n_drafted]
        assert drafted and any(e.n_accepted for e in drafted)
        text = [*prompt, *evs[-1].tokens]
        keep = common_prefix(model.seq.tokens, text)
        assert model.pending(text) == max(1, len(text) - keep) <= 2


def _probe(auto: AutoDrafter, accepted: int, seconds: float) -> None:
    """One probe of two tokens, ``accepted`` of them accepted, its round ``seconds`` long."""
    auto.rounds.probing = True
    probe = Proposal((5, 6), (None, None), (0.9, 0.9), Source.MODEL, 0.01, n_steps=1, t_steps=0.001)
    auto.observe(probe, Outcome(Source.MODEL, 2, accepted, 3, 0.01, seconds))


def test_probes_are_priced_at_what_they_took_and_their_odds_are_learned() -> None:
    """On a GPU a probe's catch-up, steps and batch after plain rounds take several plain steps: a
    probe is priced at what probes really took beyond plain rounds' time for their tokens, and the
    odds that a probe finds drafting paying are this pair's record (the prior as much as a few
    probes), so probes that never lead to drafting stop."""
    costs = SyntheticCosts(base=0.010, slope=0.0002, draft=0.0005)  # drafting would pay a lot
    auto = AutoDrafter(StaleDraft(20), LookupDrafter(), n_max=6, costs=costs)  # type: ignore[arg-type]
    auto.rounds.cls = len(MODEL_CLASSES) - 1
    for _ in range(8):
        auto.evidence.realized[PLAIN].add(1, 0.010)  # plain rounds: 10 ms a token
    auto.rounds.since, auto.rest = 10**6, 40
    assert auto.rounds.probe_due([], costs.draft_step(), 6, auto.rest)
    assert auto.rounds.odds() == 0.25
    # the draft is never right where the loop's plans say it could be: each probe is a failure
    auto.evidence.predicted[Source.MODEL][-1] = Acceptance(6, prior=0.0, weight=1e6)
    auto.evidence.begin()  # (this reply's estimates follow)
    for _ in range(3):
        _probe(auto, 0, 1.010)  # a second for a token plain rounds make in 10 ms
    assert auto.rounds.probe_loss.value == pytest.approx(1.0)
    assert auto.rounds.odds() == pytest.approx(1 / 7)
    auto.evidence.predicted[Source.MODEL][-1] = Acceptance(6, prior=0.97, weight=3.0)
    auto.evidence.begin()
    auto.rounds.since = 10**6
    assert not auto.rounds.probe_due([], costs.draft_step(), 6, auto.rest)  # a second lost for little
    auto.rest = 10**4
    assert auto.rounds.probe_due([], costs.draft_step(), 6, auto.rest)  # a long rest still pays for it
    # what was learned is kept for the pair and machine, its record weighing a bounded number of probes
    state = auto.rounds.state()
    again = AutoDrafter(StaleDraft(20), LookupDrafter(), n_max=6, costs=costs)  # type: ignore[arg-type]
    again.rounds.restore(state)
    assert again.rounds.odds() == pytest.approx(1 / 7)
    assert again.rounds.probe_loss.value == pytest.approx(1.0)
    again.rounds.restore({"probes": [0, 400], "probe_loss": -1.0})
    assert again.rounds.probes == [0.0, 16.0]
    for bad in ({"probes": [5, 2]}, {"probes": "x"}, {"probes": [1, 2, 3]}, {"probe_loss": 1e9}):
        fresh = AutoDrafter(StaleDraft(20), LookupDrafter(), n_max=6, costs=costs)  # type: ignore[arg-type]
        fresh.rounds.restore(bad)
        assert fresh.rounds.probes == [0.0, 0.0] and fresh.rounds.probe_loss.n == 0


def test_a_probe_that_starts_drafted_rounds_is_judged_by_what_they_delivered() -> None:
    """A probe after which the plan drafts again found drafting paying only if the rounds it started
    delivered more tokens/s than plain rounds: on a GPU a right probe can restart rounds that then
    lose, and counting it as a find kept the probes coming."""
    costs = SyntheticCosts(base=0.010, slope=0.0002, draft=0.0005)
    auto = AutoDrafter(StaleDraft(20), LookupDrafter(), n_max=6, costs=costs)  # type: ignore[arg-type]
    auto.rounds.cls = len(MODEL_CLASSES) - 1
    kind = auto.rounds.kind()
    for plain_seconds, found in ((0.002, False), (0.050, True)):
        for _ in range(3):
            auto.evidence.realized[PLAIN].add(1, plain_seconds)
        _probe(auto, 2, 0.030)  # right in full: the plan drafts again
        assert auto.rounds._after_probe == kind
        for _ in range(3):
            auto.evidence.realized[kind].add(3, 0.030)  # 100 tokens/s against plain's 500, or 20
        auto.rounds.begin()  # the reply ended: the rounds are judged
        assert auto.rounds._after_probe is None
        assert auto.rounds.probes == ([0.0, 1.0] if not found else [1.0, 2.0])
        auto.evidence.realized[PLAIN].rounds.clear()
    assert auto.rounds.odds() == pytest.approx(2 / 6)


class _TimedAlone(SyntheticCosts):
    """Costs whose lowest recent timings (the load's batches timed back to back) are below what rounds
    take: a GPU, where a round after plain rounds pays another batch size's kernels and graphs."""

    def __init__(self, low: SyntheticCosts, **median: float):
        super().__init__(**median)
        self.low = low

    def optimistic(self) -> SyntheticCosts:
        return self.low


def test_a_probes_hope_is_planned_on_the_lowest_costs_scaled_by_what_rounds_took_over_them() -> None:
    """A probe hopes on the lowest recent costs (a timing a busy moment inflated must not rule the
    draft out for good); the overrun that scales that hope is measured against those same costs, so
    rounds that never come near them (on a GPU, 1.5-2x the load's timings) stop the probes, and a
    session starts from what the last one measured."""
    low = SyntheticCosts(base=0.010, slope=0.0015, draft=0.003)
    costs = _TimedAlone(low, base=0.010, slope=0.004, draft=0.008)
    auto = AutoDrafter(StaleDraft(2), LookupDrafter(), n_max=6, costs=costs)  # type: ignore[arg-type]
    auto.rounds.cls = len(MODEL_CLASSES) - 1
    auto.rounds.since, auto.rest = 10**6, 10**6
    assert auto.rounds.probe_due([], costs.draft_step(), 6, auto.rest)  # on the lowest costs it would pay
    for _ in range(3):  # probes taking what the median costs predict, nowhere near the lowest
        _probe(auto, 2, 2 * costs.draft_step() + costs.verify(3))
    assert auto.rounds.overrun() == pytest.approx(1.0)
    assert auto.rounds.overrun(low=True) == pytest.approx(0.034 / (0.006 + low.verify(3)))
    auto.rounds.since = auto.rounds._probe_interval  # a probe's interval has passed
    assert not auto.rounds.probe_due([], costs.draft_step(), 6, auto.rest)
    _probe(auto, 2, 0.5)  # one round a busy moment slowed 15-fold does not move it (the earlier
    # ones have faded for the rounds since they were timed: see the next test)
    faded = 1 + (0.034 / (0.006 + low.verify(3)) - 1) * RELAX ** (auto.rounds._probe_interval - 1)
    assert auto.rounds.overrun(low=True) == pytest.approx(faded)
    # kept for the pair and machine, and bounded, as the overrun is
    again = AutoDrafter(StaleDraft(2), LookupDrafter(), n_max=6, costs=costs)  # type: ignore[arg-type]
    again.rounds.restore(auto.rounds.state())
    assert again.rounds.overrun(low=True) == pytest.approx(auto.rounds.overrun(low=True), rel=1e-4)
    again.rounds.restore({"overrun_low": 9.0})
    assert max(again.rounds.overrun_low_window.samples) == 4.0


def test_an_overrun_not_timed_again_fades_so_a_busy_moment_cannot_pause_the_draft_for_good() -> None:
    """Only rounds that draft time the overrun: rounds a busy moment slowed twofold would otherwise
    keep the draft paused and unprobed for the session, and the next (the memory file keeps it). It
    fades toward none as acceptance evidence does (RELAX a round), until a probe times it again."""
    low = SyntheticCosts(base=0.010, slope=0.0015, draft=0.003)
    costs = _TimedAlone(low, base=0.010, slope=0.004, draft=0.008)
    auto = AutoDrafter(StaleDraft(2), LookupDrafter(), n_max=6, costs=costs)  # type: ignore[arg-type]
    auto.rounds.cls = len(MODEL_CLASSES) - 1
    auto.rest = 10**6
    busy = 2 * (2 * low.draft_step() + low.verify(3))  # twice what the lowest costs predict
    for _ in range(5):
        _probe(auto, 2, 2.5 * busy)
    assert auto.rounds.overrun(low=True) == 2.0  # (bounded)
    paused = auto.rounds._probe_interval
    auto.rounds.since = paused
    assert not auto.rounds.probe_due([], costs.draft_step(), 6, auto.rest)
    saved = auto.rounds.state()["overrun_low"]
    for _ in range(600):  # rounds without the draft
        auto.rounds.since += 1
        if auto.rounds.probe_due([], costs.draft_step(), 6, auto.rest):
            break
    else:
        raise AssertionError("the draft was never probed again")
    faded = auto.rounds.overrun(low=True)
    assert 1.0 < faded < 2.0
    assert faded == pytest.approx(1 + (5.0 - 1) * RELAX ** (auto.rounds.since - 1), rel=1e-6)
    # the memory file keeps it as faded as it has become
    assert auto.rounds.state()["overrun_low"] == pytest.approx(faded, abs=1e-4)
    assert saved == pytest.approx(1 + 4.0 * RELAX ** (paused - 1), abs=1e-4)
    # a probe times it again: what it took counts beside the faded timings, which fade no further
    _probe(auto, 2, 2 * low.draft_step() + low.verify(3))
    assert auto.rounds.since == 0 and auto.rounds.overrun_low_window.n == 6
    assert auto.rounds.overrun(low=True) == pytest.approx(faded, rel=1e-6)
