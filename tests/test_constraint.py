"""Structured output (a Constraint: any JSON object, a JSON schema, a GBNF grammar) in every mode, on the
tiny real models: greedy output equal to plain decoding's token for token, sampling exact, the reply
following the grammar and ending where it is complete; drafts held to the grammar; the verification
step on a made-up distribution; the interface, and the constraint through the engine process."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import time
from collections import Counter
from dataclasses import replace

import jsonschema
import numpy as np
import pytest

from app.engine import (
    Constraint,
    ConstraintError,
    EngineClient,
    EngineError,
    GenerationSettings,
    LoadSettings,
    Source,
    Step,
)
from app.engine.drafting.base import Proposal
from app.engine.engine import Engine
from app.engine.events import Source as EventSource
from app.engine.sampling import SamplingParams, distribution
from app.engine.speculative import verify, within_grammar

# A guard against a hang, not a speed check: 1.5 s a test on a quiet 2-core EPYC, over 240 s while CI's
# Vulkan build ran beside the suite there (two llama.cpp threads on two busy cores).
pytestmark = pytest.mark.timeout(900)

PROMPTS = [
    "def add(a, b):",
    "Hello world, this is",
    "The quick brown fox",
    "One, two, three, one, two, three, one, two,",
]
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "ok": {"type": "boolean"},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
    },
    "required": ["name", "age", "ok", "tags"],
    "additionalProperties": False,
}
LIST_GBNF = 'root ::= "[" item ("," " "? item){0,5} "]"\nitem ::= [a-z]{1,8} | [0-9]{1,3}'
CONSTRAINTS = {
    "json_object": Constraint("json_object"),
    "json_schema": Constraint("json_schema", schema=json.dumps(SCHEMA), strict=True),
    "gbnf": Constraint("gbnf", gbnf=LIST_GBNF),
}
MODES = [  # (mode, n_max, adaptive)
    ("speculative", 1, False),
    ("speculative", 4, False),
    ("speculative", 8, True),
    ("lookup", 8, True),
    ("auto", 8, True),
]
TIE_TOLERANCE = 1e-3  # F32 weights: batched and single-token evaluation agree to ~1e-5


@pytest.fixture(scope="module")
def engine(tiny_pair, tmp_path_factory) -> Engine:
    folder = tmp_path_factory.mktemp("constraint-history")
    eng = Engine(
        LoadSettings(
            target=str(tiny_pair.target),
            draft=str(tiny_pair.draft),
            n_ctx=512,
            n_threads=2,
            history_dir=str(folder),
        )
    )
    deadline = time.monotonic() + 30
    while not eng.history_info().ready:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    yield eng
    eng.close()


def settings(mode: str, constraint: Constraint | None, **kw) -> GenerationSettings:
    return GenerationSettings(mode=mode, max_tokens=kw.pop("max_tokens", 100), constraint=constraint, **kw)


def assert_same_or_tie(engine: Engine, constraint: Constraint, prompt, want, got) -> bool:
    """Equal, or the first difference is a numerical tie among the tokens the grammar allows there."""
    if want == got:
        return True
    i = next((j for j, (a, b) in enumerate(zip(want, got, strict=False)) if a != b), min(len(want), len(got)))
    grammar = engine._grammar(settings("plain", constraint))
    for t in want[:i]:
        grammar.consume(t)
    from app.engine.llama import Context

    ctx = Context(engine.target, n_ctx=len(prompt) + i + 8, n_threads=2)
    try:
        ctx.decode([*prompt, *want[:i]], 0, logits="last")
        allowed = ctx.logits(-1)[grammar.mask()].astype(np.float64)
    finally:
        ctx.close()
    top = np.sort(allowed)[-2:]
    gap = float(top[1] - top[0]) if len(top) == 2 else np.inf
    assert gap < TIE_TOLERANCE, (
        f"differ at token {i}, allowed top-2 gap {gap:.4f}\nplain: {want}\ngot:   {got}"
    )
    return False


def check_follows(kind: str, text: str, complete: bool) -> None:
    if not complete:
        return
    if kind == "gbnf":
        body = text[1:-1].replace(" ", "")
        assert text[0] == "[" and text[-1] == "]" and all(x.isalnum() for x in body.split(",")), text
        return
    value = json.loads(text)
    assert isinstance(value, dict)
    if kind == "json_schema":
        jsonschema.validate(value, SCHEMA)


# -- greedy: lossless in every mode -------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(CONSTRAINTS))
def test_greedy_constrained_output_is_plain_constrained_output_in_every_mode(
    engine: Engine, kind: str
) -> None:
    constraint = CONSTRAINTS[kind]
    complete = ties = drafted = accepted = 0
    for prompt in PROMPTS:
        ids = engine.tokenize(prompt)
        plain = engine.run(ids, settings("plain", constraint))
        done = plain.reason == "eog"
        check_follows(kind, plain.text, done)
        complete += done
        for mode, n_max, adaptive in MODES:
            fin = engine.run(ids, settings(mode, constraint, n_max=n_max, adaptive=adaptive))
            ties += not assert_same_or_tie(engine, constraint, ids, plain.tokens, fin.tokens)
            if fin.tokens == plain.tokens:
                assert fin.reason == plain.reason and fin.text == plain.text
            drafted += fin.stats.n_drafted
            accepted += fin.stats.n_accepted
        unconstrained = engine.run(ids, settings("plain", None))
        assert unconstrained.tokens != plain.tokens, "the constraint should change the reply"
    assert complete >= 1, f"no {kind} reply was complete within 100 tokens"
    assert ties <= 2
    # drafts hold to the grammar (the draft model is masked by it, copies are cut): acceptance holds
    assert drafted > 0 and accepted / drafted > 0.3, (drafted, accepted)


def test_json_schema_reply_validates_and_equals_plain_in_every_mode_with_the_history(engine: Engine) -> None:
    """Auto mode copies a reply from the drafting history (the same request before) and is lossless."""
    constraint = CONSTRAINTS["json_schema"]
    for prompt in PROMPTS[:3]:
        ids = engine.tokenize(prompt)
        plain = engine.run(ids, settings("plain", constraint, max_tokens=160, history_doc=f"p-{prompt}"))
        assert plain.reason == "eog", f"incomplete reply: {plain.text!r}"
        jsonschema.validate(json.loads(plain.text), SCHEMA)
        events = list(
            engine.generate(ids, settings("auto", constraint, max_tokens=160, history_doc=f"a-{prompt}"))
        )
        fin = events[-1]
        assert fin.tokens == plain.tokens and fin.text == plain.text
        jsonschema.validate(json.loads(fin.text), SCHEMA)
        sources = {e.drafter for e in events if isinstance(e, Step) and e.n_drafted}
        assert Source.HISTORY in sources or EventSource.LOOKUP in sources, sources


def test_the_reply_ends_where_the_grammar_is_complete(engine: Engine) -> None:
    yes_no = Constraint("gbnf", gbnf='root ::= "yes" | "no"')
    for prompt in PROMPTS:
        ids = engine.tokenize(prompt)
        plain = engine.run(ids, settings("plain", yes_no))
        assert plain.text in ("yes", "no") and plain.reason == "eog"
        for mode, n_max, adaptive in MODES:
            fin = engine.run(ids, settings(mode, yes_no, n_max=n_max, adaptive=adaptive))
            assert (fin.tokens, fin.text, fin.reason) == (plain.tokens, plain.text, "eog")
    # Lark through the same field: a special token by name and an embedded JSON schema
    lark = Constraint("gbnf", gbnf='start: <|im_start|> "n=" %json {"type": "integer", "maximum": 99}')
    ids = engine.tokenize(PROMPTS[1])
    plain = engine.run(ids, settings("plain", lark))
    start = engine.target.tokenize("<|im_start|>", add_special=False, parse_special=True)
    assert plain.reason == "eog" and plain.tokens[0] == start[0] and plain.text.startswith("n=")
    assert 0 <= json.loads(plain.text[2:]) <= 99
    for mode, n_max, adaptive in MODES:
        assert engine.run(ids, settings(mode, lark, n_max=n_max, adaptive=adaptive)).tokens == plain.tokens
    # the end of the turn is allowed only where the grammar is complete: an incomplete reply is cut
    short = engine.run(
        engine.tokenize(PROMPTS[0]), settings("auto", CONSTRAINTS["json_schema"], max_tokens=5)
    )
    assert short.reason == "length" and short.text.startswith("{")


# -- sampling: exact ------------------------------------------------------------------------------------


def test_constrained_sampling_follows_plain_constrained_sampling_in_every_mode(engine: Engine) -> None:
    """The joint law of the first tokens of a constrained reply: speculative (the draft masked too) and
    prompt lookup (copying the prompt's lists) against plain, two-sample chi-square; every sample
    follows the grammar. (Auto mode drafts with one or the other.)"""
    prompt = engine.tokenize("go[ab, cd] go[ab, cd] go")
    constraint = CONSTRAINTS["gbnf"]
    n = 300
    counts: dict[str, Counter] = {}
    for mode in ("plain", "speculative", "lookup"):
        c: Counter = Counter()
        drafted = 0
        for i in range(n):
            params = SamplingParams(temperature=1.0, top_k=4, seed=i)
            # four tokens: the first comes with the prompt's batch, drafts cover the next ones
            fin = engine.run(prompt, settings(mode, constraint, sampling=params, max_tokens=4, n_max=2))
            assert fin.text.startswith("[")
            c[fin.tokens] += 1
            drafted += fin.stats.n_drafted
        assert (drafted > n) == (mode != "plain"), (mode, drafted)
        counts[mode] = c
    a = counts["plain"]
    for mode in ("speculative", "lookup"):
        b = counts[mode]
        keys = sorted(set(a) | set(b))
        x = np.array([a[k] for k in keys], dtype=float)
        y = np.array([b[k] for k in keys], dtype=float)
        mask = (x + y) >= 10
        stat = (((x - y) ** 2) / (x + y))[mask].sum()
        dof = int(mask.sum()) - 1
        assert dof >= 3, "the grammar should leave several likely replies"
        assert stat < 3 * dof + 15, f"{mode}: chi2={stat:.1f} dof={dof}\nplain={a}\n{mode}={b}"


class FakeGrammar:
    """Allows a fixed set of tokens at every position (and consumes anything allowed)."""

    def __init__(self, allowed: list[int], n: int):
        self._mask = np.zeros(n, dtype=bool)
        self._mask[allowed] = True
        self.consumed: list[int] = []
        self.done = False

    def allows(self, token: int) -> bool:
        return bool(self._mask[token])

    def mask(self) -> np.ndarray:
        return self._mask

    def valid_prefix(self, tokens) -> int:
        return next((i for i, t in enumerate(tokens) if not self._mask[t]), len(tokens))

    def consume(self, token: int) -> None:
        assert self._mask[token], f"consumed a forbidden token {token}"
        self.consumed.append(token)


@pytest.mark.parametrize("draft", ["model", "lookup"])
def test_a_drafted_token_the_grammar_forbids_is_rejected_and_the_law_is_exact(draft: str) -> None:
    """A draft sampled from an unmasked ``q`` (or copied) that the grammar forbids is rejected; the
    token that comes out follows the target's distribution masked by the grammar."""
    logits = np.log(np.array([0.30, 0.05, 0.25, 0.10, 0.20, 0.10], dtype=np.float32))
    allowed = [1, 2, 3]
    params = SamplingParams(temperature=1.0)
    p = distribution(logits, [], params, FakeGrammar(allowed, 6))
    assert p[[0, 4, 5]].sum() == 0 and p.sum() == pytest.approx(1.0)
    q = np.array([0.4, 0.1, 0.1, 0.1, 0.2, 0.1])
    rng = np.random.default_rng(5)
    counts = np.zeros(6)
    n = 30_000
    for _ in range(n):
        d = int(rng.choice(6, p=q)) if draft == "model" else 0
        grammar = FakeGrammar(allowed, 6)
        proposal = Proposal((d,), (q if draft == "model" else None,), (1.0,), Source.MODEL, 0.0)
        out, from_draft = verify(lambda i: logits, [7], proposal, params, rng, grammar)
        assert grammar.consumed == out
        assert from_draft[0] == (d in allowed and from_draft[0])
        counts[out[0]] += 1
    expected = n * p[allowed]
    stat = float(((counts[allowed] - expected) ** 2 / expected).sum())
    assert counts[[0, 4, 5]].sum() == 0 and stat < 18.42, (counts, p)  # chi2 99.99% at 2 dof


def test_greedy_verification_takes_the_argmax_among_allowed_tokens() -> None:
    logits = np.array([5.0, 1.0, 3.0, 2.0], dtype=np.float32)
    params = SamplingParams()
    grammar = FakeGrammar([1, 2, 3], 4)
    # the unconstrained argmax (0) drafted: rejected, and the target's token is the allowed argmax
    out, ok = verify(
        lambda i: logits, [9], Proposal((0,), (None,), (1.0,), Source.LOOKUP, 0.0), params, None, grammar
    )
    assert (out, ok) == ([2], [False])
    out, ok = verify(
        lambda i: logits, [9], Proposal((2,), (None,), (1.0,), Source.LOOKUP, 0.0), params, None, grammar
    )
    assert (out, ok) == ([2, 2], [True, False]) and grammar.consumed == [2, 2, 2]


def test_a_proposal_is_cut_where_the_grammar_forbids_it() -> None:
    grammar = FakeGrammar([1, 2], 4)
    q = np.full(4, 0.25)
    copy = Proposal((1, 2, 3, 1), (None,) * 4, (1.0,) * 4, Source.LOOKUP, 0.0)
    sampled = Proposal((1, 3, 2), (q, q, q), (0.5,) * 3, Source.MODEL, 0.0)
    hot = SamplingParams(temperature=0.8)
    assert within_grammar(copy, grammar, hot).tokens == (1, 2)
    assert within_grammar(sampled, grammar, SamplingParams()).tokens == (1,)  # greedy: cut before it
    kept = within_grammar(sampled, grammar, hot)  # sampled from q: kept, for the rule to reject it
    assert kept.tokens == (1, 3) and len(kept.q) == len(kept.confidence) == 2


# -- drafters ------------------------------------------------------------------------------------------


def test_drafters_draft_within_the_grammar_and_leave_its_state(engine: Engine) -> None:
    constraint = CONSTRAINTS["json_schema"]
    ids = engine.tokenize(PROMPTS[2])
    rng = np.random.default_rng(0)
    for params in (SamplingParams(), SamplingParams(temperature=0.9, seed=1)):
        grammar = engine._grammar(settings("plain", constraint))
        start = grammar.mask().copy()
        model = engine._model_drafter
        model.begin(ids)
        prop = model.propose(ids, 12, params, rng, grammar=grammar)
        assert len(prop.tokens) >= 4 and grammar.valid_prefix(prop.tokens) == len(prop.tokens)
        assert (grammar.mask() == start).all(), "the drafter changed the grammar's state"
    # prompt lookup: a copy of the prompt's own text is cut before what the grammar forbids
    text = 'Like {"name": "ab", "age": 3, "ok": true, "tags": []} and more text after it.'
    from app.engine.drafting import LookupDrafter

    lookup = LookupDrafter()
    ctx = engine.tokenize(text)
    lookup.begin(ctx)
    grammar = engine._grammar(settings("plain", constraint))
    reply = engine.target.tokenize('{"name": "ab", "age": 3', add_special=False, parse_special=False)
    for t in reply:
        grammar.consume(t)
    free = lookup.propose([*ctx, *reply], 40, SamplingParams(), rng)
    cut = lookup.propose([*ctx, *reply], 40, SamplingParams(), rng, grammar=grammar)
    assert len(cut.tokens) < len(free.tokens) and free.tokens[: len(cut.tokens)] == cut.tokens
    assert cut.tokens and grammar.valid_prefix(cut.tokens) == len(cut.tokens)
    completed = engine.detokenize([*reply, *cut.tokens])
    assert json.loads(completed) == {"name": "ab", "age": 3, "ok": True, "tags": []}


# -- the interface --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kind": "xml"}, "unknown constraint kind"),
        ({"kind": "json_schema"}, "needs its schema"),
        ({"kind": "json_schema", "schema": "{"}, "not valid JSON"),
        ({"kind": "json_schema", "schema": "[1, 2]"}, "must be a JSON object"),
        ({"kind": "json_schema", "schema": "false"}, "allows no value"),
        ({"kind": "json_schema", "schema": '{"type": "strin"}'}, "Invalid type"),
        ({"kind": "json_schema", "schema": '{"if": {}}', "strict": True}, "Unimplemented keys"),
        ({"kind": "json_schema", "schema": '{"type": "string", "pattern": "(("}'}, "regex"),
        ({"kind": "gbnf"}, "needs its gbnf"),
        ({"kind": "gbnf", "gbnf": "root ::= foo"}, "foo"),
        ({"kind": "gbnf", "gbnf": 'rooot ::= "x"'}, "root"),
        ({"kind": "json_object", "schema": "{}"}, "takes no schema"),
    ],
)
def test_an_unusable_constraint_is_a_one_line_error(kwargs: dict, message: str) -> None:
    with pytest.raises(ConstraintError, match=message) as info:
        Constraint(**kwargs)
    assert isinstance(info.value, EngineError) and "\n" not in str(info.value)
    assert len(str(info.value)) <= 400


def test_a_lenient_schema_ignores_what_the_grammar_engine_lacks() -> None:
    Constraint("json_schema", schema='{"type": "object", "if": {}}')  # strict=False: "if" ignored
    Constraint("json_schema", schema="true")


def test_settings_carry_the_constraint_across_the_process_boundary() -> None:
    gs = GenerationSettings.from_options("auto", temperature=0.5, constraint=CONSTRAINTS["json_schema"])
    assert gs.constraint == CONSTRAINTS["json_schema"]
    assert pickle.loads(pickle.dumps(gs)) == gs
    with pytest.raises(EngineError, match="Constraint"):
        GenerationSettings(constraint={"kind": "json_object"})  # type: ignore[arg-type]


def test_building_a_constraint_does_not_load_llama_cpp() -> None:
    code = (
        "import sys; from app.engine import Constraint; Constraint('json_schema', schema='{}', strict=True); "
        "print('llama_cpp' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_constraint_through_the_engine_process(tiny_pair, engine: Engine) -> None:
    gs = settings("auto", CONSTRAINTS["json_schema"], max_tokens=160)
    want = engine.run(engine.tokenize(PROMPTS[0]), gs)
    with EngineClient() as client:
        client.start()
        client.load(LoadSettings(target=str(tiny_pair.target), draft=str(tiny_pair.draft), n_ctx=512))
        fin = list(client.generate(text=PROMPTS[0], settings=gs))[-1]
        assert (fin.tokens, fin.reason) == (want.tokens, want.reason)
        jsonschema.validate(json.loads(fin.text), SCHEMA)
        # a constraint that skipped the checks (built by hand) is refused in the engine, with its type
        bad = Constraint("json_object")
        object.__setattr__(bad, "kind", "gbnf")
        object.__setattr__(bad, "gbnf", "root ::= nowhere")
        with pytest.raises(ConstraintError, match="nowhere"):
            list(client.generate(text=PROMPTS[0], settings=replace(gs, constraint=bad)))
        assert list(client.generate(text=PROMPTS[0], settings=gs))[-1].tokens == want.tokens


def test_the_cost_benchmark_replays_a_reply_through_the_grammar(engine: Engine) -> None:
    from app.engine.grammar_llama import vocabulary
    from bench.grammar_cost import replay

    vocab = vocabulary(engine.target)
    report = replay(engine.target, CONSTRAINTS["json_object"], vocab)
    assert report["tokens"] > 50 and report["mask"]["median_ms"] > 0 and report["fork"]["max_ms"] > 0
