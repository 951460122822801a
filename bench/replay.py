"""Replay auto mode on recorded replies: free of noise, in about a minute.

A benchmark run on a shared 2-core machine moves by 5-20 % per category between runs, so a change to
auto mode worth 3 % cannot be seen in one. This replays auto mode's policy on the plain replies a
``tandem bench`` run recorded, teacher-forced: each round the policy plans a draft for the recorded
text so far, the draft is checked against the recorded reply, and the round is charged fixed costs
(relative to one decode step): the target's verify cost of its batch, and for the draft model what it
costs to evaluate the tokens it catches up with and each token it drafts. The target's confidence in
each token, which the policy reads, comes from one batched pass over each reply; so do the draft
model's greedy predictions (a greedy draft agrees with the reply exactly as far as the draft model's
prediction, given the reply so far, does)::

    python -m bench.replay bench/results/a.json

Prints the modeled speedup per category of auto mode's prompt-lookup policy alone, of auto mode with
the draft model, of fixed drafting with the draft model (``spec3``, ``spec5``; set against what the
run measured for them, to show how far the fixed costs are to be trusted), and of an all-knowing
lookup policy (the lookup bound). Verify costs are the run's own (``tandem bench`` records what its
engine measured) or ``--ratios``; the draft model's are measured now or given as ``--draft-ratios``.
With ``--orders N`` the replies are replayed in N orders (the run's, then shuffled) and each figure
is the geometric mean: the policy learns across replies, so one order's figure for a category also
depends on what came before it.
The replies are fixed, so a policy that would change the text (at a numerical tie) is judged on
plain decoding's text.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.engine.drafting import EMPTY, Outcome, Proposal
from app.engine.events import Source
from bench.replay_report import Result, Table, best_fixed_table, measured_speedups, table

STEP = 0.1  # seconds charged for one decode step (the policy reads seconds; only ratios matter)
# Python's share of drafting one token with the draft model (its logits to a token and a probability),
# in decode steps of the target: about 2 ms against a step of 90-100 ms on this machine.
DRAFT_PYTHON = 0.02
# a reply's first token comes with the prompt's batch, in every mode: rounds begin after it
FIRST = 1


class TableCosts:
    """A fixed cost model: batch b costs ``ratios[b - 1]`` steps (past the table, its last slope).

    With ``draft``, the draft model evaluating a batch of b tokens costs ``draft[b - 1]`` steps (a
    catch-up is one batch; each drafted token after the first is a batch of one).
    """

    def __init__(self, ratios: Sequence[float], draft: Sequence[float] | None = None):
        if not ratios or ratios[0] != 1.0:
            raise ValueError("the table starts with a batch of 1, which costs 1.0")
        self.ratios = list(ratios)
        self.draft = list(draft) if draft else None

    @staticmethod
    def _lookup(r: Sequence[float], batch: int) -> float:
        if batch <= len(r):
            return r[max(batch, 1) - 1]
        slope = (r[-1] - r[0]) / (len(r) - 1) if len(r) > 1 else 0.35 * r[0]
        return r[-1] + slope * (batch - len(r))

    def ratio(self, batch: int) -> float:
        return self._lookup(self.ratios, batch)

    def draft_batch(self, batch: int) -> float:
        """Steps the draft model takes to evaluate ``batch`` tokens."""
        if self.draft is None:
            raise ValueError("no draft model costs")
        return self._lookup(self.draft, batch)

    def verify(self, batch: int) -> float:
        return STEP * self.ratio(batch)

    def draft_step(self) -> float | None:
        return STEP * (self.draft_batch(1) + DRAFT_PYTHON) if self.draft else None

    def observe_verify(self, batch: int, seconds: float) -> None:
        pass

    def observe_draft(self, n_tokens: int, seconds: float) -> None:
        pass

    def switch(self, drafted_last: bool | None, drafts: bool) -> tuple[float, float]:
        """Steps a round pays beyond its batches' costs for what the round before it was
        (``drafted_last``; None: the reply's first round): in the target's batch, and elsewhere in
        the round. Nothing here (see ``bench.replay_walk.LiveCosts``)."""
        return 0.0, 0.0


@dataclass(frozen=True)
class Reply:
    id: str
    category: str
    prompt: list[int]
    tokens: list[int]
    confidence: list[float]  # the target's top-token probability where it chose each token
    # the draft model's greedy token and its probability at each position, given the reply before it
    draft: tuple[int, ...] = ()
    draft_confidence: tuple[float, ...] = ()
    stops: frozenset[int] = frozenset()  # the target's control tokens (a lookup copy ends before one)


class ReplayDraft:
    """The draft model, replayed along one recorded reply (the :class:`ModelDrafter` interface).

    Its drafts are its greedy predictions given the reply so far; once a drafted token leaves the
    reply the rest of the draft is rejected whatever it is. It keeps count of how much of the text
    its cache holds, so a round after rounds without it pays for catching up.
    """

    name = "model"

    def __init__(self, costs: TableCosts):
        self.costs = costs
        self.p_min = 0.0
        self._reply: Reply | None = None
        self._text: list[int] = []  # the text of the reply being replayed (or the last), as far as seen
        self._seen = 0  # tokens of the text in the draft's cache
        self.spent = 0.0  # seconds the last prompt's processing took (none where it is caught up later)

    def start(self, reply: Reply) -> None:
        if len(reply.draft) != len(reply.tokens):
            raise ValueError(f"reply {reply.id} has no draft model predictions")
        self._reply = reply

    def begin(self, prompt: Sequence[int], *, evaluate: bool = True) -> float:
        """As :meth:`ModelDrafter.begin`: the cache keeps what this prompt shares with the last text
        (a chat template's opening), and evaluates the rest now, charged as one batch (the steps
        returned and kept in ``spent``), or (``evaluate=False``) lazily, as a catch-up."""
        from app.engine.drafting import common_prefix

        kept = common_prefix(self._text[: self._seen], prompt)
        self._seen = max(kept, len(prompt) - 1) if evaluate else kept
        self._text = list(prompt)
        n = len(prompt) - 1 - kept if evaluate else 0
        self.spent = STEP * self.costs.draft_batch(n) if n > 0 else 0.0  # the prompt's processing
        return self.spent

    def pending(self, tokens: Sequence[int]) -> int:
        return max(1, len(tokens) - self._seen)

    def propose(
        self,
        tokens: Sequence[int],
        k: int,
        params: Any,
        rng: Any,
        *,
        keep_going: Callable[[int, Sequence[float]], bool] | None = None,
        grammar: Any = None,  # replayed replies were unconstrained: a grammar is never passed here
    ) -> Proposal:
        r = self._reply
        if k <= 0 or r is None:
            return EMPTY
        n_sync = self.pending(tokens)
        t_sync = STEP * self.costs.draft_batch(n_sync)
        pos = len(tokens) - len(r.prompt)  # where the draft starts in the reply
        ids: list[int] = []
        conf: list[float] = []
        steps = 0
        on_reply = True
        for j in range(min(k, len(r.tokens) - pos)):
            c = r.draft_confidence[pos + j]
            if c < self.p_min:
                break
            on_reply = on_reply and r.draft[pos + j] == r.tokens[pos + j]
            ids.append(r.draft[pos + j] if on_reply else -1)  # -1: off the reply, rejected anyway
            conf.append(c)
            if j == k - 1 or (keep_going is not None and not keep_going(j, conf)):
                break
            steps += 1  # the drafted token is evaluated to draft the next
        good = 0
        while good < steps and ids[good] == r.tokens[pos + good]:
            good += 1
        self._seen = len(tokens) + good
        self._text = [*tokens, *ids[:good]]
        t_steps = steps * STEP * self.costs.draft_batch(1)
        t = t_sync + t_steps + len(ids) * STEP * DRAFT_PYTHON
        return Proposal(
            tuple(ids), (None,) * len(ids), tuple(conf), Source.MODEL, t, 0.0, steps, t_steps,
            n_sync=n_sync, t_sync=t_sync,
        )  # fmt: skip

    def observe(self, proposal: Proposal, outcome: Outcome) -> None:
        pass

    def close(self) -> None:
        pass


def _replay(
    replies: Sequence[Reply],
    costs: TableCosts,
    max_tokens: int,
    begin: Callable[[Reply], float | None],
    propose: Callable[[list[int], int], Proposal],
    observe: Callable[[Proposal, Any], None] | None = None,
) -> tuple[Result, dict[str, float]]:
    """Replies in order through one policy: per category (tokens, steps), and each reply's speedup.

    A reply's first token comes with the prompt's batch in every mode (``speculative.generate``), so
    what is replayed and counted are the rounds after it, and the tokens they add."""
    from app.engine.auto import CONFIDENCE_WINDOW

    out: Result = {}
    per: dict[str, float] = {}
    for r in replies:
        spent = begin(r)
        pos, cost = FIRST, (spent or 0.0) / STEP
        drafted_last: bool | None = None
        while pos < len(r.tokens):
            room = max_tokens - pos - 1
            prop = propose([*r.prompt, *r.tokens[:pos]], room) if room > 0 else EMPTY
            a = accepted(prop.tokens, r.tokens, pos)
            batch = 1 + len(prop.tokens)
            in_batch, elsewhere = costs.switch(drafted_last, bool(prop.tokens))
            drafted_last = bool(prop.tokens)
            verify = costs.verify(batch) + STEP * in_batch
            drafting = prop.t_sync + prop.t_steps + (len(prop.tokens) - prop.copied) * STEP * DRAFT_PYTHON
            # a draft cut to nothing before verifying (see ModelRounds._worth_verifying) was still made
            seconds = verify + (drafting if prop.source is Source.MODEL else 0.0) + STEP * elsewhere
            new = a + 1
            if observe is not None:
                sure = tuple(r.confidence[max(pos, pos + new - CONFIDENCE_WINDOW) : pos + new])
                observe(prop, Outcome(prop.source, len(prop.tokens), a, batch, verify, seconds, sure))
            cost += seconds / STEP
            pos += new
        n, c = out.get(r.category, (0, 0.0))
        out[r.category] = (n + counted(r.tokens), c + cost)
        per[r.id] = counted(r.tokens) / cost if cost else 0.0
    return out, per


def counted(reply: Sequence[int]) -> int:
    """The tokens of a reply its rounds add (all but the first, read with the prompt's batch)."""
    return max(0, len(reply) - FIRST)


def replay_auto(
    replies: Sequence[Reply],
    costs: TableCosts,
    max_tokens: int,
    *,
    model: bool = False,
    remembered: dict[str, Any] | None = None,
) -> Result:
    """category -> (tokens, cost in steps) of auto mode's policy, replies in order (the policy learns
    across them, as in a benchmark run): prompt lookup only, or (``model``) with the draft model too;
    from nothing learned, or from what an earlier session left (``remembered``: :func:`session_memory`)."""
    return replay_auto_replies(replies, costs, max_tokens, model=model, remembered=remembered)[0]


def session_memory(replies: Sequence[Reply], costs: TableCosts, max_tokens: int) -> dict[str, Any]:
    """What auto mode with the draft model keeps in its memory file after a session over ``replies``
    (as the engine saves and reads it: through JSON)."""
    out: dict[str, Any] = {}
    replay_auto_replies(replies, costs, max_tokens, model=True, keep=out)
    return json.loads(json.dumps(out))


def replay_auto_replies(
    replies: Sequence[Reply],
    costs: TableCosts,
    max_tokens: int,
    *,
    model: bool = False,
    remembered: dict[str, Any] | None = None,
    keep: dict[str, Any] | None = None,
) -> tuple[Result, dict[str, float]]:
    """:func:`replay_auto`, and each reply's speedup (``keep``: filled with what auto mode learned)."""
    from app.engine.auto import AutoDrafter
    from app.engine.drafting import LookupDrafter
    from app.engine.sampling import SamplingParams

    draft = ReplayDraft(costs) if model else None
    auto = AutoDrafter(draft, LookupDrafter(stops=replies[0].stops if replies else ()), costs=costs)
    if remembered is not None:
        auto.restore(remembered)
    params = SamplingParams()

    def begin(r: Reply) -> float:
        if draft is not None:
            draft.start(r)
        auto.begin(r.prompt)
        return draft.spent if draft is not None else 0.0  # the draft's prompt, where evaluated up front

    out = _replay(
        replies, costs, max_tokens, begin, lambda t, room: auto.propose(t, room, params, None), auto.observe
    )
    if keep is not None:
        keep.update(auto.state())
    return out


def replay_fixed(
    replies: Sequence[Reply], costs: TableCosts, k: int, max_tokens: int
) -> tuple[Result, dict[str, float]]:
    """The same for drafting ``k`` tokens with the draft model every round (``spec3`` for 3)."""
    draft = ReplayDraft(costs)

    def begin(r: Reply) -> float:
        draft.start(r)
        return draft.begin(r.prompt)

    return _replay(
        replies, costs, max_tokens, begin, lambda t, room: draft.propose(t, min(k, room), None, None)
    )


def replay_lookup(
    replies: Sequence[Reply], costs: TableCosts, max_tokens: int, n_max: int = 8
) -> tuple[Result, dict[str, float]]:
    """The same for lookup mode as the engine runs it: prompt lookup at the adaptive policy's length
    (``n_min`` 1 to ``n_max``), a fresh policy per reply."""
    from app.engine.drafting import LookupDrafter
    from app.engine.policy import AdaptivePolicy

    lookup = LookupDrafter(stops=replies[0].stops if replies else ())
    policy = AdaptivePolicy(1, n_max)

    def begin(r: Reply) -> None:
        nonlocal policy
        policy = AdaptivePolicy(1, n_max)
        lookup.begin(r.prompt)

    def propose(tokens: list[int], room: int) -> Proposal:
        k = policy.choose(room).k
        return lookup.propose(tokens, k, None, None) if k else EMPTY  # type: ignore[arg-type]

    def observe(prop: Proposal, outcome: Any) -> None:
        policy.observe(outcome.n_drafted, outcome.n_accepted)

    return _replay(replies, costs, max_tokens, begin, propose, observe)


def replay_plain(replies: Sequence[Reply]) -> Result:
    """Plain decoding: one step per token (after the first, which comes with the prompt's batch)."""
    out: Result = {}
    for r in replies:
        n, c = out.get(r.category, (0, 0.0))
        out[r.category] = (n + counted(r.tokens), c + counted(r.tokens))
    return out


def replay_settings(
    replies: Sequence[Reply], costs: TableCosts, max_tokens: int, spec: Sequence[int] = tuple(range(1, 9))
) -> dict[str, Result]:
    """Every fixed setting a user could pick instead of auto mode (``bench.modes.FIXED``): plain,
    speculative at each draft length of ``spec`` (with a draft model's costs), lookup."""
    out: dict[str, Result] = {"plain": replay_plain(replies)}
    if costs.draft is not None:
        for k in spec:
            out[f"spec{k}"] = replay_fixed(replies, costs, k, max_tokens)[0]
    out["lookup"] = replay_lookup(replies, costs, max_tokens)[0]
    return out


def replay_bound(replies: Sequence[Reply], costs: TableCosts) -> dict[str, tuple[int, float]]:
    """The same for the all-knowing lookup policy (``bench.run.lookup_bound``)."""
    from bench.run import lookup_bound

    out: dict[str, tuple[int, float]] = {}
    for r in replies:
        n, c = lookup_bound(r.prompt, r.tokens, costs.ratio)
        n0, c0 = out.get(r.category, (0, 0.0))
        out[r.category] = (n0 + n, c0 + c)
    return out


def accepted(draft: Sequence[int], reply: Sequence[int], pos: int) -> int:
    """How many draft tokens the target accepts at ``pos`` (it adds one of its own after them)."""
    a = 0
    while a < min(len(draft), len(reply) - pos - 1) and draft[a] == reply[pos + a]:
        a += 1
    return a


def orders(replies: Sequence[Reply], n: int) -> list[list[Reply]]:
    """The run's order, then ``n - 1`` shuffles of it (seeded: the same every time)."""
    import random

    out = [list(replies)]
    for seed in range(1, n):
        shuffled = list(replies)
        random.Random(seed).shuffle(shuffled)
        out.append(shuffled)
    return out


def _costs(flag: str, text: str | None) -> list[float] | None:
    """A comma-separated cost table given on the command line (checked before any model loads);
    ``--ratios gpu``: a laptop GPU's (:func:`bench.replay_history.gpu_ratios`)."""
    if not text:
        return None
    if flag == "--ratios" and text == "gpu":
        from bench.replay_history import gpu_ratios

        return gpu_ratios()
    try:
        values = [float(x) for x in text.split(",")]
    except ValueError:
        raise SystemExit(f"{flag} takes numbers separated by commas, not {text!r}") from None
    if any(v <= 0 for v in values):
        raise SystemExit(f"{flag}: every cost must be above 0")
    if flag == "--ratios" and values[0] != 1.0:
        raise SystemExit("--ratios starts with a batch of 1, which costs 1")
    return values


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.replay", description=__doc__)
    p.add_argument(
        "results",
        type=Path,
        help="a JSON file written by tandem bench or bench.multiturn (with a plain mode)",
    )
    p.add_argument("--target", help="the target GGUF (default: the run's)")
    p.add_argument("--draft", help="the draft GGUF (default: the run's, if it had one)")
    p.add_argument("--no-draft", action="store_true", help="replay prompt lookup only")
    p.add_argument("--prompts", type=Path, help="the prompts JSONL (default: the run's)")
    p.add_argument(
        "--ratios",
        help="verify cost of batches 1, 2, 3, ... in decode steps, comma-separated, or 'gpu' for a "
        "laptop GPU's (default: the run's, if it recorded them; else measured by loading the target now)",
    )
    p.add_argument(
        "--draft-ratios",
        help="the draft model's cost of evaluating batches of 1, 2, 3, ... tokens in decode steps of "
        "the target, comma-separated (default: measured by loading both models now)",
    )
    p.add_argument("--orders", type=int, default=1, help="replay in this many orders (default: 1, the run's)")
    args = p.parse_args(argv)
    try:
        data = json.loads(args.results.read_text(encoding="utf-8"))
        settings = data["settings"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SystemExit(f"cannot read benchmark results {args.results}: {e}") from None
    if args.orders < 1:
        raise SystemExit("--orders must be at least 1")
    given = {
        flag: _costs(flag, text)
        for flag, text in (("--ratios", args.ratios), ("--draft-ratios", args.draft_ratios))
    }
    target = args.target or settings["target"]
    draft = None if args.no_draft else args.draft or settings.get("draft")
    prompts = args.prompts or Path(settings["prompts"])
    from bench.replay_load import load_replies

    replies, measured, measured_draft = load_replies(data, target, prompts, draft)
    if not replies:
        raise SystemExit(f"{args.results} has no plain replies to replay")
    recorded = settings.get("verify_ratios")  # what the run's engine had measured when it ended
    ratios = given["--ratios"] or recorded or measured
    draft_ratios = given["--draft-ratios"] or measured_draft
    costs = TableCosts(ratios, draft_ratios if draft else None)
    max_tokens = int(settings.get("max_tokens", 96))
    rows: Table = {"auto (lookup)": [], "auto": [], "spec3": [], "spec5": [], "lookup bound": []}
    for order in orders(replies, args.orders):
        rows["auto (lookup)"].append(replay_auto(order, costs, max_tokens))
        if draft:
            rows["auto"].append(replay_auto(order, costs, max_tokens, model=True))
            for k in (3, 5):
                rows[f"spec{k}"].append(replay_fixed(order, costs, k, max_tokens)[0])
    if any("conversation" in r for r in data["runs"]):  # a multi-turn run: the history, pass by pass
        from bench.replay_history import replay_history

        for p, (result, _) in enumerate(replay_history(replies, costs, max_tokens, model=bool(draft)), 1):
            rows[f"auto-history (pass {p})"] = [result]
    rows["lookup bound"].append(replay_bound(replies, costs))
    rows = {k: v for k, v in rows.items() if v}
    run_figures = measured_speedups(data, ["spec3", "spec5", "auto"] if draft else [])
    print(
        f"Replay of {len(replies)} plain replies from {args.results.name}"
        f"{f' in {args.orders} orders' if args.orders > 1 else ''}; modeled speedup against plain.\n"
    )
    print(table(rows, run_figures))
    fixed = (
        replay_settings(replies, costs, max_tokens)
        if draft
        else replay_settings(replies, costs, max_tokens, ())
    )
    name = "auto" if draft else "auto (lookup)"
    settings = "plain, spec1-8, lookup" if draft else "plain, lookup"
    print(f"\n{name} against the best fixed setting ({settings}), per category:\n")
    print(best_fixed_table(fixed, rows[name]))
    print(f"\nverify costs (steps, batches 1-{len(ratios)}): --ratios {','.join(f'{r:g}' for r in ratios)}")
    if draft and draft_ratios:
        print(
            f"draft model costs (steps, batches 1-{len(draft_ratios)}): "
            f"--draft-ratios {','.join(f'{r:g}' for r in draft_ratios)}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
