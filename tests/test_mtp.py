"""Multi-token-prediction drafting: a tiny Qwen3.5 with one MTP block and a tiny Step-3.5 with three
chained ones, loaded by the real llama.cpp."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import llama_cpp
import pytest
from llama_cpp import llama_cpp_ext
from sampled_law import assert_same_first_tokens_law, assert_stays_in_step

from app.engine.engine import Engine
from app.engine.errors import EngineError
from app.engine.events import Finished, Source, Step
from app.engine.llama_mtp import PARAMS, SYMBOLS
from app.engine.settings import Constraint, GenerationSettings, LoadSettings
from app.tiny_arch import write_tiny_model

LIST_GBNF = 'root ::= "[" item ("," " "? item){0,5} "]"\nitem ::= [a-z]{1,8} | [0-9]{1,3}'
PROMPTS = (
    "Once upon a time there was a cat who",
    "def fib(n):\n    return",
    "The list of colours: red, green, blue, red, green,",
)


HEADS = {"qwen35": 1, "step35": 3}


@pytest.fixture(scope="module", params=sorted(HEADS))
def mtp_target(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    arch = request.param
    return write_tiny_model(tmp_path_factory.mktemp("mtp") / f"tiny-{arch}-mtp.gguf", arch, mtp=HEADS[arch])


@pytest.fixture(scope="module")
def engine(mtp_target: Path):
    with Engine(LoadSettings(target=str(mtp_target), n_ctx=1024, n_threads=1)) as eng:
        yield eng


def test_the_bindings_mtp_drafting_calls_exist() -> None:
    """An upgrade of llama-cpp-python that drops or renames one fails here, not in a user's chat."""
    modules = {"llama_cpp": llama_cpp, "llama_cpp_ext": llama_cpp_ext}
    for module, names in SYMBOLS.items():
        for name in names:
            assert callable(getattr(modules[module], name, None)) or isinstance(
                getattr(modules[module], name), int
            ), f"{module}.{name}"
    for struct, fields in PARAMS.items():
        known = {f[0] for f in getattr(llama_cpp, struct)._fields_}
        assert set(fields) <= known, (struct, set(fields) - known)


def test_the_heads_load_with_the_target(engine: Engine) -> None:
    arch = engine.target.meta("general.architecture")
    assert engine.target.n_layer_nextn == HEADS[arch]
    assert engine.target.n_layer == {"qwen35": 4, "step35": 2}[arch]  # the trunk: MTP blocks apart


def test_greedy_mtp_equals_plain_decoding(engine: Engine) -> None:
    drafted = accepted = 0
    for text in PROMPTS:
        prompt = engine.tokenize(text)
        plain = engine.run(prompt, GenerationSettings(mode="plain", max_tokens=48))
        for n_max, adaptive in ((1, False), (3, False), (8, True)):
            gs = GenerationSettings(mode="mtp", max_tokens=48, n_max=n_max, adaptive=adaptive)
            got = engine.run(prompt, gs)
            assert got.tokens == plain.tokens, (text, n_max)
            drafted += got.stats.n_drafted
            accepted += got.stats.n_accepted
    assert 0 < accepted < drafted  # both accepted and rejected drafts were exercised


def test_mtp_steps_say_the_head_drafted(engine: Engine) -> None:
    events = list(engine.generate(engine.tokenize(PROMPTS[0]), GenerationSettings(mode="mtp", max_tokens=12)))
    steps = [e for e in events if isinstance(e, Step) and e.n_drafted]
    assert steps and all(s.drafter is Source.MTP for s in steps)


def test_auto_mode_measures_and_drafts_with_the_head_and_equals_plain(engine: Engine) -> None:
    """Auto mode takes the head as one of its sources (no draft model here: the head and prompt
    lookup): it times the head's step, drafts with it where that pays, and says so in each round; the
    head stays in step when auto and mode "mtp" take turns on one engine."""
    sources: Counter = Counter()
    for text in PROMPTS:
        prompt = engine.tokenize(text)
        plain = engine.run(prompt, GenerationSettings(mode="plain", max_tokens=40))
        for mode in ("auto", "mtp", "auto"):
            events = list(engine.generate(prompt, GenerationSettings(mode=mode, max_tokens=40)))
            fin = events[-1]
            assert isinstance(fin, Finished) and fin.tokens == plain.tokens, (text, mode)
            if mode == "auto":
                sources.update(e.decision.source for e in events if isinstance(e, Step))
    assert sources[Source.MTP] > 0  # measured, drafted or paused: the head is in auto mode's choice
    auto = engine._drafter(GenerationSettings(mode="auto"))
    assert auto.mtp_costs.draft_step() is not None  # its step was timed, apart from any draft model's
    assert "mtp" in auto.state()


def test_sampled_mtp_output_follows_plain_sampling(engine: Engine) -> None:
    """At temperature 1 the joint law of the first three tokens is the same with and without the head."""
    assert_same_first_tokens_law(engine, engine.tokenize(PROMPTS[2]), "mtp")


def test_the_head_stays_in_step_across_rejections_cancels_and_new_requests(mtp_target: Path) -> None:
    """After replies with rejections, a cancelled reply and a regenerated one, the head drafts a new
    turn exactly as a freshly loaded engine does: its memory held only confirmed pairs."""

    def paired(eng: Engine) -> None:
        assert eng._mtp_drafter is not None and eng._mtp_drafter.unpaired == 0

    greedy = GenerationSettings(mode="mtp", max_tokens=32, n_max=4, adaptive=False)
    assert_stays_in_step(
        LoadSettings(target=str(mtp_target), n_ctx=1024, n_threads=1), greedy, PROMPTS, paired
    )


def test_mtp_mode_on_a_model_without_heads_says_so(tiny_pair) -> None:
    with Engine(LoadSettings(target=str(tiny_pair.target), n_ctx=256, n_threads=1)) as eng:
        with pytest.raises(EngineError, match="multi-token-prediction"):
            eng.run(eng.tokenize("hi"), GenerationSettings(mode="mtp", max_tokens=4))
        done = eng.run(eng.tokenize("hi"), GenerationSettings(mode="plain", max_tokens=4))
        assert isinstance(done, Finished)


def test_tandem_generate_mode_mtp_says_what_plain_decoding_says(mtp_target: Path, engine: Engine) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "app", "generate", "--target", str(mtp_target), "--mode", "mtp", "--prompt",
         PROMPTS[0], "--max-tokens", "24", "--json", "--threads", "1"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    plain = engine.run(out["prompt_tokens"], GenerationSettings(mode="plain", max_tokens=24))
    assert out["tokens"] == list(plain.tokens)
    assert out["stats"]["mode"] == "mtp" and out["stats"]["n_drafted"] > 0


def test_tandem_serve_mode_mtp_on_a_model_without_heads_is_one_line(tiny_pair) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "app", "serve", "--model", str(tiny_pair.target), "--mode", "mtp",
         "--port", "0"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert res.returncode == 2
    assert "--mode mtp needs a model with multi-token-prediction layers" in res.stderr


def test_the_engine_info_counts_the_heads(engine: Engine) -> None:
    assert engine.info().target.mtp_layers == engine.target.n_layer_nextn > 0


@pytest.mark.parametrize("constraint", [Constraint("json_object"), Constraint("gbnf", gbnf=LIST_GBNF)])
def test_constrained_mtp_output_equals_plain_constrained_output(
    engine: Engine, constraint: Constraint
) -> None:
    drafted = 0
    for text in PROMPTS:
        prompt = engine.tokenize(text)
        plain = engine.run(prompt, GenerationSettings(mode="plain", max_tokens=40, constraint=constraint))
        gs = GenerationSettings(mode="mtp", max_tokens=40, n_max=3, adaptive=False, constraint=constraint)
        got = engine.run(prompt, gs)
        assert got.tokens == plain.tokens and got.reason == plain.reason, (text, constraint.kind)
        drafted += got.stats.n_drafted
    assert drafted > 0


def test_mode_mtp_through_the_engine_process(mtp_target: Path) -> None:
    """The app, the CLI and the server reach the engine through its process: mode mtp there too."""
    from app.engine import EngineClient

    client = EngineClient()
    client.start()
    try:
        info = client.load(LoadSettings(target=str(mtp_target), n_ctx=512, n_threads=1))
        assert info.target.mtp_layers > 0
        prompt = client.tokenize(PROMPTS[1])
        runs = {}
        for mode in ("plain", "mtp", "mtp"):  # the second mtp run starts from what the first left
            events = list(
                client.generate(prompt=prompt, settings=GenerationSettings(mode=mode, max_tokens=24))
            )
            runs[mode] = [e for e in events if isinstance(e, Finished)][-1]
            assert runs[mode].tokens == runs["plain"].tokens, mode
        assert runs["mtp"].stats.n_drafted > 0
    finally:
        client.shutdown()
