"""Auto mode's copies: prompt lookup's matches, which copies are drafted and how far, and what they teach."""

from __future__ import annotations

import pytest
from auto_doubles import (
    CPU_LIKE,
    EXPENSIVE,
    GPU_LIKE,
    Avx512Cpu,
    EpycCpu,
    MeasuredCpu,
    OracleDraft,
    SlowBatchCpu,
    SureDraft,
    SyntheticCosts,
    decode_teacher_forced,
)

from app.engine.auto import (
    LOOKUP_CLASSES,
    LOOKUP_MAX,
    Acceptance,
    AutoDrafter,
    best_length,
    lookup_class,
)
from app.engine.auto.copies import CopyRounds
from app.engine.auto.evidence import PLAIN
from app.engine.drafting import EMPTY, LookupDrafter, Outcome, Proposal
from app.engine.engine import Engine, GenerationSettings, LoadSettings
from app.engine.events import Action, Declined, Source, Step


def test_lookup_reports_the_longest_recent_match() -> None:
    lk = LookupDrafter()
    text = [1, 2, 3, 9, 7, 7, 5, 6, 1, 2, 3, 4, 8, 8]  # "2 3" occurs twice; "1 2 3" twice
    lk.begin(text)
    prop = lk.propose([*text, 5, 6, 1, 2, 3], 4, None, None)  # type: ignore[arg-type]
    # "5 6 1 2 3" matched the copy starting at index 6 (5 tokens), not the first "1 2 3" (3 tokens)
    assert prop.match == 5 and prop.tokens == (4, 8, 8, 5)
    short = lk.propose([*text, 5, 6, 1, 2, 3, 4, 8, 0, 3, 9], 2, None, None)  # type: ignore[arg-type]
    assert short.match == 2 and short.tokens == (7, 7)


def test_lookup_finds_the_copy_that_goes_on_after_a_draft_and_keeps_no_trace_of_it() -> None:
    lk = LookupDrafter()
    text = [1, 2, 3, 9, 7, 7, 5, 6, 1, 2, 3, 4, 8, 8]
    lk.begin(text)
    after = lk.after([*text, 5], [6, 1, 2, 3], 3)
    # "5" then the draft "6 1 2 3" match the copy at index 6: it goes on with "4 8 8"
    assert after.match == 5 and after.tokens == (4, 8, 8) and after.origin == 11
    assert lk.after([*text, 5], [0, 0], 3).tokens == ()  # nothing follows "0 0" in the text
    # the draft's tokens were neither indexed nor taken as the copy in progress
    fresh = LookupDrafter()
    fresh.begin(text)
    for drafter in (lk, fresh):
        prop = drafter.propose([*text, 5, 6, 0, 3, 9], 2, None, None)  # type: ignore[arg-type]
        assert (prop.match, prop.tokens) == (2, (7, 7))


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


def test_lookup_says_when_equally_long_matches_go_on_differently() -> None:
    """Two earlier "1 2 3"s, one followed by 4 and one by 5: a coin flip between texts, not a copy."""
    lk = LookupDrafter()
    text = [7, 1, 2, 3, 4, 9, 8, 1, 2, 3, 5, 9]
    lk.begin(text)
    flip = lk.propose([*text, 6, 1, 2, 3], 2, None, None)  # type: ignore[arg-type]
    assert flip.match == 3 and flip.ambiguous
    longer = lk.propose([*text, 6, 8, 1, 2, 3], 2, None, None)  # type: ignore[arg-type]
    assert longer.match == 4 and longer.tokens == (5, 9) and not longer.ambiguous  # "8 1 2 3" is one
    same = LookupDrafter()
    agreeing = [7, 1, 2, 3, 4, 9, 8, 1, 2, 3, 4, 0]
    same.begin(agreeing)
    assert not same.propose([*agreeing, 6, 1, 2, 3], 2, None, None).ambiguous  # type: ignore[arg-type]


def test_an_ambiguous_short_match_is_judged_in_a_class_of_its_own() -> None:
    """Teacher-forced over the recorded replies, such a copy's first token was right 23 % of the time:
    where a copy after the same match length would be drafted, the ambiguous one is not."""
    from app.engine.auto.priors import AMBIGUOUS

    cpu = MeasuredCpu(0.1, 0.0, 0.05)
    auto = AutoDrafter(None, LookupDrafter(), n_max=6, costs=cpu)
    assert auto.copies.lookup_class(4, 10, ambiguous=True) == AMBIGUOUS
    assert auto.copies.lookup_class(4, 10) == lookup_class(4)
    assert auto.copies.lookup_class(12, 10, ambiguous=True) == lookup_class(12)  # a copy in progress
    for sure in (0, 1):
        plain_match = auto.evidence.copied[Source.LOOKUP][lookup_class(4)][sure]
        ambiguous = auto.evidence.copied[Source.LOOKUP][AMBIGUOUS][sure]
        assert best_length(plain_match, cpu, 0.0, 8, 0.03).k > 0
        assert best_length(ambiguous, cpu, 0.0, 8, 0.03).k == 0


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
        len(auto.evidence.copied[Source.LOOKUP]) == len(LOOKUP_CLASSES) + 2
    )  # and the classes of a resumed copy and of an ambiguous match


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


def test_a_copy_that_goes_on_in_this_reply_is_drafted_further() -> None:
    """Positions a reply has not drafted yet follow the deepest it has: copies that keep going at
    positions 1-2 are drafted long, copies that stop there are not, and the draft model is not."""
    from app.engine.auto.acceptance import ReplyAcceptance

    costs = Avx512Cpu(0.1, 0.0, 0.05)
    first, rest = LOOKUP_CLASSES[1][1]  # a 3-5 token match in a reply that is copying

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


def test_copies_offered_but_not_drafted_are_followed_as_evidence(monkeypatch) -> None:
    """Where short matches do not pay by their class's prior, a reply of records copies each earlier
    record undrafted. Each copy offered and not drafted is checked against the text that followed (at
    temperature 0, exactly what verifying it would have accepted), so the reply learns that its
    copies hold (by class, and that it is copying), and drafts the later records' copies."""
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
    monkeypatch.setattr(CopyRounds, "check", lambda self, tokens, reply: self.breaks.check(tokens) and 0)
    blind = decode_teacher_forced(AutoDrafter(None, LookupDrafter(), costs=costs), prompt, reply, costs)
    assert not blind, "without following undrafted copies, the prior alone never drafts them"


def records(values: list[int]) -> list[int]:
    """Records of the same shape (a key, a value, more keys) with these values."""
    out: list[int] = []
    for v in values:
        out += [10, 11, 12, 13, v, 20, 21, 22, 23, 24, 25, 26, 27, 28, v + 1, 30, 31]
    return out


def test_a_copy_goes_on_where_the_draft_models_draft_ends() -> None:
    """Records with new values: prompt lookup alone breaks at each value, the draft model writes the
    values, and the copy of the records' shape goes on after its draft in the same batch."""
    prompt, reply = [1, 2, *records([50, 60, 70])], records([80, 90, 100, 110, 120, 130])
    auto = AutoDrafter(OracleDraft(prompt, reply), LookupDrafter(), n_max=4, costs=GPU_LIKE)  # type: ignore[arg-type]
    drafts = decode_teacher_forced(auto, prompt, reply, GPU_LIKE)
    after = [p for p in drafts if p.copied]
    assert after and all(p.source is Source.MODEL and len(p.tokens) > p.copied for p in after)
    assert all(p.decision.copied == p.copied and p.decision.match == p.match for p in after)
    assert max(p.copied for p in after) > 4  # past what the draft model may draft in a round
    # the copy is judged as a copy: its class learned that it held
    held = [e.hits[0] for (s, _, _), e in auto.evidence.reply.items() if s is Source.LOOKUP]
    assert max(held) > 0
    assert len(reply) / len(drafts) > 5  # a round delivers more than the draft model's n_max + 1


def test_a_copy_after_the_draft_is_not_added_where_batches_are_dear() -> None:
    prompt, reply = [1, 2, *records([50, 60, 70])], records([80, 90, 100, 110])
    auto = AutoDrafter(OracleDraft(prompt, reply), LookupDrafter(), n_max=4, costs=EXPENSIVE)  # type: ignore[arg-type]
    assert not any(p.copied for p in decode_teacher_forced(auto, prompt, reply, EXPENSIVE))


def test_a_copy_after_the_draft_is_verified_losslessly_by_llama_cpp(tmp_path) -> None:
    """A model whose next token depends on the current one alone runs in a cycle; the prompt holds
    part of that cycle and ends where the reply will reach it in a few tokens. The draft model (the
    model itself) drafts the way in, prompt lookup copies the cycle after its draft, and the output
    is plain decoding's."""
    from app.tiny_gguf import write_tiny_llama

    path = write_tiny_llama(tmp_path / "cycle.gguf", seed=1, memoryless=True)
    with Engine(LoadSettings(str(path), str(path), n_ctx=512), costs=GPU_LIKE) as eng:
        walk = eng.run([5], GenerationSettings(mode="plain", max_tokens=80)).tokens
        start = next(i for i, t in enumerate(walk) if t in walk[i + 1 :])  # where the cycle begins
        cycle = walk[start : walk.index(walk[start], start + 1)]
        assert 8 <= len(cycle) <= 40 and start >= 2
        prompt = [*cycle[: len(cycle) // 2], 5]
        plain = eng.run(prompt, GenerationSettings(mode="plain", max_tokens=60)).tokens
        events = eng.generate(prompt, GenerationSettings(mode="auto", max_tokens=60))
        steps = [e for e in events if isinstance(e, Step)]
    assert tuple(t for s in steps for t in s.tokens) == plain
    after = [s for s in steps if s.decision.copied]
    assert after and all(s.drafter is Source.MODEL for s in after)
    assert any(s.n_accepted > s.n_drafted - s.decision.copied for s in after)  # copied tokens accepted


def test_a_copy_is_judged_by_whether_the_reply_is_copying() -> None:
    """A reply is copying while at least COVERED_SHARE of its tokens held to a copy lookup offered
    before them (drafted or not). A 6-token match's copy is judged at that class's prior for a copying
    reply there, and at the lower one in a reply that writes text of its own: on a CPU where a batch
    of 2 costs 1.9 steps, only the first pays."""
    costs = SlowBatchCpu(0.03, 0.0, 0.016)
    prompt = list(range(100, 140))
    match = list(range(120, 126))
    copying = [*range(100, 120), *range(500, 510), *match]  # copies the prompt, then its own text
    fresh = [*range(600, 630), *match]
    for reply, drafts in ((copying, True), (fresh, False)):
        auto = AutoDrafter(None, LookupDrafter(), costs=costs)
        decode_teacher_forced(auto, prompt, reply, costs)
        prop = auto.propose([*prompt, *reply], 3, None, None)  # type: ignore[arg-type]
        assert (prop.decision.declined or prop.decision).match == len(match)
        assert auto.evidence.copying == drafts
        assert prop.tokens == ((126, 127, 128) if drafts else ()), prop.decision
