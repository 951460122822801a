"""Auto mode's measured priors and constants.

Each value was measured on the benchmark's replies (Qwen2.5-Coder 1.5B + 0.5B) or replayed with
``bench.replay``; ``docs/benchmarks.md`` ("Auto mode's measured constants") gives the figures behind
each. Evidence learned online overrides the priors; the rest bound how fast it is learned.
"""

from __future__ import annotations

# Prompt lookup, by the length of the match a draft was copied from: (shortest match, prior in a
# reply that is copying, prior in one that is not). Each prior is (first token, each later token given
# the ones before it were accepted): a copy goes on, a coincidence fails at once. A reply is copying
# while at least COVERED_SHARE of its tokens held to a copy prompt lookup offered before them (so from
# its first token until it writes text of its own): teacher-forced over the recorded single-turn and
# multi-turn replies a 3-5 token match's first token was right 86 % of the time there and 68 %
# elsewhere (the target's sureness of its last tokens, the split this replaced, 78 % and 69 %).
LOOKUP_CLASSES = (
    (0, (0.6, 0.85), (0.5, 0.7)),
    (3, (0.86, 0.86), (0.68, 0.68)),
    (6, (0.92, 0.91), (0.62, 0.8)),
    (9, (0.94, 0.97), (0.83, 0.97)),
    (16, (0.95, 0.97), (0.95, 0.97)),
    (32, (0.97, 0.98), (0.97, 0.98)),
)
COVERED_SHARE = 0.3
# A short match on the diagonal of the last accepted copy (give or take RESUME_SHIFT tokens) resumes
# that copy after a small edit; it is judged in a class of its own.
RESUME = len(LOOKUP_CLASSES)
RESUME_PRIOR = ((0.78, 0.87), (0.67, 0.69))  # in a reply that is copying, and in one that is not
RESUME_SHIFT = 2  # tokens the edit may have inserted or deleted
RESUME_BELOW = LOOKUP_CLASSES[2][0]  # matches this long are judged as copies in their own right
# A match under AMBIGUOUS_BELOW tokens whose earlier occurrences, matching as far back, go on
# differently is judged in a class of its own (after RESUME): teacher-forced over the recorded replies
# its first token was right 23 % of the time (123 offers), against 50-99 % for the other copies of its
# match length. A longer match is a copy in progress, judged by its length.
AMBIGUOUS = RESUME + 1
AMBIGUOUS_PRIOR = (0.25, 0.8)
AMBIGUOUS_BELOW = LOOKUP_CLASSES[3][0]
RELAX = 0.995  # per round: evidence by class fades toward the prior (re-tries a class in time)
RELAX_EVERY = 8  # rounds between two fadings (by RELAX to that power)

# The draft model, by the least sure the target was of its last CONFIDENCE_WINDOW tokens: (lowest
# target confidence, prior acceptance per token). Where the target was sure, the draft agrees.
MODEL_CLASSES = ((0.0, 0.75), (0.9, 0.88), (0.99, 0.97))
CONFIDENCE_WINDOW = 3
# Below the lowest class threshold the loop may report an upper bound from the two largest logits
# (no pass of exp over the vocabulary): the class is the same.
CONFIDENCE_FLOOR = min(c for c, _ in MODEL_CLASSES if c > 0)

# A batch size timed fewer than EXPLORE_SAMPLES times is planned EXPLORE cheaper, so one slow timing
# cannot make a size look dear for good.
EXPLORE = 0.1
EXPLORE_SAMPLES = 3
# Prompt lookup in a reply: positions not yet drafted follow the deepest position drafted this often.
BORROW_TRIALS = 2
PROBE_HOPE = 0.5  # a probe hopes for its class's acceptance this far on the way to 1
PROBE_K = 2  # a probe drafts this many tokens at most; its own round is part of its price
# The odds that a probe finds drafting paying again are learned per pair and machine; the prior
# (AutoDrafter's ``probe_odds``) weighs as much as this many probes, and what earlier sessions found
# as much as PROBE_MEMORY probes at most.
PROBE_PRIOR_WEIGHT = 4.0
PROBE_MEMORY = 16.0
# Prompt lookup's drafts cost nothing to make: their length is bounded by what verifying them costs.
LOOKUP_MAX = 63
# The first draft of a class of copy in a reply copies at most this many tokens: a long draft failing
# at its first token costs a whole batch.
FIRST_LOOKUP = 3
COPYING = 16  # a match this long is a copy in progress: its first draft is not capped
# A copied token from where this reply once departed from a copy of itself is judged at the rate such
# tokens held (this prior, as if seen BREAK_WEIGHT times, until the reply has its own evidence).
BREAK_PRIOR = 0.2
BREAK_WEIGHT = 2.0
HORIZON = 256  # tokens of a reply counted on when spreading a catch-up of the draft
# Once a reply has had SERVED_RUNS runs of model rounds, a catch-up is spread over no more rounds
# than the median of its last SERVED_RUNS.
SERVED_RUNS = 2
TOKENS_PER_ROUND = 3.0  # about what a drafted round delivers, for counting rounds left
# The rest of a reply is expected to be what the last REPLY_LENGTHS replies that went on past this
# point produced after it, with as much as the reply so far (at least REPLY_MIN tokens) weighing as
# one of them, and at most the token budget: a catch-up or a probe must pay itself back within it.
REPLY_MIN = 16
REPLY_LENGTHS = 32
# This reply's own evidence weighs as much as this many pooled samples: (the draft model, a copy). One
# early rejection must not stop a draft model that pays in most of a reply (a draft's tokens are right
# or wrong in runs); a copy's class is judged on its own in each reply (a coincidence fails at once).
REPLY_WEIGHT = (8.0, 4.0)
# A kind of round is losing (paused for the rest of the reply, until a probe) when its recent rounds
# delivered fewer tokens/s than plain rounds by more than this many standard errors of the difference
# (as Student's t reads it for the few rounds the errors are estimated from: 1.32 for three rounds).
LOSING_ERRORS = 1.0
# A draft model in step with the text (nothing to catch up) goes on drafting in a class while this
# reply's acceptance there, this many standard errors above its estimate, says a round could pay:
# stopping at break-even leaves the draft behind, and each later round that needs it pays a catch-up.
ENGAGED_ERRORS = 2.0
# Until a catch-up has been timed, the draft evaluates a token of a catch-up batch at this share of a
# drafted token's cost (a batch shares the weights' reads): measured 16-token batches of the 0.5B
# draft cost 0.31-0.36 of 16 single steps on the EPYC, 0.19 on the Xeon (docs/benchmarks.md).
SYNC_SHARE = 0.35
# A catch-up's cost per token is read as the slope of its cost in the batch's size once the catch-ups
# timed differ in size this many times over (below it the slope is noise): see
# ModelRounds.sync_per_token.
SYNC_SPREAD = 4
