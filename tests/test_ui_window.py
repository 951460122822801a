"""The main window driving the real engine process on tiny GGUF models (pytest-qt, offscreen)."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import gc
import signal
import sys
import time
from dataclasses import replace

import pytest
from PySide6.QtCore import QEvent, Qt
from PySide6.QtWidgets import QApplication

from app.engine import FinishReason
from app.ui.core.settings import AppSettings
from app.ui.main_window import MainWindow

pytestmark = [pytest.mark.timeout(90), pytest.mark.usefixtures("no_leaked_threads")]

# always draft 4 tokens with the draft model: the tiny draft agrees with the target often enough
FAST = AppSettings(
    speculative=True, draft_source="model", n_max=4, adaptive=False, max_tokens=120, n_ctx=2048, n_threads=1
)
# "Write a long story" makes the tiny target write ~750 tokens; 16-token drafts make rounds slow (~5 s in
# all), so Stop or a kill lands well inside the reply
LONG_PROMPT = "Write a long story"
SLOW = replace(FAST, n_max=16, max_tokens=2000)
WAIT = 60_000  # ms: generous, for loaded CI machines


@pytest.fixture
def open_window(qtbot, ui_data_dir, tiny_pair):
    """Open a window on the data dir; with ``load=True`` load the tiny pair and wait until it is ready."""
    windows: list[MainWindow] = []

    def make(settings: AppSettings | None = FAST, load: bool = True) -> MainWindow:
        w = MainWindow()
        qtbot.addWidget(w)
        windows.append(w)
        if settings is not None:
            w.apply_settings(settings)
        w.show()
        if load:
            with qtbot.waitSignal(w.modelLoaded, timeout=WAIT):
                w.load_pair(str(tiny_pair.target), str(tiny_pair.draft))
        return w

    yield make
    for w in windows:
        w.close()
        w.deleteLater()
    windows.clear()
    QApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    gc.collect()  # here, in the GUI thread: never let a later test's engine thread collect a widget


def send(qtbot, w: MainWindow, text: str) -> None:
    w.composer.setPlainText(text)
    qtbot.keyClick(w.composer, Qt.Key.Key_Return)


def finish(qtbot, w: MainWindow, text: str) -> str:
    with qtbot.waitSignal(w.replyFinished, timeout=WAIT) as sig:
        send(qtbot, w, text)
    return sig.args[0]


def test_no_model_state(open_window) -> None:
    w = open_window(None, load=False)
    assert "No model loaded" in w.chat.placeholder.text() and w.chat.placeholder.isVisible()
    assert not w.send_button.isEnabled()
    w.composer.setPlainText("hello")
    w.send()
    assert w.chat.messages == [] and w.composer.toPlainText() == "hello"


def test_reply_streams_then_gauges_show_figures(qtbot, open_window) -> None:
    w = open_window(replace(FAST, max_tokens=400))
    w.side_tabs.currentWidget()
    seen: list[int] = []
    w.worker.steps.connect(lambda batch: seen.append(len(batch)))
    reason = finish(qtbot, w, "Tell me about the fox")
    assert reason in ("eog", "length")
    assert len(seen) > 1 and w.render_count > 1, "the reply arrived in one piece"
    user, reply = w.chat.messages
    assert (user.role, reply.role) == ("user", "assistant") and reply.text
    assert reply.saved.stats.n_generated > 0 and "tok/s" in reply.info.text()
    # gauges: a speculative reply with a tiny draft that agrees part of the time
    assert w.meter is not None and w.meter.acceptance and w.meter.acceptance > 0
    assert w.gauges.acceptance.value.text().endswith("%") and w.gauges.acceptance.value.text() != "0%"
    assert w.gauges.speed.value.text().endswith("tok/s") and float(w.gauges.speed.value.text().split()[0]) > 0
    assert float(w.gauges.per_round.value.text()) > 0
    assert w.gauges.ttft.value.text() != "–"
    assert "Drafting with the draft model" in w.gauges.status.text()
    # highlight drafted tokens: the reply becomes plain text with tinted spans
    w.gauges.highlight.setChecked(True)
    assert w.highlight_action.isChecked()
    assert "background-color" in reply._blocks[0].text()
    w.highlight_action.setChecked(False)
    assert not w.gauges.highlight.isChecked()


def test_stop_mid_reply(qtbot, open_window) -> None:
    w = open_window(SLOW)
    send(qtbot, w, LONG_PROMPT)
    qtbot.waitUntil(lambda: w.render_count >= 1 and bool(w.chat.messages[-1].text), timeout=WAIT)
    assert w.send_button.text() == "Stop"
    with qtbot.waitSignal(w.replyFinished, timeout=WAIT) as sig:
        qtbot.mouseClick(w.send_button, Qt.MouseButton.LeftButton)
    assert sig.args == ["cancelled"]
    assert w.send_button.text() == "Send" and w.send_button.isEnabled() and not w.generating
    reply = w.chat.messages[-1]
    assert reply.saved.reason is FinishReason.CANCELLED and "stopped" in reply.info.text()
    assert reply.saved.stats.n_generated < 700  # it really stopped early
    w.apply_settings(replace(FAST, last_target=w.settings.last_target, last_draft=w.settings.last_draft))
    assert finish(qtbot, w, "hi") in ("eog", "length")  # ready for the next message


def test_regenerate_and_edit_last_message(qtbot, open_window) -> None:
    w = open_window()
    finish(qtbot, w, "hi")
    first = w.chat.messages[-1].text
    assert w.chat.messages[-1].regen_button.isVisibleTo(w) and w.chat.messages[0].edit_button.isVisibleTo(w)
    with qtbot.waitSignal(w.replyFinished, timeout=WAIT):
        qtbot.mouseClick(w.chat.messages[-1].regen_button, Qt.MouseButton.LeftButton)
    assert len(w.chat.messages) == 2
    assert w.chat.messages[-1].text == first  # greedy: the same reply again
    assert [m.role for m in w.store.messages(w.conversation.id)] == ["user", "assistant"]
    w.edit_last()
    assert w.chat.messages == [] and w.composer.toPlainText() == "hi"
    w.composer.setPlainText("hi there")
    with qtbot.waitSignal(w.replyFinished, timeout=WAIT):
        qtbot.keyClick(w.composer, Qt.Key.Key_Return)
    assert w.store.messages(w.conversation.id)[0].content == "hi there"


def test_conversation_survives_a_restart(qtbot, open_window, ui_data_dir) -> None:
    w = open_window()
    w.conversations.system_toggle.setChecked(True)
    w.conversations.system_prompt.setPlainText("You are terse.")
    finish(qtbot, w, "hi")
    texts = [(m.role, m.text) for m in w.chat.messages]
    title = w.conversation.title
    w.new_conversation()
    finish(qtbot, w, "second chat")
    w.open_conversation(w.store.conversations()[-1].id)  # back to the first one: it is the last opened
    w.close()

    again = open_window(None, load=False)
    assert again.conversation.title == title == "hi"
    assert [(m.role, m.text) for m in again.chat.messages] == texts
    assert again.conversations.system_prompt.toPlainText() == "You are terse."
    assert again.conversations.conv_list.count() == 2
    again.delete_conversation(confirm=False)
    assert again.conversations.conv_list.count() == 1 and again.conversation.title == "second chat"


def test_settings_persist_and_load_settings_reload_the_models(qtbot, open_window, ui_data_dir) -> None:
    w = open_window()
    dlg = w.open_settings()
    dlg.temperature.setValue(0.8)
    dlg.top_k.setValue(40)
    dlg.source.setCurrentIndex(2)  # prompt lookup
    dlg.n_ctx.setValue(1024)  # a load-time setting: the pair is reloaded
    with qtbot.waitSignal(w.modelLoaded, timeout=WAIT) as sig:
        dlg.accept()
    assert sig.args[0].n_ctx == 1024
    assert (w.settings.temperature, w.settings.top_k, w.settings.draft_source) == (0.8, 40, "lookup")
    w.close()
    again = open_window(None, load=False)
    s = again.settings
    assert (s.temperature, s.top_k, s.draft_source, s.n_ctx, s.n_max) == (0.8, 40, "lookup", 1024, 4)
    assert s.last_target.endswith("tiny-target.gguf")


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")
def test_engine_killed_mid_reply_shows_an_error_and_recovers(qtbot, open_window) -> None:
    w = open_window(SLOW)
    pid = w.client.pid
    send(qtbot, w, LONG_PROMPT)
    qtbot.waitUntil(lambda: w.render_count >= 1, timeout=WAIT)
    with qtbot.waitSignal(w.replyFailed, timeout=WAIT) as sig:
        os.kill(pid, signal.SIGKILL)
    assert "SIGKILL" in sig.args[0]
    roles = [m.role for m in w.chat.messages]
    assert roles[0] == "user" and roles[-1] == "error"
    assert "engine" in w.chat.messages[-1].text.lower()
    assert not w.generating and w.send_button.text() == "Send"
    # the engine comes back with the same pair; the next message works and the chat is kept
    qtbot.waitUntil(lambda: bool(w.info) and not w.loading and w.client.pid != pid, timeout=WAIT)
    w.apply_settings(replace(FAST, last_target=w.settings.last_target, last_draft=w.settings.last_draft))
    assert finish(qtbot, w, "hi") in ("eog", "length")
    assert w.chat.messages[0].text == LONG_PROMPT and w.chat.messages[-1].role == "assistant"
    assert "error" in [m.role for m in w.store.messages(w.conversation.id)]


def test_does_speculation_pay_runs_on_recent_prompts_and_shows_the_speedup(qtbot, open_window) -> None:
    w = open_window(replace(FAST, max_tokens=16))
    finish(qtbot, w, "def add(a, b):")
    check = w.speed_check
    assert check.button.isEnabled()
    with qtbot.waitSignal(check.finished, timeout=WAIT) as sig:
        check.button.click()
        assert not w.send_button.isEnabled()  # the chat waits while the check runs
    result = sig.args[0]
    assert result is not None and result.own_prompts and len(result.ratios) == 1
    assert "x plain decoding" in check.label.text() and "your recent prompts" in check.label.text()
    assert check.button.isEnabled() and w.send_button.isEnabled()


def test_the_drafting_history_learns_chats_forgets_deleted_ones_and_shows_in_settings(
    qtbot, open_window
) -> None:
    w = open_window(replace(FAST, max_tokens=16))
    finish(qtbot, w, "def add(a, b):")
    first = w.conversation.id

    def history():
        with qtbot.waitSignal(w.worker.historyInfo, timeout=WAIT) as sig:
            w.worker.history("info")
        return sig.args[0]

    deadline = time.monotonic() + 30
    while not (info := history()).ready:
        assert time.monotonic() < deadline
    assert info.enabled and info.documents == 1 and info.tokens > 0
    w.new_conversation()
    finish(qtbot, w, "The quick brown fox")
    assert history().documents == 2
    w.delete_conversation(first, confirm=False)
    assert history().documents == 1  # the deleted chat's tokens left the history
    dlg = w.open_settings()
    assert dlg.history is not None and dlg.history.learn.isChecked()
    qtbot.waitUntil(lambda: "conversation" in dlg.history.size.text(), timeout=WAIT)
    assert "1 conversation" in dlg.history.size.text()
    dlg.reject()


def test_a_message_sent_while_the_pair_loads_waits_and_is_answered(qtbot, open_window, tiny_pair) -> None:
    w = open_window(load=False)
    w.load_pair(str(tiny_pair.target), str(tiny_pair.draft))
    assert w.loading and w.send_button.isEnabled()
    assert "Load a model first" not in w.statusBar().currentMessage()
    with qtbot.waitSignal(w.replyFinished, timeout=WAIT) as sig:
        send(qtbot, w, "hi")  # Enter, while the pair loads
        assert w.composer.toPlainText() == ""  # taken at once, not left in the box
        (user,) = w.chat.messages
        assert user.text == "hi" and "model is loading" in user.info.text()
        send(qtbot, w, "there")  # a second message joins the waiting one
        assert [m.text for m in w.chat.messages] == ["hi\n\nthere"]
    assert sig.args[0] in ("eog", "length")
    user, reply = w.chat.messages
    assert user.info.text() == "" and reply.role == "assistant" and reply.text
    assert w.store.messages(w.conversation.id)[0].content == "hi\n\nthere"


def test_a_message_sent_while_the_pair_calibrates_waits_for_it_and_is_answered(
    qtbot, open_window, tiny_pair
) -> None:
    w = open_window(load=False)
    order: list[str] = []
    w.worker.calibrated.connect(lambda _steps: order.append("calibrated"))
    w.worker.started.connect(lambda _ev: order.append("started"))
    notes: list[str] = []

    def send_now(_info: object) -> None:  # the pair is loaded; its calibration has not reported yet
        assert w.calibrating
        w.composer.setPlainText("hello")
        qtbot.keyClick(w.composer, Qt.Key.Key_Return)
        notes.append(w.chat.messages[-1].info.text())

    w.modelLoaded.connect(send_now)
    with qtbot.waitSignal(w.replyFinished, timeout=WAIT) as sig:
        w.load_pair(str(tiny_pair.target), str(tiny_pair.draft))
    assert sig.args[0] in ("eog", "length")
    assert notes and "measuring plain decoding" in notes[0]
    assert order[:2] == ["calibrated", "started"] and not w.calibrating
    assert [m.role for m in w.chat.messages] == ["user", "assistant"] and w.chat.messages[-1].text
