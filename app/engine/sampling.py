"""Logits -> probabilities under the sampling settings, and the exact speculative accept/resample step.

Pure numpy. The *same* transform is applied to the target's and the draft's logits, so speculative
sampling reproduces exactly the distribution plain sampling would use. The order of the transforms
follows llama.cpp's default sampler chain: repetition penalty, top-k, top-p, min-p, then temperature.
A grammar (structured output, :class:`Allowed`) removes the tokens it forbids before all of them, as
llama.cpp's grammar sampler does when it comes first: top-k and the others see the allowed tokens only.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np


class SamplingError(ValueError):
    """Invalid sampling settings."""


class Allowed(Protocol):
    """Which tokens may come next (a grammar's state: :class:`app.engine.grammar.Grammar`)."""

    def allows(self, token: int) -> bool:
        """Whether one token may come next (cheap: no mask)."""
        ...

    def mask(self) -> np.ndarray:
        """Bool per token of the vocabulary (may be shorter than the logits: the rest is forbidden)."""
        ...


def _fit(mask: np.ndarray, n: int) -> np.ndarray:
    """``mask`` over ``n`` tokens (a draft's vocabulary may be longer: its extra tokens are forbidden)."""
    if mask.shape[0] == n:
        return mask
    out = np.zeros(n, dtype=bool)
    m = min(n, mask.shape[0])
    out[:m] = mask[:m]
    return out


def masked(logits: np.ndarray, allowed: Allowed) -> np.ndarray:
    """A copy of ``logits`` with the forbidden tokens at -inf."""
    return np.where(_fit(allowed.mask(), logits.shape[0]), logits, np.float32(-np.inf))


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen. ``temperature == 0`` is greedy decoding."""

    temperature: float = 0.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    min_p: float = 0.0  # 0 = off
    repeat_penalty: float = 1.0  # 1 = off
    repeat_last_n: int = 64  # the window the penalties look back over
    presence_penalty: float = 0.0  # 0 = off; subtracted once from a token seen in the window
    frequency_penalty: float = 0.0  # 0 = off; subtracted per occurrence in the window
    seed: int | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise SamplingError(f"temperature must be >= 0, not {self.temperature}")
        if self.top_k < 0:
            raise SamplingError(f"top_k must be >= 0 (0 = off), not {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise SamplingError(f"top_p must be in (0, 1], not {self.top_p}")
        if not 0 <= self.min_p < 1:
            raise SamplingError(f"min_p must be in [0, 1), not {self.min_p}")
        if not (math.isfinite(self.repeat_penalty) and self.repeat_penalty > 0):
            raise SamplingError(f"repeat_penalty must be > 0, not {self.repeat_penalty}")
        if self.repeat_last_n < 0:
            raise SamplingError(f"repeat_last_n must be >= 0, not {self.repeat_last_n}")
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if not (math.isfinite(v) and -2.0 <= v <= 2.0):
                raise SamplingError(f"{name} must be between -2 and 2, not {v}")

    @property
    def penalizes(self) -> bool:
        """Some penalty looks at the recent tokens."""
        return self.repeat_last_n > 0 and (
            self.repeat_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
        )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def penalized(logits: np.ndarray, history: Sequence[int], params: SamplingParams) -> np.ndarray:
    """Apply llama.cpp's penalties over the last ``repeat_last_n`` tokens of ``history``: the
    repetition penalty (divide a positive logit, multiply a negative one), then the frequency and
    presence penalties (``logit -= count * frequency + (count > 0) * presence``).

    Returns ``logits`` itself when there is nothing to do (callers must not modify it), else a copy.
    """
    if not params.penalizes or not history:
        return logits
    recent, counts = np.unique(
        np.asarray(history[-params.repeat_last_n :], dtype=np.int64), return_counts=True
    )
    out = np.array(logits, dtype=np.float32, copy=True)
    vals = out[recent]
    if params.repeat_penalty != 1.0:
        vals = np.where(vals <= 0, vals * params.repeat_penalty, vals / params.repeat_penalty)
    if params.frequency_penalty or params.presence_penalty:
        vals = vals - (counts * params.frequency_penalty + params.presence_penalty).astype(np.float32)
    out[recent] = vals
    return out


def greedy_token(
    logits: np.ndarray, history: Sequence[int], params: SamplingParams, allowed: Allowed | None = None
) -> int:
    """The argmax token after the repetition penalty (ties go to the lowest id, as in llama.cpp); with
    ``allowed``, the argmax among the allowed tokens (the mask is computed only when the argmax is
    forbidden: the lowest-id argmax, if allowed, is also the lowest-id argmax among the allowed)."""
    x = penalized(logits, history, params)
    t = int(np.argmax(x))
    if allowed is None or allowed.allows(t):
        return t
    return int(np.argmax(masked(x, allowed)))


_scratch = threading.local()


def top_probability(logits: np.ndarray, floor: float = 0.0) -> float:
    """The largest softmax probability of raw ``logits`` (the draft's confidence in greedy mode).

    With a ``floor``, a probability below it comes back as an upper bound on it (still below
    ``floor``) taken from the two largest logits, ``1 / (1 + exp(second - top))``: enough for a
    caller that only compares the result with thresholds at or above ``floor``, and no pass of
    ``exp`` over the vocabulary (right after a decode: 65-75 us instead of 185 on an AMD EPYC).

    Auto mode asks this of every token the target decodes (and a draft of every token it drafts),
    so it works in a per-thread buffer: a fresh 600 kB array per call (a 150k vocabulary) costs page
    faults that doubled its time.
    """
    x = np.asarray(logits, dtype=np.float32)
    if floor > 0.0:
        i = int(x.argmax())
        top = float(x[i])
        second = max(float(x[:i].max(initial=-np.inf)), float(x[i + 1 :].max(initial=-np.inf)))
        bound = 1.0 / (1.0 + math.exp(min(second - top, 0.0)))
        if bound < floor:
            return bound
        m = x.dtype.type(top)
    else:
        m = x.max()
    buf = getattr(_scratch, "buf", None)
    if buf is None or buf.shape != x.shape:
        buf = _scratch.buf = np.empty_like(x)
    np.subtract(x, m, out=buf)
    np.exp(buf, out=buf)
    return float(1.0 / np.einsum("i->", buf))  # unrolled: 3.5x faster than sum()'s pairwise loop


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def distribution(
    logits: np.ndarray, history: Sequence[int], params: SamplingParams, allowed: Allowed | None = None
) -> np.ndarray:
    """The dense probability vector (float64, sums to 1) that sampling draws the next token from;
    with ``allowed``, over the allowed tokens only (renormalised).

    Greedy settings give a one-hot vector at the argmax, so the accept/resample rule below also
    covers greedy verification.
    """
    n = logits.shape[0]
    if params.greedy:
        out = np.zeros(n)
        out[greedy_token(logits, history, params, allowed)] = 1.0
        return out
    x = penalized(logits, history, params)
    if allowed is None:
        keep, xs = np.arange(n), x.astype(np.float64)
    else:  # the transforms below see the allowed tokens only (fewer to sort where the grammar is narrow)
        keep = np.flatnonzero(_fit(allowed.mask(), n))
        if keep.size == 0:
            keep = np.array([int(np.argmax(x))])
        xs = x[keep].astype(np.float64)
    if 0 < params.top_k < xs.shape[0]:
        top = np.argpartition(-xs, params.top_k - 1)[: params.top_k]
        keep, xs = keep[top], xs[top]
    if params.top_p < 1.0 or params.min_p > 0.0:
        p = _softmax(xs)
        order = np.argsort(-p, kind="stable")
        p, keep, xs = p[order], keep[order], xs[order]
        cut = len(p)
        if params.top_p < 1.0:
            # smallest prefix whose mass reaches top_p (always at least one token)
            cut = min(cut, int(np.searchsorted(np.cumsum(p), params.top_p)) + 1)
        if params.min_p > 0.0:
            cut = min(cut, max(1, int(np.count_nonzero(p >= params.min_p * p[0]))))
        keep, xs = keep[:cut], xs[:cut]
    out = np.zeros(n)
    out[keep] = _softmax(xs / params.temperature)
    return out


def sample(p: np.ndarray, rng: np.random.Generator) -> int:
    """Draw one token id from the probability vector ``p``."""
    support = np.flatnonzero(p)
    if support.size == 1:
        return int(support[0])
    cdf = np.cumsum(p[support])
    i = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
    return int(support[min(i, support.size - 1)])


def accept_or_resample(
    p: np.ndarray, q: np.ndarray | None, token: int, rng: np.random.Generator
) -> tuple[bool, int]:
    """The exact speculative sampling step for one drafted ``token``.

    ``p`` is the target's distribution, ``q`` the draft's (``None`` for a deterministic drafter such as
    prompt lookup, i.e. a point mass at ``token``). Accept with probability min(1, p/q); on rejection
    draw from normalize(max(0, p - q)). The token that comes out is distributed exactly as ``p``.
    Returns (accepted, token).
    """
    pt = float(p[token])
    qt = 1.0 if q is None else float(q[token])
    if qt > 0.0 and (pt >= qt or rng.random() * qt < pt):
        return True, token
    if q is None:
        residual = p.copy()
        residual[token] = 0.0
    else:
        residual = np.maximum(p - q, 0.0)
    if residual.sum() <= 0.0:  # p <= q everywhere cannot reject in exact arithmetic; guard rounding
        return False, sample(p, rng)
    return False, sample(residual, rng)
