"""What auto mode knows about each source of drafts, keyed by :class:`Source` and class.

A *kind* of round is a source and a class of situation (``(Source.MODEL, 2)``: the draft model where
the target was sure; ``(Source.LOOKUP, 0)``: a copy after a short match; ``(Source.NONE, 0)``: plain
rounds). :class:`Evidence` holds, per kind, the pooled acceptance (over replies; copies also by
whether the reply is copying), this reply's own estimates on top of it, and what
recent rounds of each kind really delivered. A new source is a line in :data:`PREDICTORS` (drafters
that predict, judged by the target's confidence like the draft model) or :data:`COPIERS` (drafters
that copy text, judged by the match they copied after).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from app.engine.auto.acceptance import Acceptance, ReplyAcceptance
from app.engine.auto.costs import Realized
from app.engine.auto.priors import (
    AMBIGUOUS_PRIOR,
    LOOKUP_CLASSES,
    LOSING_ERRORS,
    MODEL_CLASSES,
    REPLY_WEIGHT,
    RESUME_PRIOR,
)
from app.engine.events import Source

Kind = tuple[Source, int]  # a source and its class of situation
PLAIN: Kind = (Source.NONE, 0)
# classes by the target's confidence (MODEL_CLASSES)
PREDICTORS = (Source.MODEL, Source.MTP, Source.EAGLE3, Source.ASSISTANT)
COPIERS = (Source.LOOKUP, Source.HISTORY)  # classes by match length (LOOKUP_CLASSES)
RESUMES = (Source.LOOKUP,)  # copiers whose copies have a place in the context (a resume class too)


class Evidence:
    """Pooled acceptance by source and class, this reply's estimates, and realized rates by kind."""

    def __init__(self, n_max: int, lookup_max: int):
        self.n_max, self.lookup_max = n_max, lookup_max
        # predictors: by how sure the target was of the last tokens; one calibration of the draft's
        # own confidence per source
        self.predicted = {
            s: [Acceptance(n_max, prior=p, weight=3.0) for _, p in MODEL_CLASSES] for s in PREDICTORS
        }
        self.calibration = {s: Acceptance(n_max) for s in PREDICTORS}
        # copiers: by match length (and a resume class), each split by whether the reply is copying
        # (index 1: it is, 0: not; see CopyRounds.check)
        self.copied: dict[Source, list[tuple[Acceptance, Acceptance]]] = {}
        for s in COPIERS:
            classes = [(copying, other) for _, copying, other in LOOKUP_CLASSES]
            if s in RESUMES:
                classes.append(RESUME_PRIOR)
                classes.append((AMBIGUOUS_PRIOR, AMBIGUOUS_PRIOR))
            self.copied[s] = [
                (
                    Acceptance(lookup_max, prior=other[0], prior_rest=other[1], weight=3.0),
                    Acceptance(lookup_max, prior=copying[0], prior_rest=copying[1], weight=3.0),
                )
                for copying, other in classes
            ]
        self.realized: dict[Kind, Realized] = {PLAIN: Realized(16)}
        self.realized.update({k: Realized(6) for k in self.kinds()})
        self.reply: dict[tuple[Source, int, int], ReplyAcceptance] = {}  # this reply's, by class
        self.copying = 0  # whether the reply was copying when this round was planned

    def kinds(self, sources: tuple[Source, ...] | None = None) -> Iterator[Kind]:
        """Every drafting kind (of ``sources`` only, if given)."""
        for s, classes in [*self.predicted.items(), *self.copied.items()]:
            if sources is None or s in sources:
                yield from ((s, c) for c in range(len(classes)))

    def pooled(self, source: Source, c: int, copying: int = 0) -> Acceptance:
        """The pooled acceptance of class ``c`` of ``source`` (copies: in a reply that is ``copying``)."""
        if source in self.copied:
            return self.copied[source][c][copying]
        return self.predicted[source][c]

    def every(self) -> Iterator[Acceptance]:
        """Every pooled estimate by class (not the calibrations)."""
        for pairs in self.copied.values():
            for pair in pairs:
                yield from pair
        for accs in self.predicted.values():
            yield from accs

    def begin(self) -> None:
        """A new reply: its own estimates start from the pooled ones."""
        self.reply.clear()

    def estimate(self, source: Source, c: int, copying: int | None = None) -> ReplyAcceptance:
        """Acceptance in this reply for class ``c`` of ``source`` (copies also by whether the reply
        is copying: as this round found unless ``copying`` is given)."""
        copies = source in self.copied
        copying = (self.copying if copying is None else copying) if copies else 0
        key = (source, c, copying)
        est = self.reply.get(key)
        if est is None:
            pooled = self.pooled(source, c, copying)
            est = self.reply[key] = ReplyAcceptance(pooled, REPLY_WEIGHT[copies], copies=copies)
        return est

    def losing(self, kind: Kind) -> bool:
        """Recent rounds of ``kind`` delivered fewer tokens/s than plain rounds did, by more than
        ``LOSING_ERRORS`` standard errors of the difference: a draft at break-even is not stopped by
        a round that drew a rejection or a busy moment, and one that fails every round still is
        (its rounds' rate has no spread). The errors come from a few rounds, so the threshold is
        Student's t at the same confidence, with the Welch-Satterthwaite degrees of freedom."""
        mine, plain = self.realized[kind], self.realized[PLAIN]
        if mine.n < 3 or plain.n < 3:
            return False
        gap = plain.rate() - mine.rate()
        if gap <= 0:
            return False
        a, b = mine.error() ** 2, plain.error() ** 2
        if a + b == 0:
            return True
        if math.isinf(a + b):
            return False
        # the errors are estimated from a few rounds: the same confidence needs Student's t
        df = (a + b) ** 2 / (a * a / (mine.n - 1) + b * b / (plain.n - 1))
        return gap > student_t(LOSING_ERRORS, df) * math.sqrt(a + b)

    def measured(self, kind: Kind) -> float | None:
        """What recent rounds of ``kind`` delivered over plain rounds (None: too few of either)."""
        mine, plain = self.realized[kind], self.realized[PLAIN]
        if mine.n < 3 or plain.n < 3 or plain.rate() <= 0:
            return None
        return mine.rate() / plain.rate()

    def forget_realized(self, sources: tuple[Source, ...]) -> None:
        """Judge the kinds of ``sources`` afresh (a new reply)."""
        for kind in self.kinds(sources):
            self.realized[kind].rounds.clear()

    def state(self) -> dict[str, Any]:
        """The pooled evidence, for :class:`~app.engine.auto.memory.AutoMemory` (keyed by source)."""
        return {
            "predicted": {s.value: [a.state() for a in accs] for s, accs in self.predicted.items()},
            "calibration": {s.value: a.state() for s, a in self.calibration.items()},
            # by whether the reply is copying (saved as "copied" when split by the target's sureness,
            # which is not restored into this split)
            "copies": {
                s.value: [[a.state() for a in pair] for pair in pairs] for s, pairs in self.copied.items()
            },
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Take a saved :meth:`state`'s evidence where its shape matches (a source or class the state
        does not have keeps its prior)."""
        predicted, calibration, copied = (state.get(k) or {} for k in ("predicted", "calibration", "copies"))
        for s, accs in self.predicted.items():
            for a, saved in zip(accs, predicted.get(s.value) or [], strict=False):
                a.restore(saved)
            self.calibration[s].restore(calibration.get(s.value))
        for s, pairs in self.copied.items():
            for pair, saved in zip(pairs, copied.get(s.value) or [], strict=False):
                for a, one in zip(pair, saved if isinstance(saved, list) else [], strict=False):
                    a.restore(one)


def student_t(z: float, df: float) -> float:
    """The quantile of Student's t with ``df`` degrees of freedom at the normal quantile ``z`` (the
    Cornish-Fisher expansion, Abramowitz and Stegun 26.7.5: within 0.2 % of the exact value from 2
    degrees of freedom up at z = 1)."""
    z2 = z * z
    g = (
        (z2 + 1) * z / 4,
        ((5 * z2 + 16) * z2 + 3) * z / 96,
        (((3 * z2 + 19) * z2 + 17) * z2 - 15) * z / 384,
        ((((79 * z2 + 776) * z2 + 1482) * z2 - 1920) * z2 - 945) * z / 92160,
    )
    return z + sum(gi / df ** (i + 1) for i, gi in enumerate(g))
