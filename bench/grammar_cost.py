"""What structured output costs per token: the grammar's work at each position of a JSON reply.

On a model's real vocabulary (``--model``, e.g. a Qwen2.5 GGUF: 152k tokens; default: the tiny test
model, 509), replays a JSON reply that follows a schema token by token through
:class:`app.engine.grammar.Grammar` and times, per position:

- ``mask``: which tokens of the vocabulary the grammar allows (what sampling needs at each position);
- ``allows``: whether one token is allowed (greedy decoding's check of the argmax, and a draft's);
- ``greedy``: the constrained argmax when the argmax is forbidden (mask and masked argmax);
- ``sampled`` and ``sampled_free``: the sampling transform (temperature 0.8, top-p 0.95) over the
  allowed tokens (the mask included), and over the whole vocabulary;
- ``consume``, ``fork`` (a drafter's copy of the state);

then, with ``--decode N``, plain greedy decoding of N tokens with and without a ``json_object``
constraint on the model (ms per token; the difference is the constraint's cost end to end).
Building the vocabulary for the grammar engine (once per loaded model) and compiling a grammar are
timed too. ``python -m bench.grammar_cost [--model PATH] [--decode 64]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from app.engine.engine import Engine
from app.engine.grammar import Grammar, _compile, compile_constraint
from app.engine.grammar_llama import vocabulary
from app.engine.llama import Model
from app.engine.sampling import SamplingParams, distribution, greedy_token
from app.engine.settings import Constraint, GenerationSettings, LoadSettings

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "version": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "config": {"type": "object"},
    },
    "required": ["name", "version", "tags", "config"],
}
REPLY = (
    '{\n  "name": "tandem",\n  "version": 3,\n  "tags": ["speculative", "decoding", "lossless"],\n'
    '  "config": {"n_max": 8, "adaptive": true, "ratio": 0.75, "modes": ["auto", "plain"]}\n}'
)


def _ms(times: list[float]) -> dict[str, float]:
    s = sorted(times)
    return {
        "median_ms": round(statistics.median(s) * 1e3, 4),
        "p90_ms": round(s[int(0.9 * (len(s) - 1))] * 1e3, 4),
        "max_ms": round(s[-1] * 1e3, 4),
    }


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def replay(model: Model, constraint: Constraint, vocab) -> dict:
    """Per-position costs over ``REPLY`` under ``constraint``."""
    _compile.cache_clear()
    t0 = time.perf_counter()
    grammar_text = compile_constraint(constraint)
    t_compile = time.perf_counter() - t0
    t_start_first = _timed(lambda: Grammar(vocab, grammar_text))
    t_start = _timed(lambda: Grammar(vocab, grammar_text))
    tokens = model.tokenize(REPLY, add_special=False, parse_special=False)
    g = Grammar(vocab, grammar_text)
    rng = np.random.default_rng(0)
    hot = SamplingParams(temperature=0.8, top_p=0.95)
    names = ("mask", "allows", "greedy", "sampled", "sampled_free", "consume", "fork")
    rows: dict[str, list[float]] = {k: [] for k in names}
    for tok in tokens:
        logits = rng.standard_normal(model.n_vocab).astype(np.float32)
        forbidden = int(np.flatnonzero(~g.mask())[0])  # (the mask is computed again below)
        logits[forbidden] = 50.0  # the argmax is forbidden: the greedy check falls back to the mask
        g._mask = None
        rows["mask"].append(_timed(g.mask))
        rows["allows"].append(_timed(lambda t=tok: g.allows(t)))
        g._mask = None
        rows["greedy"].append(_timed(lambda x=logits: greedy_token(x, [], SamplingParams(), g)))
        g._mask = None
        rows["sampled_free"].append(_timed(lambda x=logits: distribution(x, [], hot)))
        rows["sampled"].append(_timed(lambda x=logits: distribution(x, [], hot, g)))
        rows["fork"].append(_timed(g.fork))
        rows["consume"].append(_timed(lambda t=tok: g.consume(t)))
    assert g.done, "the reply should complete the grammar"
    return {
        "constraint": constraint.kind,
        "tokens": len(tokens),
        "compile_ms": round(t_compile * 1e3, 3),
        "first_request_ms": round(t_start_first * 1e3, 3),
        "request_ms": round(t_start * 1e3, 3),
        **{k: _ms(v) for k, v in rows.items()},
    }


def decode(path: Path, n: int, threads: int) -> dict:
    """Plain greedy decoding with and without a json_object constraint, interleaved, 3 times each."""
    out: dict[str, list[float]] = {"free": [], "json_object": []}
    with Engine(LoadSettings(target=str(path), n_ctx=1024, n_threads=threads)) as eng:
        text = "Describe this project as a JSON object with its name, version and tags:"
        prompt = eng.target.tokenize(text, add_special=True, parse_special=False)
        constraint = Constraint("json_object")
        eng.run(prompt, GenerationSettings(mode="plain", max_tokens=4, constraint=constraint))  # vocab
        for _ in range(3):
            for name, c in (("free", None), ("json_object", constraint)):
                eng.reset()
                fin = eng.run(prompt, GenerationSettings(mode="plain", max_tokens=n, constraint=c))
                out[name].append(fin.stats.t_decode_s / max(1, fin.stats.n_generated))
    return {k: round(statistics.median(v) * 1e3, 3) for k, v in out.items()}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="a GGUF whose vocabulary to use (default: the tiny test model)")
    ap.add_argument("--decode", type=int, default=0, help="also decode this many tokens, with and without")
    ap.add_argument("--threads", type=int, default=1, help="decoding threads (1: least disturbed by load)")
    args = ap.parse_args(argv)
    if args.model:
        path = Path(args.model)
    else:
        from app.tiny_gguf import write_tiny_pair

        path = Path(write_tiny_pair(Path(tempfile.mkdtemp(prefix="tandem-grammar-")))[0])
    model = Model(path)
    t0 = time.perf_counter()
    vocab = vocabulary(model)
    report = {
        "model": path.name,
        "n_vocab": model.n_vocab,
        "vocabulary_build_s": round(time.perf_counter() - t0, 3),
        "replays": [
            replay(model, c, vocab)
            for c in (Constraint("json_object"), Constraint("json_schema", schema=json.dumps(SCHEMA)))
        ],
    }
    model.close()
    if args.decode:
        report["decode_ms_per_token"] = decode(path, args.decode, args.threads)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
