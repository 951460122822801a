"""A reply's statistics, built from its rounds."""

from __future__ import annotations

from app.engine.events import Action, Decision, Mode, Policy, Source, StatsBuilder, Step


def _round(source: Source, drafted: int, accepted: int, copied: int = 0) -> Step:
    decision = Decision(Action.DRAFT, Policy.AUTO, source, k=drafted - copied, copied=copied)
    tokens = tuple(range(accepted + 1))
    return Step(
        text="", tokens=tokens, from_draft=(True,) * accepted + (False,), n_drafted=drafted,
        n_accepted=accepted, k=drafted, drafter=source, decision=decision,
        t_draft=0.0, t_verify=0.01, t_round=0.01, t_llama=0.01,
    )  # fmt: skip


def test_a_copy_after_a_model_draft_counts_as_prompt_lookups_per_source() -> None:
    b = StatsBuilder(Mode.AUTO)
    b.add(_round(Source.MODEL, drafted=5, accepted=4, copied=3))  # 2 drafted by the model, then 3 copied
    b.add(_round(Source.MODEL, drafted=4, accepted=1, copied=2))  # the model's second token failed
    b.add(_round(Source.LOOKUP, drafted=6, accepted=6))
    s = b.build(t_decode=0.03)
    by = {src: (rounds, n, acc) for src, rounds, n, acc in s.drafted_by}
    assert by[Source.MODEL] == (2, 4, 3)
    assert by[Source.LOOKUP] == (3, 11, 8)
    assert sum(n for _, n, _ in by.values()) == s.n_drafted == 15
    assert sum(acc for _, _, acc in by.values()) == s.n_accepted == 11
