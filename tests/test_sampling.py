"""The sampling transform and the exact speculative accept/resample step (pure numpy, no model)."""

from __future__ import annotations

import numpy as np
import pytest

from app.engine import sampling
from app.engine.sampling import SamplingError, SamplingParams

# Chi-square 99.99% quantiles by degrees of freedom: a correct sampler fails with probability 1e-4
# per check; the seeds are fixed, so the outcome is deterministic anyway.
CHI2_9999 = {1: 15.14, 2: 18.42, 3: 21.11, 4: 23.51, 5: 25.74, 6: 27.86, 7: 29.88}

PAIRS = {
    "overlapping": ([0.5, 0.2, 0.1, 0.1, 0.1, 0.0], [0.2, 0.5, 0.1, 0.1, 0.05, 0.05]),
    "q zero where p positive": ([0.3, 0.3, 0.2, 0.2, 0.0, 0.0], [0.5, 0.5, 0.0, 0.0, 0.0, 0.0]),
    "p zero where q positive": ([0.6, 0.4, 0.0, 0.0, 0.0, 0.0], [0.1, 0.1, 0.3, 0.3, 0.1, 0.1]),
    "draft overconfident": ([0.25, 0.25, 0.25, 0.25, 0.0, 0.0], [0.97, 0.01, 0.01, 0.01, 0.0, 0.0]),
    "identical": ([0.4, 0.3, 0.2, 0.1, 0.0, 0.0], [0.4, 0.3, 0.2, 0.1, 0.0, 0.0]),
    "disjoint": ([0.0, 0.0, 0.0, 0.5, 0.5, 0.0], [0.5, 0.5, 0.0, 0.0, 0.0, 0.0]),
}


def chi_square(counts: np.ndarray, p: np.ndarray) -> tuple[float, int]:
    n = counts.sum()
    support = p > 0
    assert counts[~support].sum() == 0, "sampled a token with p = 0"
    expected = n * p[support]
    return float(((counts[support] - expected) ** 2 / expected).sum()), int(support.sum() - 1)


@pytest.mark.parametrize("name", list(PAIRS))
def test_accept_or_resample_reproduces_target_distribution(name: str) -> None:
    p, q = (np.array(v, dtype=np.float64) for v in PAIRS[name])
    rng = np.random.default_rng(1234)
    n = 60_000
    counts = np.zeros(len(p), dtype=np.int64)
    accepted = 0
    drafts = rng.choice(len(q), size=n, p=q)
    for d in drafts:
        ok, tok = sampling.accept_or_resample(p, q, int(d), rng)
        counts[tok] += 1
        accepted += ok
    stat, dof = chi_square(counts, p)
    if dof > 0:
        assert stat < CHI2_9999[dof], f"{name}: chi2={stat:.1f} dof={dof} counts={counts} p={p}"
    else:
        assert counts[np.argmax(p)] == n
    # the acceptance rate of speculative sampling is sum(min(p, q))
    expected_accept = np.minimum(p, q).sum()
    sigma = np.sqrt(expected_accept * (1 - expected_accept) / n)
    assert abs(accepted / n - expected_accept) < 5 * sigma + 1e-9


@pytest.mark.parametrize("draft_token", [0, 2, 4])
def test_deterministic_draft_reproduces_target_distribution(draft_token: int) -> None:
    """Prompt lookup drafts one token with certainty (q is a point mass): output must still be p."""
    p = np.array([0.35, 0.25, 0.2, 0.2, 0.0])
    rng = np.random.default_rng(7)
    n = 40_000
    counts = np.zeros(len(p), dtype=np.int64)
    for _ in range(n):
        _, tok = sampling.accept_or_resample(p, None, draft_token, rng)
        counts[tok] += 1
    stat, dof = chi_square(counts, p)
    assert stat < CHI2_9999[dof], counts


def test_greedy_distribution_is_one_hot_and_verification_is_exact_match() -> None:
    logits = np.array([0.1, 2.0, 1.9, -1.0], dtype=np.float32)
    params = SamplingParams(temperature=0.0)
    p = sampling.distribution(logits, [], params)
    assert p.tolist() == [0.0, 1.0, 0.0, 0.0]
    rng = np.random.default_rng(0)
    assert sampling.accept_or_resample(p, None, 1, rng) == (True, 1)
    assert sampling.accept_or_resample(p, None, 2, rng) == (False, 1)


def reference_distribution(logits: np.ndarray, history: list[int], prm: SamplingParams) -> np.ndarray:
    """A slow, obvious implementation of the same chain, to check the fast one against."""
    x = logits.astype(np.float32).copy()  # llama.cpp applies the penalty to float logits
    for t in set(history[-prm.repeat_last_n :]) if prm.repeat_last_n else set():
        x[t] = x[t] * np.float32(prm.repeat_penalty) if x[t] <= 0 else x[t] / np.float32(prm.repeat_penalty)
    x = x.astype(np.float64)
    order = sorted(range(len(x)), key=lambda i: (-x[i], i))
    if prm.top_k:
        order = order[: prm.top_k]
    probs = np.exp(x[order] - x[order].max())
    probs /= probs.sum()
    if prm.top_p < 1:
        cum, cut = 0.0, len(order)
        for j, pj in enumerate(probs):
            cum += pj
            if cum >= prm.top_p:
                cut = j + 1
                break
        order, probs = order[:cut], probs[:cut] / probs[:cut].sum()
    if prm.min_p > 0:
        keep = [j for j, pj in enumerate(probs) if pj >= prm.min_p * probs[0]]
        order = [order[j] for j in keep]
    out = np.zeros(len(x))
    z = x[order] / prm.temperature
    e = np.exp(z - z.max())
    out[order] = e / e.sum()
    return out


@pytest.mark.parametrize(
    "prm",
    [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.7, top_k=5),
        SamplingParams(temperature=1.3, top_p=0.8),
        SamplingParams(temperature=0.9, min_p=0.1),
        SamplingParams(temperature=1.0, top_k=20, top_p=0.9, min_p=0.05, repeat_penalty=1.3),
        SamplingParams(temperature=0.5, repeat_penalty=0.8, repeat_last_n=3),
    ],
)
def test_distribution_matches_reference(prm: SamplingParams) -> None:
    rng = np.random.default_rng(5)
    for _ in range(20):
        logits = rng.normal(0, 2.5, size=64).astype(np.float32)
        history = rng.integers(0, 64, size=10).tolist()
        got = sampling.distribution(logits, history, prm)
        want = reference_distribution(logits, history, prm)
        np.testing.assert_allclose(got, want, atol=1e-9)
        assert abs(got.sum() - 1) < 1e-9


def test_penalty_makes_repeated_tokens_less_likely_and_leaves_input_alone() -> None:
    logits = np.array([2.0, -1.0, 1.0], dtype=np.float32)
    prm = SamplingParams(repeat_penalty=2.0)
    out = sampling.penalized(logits, [0, 1], prm)
    assert out.tolist() == [1.0, -2.0, 1.0]
    assert logits.tolist() == [2.0, -1.0, 1.0]
    assert sampling.greedy_token(logits, [0, 1], prm) == 0  # tie 1.0 vs 1.0: lowest id
    assert sampling.greedy_token(logits, [0, 1], SamplingParams(repeat_penalty=2.5)) == 2


def test_presence_and_frequency_penalties_follow_llama_cpp() -> None:
    logits = np.array([2.0, -1.0, 1.0, 0.5], dtype=np.float32)
    prm = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25)
    out = sampling.penalized(logits, [0, 0, 0, 1], prm)  # token 0 three times, token 1 once
    assert out.tolist() == pytest.approx([2.0 - 0.75 - 0.5, -1.0 - 0.25 - 0.5, 1.0, 0.5])
    assert sampling.greedy_token(logits, [0, 0, 0, 1], prm) == 2
    assert not SamplingParams().penalizes and prm.penalizes
    assert not SamplingParams(presence_penalty=1.0, repeat_last_n=0).penalizes
    with pytest.raises(SamplingError, match="presence_penalty"):
        SamplingParams(presence_penalty=3.0)


def test_sample_follows_distribution() -> None:
    p = np.array([0.1, 0.0, 0.6, 0.3])
    rng = np.random.default_rng(3)
    counts = np.bincount([sampling.sample(p, rng) for _ in range(30_000)], minlength=4)
    stat, dof = chi_square(counts, p)
    assert stat < CHI2_9999[dof]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": -0.1},
        {"temperature": float("nan")},
        {"top_k": -1},
        {"top_p": 0.0},
        {"top_p": 1.5},
        {"min_p": 1.0},
        {"repeat_penalty": 0.0},
        {"repeat_last_n": -2},
    ],
)
def test_bad_sampling_settings_are_rejected(kwargs: dict) -> None:
    with pytest.raises(SamplingError):
        SamplingParams(**kwargs)


def test_top_probability_is_exact_at_or_above_its_floor_and_a_bound_below_it() -> None:
    """Auto mode only compares the target's confidence with thresholds of at least 0.9: below the
    floor an upper bound from the two largest logits is enough (and still below the floor)."""
    from app.engine.sampling import top_probability

    rng = np.random.default_rng(3)
    seen_below = seen_above = 0
    for spread in (0.5, 2.0, 4.0, 8.0, 12.0):
        for _ in range(40):
            x = (rng.standard_normal(5000) * spread).astype(np.float32)
            exact = float(1.0 / np.exp(x.astype(np.float64) - x.max()).sum())
            assert top_probability(x) == pytest.approx(exact, rel=1e-5)
            floored = top_probability(x, 0.9)
            if exact >= 0.9:
                seen_above += 1
                assert floored == pytest.approx(exact, rel=1e-5)
            else:
                seen_below += 1
                assert exact * (1 - 1e-5) <= floored < 0.9 or floored == pytest.approx(exact, rel=1e-5)
    assert seen_below and seen_above  # both branches were tried
    one_hot = np.full(10, -50.0, dtype=np.float32)
    one_hot[0] = 50.0  # the largest logit first, or last: the bound looks on both sides
    assert top_probability(one_hot, 0.9) == pytest.approx(1.0)
    assert top_probability(one_hot[::-1].copy(), 0.9) == pytest.approx(1.0)
    tie = np.zeros(4, dtype=np.float32)
    assert top_probability(tie, 0.9) == pytest.approx(0.5)  # two equal largest: at most one half


def test_a_sampled_draft_followed_by_a_copy_keeps_the_targets_law() -> None:
    """Auto mode verifies a draft model's sampled tokens and, after them, a copy chosen from them (a
    point mass at each position): the round's first two tokens still follow the target's joint law."""
    from app.engine.drafting import Proposal
    from app.engine.events import Source
    from app.engine.speculative import verify

    p0 = np.array([0.4, 0.3, 0.2, 0.1])
    p1 = {t: np.roll([0.5, 0.25, 0.15, 0.1], t) for t in range(4)}  # the second token's law after t
    q0 = np.array([0.1, 0.6, 0.2, 0.1])
    copy = {0: 3, 1: 1, 2: 0, 3: 2}  # the copied token after each first token
    params = SamplingParams(temperature=1.0)
    rng = np.random.default_rng(11)
    n = 40_000
    counts = np.zeros((4, 4), dtype=np.int64)
    for _ in range(n):
        d0 = int(rng.choice(4, p=q0))
        proposal = Proposal((d0, copy[d0]), (q0, None), (float(q0[d0]), 1.0), Source.MODEL, 0.0, copied=1)
        rows = {0: np.log(p0), 1: np.log(p1[d0]), 2: np.log(np.full(4, 0.25))}
        out, _ = verify(lambda i, rows=rows: rows[i], [5], proposal, params, rng)
        if len(out) < 2:  # the first token was rejected: the next round draws the second
            out.append(int(rng.choice(4, p=p1[out[0]])))
        counts[out[0], out[1]] += 1
    joint = p0[:, None] * np.array([p1[t] for t in range(4)])
    stat, dof = chi_square(counts.ravel(), joint.ravel())
    assert stat < 44.26, f"chi2={stat:.1f} dof={dof}"  # the 99.99 % quantile at 15 degrees of freedom
