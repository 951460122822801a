"""The desktop app's parts without an engine: store, settings, Markdown, metrics, composer keys."""

from __future__ import annotations

import json
import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest
from PySide6.QtCore import Qt

from app.engine import Action, Decision, Declined, FinishReason, Mode, Policy, Source, Step
from app.ui.chat.composer import Composer
from app.ui.core.settings import AppSettings
from app.ui.core.store import Store
from app.ui.shared.markdown import Segment, draft_html, render_code, render_prose, split_segments
from app.ui.shared.metrics import PlainCost, ReplyMeter, Rolling, draft_share
from app.ui.shared.saved import SavedReply

pytestmark = pytest.mark.timeout(30)


PAUSED = Decision(Action.PAUSED, Policy.AUTO)


def step(
    text: str,
    from_draft: tuple[bool, ...],
    t_round: float = 0.01,
    decision: Decision | None = None,
    k: int = 4,
) -> Step:
    n = len(from_draft)
    if decision is None:
        decision = Decision(Action.DRAFT, Policy.FIXED, Source.MODEL, k=k, n_max=k) if k else PAUSED
    return Step(
        text=text,
        tokens=tuple(range(n)),
        from_draft=from_draft,
        n_drafted=k if k else 0,
        n_accepted=sum(from_draft),
        k=k,
        drafter=Source.MODEL if k else Source.NONE,
        decision=decision,
        t_draft=0.0,
        t_verify=t_round,
        t_round=t_round,
        t_llama=t_round,
    )


# -- store ------------------------------------------------------------------------------------------


def test_store_conversations_messages_and_meta(tmp_path) -> None:
    store = Store(tmp_path / "c.db")
    a = store.create("First")
    b = store.create("Second", system_prompt="Be brief.")
    m1 = store.add_message(a.id, "user", "hi")
    store.add_message(a.id, "assistant", "hello", SavedReply(FinishReason.EOG, draft_spans=((0, 2),)))
    assert [c.id for c in store.conversations()] == [a.id, b.id]  # most recently updated first
    store.rename(b.id, "Renamed")
    store.set_system_prompt(a.id, "sys")
    store.set_meta("last_conversation", str(a.id))
    store.close()

    store = Store(tmp_path / "c.db")
    assert store.get(b.id).title == "Renamed"
    assert store.get(a.id).system_prompt == "sys"
    msgs = store.messages(a.id)
    assert [(m.role, m.content) for m in msgs] == [("user", "hi"), ("assistant", "hello")]
    assert msgs[1].saved == SavedReply(FinishReason.EOG, draft_spans=((0, 2),))
    assert msgs[0].saved is None
    store.delete_messages_from(a.id, m1.id)
    assert store.messages(a.id) == []
    store.delete(a.id)
    assert store.get(a.id) is None and store.get_meta("last_conversation") == str(a.id)
    store.close()


def test_a_saved_reply_reads_back_as_its_record_old_records_too() -> None:
    old = {  # as the app saved replies before the record existed: Stats as a dict, a key it lacks
        "reason": "length",
        "stats": {"mode": "speculative", "n_generated": 40, "n_drafted": 10, "acceptance_rate": 0.5,
                  "decode_tokens_per_second": 12.5, "acceptance_by_position": [0.75, 0.25],
                  "drafting_off": None},
        "ttft_ui_s": 0.2,
        "draft_spans": [[0, 3], [5, 9]],
    }  # fmt: skip
    saved = SavedReply.from_json(old)
    assert saved.reason is FinishReason.LENGTH and saved.ttft_ui_s == 0.2
    assert saved.stats is not None and saved.stats.mode is Mode.SPECULATIVE and saved.stats.n_generated == 40
    assert saved.stats.acceptance_by_position == (0.75, 0.25) and saved.stats.python_share == 0.0
    assert saved.draft_spans == ((0, 3), (5, 9))
    assert SavedReply.from_json(json.loads(json.dumps(saved.to_json()))) == saved
    assert SavedReply.from_json({"reason": "error"}).reason is FinishReason.ERROR
    assert SavedReply.from_json(None) == SavedReply()


# -- settings ---------------------------------------------------------------------------------------


def test_settings_round_trip_and_engine_mapping(tmp_path) -> None:
    s = AppSettings(speculative=True, draft_source="model", n_max=5, temperature=0.7, seed=3, n_threads=2)
    s.write(tmp_path)
    assert AppSettings.read(tmp_path) == s
    gs = s.generation(has_draft=True)
    assert (gs.mode, gs.n_max, gs.sampling.temperature, gs.sampling.seed) == ("speculative", 5, 0.7, 3)
    assert s.generation(has_draft=False).mode == "auto"
    assert AppSettings(speculative=False).generation().mode == "plain"
    assert AppSettings(draft_source="lookup").generation().mode == "lookup"
    # the model's own MTP layers: drafted with where the target has them, else auto mode
    assert AppSettings(draft_source="mtp").generation(has_mtp=True).mode == "mtp"
    assert AppSettings(draft_source="mtp").generation(has_mtp=False).mode == "auto"
    assert AppSettings(seed=-1).generation().sampling.seed is None
    ls = s.load("t.gguf", None)
    assert (ls.n_threads, ls.draft) == (2, None)
    assert s.needs_reload(AppSettings(n_ctx=8192)) and not s.needs_reload(AppSettings(n_threads=2, n_max=3))


def test_settings_ignore_a_broken_file(tmp_path) -> None:
    (tmp_path / "settings.json").write_text('{"n_max": "many", "top_k": 40, "draft_source": "x"')
    assert AppSettings.read(tmp_path) == AppSettings()
    (tmp_path / "settings.json").write_text('{"n_max": "many", "top_k": 40, "draft_source": "x", "p_min": 1}')
    s = AppSettings.read(tmp_path)
    assert (s.n_max, s.top_k, s.draft_source, s.p_min) == (8, 40, "auto", 1.0)


# -- markdown ---------------------------------------------------------------------------------------

REPLY = """# Plan

Some **bold** text and `inline` code.

```python
def add(a, b):
    return a + b
```

| a | b |
|---|---|
| 1 | 2 |
"""


def test_markdown_segments_and_html() -> None:
    segs = split_segments(REPLY)
    assert [s.kind for s in segs] == ["prose", "code", "prose"]
    assert segs[1] == Segment("code", "def add(a, b):\n    return a + b", "python", True)
    html = render_prose(segs[0].text)
    assert "<h1>Plan</h1>" in html and "<strong>bold</strong>" in html and "inline</code>" in html
    assert "<table" in render_prose(segs[2].text)
    code = render_code(segs[1].text, "python")
    assert code.startswith("<pre") and "<span" in code and "def" in code
    assert "&lt;script&gt;" in render_prose("<script>alert(1)</script>")  # raw HTML is shown as text


def test_streaming_segments_are_stable_prefixes() -> None:
    """While a reply streams, segments before the last never change (so their widgets are reused)."""
    long = ("A paragraph of prose that goes on. " * 12 + "\n\n") * 6 + REPLY
    prev: list[Segment] = []
    for end in range(1, len(long) + 1, 7):
        segs = split_segments(long[:end])
        if prev and segs:
            for a, b in zip(prev[:-1], segs, strict=False):
                assert a == b, (end, a, b)
        prev = segs
    assert len(split_segments(long)) > 4  # long prose is chunked


def test_unclosed_fence_streams_as_code() -> None:
    segs = split_segments("Intro\n```py\nx = 1\n``")
    assert segs[-1] == Segment("code", "x = 1", "py", False)


def test_draft_html_tints_spans() -> None:
    html = draft_html("abcdef<", [(1, 3)])
    assert html.count("<span") == 1 and ">bc</span>" in html and "&lt;" in html


# -- metrics ----------------------------------------------------------------------------------------


def test_meter_figures_and_draft_spans() -> None:
    m = ReplyMeter(t_sent=0.0)
    m.add(step("abcd", (True, True, True, False), 0.02), now=0.5)
    m.add(step("xy", (False,), 0.01, k=0, decision=PAUSED), now=0.6)
    assert m.ttft == 0.5 and m.n_tokens == 5 and m.rounds == 2
    assert m.acceptance == 3 / 4
    assert m.draft_spans == [(0, 3)]  # 3 of 4 tokens drafted: the first 3/4 of "abcd"
    assert m.tokens_per_second == pytest.approx(5 / 0.03)
    assert m.paused
    assert m.speedup(0.01) == pytest.approx(5 / 0.03 * 0.01)
    assert draft_share(step("", (True,))) == 0
    rolling = Rolling()
    rolling.add(m)
    assert rolling.acceptance() == 0.75


def test_status_names_a_declined_lookup_match_while_paused() -> None:
    from app.ui.shared.wording import status_text

    m = ReplyMeter(t_sent=0.0)
    m.add(step("x", (False,), k=0, decision=PAUSED), now=0.1)
    assert m.paused
    assert (
        status_text(m, "CPU", Mode.AUTO) == "Drafting paused: verifying costs more than it saves on this CPU."
    )
    declined = Declined(Source.LOOKUP, match=2, losing=False)
    m.add(step("y", (False,), k=0, decision=Decision(Action.PAUSED, Policy.AUTO, declined=declined)), now=0.2)
    assert m.paused
    assert status_text(m, "CPU", Mode.AUTO) == (
        "Drafting paused: verifying costs more than it saves on this CPU "
        "(prompt lookup: a 2-token match, too likely to break to pay)."
    )


def test_status_words_each_decision_from_its_fields() -> None:
    from app.ui.shared.wording import describe_decision, status_text

    lookup = Decision(
        Action.DRAFT,
        Policy.AUTO,
        Source.LOOKUP,
        k=5,
        match=9,
        resumes_copy=True,
        copy_broke_at=3,
        expected_speedup=1.5,
        measured_speedup=1.25,
    )
    assert describe_decision(lookup) == (
        "prompt lookup: 9-token match, resuming the copy, copy broke at token 3 before, "
        "1.50x expected, 1.25x lately"
    )
    model = Decision(
        Action.DRAFT, Policy.AUTO, Source.MODEL, k=4, target_sure=None, sure_floor=0.9, acceptance=0.8
    )
    assert describe_decision(model) == "draft model: target under 90% sure, 80% acceptance"
    then_copy = Decision(Action.DRAFT, Policy.AUTO, Source.MODEL, k=3, target_sure=0.95, copied=12, match=5)
    assert describe_decision(then_copy) == (
        "draft model: target 95% sure, then 12 tokens copied after a 5-token match"
    )
    assert describe_decision(Decision(Action.NO_MATCH, Policy.AUTO)) == "no n-gram match"
    assert describe_decision(Decision(Action.PROBE, Policy.AUTO, Source.MODEL, k=2)).startswith("probing")
    hoping = Decision(Action.PROBE, Policy.AUTO, Source.MODEL, k=2, acceptance=0.95, expected_speedup=1.12)
    assert describe_decision(hoping).endswith("(1.12x if the draft is 95% right)")
    m = ReplyMeter(t_sent=0.0)
    m.add(step("a", (True, False), decision=model), now=0.1)
    assert status_text(m, "CPU", Mode.AUTO) == (
        "Drafting with the draft model, up to 4 tokens a round "
        "(draft model: target under 90% sure, 80% acceptance)."
    )
    fixed = Decision(Action.DRAFT, Policy.FIXED, Source.MODEL, k=3, n_max=3)
    m.add(step("b", (True, False), decision=fixed, k=3), now=0.2)
    assert status_text(m, "CPU", Mode.SPECULATIVE) == "Drafting with the draft model, up to 3 tokens a round."
    assert status_text(m, "CPU", Mode.PLAIN) == "Plain decoding (speculation is off)."


def test_plain_cost_needs_plain_rounds() -> None:
    pc = PlainCost()
    pc.observe([step("a", (True, False), 0.05)])
    assert pc.value is None
    pc.observe([step("a", (False,), t, k=0) for t in (0.01, 0.02, 0.03)])
    assert pc.value == 0.02


# -- composer ---------------------------------------------------------------------------------------


def test_enter_sends_and_shift_enter_adds_a_line(qtbot) -> None:
    box = Composer()
    qtbot.addWidget(box)
    sent: list[str] = []
    box.submitted.connect(lambda: sent.append(box.toPlainText()))
    qtbot.keyClicks(box, "first")
    qtbot.keyClick(box, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    qtbot.keyClicks(box, "second")
    assert box.toPlainText() == "first\nsecond" and sent == []
    qtbot.keyClick(box, Qt.Key.Key_Return)
    assert sent == ["first\nsecond"]
    qtbot.keyClick(box, Qt.Key.Key_Enter)  # the keypad's Enter too
    assert len(sent) == 2


def test_gpu_layers_default_to_auto_and_are_saved_as_words(tmp_path, ui_data_dir) -> None:
    s = AppSettings()
    assert (s.gpu_layers, s.gpu_layers_draft) == ("auto", "auto")
    load = s.load("t.gguf", "d.gguf")
    assert (load.n_gpu_layers, load.n_gpu_layers_draft) == (None, None)  # auto: the engine plans
    from dataclasses import replace

    chosen = replace(s, gpu_layers="12", gpu_layers_draft="cpu")
    assert (chosen.load("t.gguf", None).n_gpu_layers, chosen.load("t.gguf", "d").n_gpu_layers_draft) == (
        12,
        0,
    )
    chosen.write(tmp_path)
    assert AppSettings.read(tmp_path).gpu_layers == "12"
    (tmp_path / "settings.json").write_text('{"gpu_layers": "lots", "n_gpu_layers": 0}')
    assert AppSettings.read(tmp_path).load("t.gguf", None).n_gpu_layers is None  # unreadable: auto


def test_status_bar_says_where_the_pair_runs() -> None:
    from app.engine import Device, EngineInfo, ModelInfo, Offload
    from app.ui.chat.status_bar import backend_text

    gpu = Device("CUDA0", "NVIDIA GeForce RTX 4060", "GPU", 7 * 10**9, 8 * 10**9)
    cpu = Device("CPU", "AMD Ryzen 7", "CPU", 0, 0)

    def info(layers: int) -> EngineInfo:
        o = Offload(
            None, layers, 29, "CUDA" if layers else "CPU", "NVIDIA GeForce RTX 4060" if layers else ""
        )  # type: ignore[arg-type]
        return EngineInfo(
            "CUDA", (gpu, cpu), 4096, ModelInfo("t.gguf", "qwen2 1.5B", 1, 1, 28, 10, o, 2), None, True
        )

    assert backend_text(info(29)) == "CUDA · NVIDIA GeForce RTX 4060 (8.0 GB)"
    assert backend_text(info(14)) == "CUDA · NVIDIA GeForce RTX 4060 (8.0 GB) · 14/29 target layers"
    assert backend_text(info(0)) == "CPU · AMD Ryzen 7"
    # a laptop whose integrated GPU is listed first: the status bar names the discrete one the pair runs on
    igpu = Device("Vulkan0", "AMD Radeon 780M (RADV PHOENIX)", "IGPU", 2 * 10**9, 2 * 10**9)
    dgpu = Device("Vulkan1", "NVIDIA GeForce RTX 4060", "GPU", 7 * 10**9, 8 * 10**9)
    o = Offload(-1, 29, 29, "Vulkan", "NVIDIA GeForce RTX 4060", device_kind="GPU")
    both = EngineInfo(
        "Vulkan", (igpu, dgpu, cpu), 4096, ModelInfo("t.gguf", "q", 1, 1, 28, 10, o, 2), None, True
    )
    assert backend_text(both) == "Vulkan · NVIDIA GeForce RTX 4060 (8.0 GB)"
