"""The Models panel's *Servers* tab: chat with a remote OpenAI-compatible server instead of a local pair
(another machine's ``tandem serve``, llama.cpp's ``llama-server``, vLLM).

Each saved server has a name, a base URL and an API key; *Test* lists the server's models (or says
what went wrong), *Use this server* sends the chat there with the chosen model, *Back to the local
pair* returns (loading a pair does too). The names and URLs are saved in ``servers.json`` in the data
folder; the keys in the OS keyring or a private file (`app.ui.core.secrets`), never in a settings file.
`attach_servers(session, view, menu)` routes the view to the session (`Session.use_remote`); the status
bar follows the session and shows the server while the chat uses it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import uuid
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QAction
from PySide6.QtWidgets import (
    QComboBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QMenu,
    QPushButton,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app.remote_client import RemoteClient, RemoteInfo, RemoteServerError, normalize_base_url
from app.ui.core.paths import data_dir
from app.ui.core.secrets import Secrets
from app.ui.core.session import Session

log = logging.getLogger("tandem.ui")

__all__ = ["ServerEntry", "ServersView", "attach_servers", "load_servers", "save_servers"]

FILE_NAME = "servers.json"
URL_HINT = "http://192.168.1.20:8080/v1"


@dataclass(frozen=True)
class ServerEntry:
    """A saved server (its key is kept apart, under ``secret_name``)."""

    id: str
    name: str
    base_url: str
    model: str = ""
    has_key: bool = False

    @property
    def secret_name(self) -> str:
        return f"server/{self.id}"


def load_servers(directory: Path) -> list[ServerEntry]:
    path = Path(directory) / FILE_NAME
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as e:
        log.warning("ignoring the unreadable servers file %s: %s", path, e)
        return []
    out = []
    for item in raw.get("servers", []) if isinstance(raw, dict) else []:
        with contextlib.suppress(TypeError, KeyError, AttributeError):
            out.append(ServerEntry(**{k: item[k] for k in ServerEntry.__dataclass_fields__ if k in item}))
    return out


def save_servers(directory: Path, entries: list[ServerEntry]) -> None:
    path = Path(directory) / FILE_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"servers": [asdict(e) for e in entries]}, indent=2), encoding="utf-8")
    tmp.replace(path)


class ServersView(QWidget):
    """Saved servers, the form of the one shown, Test, and Use this server."""

    useRequested = Signal(object)  # RemoteClient: send the chat there
    localRequested = Signal()  # back to the local pair
    _tested = Signal(object, object, str)  # (entry id, models or None, error), from a test's thread

    def __init__(
        self, parent: QWidget | None = None, *, data: Path | None = None, secrets: Secrets | None = None
    ) -> None:
        super().__init__(parent)
        self.data = Path(data) if data is not None else data_dir()
        self.secrets = secrets or Secrets(self.data)
        self.entries = load_servers(self.data)
        self.current: ServerEntry | None = None
        self.connected: RemoteInfo | None = None
        self._threads: list[threading.Thread] = []
        self._build()
        self._tested.connect(self._on_tested)
        self._fill_list(self.entries[0].id if self.entries else None)

    # -- construction -------------------------------------------------------------------------------
    def _build(self) -> None:
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 6, 0, 0)
        intro = QLabel(
            "Chat with a model another computer serves: Tandem's <code>tandem serve</code>, llama.cpp's "
            "<code>llama-server</code>, vLLM or any OpenAI-compatible server."
        )
        intro.setWordWrap(True)
        lay.addWidget(intro)

        top = QHBoxLayout()
        self.list = QComboBox()
        self.list.currentIndexChanged.connect(self._selected)
        self.new_button = QPushButton("New")
        self.new_button.clicked.connect(lambda _=False: self.new_server())
        self.delete_button = QPushButton("Delete")
        self.delete_button.clicked.connect(lambda _=False: self.delete_server())
        top.addWidget(self.list, 1)
        top.addWidget(self.new_button)
        top.addWidget(self.delete_button)
        lay.addLayout(top)

        form = QFormLayout()
        self.name = QLineEdit()
        self.name.setPlaceholderText("e.g. workstation")
        self.url = QLineEdit()
        self.url.setPlaceholderText(URL_HINT)
        self.key = QLineEdit()
        self.key.setEchoMode(QLineEdit.EchoMode.Password)
        self.forget_key = QPushButton("Forget")
        self.forget_key.setToolTip("Delete the saved key")
        self.forget_key.clicked.connect(lambda _=False: self.forget_saved_key())
        key_row = QHBoxLayout()
        key_row.addWidget(self.key, 1)
        key_row.addWidget(self.forget_key)
        form.addRow("Name", self.name)
        form.addRow("Base URL", self.url)
        form.addRow("API key", key_row)
        self.key_note = QLabel(
            "Keys are kept in the OS keyring where there is one, else in a file only you can read; "
            "never in the settings file."
        )
        self.key_note.setObjectName("machineLine")
        self.key_note.setWordWrap(True)
        form.addRow("", self.key_note)
        lay.addLayout(form)

        row = QHBoxLayout()
        self.test_button = QPushButton("Test")
        self.test_button.setToolTip("Ask the server for its models (GET /v1/models)")
        self.test_button.clicked.connect(lambda _=False: self.test())
        self.save_button = QPushButton("Save")
        self.save_button.clicked.connect(lambda _=False: self.save())
        row.addWidget(self.test_button)
        row.addWidget(self.save_button)
        row.addStretch(1)
        lay.addLayout(row)

        model_row = QHBoxLayout()
        model_row.addWidget(QLabel("Model"))
        self.models = QComboBox()
        self.models.setMinimumContentsLength(18)
        model_row.addWidget(self.models, 1)
        lay.addLayout(model_row)

        use_row = QHBoxLayout()
        self.use_button = QPushButton("Use this server")
        self.use_button.setObjectName("primaryButton")
        self.use_button.clicked.connect(lambda _=False: self.use())
        self.local_button = QPushButton("Back to the local pair")
        self.local_button.clicked.connect(lambda _=False: self.localRequested.emit())
        use_row.addWidget(self.use_button)
        use_row.addWidget(self.local_button)
        use_row.addStretch(1)
        lay.addLayout(use_row)

        self.message = QLabel()
        self.message.setObjectName("panelMessage")
        self.message.setWordWrap(True)
        self.message.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        lay.addWidget(self.message)
        lay.addStretch(1)
        self.set_connected(None)

    # -- the list -----------------------------------------------------------------------------------
    def _fill_list(self, select: str | None) -> None:
        self.list.blockSignals(True)
        self.list.clear()
        for e in self.entries:
            self.list.addItem(e.name, e.id)
        self.list.addItem("New server…", None)
        index = next((i for i, e in enumerate(self.entries) if e.id == select), len(self.entries))
        self.list.setCurrentIndex(index)
        self.list.blockSignals(False)
        self._selected(index)

    def _selected(self, index: int) -> None:
        entry_id = self.list.itemData(index)
        self.current = next((e for e in self.entries if e.id == entry_id), None)
        e = self.current
        self.name.setText(e.name if e else "")
        self.url.setText(e.base_url if e else "")
        self.key.clear()
        self._show_key_state()
        self.models.clear()
        if e and e.model:
            self.models.addItem(e.model)
        self.delete_button.setEnabled(e is not None)
        self.show_message("")

    def _show_key_state(self) -> None:
        saved = self.current is not None and self.current.has_key
        self.key.setPlaceholderText("saved: type to replace it" if saved else "none")
        self.forget_key.setEnabled(saved)

    def new_server(self) -> None:
        self.list.setCurrentIndex(self.list.count() - 1)
        self.name.setFocus()

    def delete_server(self) -> None:
        e = self.current
        if e is None:
            return
        self.secrets.delete(e.secret_name)
        self.entries = [x for x in self.entries if x.id != e.id]
        save_servers(self.data, self.entries)
        self._fill_list(self.entries[0].id if self.entries else None)

    def forget_saved_key(self) -> None:
        e = self.current
        if e is not None and e.has_key:
            self.secrets.delete(e.secret_name)
            self._replace(replace(e, has_key=False))
            self._show_key_state()
            self.show_message("The key is forgotten.", "ok")

    # -- the form -----------------------------------------------------------------------------------
    def _form(self) -> tuple[str, str, str]:
        """(name, base URL, key) as typed; the key is the saved one when none is typed."""
        url = normalize_base_url(self.url.text())
        name = self.name.text().strip() or url.split("://", 1)[1].split("/", 1)[0]
        key = self.key.text().strip()
        if not key and self.current is not None and self.current.has_key:
            key = self.secrets.get(self.current.secret_name) or ""
        return name, url, key

    def save(self, model: str | None = None) -> ServerEntry | None:
        """Save the form as the current server (a new one from *New server…*); the key goes to the
        keyring or the private file."""
        try:
            name, url, _ = self._form()
        except RemoteServerError as e:
            self.show_message(str(e), "error")
            return None
        e = self.current or ServerEntry(uuid.uuid4().hex[:12], name, url)
        typed = self.key.text().strip()
        has_key = e.has_key
        if typed:
            where = self.secrets.set(e.secret_name, typed)
            has_key = True
            self.key_note.setText(
                "The key is kept in the OS keyring." if where == "keyring"
                else f"The key is kept in {self.secrets.path} (only you can read it)."
            )  # fmt: skip
        chosen = model if model is not None else (self.models.currentText() or e.model)
        e = replace(e, name=name, base_url=url, model=chosen, has_key=has_key)
        models = [self.models.itemText(i) for i in range(self.models.count())]
        self._replace(e)
        self._fill_list(e.id)
        if models:  # keep what a test listed
            self.models.clear()
            self.models.addItems(models)
            self.models.setCurrentText(chosen)
        self.show_message(f"Saved {name}.", "ok")
        return e

    def _replace(self, entry: ServerEntry) -> None:
        known = any(x.id == entry.id for x in self.entries)
        self.entries = (
            [entry if x.id == entry.id else x for x in self.entries] if known else [*self.entries, entry]
        )
        self.current = entry
        save_servers(self.data, self.entries)

    def client(self) -> RemoteClient:
        """A client for the form's server and model (raises RemoteServerError for a bad URL)."""
        name, url, key = self._form()
        return RemoteClient(url, key or None, self.models.currentText() or None, name=name)

    def test(self) -> None:
        """List the server's models on a thread of its own; the list (or the error) is shown."""
        try:
            client = self.client()
        except RemoteServerError as e:
            self.show_message(str(e), "error")
            return
        entry_id = self.current.id if self.current else None
        self.test_button.setEnabled(False)
        self.show_message(f"Asking {client.base_url} for its models…")

        def run() -> None:
            try:
                models, error = client.list_models(), ""
            except RemoteServerError as e:
                models, error = None, str(e)
            with contextlib.suppress(RuntimeError):  # the view is gone
                self._tested.emit(entry_id, models, error)

        thread = threading.Thread(target=run, name="tandem-ui-server-test", daemon=True)
        self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()

    def _on_tested(self, entry_id: str | None, models: list[str] | None, error: str) -> None:
        self.test_button.setEnabled(True)
        if entry_id != (self.current.id if self.current else None):
            return  # another server is shown now
        if models is None:
            self.show_message(error, "error")
            return
        chosen = self.models.currentText()
        self.models.clear()
        self.models.addItems(models)
        if chosen in models:
            self.models.setCurrentText(chosen)
        shown = ", ".join(models[:6]) + (f" and {len(models) - 6} more" if len(models) > 6 else "")
        self.show_message(f"It answers: {len(models)} model{'s' if len(models) != 1 else ''}: {shown}.", "ok")

    def use(self) -> None:
        """Save the server and ask for the chat to go there (``useRequested`` with a client)."""
        entry = self.save()
        if entry is None:
            return
        try:
            client = self.client()
        except RemoteServerError as e:
            self.show_message(str(e), "error")
            return
        self.show_message(f"Connecting to {client.name}…")
        self.useRequested.emit(client)

    # -- state shown --------------------------------------------------------------------------------
    def set_connected(self, info: RemoteInfo | None) -> None:
        """The chat now uses ``info``'s server (None: the local pair)."""
        self.connected = info
        self.local_button.setEnabled(info is not None)
        if info is not None:
            if self.models.findText(info.model) < 0:
                self.models.addItem(info.model)
            self.models.setCurrentText(info.model)
            self.show_message(f"The chat uses {info.label} ({info.base_url}).", "ok")

    def show_message(self, text: str, level: str = "") -> None:
        self.message.setText(text)
        self.message.setProperty("level", level)
        self.message.setStyleSheet({"error": "color: #a40e26;", "ok": "color: #116329;"}.get(level, ""))

    def shutdown(self, timeout: float = 5.0) -> None:
        """Wait for a test still asking its server."""
        for t in self._threads:
            t.join(timeout)


def attach_servers(session: Session, view: ServersView, menu: QMenu | None = None) -> None:
    """Route ``view`` to ``session``: *Use this server* sends the chat to the server (the status bar
    names it, the chat, gauges and Stop work as with a local pair), *Back to the local pair* and loading
    a pair switch back. Adds *Chat with a remote server…* to ``menu`` (the window's Server menu)."""

    def connected(info: RemoteInfo | None) -> None:
        view.set_connected(info)
        if info is None:
            session.notify("The chat uses the local pair again.", 5000)
        else:
            session.notify(f"The chat uses {info.label}.", 5000)

    def failed(message: str) -> None:
        view.show_message(message, "error")
        session.notify(message, 10000)

    view.useRequested.connect(session.use_remote)
    view.localRequested.connect(lambda: session.use_remote(None))
    session.remoteChanged.connect(connected)
    session.worker.connectFailed.connect(failed)
    session.loadStarted.connect(lambda _settings: view.set_connected(None))
    if menu is not None:
        act = QAction("Chat with a &remote server…", view)
        act.triggered.connect(lambda _=False: reveal(view))
        menu.addSeparator()
        menu.addAction(act)


def reveal(widget: QWidget) -> None:
    """Bring ``widget`` to the front through the tabs that hold it (the side pane, the panel's tabs)."""
    chain: list[QWidget] = []
    w: QWidget | None = widget
    while w is not None:
        chain.append(w)
        w = w.parentWidget()
    for tabs in chain:
        if isinstance(tabs, QTabWidget):
            page = next((c for c in chain if tabs.indexOf(c) >= 0), None)
            if page is not None:
                tabs.setCurrentWidget(page)
