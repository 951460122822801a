"""The app's chat with a remote server: the Servers tab against a real ``tandem serve`` on 127.0.0.1
(pytest-qt, offscreen, tiny GGUFs), and back to a local pair."""

from __future__ import annotations

import gc
import json
from collections.abc import Iterator
from dataclasses import replace

import keyring
import pytest
from keyring.backends import fail
from PySide6.QtCore import QEvent, Qt
from PySide6.QtWidgets import QApplication

from api_server import Running, start
from app.engine import EngineClient, LoadSettings, Mode
from app.server.served import Served
from app.ui.core.secrets import Secrets
from app.ui.core.settings import AppSettings
from app.ui.main_window import MainWindow
from app.ui.models.servers_view import ServersView, attach_servers, load_servers

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("no_leaked_threads")]

KEY = "sekret"
FAST = AppSettings(
    speculative=True, draft_source="model", n_max=4, adaptive=False, max_tokens=120, n_ctx=2048, n_threads=1
)
WAIT = 60_000


@pytest.fixture(scope="module")
def remote(tiny_pair) -> Iterator[Running]:
    """Another machine's ``tandem serve`` (here: this one's, with a key)."""
    with EngineClient(auto_restart=True) as c:
        c.load(
            LoadSettings(target=str(tiny_pair.target), draft=str(tiny_pair.draft), n_ctx=1024, n_threads=1)
        )
        served = Served(c, mode="speculative", model_path=str(tiny_pair.target), n_ctx=1024)
        running = start(served, api_key=KEY)
        yield running
        running.stop()


@pytest.fixture
def no_os_keyring():
    """Keys go to the private file in these tests, never to the OS keyring of the machine running them."""
    before = keyring.get_keyring()
    keyring.set_keyring(fail.Keyring())
    yield
    keyring.set_keyring(before)


@pytest.fixture
def window(qtbot, ui_data_dir, no_os_keyring):
    w = MainWindow()
    qtbot.addWidget(w)
    w.apply_settings(FAST)
    view = ServersView(data=ui_data_dir)
    w.add_panel("Servers", view)
    attach_servers(w.session, view, w.local_server.menu)
    w.show()
    yield w, view
    view.shutdown()
    w.close()
    w.deleteLater()
    QApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    gc.collect()


def fill(view: ServersView, url: str, key: str, name: str = "box") -> None:
    view.name.setText(name)
    view.url.setText(url)
    view.key.setText(key)


def run_test(qtbot, view: ServersView) -> str:
    with qtbot.waitSignal(view._tested, timeout=WAIT):
        qtbot.mouseClick(view.test_button, Qt.MouseButton.LeftButton)
    return view.message.text()


def send(qtbot, w: MainWindow, text: str) -> str:
    with qtbot.waitSignal(w.replyFinished, timeout=WAIT) as sig:
        w.composer.setPlainText(text)
        qtbot.keyClick(w.composer, Qt.Key.Key_Return)
    return sig.args[0]


def test_chat_with_a_remote_server_then_back_to_a_local_pair(qtbot, window, remote, tiny_pair) -> None:
    w, view = window
    assert not w.info and not w.send_button.isEnabled()
    fill(view, f"127.0.0.1:{remote.port}", "wrong")
    assert "refused the API key (401" in run_test(qtbot, view)
    assert view.message.property("level") == "error"
    view.key.setText(KEY)
    assert "1 model: tiny-target" in run_test(qtbot, view)
    assert view.models.currentText() == "tiny-target"

    with qtbot.waitSignal(w.worker.connected, timeout=WAIT):
        qtbot.mouseClick(view.use_button, Qt.MouseButton.LeftButton)
    assert w.status.pair_label.text() == "tiny-target on box"
    assert w.status.backend_label.text() == f"Remote · 127.0.0.1:{remote.port}"
    assert w.send_button.isEnabled() and "Ready" in w.chat.placeholder.text()
    assert not w.speed_check.button.isEnabled()  # it measures the local pair only
    # saved: the name and URL in servers.json, the key in the private file (no keyring here)
    saved = load_servers(w.data)
    assert [(e.name, e.base_url, e.model, e.has_key) for e in saved] == [
        ("box", remote.url, "tiny-target", True)
    ]
    assert (
        KEY not in (w.data / "servers.json").read_text() and KEY not in (w.data / "settings.json").read_text()
    )
    assert Secrets(w.data).get(saved[0].secret_name) == KEY

    steps: list[int] = []
    w.worker.steps.connect(lambda batch: steps.append(len(batch)))
    assert send(qtbot, w, "Tell me about the fox") in ("eog", "length")
    reply = w.chat.messages[-1]
    assert reply.role == "assistant" and reply.text and len(steps) > 1 and w.render_count >= 1
    stats = reply.saved.stats
    assert stats.mode is Mode.REMOTE and stats.n_generated > 0 and stats.n_drafted > 0
    assert "tok/s" in reply.info.text() and "accepted" in reply.info.text()
    speed = w.gauges.speed.value.text()
    assert speed.endswith("tok/s") and float(speed.split()[0]) > 0
    assert w.gauges.acceptance.value.text().endswith("%")
    assert w.gauges.ttft.value.text() != "–"
    assert "remote server" in w.gauges.status.text()
    assert "draft counts" in w.gauges.status.text()

    # back to the local pair: loading one switches the chat back
    with qtbot.waitSignal(w.modelLoaded, timeout=WAIT):
        w.load_pair(str(tiny_pair.target), str(tiny_pair.draft))
    assert w.status.remote is None and w.worker.remote is None and view.connected is None
    assert w.status.pair_label.text() == "tiny-target.gguf  +  tiny-draft.gguf"
    assert send(qtbot, w, "hi") in ("eog", "length")
    assert w.chat.messages[-1].saved.stats.mode is Mode.SPECULATIVE

    # and to the server again, then back with the button (the loaded pair stays)
    with qtbot.waitSignal(w.worker.connected, timeout=WAIT):
        qtbot.mouseClick(view.use_button, Qt.MouseButton.LeftButton)
    assert w.status.remote is not None and view.local_button.isEnabled()
    with qtbot.waitSignal(w.worker.connected, timeout=WAIT) as sig:
        qtbot.mouseClick(view.local_button, Qt.MouseButton.LeftButton)
    assert sig.args == [None] and w.status.pair_label.text().startswith("tiny-target.gguf")
    assert send(qtbot, w, "hello") in ("eog", "length")


def test_stop_a_remote_reply(qtbot, window, remote) -> None:
    w, view = window
    w.apply_settings(replace(FAST, max_tokens=2000))
    fill(view, remote.url, KEY)
    with qtbot.waitSignal(w.worker.connected, timeout=WAIT):
        view.use()
    w.composer.setPlainText("Write a long story")
    qtbot.keyClick(w.composer, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: bool(w.chat.messages[-1].text), timeout=WAIT)
    with qtbot.waitSignal(w.replyFinished, timeout=5_000) as sig:
        w.stop()
    assert sig.args == ["cancelled"] and w.chat.messages[-1].text
    qtbot.waitUntil(lambda: not remote.served.turns.busy, timeout=WAIT)  # the server stopped too


def test_a_wrong_key_on_use_and_a_dead_server_are_readable(qtbot, window, remote) -> None:
    w, view = window
    w.side_tabs.setCurrentWidget(w.gauges)
    menu = next(a.menu() for a in w.menuBar().actions() if a.text() == "Se&rver")
    next(a for a in menu.actions() if a.text() == "Chat with a &remote server…").trigger()
    assert w.side_tabs.currentWidget() is view
    fill(view, remote.url, "wrong")
    with qtbot.waitSignal(w.worker.connectFailed, timeout=WAIT) as sig:
        view.use()
    assert "refused the API key" in sig.args[0] and "refused the API key" in view.message.text()
    assert w.status.remote is None and not w.info
    fill(view, "http://127.0.0.1:9/v1", "", name="dead")
    view.new_server()
    fill(view, "http://127.0.0.1:9/v1", "", name="dead")
    assert "Cannot reach http://127.0.0.1:9/v1" in run_test(qtbot, view)
    assert [e.name for e in load_servers(w.data)] == ["box"]  # a test saves nothing
    view.save()
    assert [e.name for e in load_servers(w.data)] == ["box", "dead"]
    view.delete_server()
    assert [e.name for e in load_servers(w.data)] == ["box"] and view.current.name == "box"
    view.forget_saved_key()
    assert not load_servers(w.data)[0].has_key
    assert json.loads((w.data / "secrets.json").read_text()) == {}
