"""Auto mode's costs: the draft-length choice from a cost model, timing batches and the draft online."""

from __future__ import annotations

from collections import Counter

import pytest
from auto_doubles import (
    CPU_LIKE,
    EXPENSIVE,
    GPU_LIKE,
    StaleDraft,
    SureDraft,
    SyntheticCosts,
)

from app.engine.auto import (
    LOOKUP_MAX,
    Acceptance,
    AutoDrafter,
    MeasuredCosts,
    best_length,
)
from app.engine.auto.costs import DraftCosts
from app.engine.auto.planner import continue_rule
from app.engine.drafting import LookupDrafter, Outcome, Proposal
from app.engine.engine import Engine, LoadSettings
from app.engine.events import Source
from app.engine.llama import Context, Model
from app.engine.loading import warm_up
from app.engine.speculative import TargetCache


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


def test_the_step_plain_rounds_are_planned_at_is_one_timed_in_a_run() -> None:
    """On CUDA a step timed between two batch sizes runs without its CUDA graph: on an H200 it took
    5.17 ms where plain decoding took 4.07 ms a token. The step is the one timed back to back; each
    batch keeps its cost relative to the steps beside it, in seconds as the machine is now."""
    from app.engine.loading import relative_to_neighbours

    between, run = 5.17e-3, [4.1e-3, 4.07e-3, 4.0e-3]
    timed = [(1, between), (2, 5.71e-3), (4, 7.03e-3), (1, between)]
    costs = MeasuredCosts()
    for batch, seconds in relative_to_neighbours(timed, run=run):
        costs.observe_verify(batch, seconds)
    assert costs.verify(1) == pytest.approx(4.07e-3)
    assert costs.verify(2) == pytest.approx(5.71e-3) and costs.ratio(2) == pytest.approx(5.71 / 4.07)
    # without a run (a record from before), the steps between the batches are the step
    assert dict(relative_to_neighbours(timed))[1] == pytest.approx(between)


def test_measured_costs_keep_samples_taken_before_the_first_step() -> None:
    costs = MeasuredCosts()
    costs.observe_verify(4, 0.2)
    costs.observe_draft(2, 0.1)
    assert costs.verify(4) is None and costs.draft_step() is None
    costs.observe_verify(1, 0.1)
    assert costs.verify(4) == pytest.approx(0.2) and costs.draft_step() == pytest.approx(0.05)


def test_acceptance_calibration_by_confidence() -> None:
    acc = Acceptance(4, weight=1.0)
    for _ in range(100):
        acc.observe(2, 1, [0.95, 0.15])  # confident tokens accepted, unconfident rejected
    assert acc.calibrated(0.95) > 0.9
    assert acc.calibrated(0.15) < 0.1
    assert acc.alpha(0) > 0.9 and acc.alpha(1) < 0.1


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


class Counted(TargetCache):
    """A target cache that counts the batch sizes it evaluates."""

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        self.evaluated: Counter[int] = Counter()
        self.order: list[int] = []

    def verify_batch(self, pending: int, draft: list[int]) -> None:
        self.evaluated[len(draft) + 1] += 1
        self.order.append(len(draft) + 1)
        super().verify_batch(pending, draft)


class Timings(MeasuredCosts):
    """Costs that count the timings they are given, per batch size."""

    def __init__(self) -> None:
        super().__init__()
        self.timed: Counter[int] = Counter()

    def observe_verify(self, batch: int, seconds: float) -> None:
        self.timed[batch] += 1
        super().observe_verify(batch, seconds)

    def observe_draft(self, n_tokens: int, seconds: float) -> None:
        self.timed[0] += n_tokens
        super().observe_draft(n_tokens, seconds)


class Decodes(Context):
    """A context that records the size of each evaluation."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.sizes: list[int] = []

    def decode(self, tokens, pos0, **kwargs):  # type: ignore[no-untyped-def, override]
        self.sizes.append(len(tokens))
        return super().decode(tokens, pos0, **kwargs)


@pytest.mark.parametrize("on_gpu", [False, True])
def test_a_gpus_first_evaluation_of_each_batch_size_is_not_timed(tiny_pair, on_gpu: bool) -> None:
    """A GPU loads (compiles) each batch size's kernels and grows its buffers on first use: on an H200
    a batch of 64 evaluated first costs 9.0 decode steps, 3.0 after. There the warm-up evaluates every
    size once before it times any; a CPU, whose first evaluations cost what later ones do, is spared it."""
    model = Model(tiny_pair.target)
    try:
        seq = Counted(Context(model, n_ctx=512, n_threads=1))
        costs = Timings()
        warm_up(seq, model.n_vocab, None, costs, on_gpu=on_gpu)
        sizes = [b for b in Engine.WARM_UP_BATCHES if b > 1]
        untimed = {b: seq.evaluated[b] - costs.timed[b] for b in sizes}
        assert untimed == {b: 1 if on_gpu or b == 4 else 0 for b in sizes}
        assert all(costs.samples(b) for b in sizes)  # every size still timed
        seq.ctx.close()
    finally:
        model.close()


def test_loading_times_the_step_in_a_run_after_the_batches(tiny_pair) -> None:
    """The warm-up ends with steps evaluated back to back; the step auto mode starts from is timed
    there (all but the first of the run), not between two batch sizes."""
    from app.engine.loading import RUN_STEPS

    model = Model(tiny_pair.target)
    try:
        seq = Counted(Context(model, n_ctx=512, n_threads=1))
        costs = Timings()
        warm_up(seq, model.n_vocab, None, costs)
        assert RUN_STEPS >= 3 and seq.order[-(RUN_STEPS + 1) :] == [1] * (RUN_STEPS + 1)
        assert seq.order[-(RUN_STEPS + 2)] > 1  # the run follows the last batch's neighbour step
        assert costs.timed[1] == RUN_STEPS - 1
        seq.ctx.close()
    finally:
        model.close()


def test_loading_times_the_drafts_steps_as_a_round_drafts(tiny_pair) -> None:
    """The draft's step is timed after a batch of 2, as in a round that drafts (on CUDA a step there
    runs without its graph, where steps back to back would replay it); its first round untimed."""
    from app.engine.loading import DRAFT_STEPS

    model, draft = Model(tiny_pair.target), Model(tiny_pair.draft)
    try:
        seq = TargetCache(Context(model, n_ctx=512, n_threads=1))
        ctx = Decodes(draft, n_ctx=512, n_threads=1)
        costs = Timings()
        warm_up(seq, model.n_vocab, ctx, costs)
        assert ctx.sizes == ([2] + [1] * DRAFT_STEPS) * 3
        assert costs.timed[0] == 2 * DRAFT_STEPS and costs.draft_step()
        ctx.close()
        seq.ctx.close()
    finally:
        draft.close()
        model.close()


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


def test_the_lowest_costs_follow_every_timing_while_kept_between_them() -> None:
    """Auto mode reads the lowest recent costs every round; they are kept while no timing changes them
    (a step above the lowest), and follow a lower step, a batch or a draft step at once."""
    costs = MeasuredCosts()
    for batch, seconds in ((1, 0.10), (4, 0.20), (1, 0.12)):
        costs.observe_verify(batch, seconds)
    draft = DraftCosts(costs)
    draft.observe_draft(1, 0.05)
    low, low_draft = costs.optimistic(), draft.optimistic()
    costs.observe_verify(1, 0.11)  # above the lowest step: the same costs
    assert costs.optimistic() is low and draft.optimistic() is low_draft
    costs.observe_verify(1, 0.08)
    assert costs.optimistic().verify(1) == pytest.approx(0.08)
    assert draft.optimistic().verify(1) == pytest.approx(0.08)
    costs.observe_verify(4, 0.09)  # a batch of 4 in about one step
    assert costs.optimistic().verify(4) < low.verify(4)
    before = draft.optimistic().draft_step()
    draft.observe_draft(1, 0.01)
    assert draft.optimistic().draft_step() < before
