"""The replies a benchmark run recorded, made ready to replay: each with its prompt, the target's
confidence in every token and (with a draft model) the draft's greedy predictions; and the costs of
both models measured on this machine now."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.replay import Reply
from bench.run import recorded_ratios


def load_replies(
    data: dict[str, Any], target: str, prompts: Path, draft: str | None = None
) -> tuple[list[Reply], list[float], list[float] | None]:
    """The run's plain replies with the target's confidences (and the ``draft`` model's predictions),
    the target's verify cost ratios for batches of 1 to auto mode's longest, as its warm-up measures
    them on this machine now, and (with a draft) the draft's cost of evaluating batches of 1-32
    (:func:`measure_draft`)."""
    from app.engine import sampling
    from app.engine.engine import Engine, LoadSettings
    from app.engine.llama import Context, Model
    from bench.run import load_prompts

    # A reply recorded with the chat it answered (``bench.multiturn``: a turn of a conversation) is
    # replayed on that chat; otherwise on its prompt from the prompt file. A reply recorded more than
    # once (the repeats of a multi-turn run) is replayed once.
    plain: list[dict[str, Any]] = []
    for r in data["runs"]:
        if r["mode"] == "plain" and all(r["id"] != x["id"] for x in plain):
            plain.append(r)
    need = any("messages" not in r for r in plain)
    text = {row["id"]: row["prompt"] for row in load_prompts(prompts)} if need else {}
    replies = []
    with Engine(LoadSettings(target, draft, n_ctx=512)) as engine:
        ratios = recorded_ratios(engine.costs) or []
        draft_ratios = measure_draft(engine.target, engine.draft) if engine.draft is not None else None
        for run in plain:
            messages = run.get("messages")
            if messages is None and run["id"] in text:
                messages = [{"role": "user", "content": text[run["id"]]}]
            if messages is None:
                continue
            ids = engine.chat_prompt(messages)
            tokens = list(run["tokens"])
            n = len(ids) + len(tokens)
            found: list[tuple[list[int], list[float]]] = []
            models: list[Model] = [engine.target] if engine.draft is None else [engine.target, engine.draft]
            for model in models:
                ctx = Context(model, n_ctx=n + 8, n_batch=n + 8)
                try:
                    ctx.decode([*ids, *tokens], 0, logits="all")
                    rows = [ctx.logits(len(ids) - 1 + i) for i in range(len(tokens))]
                    found.append(
                        ([int(row.argmax()) for row in rows], [sampling.top_probability(x) for x in rows])
                    )
                finally:
                    ctx.close()
            conf = found[0][1]
            guess, guess_conf = found[1] if len(found) > 1 else ([], [])
            replies.append(
                Reply(
                    run["id"],
                    run["category"],
                    ids,
                    tokens,
                    conf,
                    tuple(guess),
                    tuple(guess_conf),
                    engine.target.control_tokens,
                )
            )
    return replies, ratios, draft_ratios


DRAFT_BATCHES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)


def measure_draft(target: Any, draft: Any, context: int = 300, reps: int = 7) -> list[float]:
    """The draft model's cost of evaluating a batch of 1-32 tokens after ``context`` tokens, in steps
    of the target (medians of ``reps`` timings; sizes between the timed ones interpolated)."""
    import statistics
    import time

    from app.engine.llama import Context

    def timed(ctx: Any, n: int) -> float:
        samples = []
        for _ in range(reps):
            ctx.trim(context)
            t0 = time.perf_counter()
            ctx.decode([(2000 + i) % vocab for i in range(n)], context, logits="last")
            samples.append(time.perf_counter() - t0)
        return statistics.median(samples)

    vocab = min(target.n_vocab, draft.n_vocab)
    ctxs = [Context(m, n_ctx=context + 64, n_batch=64) for m in (target, draft)]
    try:
        for ctx in ctxs:
            ctx.decode([(1000 + i) % vocab for i in range(context)], 0, logits="none")
        step = timed(ctxs[0], 1)
        at = {n: timed(ctxs[1], n) / step for n in DRAFT_BATCHES}
    finally:
        for ctx in ctxs:
            ctx.close()
    out = []
    for b in range(1, DRAFT_BATCHES[-1] + 1):
        lo = max(n for n in DRAFT_BATCHES if n <= b)
        hi = min(n for n in DRAFT_BATCHES if n >= b)
        out.append(round(at[lo] + (at[hi] - at[lo]) * ((b - lo) / (hi - lo) if hi > lo else 0.0), 3))
    return out
