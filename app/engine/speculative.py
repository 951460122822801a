"""The speculative loop: a generator of events, with KV-cache rollback in ``finally``.

The prompt's last token is evaluated with the rest of the prompt and its row read, so the reply's
first token comes with the prompt (``Action.PROMPT``; a recurrent memory, which keeps a checkpoint
before the last prompt token, leaves it to the first round). Invariant between rounds: the target's
KV cache holds ``tokens[:-1]``; the last accepted token is *pending* (not evaluated yet). A round
evaluates ``[pending, d1..dk]`` in one batch with logits at every position, accepts a prefix of the
draft, appends the target's own token at the first mismatch (or a bonus token when all were
accepted), and trims the rejected positions from the cache. With no draft
(k = 0) the same round is plain decoding, so plain and speculative modes share one code path.

With a grammar (structured output), every position's distribution is the target's masked by it, a
drafted token it forbids is rejected, and it consumes the tokens each round adds: after a round it is in
the state after the accepted text, as the KV cache is (:mod:`app.engine.grammar`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from app.engine import sampling
from app.engine.drafting.base import EMPTY, Drafter, Outcome, Proposal
from app.engine.errors import PromptTooLongError
from app.engine.events import (
    Action,
    Decision,
    Finished,
    FinishReason,
    Mode,
    Source,
    Started,
    StatsBuilder,
    Step,
)
from app.engine.overlap import Overlap
from app.engine.policy import DraftPolicy
from app.engine.sampling import SamplingParams
from app.engine.sequence import PROMPT, CachedSequence
from app.engine.textstream import StopMatcher, Utf8Stream
from app.gguf.arch import Rollback

if TYPE_CHECKING:
    from app.engine.grammar import Grammar


class TargetCache(CachedSequence):
    """The target's context and the tokens its memory holds (reused across requests by prefix)."""

    first_ready = False  # whether the last prompt token's row was read with the prompt (see begin)

    def begin(self, prompt: Sequence[int]) -> int:
        """Evaluate the prompt, reusing the held common prefix; returns tokens reused.

        Where the memory can remove any suffix, the prompt's last token goes in its batch with its
        logits row read (``first_ready``): the reply's first token comes with the prompt, not a
        decode step later, and is sampled the same way whatever was held (a seed gives one reply).
        A recurrent memory evaluates ``prompt[:-1]`` and keeps a checkpoint there, for the next
        request to start from; its last token is the first round's pending token."""
        self.first_ready = self.memory.rollback is Rollback.TRIM
        if self.first_ready:
            return self.sync(prompt, logits="last", last_again=True)
        reused = self.sync(prompt[:-1])
        if not self.can_trim_any and len(self.tokens) > reused:
            self.checkpoint(PROMPT)
        return reused

    def verify_batch(self, pending: int, draft: Sequence[int]) -> None:
        """Evaluate ``[pending, *draft]`` with logits at every position, after saving a checkpoint
        where the memory could not otherwise undo the draft."""
        if draft and self.undo_reach(len(draft) + 1) < len(draft):
            self.checkpoint()
        self.extend([pending, *draft], logits="all")

    def queue(self, pending: int) -> None:
        """Queue the evaluation of ``pending`` alone, without waiting for it (see :mod:`.overlap`):
        the next round reads its row after :meth:`settle`, or removes it and drafts."""
        self.extend([pending], logits="last", wait=False)

    def settle(self) -> None:
        """Wait for queued evaluations."""
        self.ctx.synchronize()


def verify(
    row: Callable[[int], np.ndarray],
    context: Sequence[int],
    proposal: Proposal,
    params: SamplingParams,
    rng: np.random.Generator,
    grammar: Grammar | None = None,
) -> tuple[list[int], list[bool]]:
    """One verification: the tokens the round adds and, for each, whether it was an accepted draft.

    ``row(i)`` gives the target's logits after the pending token and the first ``i`` draft tokens;
    ``context`` ends with the pending token (only its last ``repeat_last_n`` tokens matter).
    Greedy: accept while the draft equals the target's argmax. Otherwise: exact rejection sampling.
    A ``grammar`` (in the state after ``context``) masks each row and consumes each token added; a
    round ends where the grammar is complete.
    """
    window = list(context[-params.repeat_last_n :]) if params.penalizes else []
    out: list[int] = []
    from_draft: list[bool] = []
    for i, d in enumerate(proposal.tokens):
        if params.greedy:
            t = sampling.greedy_token(row(i), window, params, grammar)
            ok = t == d
        else:
            p = sampling.distribution(row(i), window, params, grammar)
            ok, t = sampling.accept_or_resample(p, proposal.q[i], d, rng)
        out.append(t)
        from_draft.append(ok)
        if grammar is not None:
            grammar.consume(t)
        if not ok or (grammar is not None and grammar.done):
            return out, from_draft
        window.append(t)
    last = row(len(proposal.tokens))
    if params.greedy:
        out.append(sampling.greedy_token(last, window, params, grammar))
    else:
        out.append(sampling.sample(sampling.distribution(last, window, params, grammar), rng))
    from_draft.append(False)
    if grammar is not None:
        grammar.consume(out[-1])
    return out, from_draft


def within_grammar(proposal: Proposal, grammar: Grammar, params: SamplingParams) -> Proposal:
    """The proposal cut where the grammar forbids a token (nothing to verify past a token that is
    rejected for certain). A draft sampled from a distribution ``q`` keeps its first forbidden token:
    rejecting it by the rule of speculative sampling keeps the output's law exact, where cutting a
    draft at a token chosen by its own value would not. A deterministic draft (prompt lookup, the
    history) or a greedy one is cut before it."""
    n = grammar.valid_prefix(proposal.tokens)
    if n == len(proposal.tokens):
        return proposal
    if not params.greedy and proposal.q[n] is not None:
        n += 1
    return replace(proposal, tokens=proposal.tokens[:n], q=proposal.q[:n], confidence=proposal.confidence[:n])


def _flush(utf8: Utf8Stream, stopper: StopMatcher) -> str:
    safe, _ = stopper.feed(utf8.flush())
    return safe + stopper.flush()


def generate(
    target: TargetCache,
    drafter: Drafter | None,
    policy: DraftPolicy,
    prompt: Sequence[int],
    params: SamplingParams,
    *,
    piece: Callable[[int], bytes],
    is_eog: Callable[[int], bool],
    max_tokens: int,
    stop: Sequence[str] = (),
    cancel: Callable[[], bool] | None = None,
    mode: Mode | str = Mode.SPECULATIVE,
    rng: np.random.Generator | None = None,
    grammar: Grammar | None = None,
    overlap: Overlap | None = None,
) -> Iterator[Started | Step | Finished]:
    """Generate a reply to ``prompt`` (token ids), yielding ``Started``, ``Step``s and ``Finished``.

    The ``Step`` texts concatenate to the reply; ``Finished.text`` is the whole reply (after a cancel it
    also holds text that was held back, e.g. the start of a possible stop string). With a ``grammar``
    (fresh: in its start state), the reply follows it and ends (reason "eog") once it is complete.
    With an ``overlap`` (a target whose evaluations are queued on a GPU), the next round's pending
    token is queued before the round is planned, where that is expected to pay (:mod:`.overlap`).
    """
    n_ctx = target.ctx.n_ctx
    if not prompt:
        raise ValueError("the prompt is empty")
    if len(prompt) >= n_ctx:
        raise PromptTooLongError(
            f"the prompt has {len(prompt)} tokens but the context holds {n_ctx}: "
            "shorten it, start a new chat, or load the model with a larger context"
        )
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, not {max_tokens}")
    rng = rng if rng is not None else np.random.default_rng(params.seed)
    stats = StatsBuilder(mode=Mode(mode), n_prompt_tokens=len(prompt))

    t_start = time.perf_counter()
    reply = _ReplyText(prompt, piece, is_eog, max_tokens, n_ctx, stop, grammar)
    tokens = reply.tokens  # the prompt and the reply so far
    n_prompt = len(prompt)
    reason: FinishReason | None = None
    if overlap is not None and not (target.can_trim_any and target.ctx.on_decode is None):
        overlap = None  # a queued token must be removable, and no drafter may read the batch as it lands
    queued = 0.0  # when the pending token's evaluation was queued (0.0: it was not)
    t_reads = 0.0  # when the last round's logit rows were read (from then on the next batch could run)
    drafted_last: bool | None = None  # whether the last round drafted (None: no round yet)
    try:
        stats.n_prompt_cached = target.begin(prompt)
        if drafter is not None:
            t_draft = time.perf_counter()
            drafter.begin(prompt)
            stats.t_draft_prompt = time.perf_counter() - t_draft
        stats.t_prompt = time.perf_counter() - t_start
        yield Started(len(prompt), stats.n_prompt_cached, stats.t_prompt)
        t_decode0 = time.perf_counter()
        if target.first_ready:  # the first token, from the row the prompt's batch read
            t0, began = time.perf_counter(), time.monotonic()
            new, _ = verify(lambda _: target.ctx.logits(-1), tokens, EMPTY, params, rng, grammar)
            shown, text, reason = reply.add(new)
            mode_policy = policy.choose(0).decision.policy
            step = Step(
                text=text,
                tokens=shown,
                from_draft=(False,) * len(shown),
                n_drafted=0,
                n_accepted=0,
                k=0,
                drafter=Source.NONE,
                decision=Decision(Action.PROMPT, mode_policy),
                t_draft=0.0,
                t_verify=time.perf_counter() - t0,
                t_round=time.perf_counter() - t0,
                t_llama=0.0,
                began=began,
            )
            stats.add(step)
            if shown:
                stats.ttft = time.perf_counter() - t_start
            yield step

        while not reason:
            if cancel is not None and cancel():
                reason = FinishReason.CANCELLED
                break
            t0, began = time.perf_counter(), time.monotonic()
            n = len(tokens)  # the pending token sits at position n - 1
            limit = max(0, min(max_tokens - (n - n_prompt) - 1, n_ctx - n))
            choice = policy.choose(limit if drafter is not None else 0)
            proposal = EMPTY
            if drafter is not None and choice.k:
                if grammar is None:
                    proposal = drafter.propose(tokens, choice.k, params, rng)
                else:
                    proposal = drafter.propose(tokens, choice.k, params, rng, grammar=grammar)
                    proposal = within_grammar(proposal, grammar, params)

            if queued and proposal.tokens:  # the round drafts after all: the queued step is wasted
                target.settle()  # (in the round's time, not in what its batch is timed at)
                target.rollback(n - 1)
                queued = 0.0
                stats.n_wasted += 1
            t1 = time.perf_counter()
            timed = True  # whether t_llama_verify times the evaluation (for the drafter's cost model)
            if queued:
                target.settle()
                t_ready = time.perf_counter()
                # the step is timed only where the CPU waited for it (not a tenth of it: noise)
                timed = t_ready - t1 > 0.1 * (t_ready - queued)
                t_llama_verify = t_ready - queued if timed else t_ready - t1
                t_blocked = t_ready - t1
                queued = 0.0
            else:
                target.verify_batch(tokens[-1], proposal.tokens)
                t_llama_verify = t_blocked = time.perf_counter() - t1
            if overlap is not None:
                if not proposal.tokens:
                    if t_reads:
                        overlap.gap.add(t1 - t_reads)
                    if timed:
                        overlap.step.add(t_llama_verify)
                overlap.observe(drafted_last, bool(proposal.tokens))
            drafted_last = bool(proposal.tokens)
            new, from_draft = verify(target.ctx.logits, tokens, proposal, params, rng, grammar)
            n_accepted = sum(from_draft)
            queue_next = (
                overlap is not None
                and not any(is_eog(t) for t in new)
                and len(tokens) + len(new) - n_prompt < max_tokens
                and len(tokens) + len(new) < n_ctx
                and not (grammar is not None and grammar.done)
                and overlap.should_queue(drafted_last, drafter is not None)
            )
            # how sure the target was of the last tokens it added (row j chose new[j]), read before
            # the rollback, which may evaluate tokens again; where the next token is queued, the rows
            # are copied and their softmax waits until the GPU has the next step in hand
            sure: tuple[float, ...] = ()
            rows: list[np.ndarray] = []
            if drafter is not None and drafter.wants_target_confidence:
                floor = drafter.target_confidence_floor
                last = range(max(0, len(new) - drafter.wants_target_confidence), len(new))
                if queue_next:
                    rows = [np.array(target.ctx.logits(j), dtype=np.float32) for j in last]
                else:
                    sure = tuple(sampling.top_probability(target.ctx.logits(j), floor) for j in last)
            t2 = time.perf_counter()
            target.rollback(n + n_accepted)  # keep through the last accepted draft token
            t_rollback = time.perf_counter() - t2  # a restore and replay is part of verifying
            t_llama_verify += t_rollback
            t_blocked += t_rollback
            t_reads = time.perf_counter()
            if queue_next:
                target.queue(new[-1])  # the next round's pending token, evaluated while it is planned
                queued = time.perf_counter()
                stats.n_queued += 1
            if rows:
                sure = tuple(sampling.top_probability(r, floor) for r in rows)
            policy.observe(len(proposal.tokens), n_accepted)
            if drafter is not None:
                drafter.observe(
                    proposal,
                    Outcome(
                        proposal.source,
                        len(proposal.tokens),
                        n_accepted,
                        1 + len(proposal.tokens),
                        t_llama_verify,
                        time.perf_counter() - t0,
                        sure,
                        timed,
                    ),
                )
            t_verify = time.perf_counter() - t1

            decision = proposal.decision or choice.decision
            if decision.source is not proposal.source and proposal.decision is None:
                decision = replace(decision, source=proposal.source)  # the policy's choice, drafted
            shown, text, reason = reply.add(new)
            step = Step(
                text=text,
                tokens=shown,
                from_draft=tuple(from_draft[: len(shown)]),
                n_drafted=len(proposal.tokens),
                n_accepted=n_accepted,
                k=decision.k,
                drafter=proposal.source,
                decision=decision,
                t_draft=t1 - t0,
                t_verify=t_verify,
                t_round=time.perf_counter() - t0,
                t_llama=proposal.t_llama + t_blocked,
                began=began,
            )
            stats.add(step)
            if stats.ttft == 0.0 and shown:
                stats.ttft = time.perf_counter() - t_start
            yield step
    finally:
        # Whatever happened (cancel, an abandoned stream, an exception), leave the KV cache holding
        # exactly the accepted text minus the pending token, ready for the next request.
        if queued:
            target.settle()
        target.rollback(min(len(target.tokens), max(0, len(tokens) - 1)))

    t_decode = time.perf_counter() - t_decode0
    if reason is FinishReason.CANCELLED:
        reply.flush()
    generated = tuple(t for t in tokens[n_prompt:] if not is_eog(t))
    assert reason is not None
    yield Finished(reason, "".join(reply.pieces), generated, stats.build(t_decode, len(generated)))


class _ReplyText:
    """The reply's tokens and text as rounds add them, and where it ends: the end of the turn, a
    stop string, the token budget, a complete grammar or the context."""

    def __init__(
        self,
        prompt: Sequence[int],
        piece: Callable[[int], bytes],
        is_eog: Callable[[int], bool],
        max_tokens: int,
        n_ctx: int,
        stop: Sequence[str],
        grammar: Grammar | None,
    ):
        self.tokens = list(prompt)
        self.n_prompt = len(prompt)
        self.piece, self.is_eog = piece, is_eog
        self.max_tokens, self.n_ctx = max_tokens, n_ctx
        self.grammar = grammar
        self.utf8 = Utf8Stream()
        self.stopper = StopMatcher(stop)
        self.pieces: list[str] = []  # the text shown so far, a piece a round

    def add(self, new: Sequence[int]) -> tuple[tuple[int, ...], str, FinishReason | None]:
        """Append a round's tokens (up to where the reply ends); returns the tokens shown, the text
        safe to show now and why the reply ended (None: it goes on)."""
        reason: FinishReason | None = None
        text_parts: list[str] = []
        kept = 0
        for tok in new:
            self.tokens.append(tok)
            kept += 1
            if self.is_eog(tok):
                reason = FinishReason.EOG
                break
            safe, hit = self.stopper.feed(self.utf8.feed(self.piece(tok)))
            text_parts.append(safe)
            if hit:
                reason = FinishReason.STOP
                break
            if len(self.tokens) - self.n_prompt >= self.max_tokens:
                reason = FinishReason.LENGTH
                break
            if self.grammar is not None and kept == len(new) and self.grammar.done:
                reason = FinishReason.EOG  # the grammar is complete: only the end of the turn may follow
        if not reason and len(self.tokens) > self.n_ctx:
            reason = FinishReason.CONTEXT
        if reason and reason is not FinishReason.STOP:  # the reply ends here: release held-back text
            text_parts.append(_flush(self.utf8, self.stopper))
        text = "".join(text_parts)
        self.pieces.append(text)
        return tuple(t for t in new[:kept] if not self.is_eog(t)), text, reason

    def flush(self) -> None:
        """Release the text held back (a cancelled reply's: the start of a possible stop string)."""
        self.pieces.append(_flush(self.utf8, self.stopper))
