"""The app's local API switch: the window's pair served through tandem serve's API (pytest-qt,
offscreen, the real engine on tiny GGUFs, the official openai client on 127.0.0.1)."""

from __future__ import annotations

import gc
import socket
import threading
from dataclasses import replace

import openai
import pytest
from PySide6.QtCore import QEvent, Qt
from PySide6.QtWidgets import QApplication, QPushButton

from api_server import free_port
from app.ui.core.settings import AppSettings
from app.ui.main_window import MainWindow
from app.ui.server.local_server import bind_socket
from app.ui.server.server_dialog import examples

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("no_leaked_threads")]

FAST = AppSettings(
    speculative=True, draft_source="model", n_max=4, adaptive=False, max_tokens=60, n_ctx=2048, n_threads=1
)
WAIT = 60_000


@pytest.fixture
def window(qtbot, ui_data_dir, tiny_pair):
    w = MainWindow()
    qtbot.addWidget(w)
    w.apply_settings(replace(FAST, server_port=free_port()))
    w.show()
    with qtbot.waitSignal(w.modelLoaded, timeout=WAIT):
        w.load_pair(str(tiny_pair.target), str(tiny_pair.draft))
    yield w
    w.close()
    w.deleteLater()
    QApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    gc.collect()


def switch(qtbot, w: MainWindow, on: bool, state: str) -> None:
    with qtbot.waitSignal(w.local_server.stateChanged, timeout=10_000, check_params_cb=lambda s: s == state):
        w.local_server.action.setChecked(on)


def ask(port: int, text: str, max_tokens: int = 60) -> str:
    api = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=60)
    r = api.chat.completions.create(
        model="tiny-target",
        messages=[{"role": "user", "content": text}],
        temperature=0,
        max_tokens=max_tokens,
    )
    return r.choices[0].message.content


def chat(qtbot, w: MainWindow, text: str) -> str:
    with qtbot.waitSignal(w.replyFinished, timeout=WAIT):
        w.composer.setPlainText(text)
        qtbot.keyClick(w.composer, Qt.Key.Key_Return)
    return w.chat.messages[-1].text


def test_the_switch_serves_the_windows_pair_beside_its_chat(qtbot, window) -> None:
    w = window
    port = w.settings.server_port
    assert w.local_server.indicator.text() == "API off" and not w.local_server.action.isChecked()
    switch(qtbot, w, True, "on")
    assert w.local_server.indicator.text() == f"API on · 127.0.0.1:{port}"
    assert w.local_server.served.turns is w.worker.turns  # one queue for the chat and the API
    # greedy: the API answers with the words the window's engine writes
    mine = chat(qtbot, w, "Tell me about the fox")
    assert mine and ask(port, "Tell me about the fox") == mine
    # both at once: they take turns at the engine, and both finish
    got: list[str] = []
    other = threading.Thread(target=lambda: got.append(ask(port, "Write a long story", 200)))
    other.start()
    qtbot.waitUntil(lambda: w.local_server.served.turns.busy, timeout=WAIT)
    assert chat(qtbot, w, "hi")
    other.join(60)
    assert got and got[0]
    # off: the port is free again
    switch(qtbot, w, False, "off")
    assert w.local_server.indicator.text() == "API off"
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port), timeout=2):
        pass
    bind_socket("127.0.0.1", port).close()
    assert chat(qtbot, w, "hello again")  # the chat goes on


def test_a_taken_port_is_said_clearly(qtbot, window) -> None:
    w = window
    taken = bind_socket("127.0.0.1", w.settings.server_port)
    try:
        switch(qtbot, w, True, "failed")
    finally:
        taken.close()
    assert not w.local_server.action.isChecked()
    assert f"Port {w.settings.server_port} is taken" in w.local_server.error
    assert "failed" in w.local_server.indicator.text()
    assert w.local_server.error in w.statusBar().currentMessage()
    switch(qtbot, w, True, "on")  # free now: it starts


def test_the_dialog_shows_the_url_model_and_examples_to_copy(qtbot, window) -> None:
    w = window
    dlg = w.local_server.show_dialog()
    assert not dlg.switch.isChecked() and dlg.port.isEnabled() and not dlg.details.isEnabled()
    with qtbot.waitSignal(w.local_server.stateChanged, timeout=10_000, check_params_cb=lambda s: s == "on"):
        dlg.switch.setChecked(True)
    url = f"http://127.0.0.1:{w.settings.server_port}/v1"
    assert dlg.url.text() == url and dlg.model.text() == "tiny-target" and not dlg.port.isEnabled()
    assert "tiny-target" in dlg.state.text() and w.local_server.action.isChecked()
    assert dlg.snippets["curl"].toPlainText() == examples(url, "tiny-target")["curl"]
    assert f'base_url="{url}"' in dlg.snippets["Python"].toPlainText()
    buttons = {b.text(): b for b in dlg.findChildren(QPushButton)}
    assert "Copy" in buttons
    buttons["Copy the curl example"].click()
    assert QApplication.clipboard().text() == examples(url, "tiny-target")["curl"]
    assert buttons["Copy the curl example"].text() == "Copied"
    with qtbot.waitSignal(w.local_server.stateChanged, timeout=10_000, check_params_cb=lambda s: s == "off"):
        dlg.switch.setChecked(False)
    dlg.port.setValue(w.settings.server_port + 1)
    assert w.settings.server_port == dlg.port.value()  # saved in the app's settings
    assert AppSettings.read(w.data).server_port == dlg.port.value()


def test_the_examples_run_as_written() -> None:
    ex = examples("http://127.0.0.1:8080/v1", "big")
    assert ex["curl"].startswith("curl http://127.0.0.1:8080/v1/chat/completions")
    assert '"model": "big"' in ex["curl"]
    compile(ex["Python"], "example", "exec")
