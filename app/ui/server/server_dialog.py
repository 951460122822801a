"""The local API's dialog: the switch and the port, and while it serves, the base URL, the model id and
a ``curl`` and a Python example, each with a Copy button (`app.ui.server.local_server` runs the server)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Protocol

from PySide6.QtCore import Qt, QTimer, SignalInstance
from PySide6.QtGui import QAction, QFontDatabase, QGuiApplication
from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app.ui.core.session import Session


class ServedState(Protocol):
    """What the dialog shows of `app.ui.server.local_server.LocalServer` (which opens it)."""

    state: str  # off | starting | on | stopping | failed
    error: str
    action: QAction  # the Server menu's switch
    stateChanged: SignalInstance

    @property
    def base_url(self) -> str: ...

    @property
    def model_id(self) -> str: ...


__all__ = ["ServerDialog", "examples"]

PROMPT = "Write a binary search in Python"


def examples(base_url: str, model: str) -> dict[str, str]:
    """Ready-to-run requests to the local API: ``curl`` and Python (the ``openai`` package)."""
    body = f'{{"model": "{model}", "stream": true, "messages": [{{"role": "user", "content": "{PROMPT}"}}]}}'
    curl = f"curl {base_url}/chat/completions \\\n  -H \"Content-Type: application/json\" \\\n  -d '{body}'"
    python = (
        "from openai import OpenAI\n\n"
        f'client = OpenAI(base_url="{base_url}", api_key="none")\n'
        "stream = client.chat.completions.create(\n"
        f'    model="{model}",\n'
        f'    messages=[{{"role": "user", "content": "{PROMPT}"}}],\n'
        "    stream=True,\n"
        ")\n"
        "for chunk in stream:\n"
        '    print(chunk.choices[0].delta.content or "", end="", flush=True)\n'
    )
    return {"curl": curl, "Python": python}


def copy_button(text: Callable[[], str], label: str = "Copy") -> QPushButton:
    """A button that copies ``text()`` to the clipboard and says so for a moment."""
    button = QPushButton(label)

    def copy() -> None:
        QGuiApplication.clipboard().setText(text())
        button.setText("Copied")
        QTimer.singleShot(1200, button, lambda: button.setText(label))  # not once the button is gone

    button.clicked.connect(lambda _=False: copy())
    return button


class ServerDialog(QDialog):
    """Non-modal; follows the server's state while it is open."""

    def __init__(self, server: ServedState, session: Session, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.server, self.session = server, session
        self.setWindowTitle("Local API server")
        self.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        self.resize(620, 520)
        lay = QVBoxLayout(self)

        intro = QLabel(
            "Programs on this computer (editors, notebooks, agents) can use the pair this window has "
            "loaded through the OpenAI API, as with <code>tandem serve</code>. Their requests and this "
            "window's chat take turns. Only this computer can connect (127.0.0.1)."
        )
        intro.setWordWrap(True)
        lay.addWidget(intro)

        row = QHBoxLayout()
        self.switch = QCheckBox("Serve the loaded pair")
        self.switch.toggled.connect(server.action.setChecked)
        row.addWidget(self.switch)
        row.addStretch(1)
        row.addWidget(QLabel("Port"))
        self.port = QSpinBox()
        self.port.setRange(1024, 65535)
        self.port.setValue(session.settings.server_port)
        self.port.valueChanged.connect(self._port_changed)
        row.addWidget(self.port)
        lay.addLayout(row)

        self.state = QLabel()
        self.state.setWordWrap(True)
        self.state.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        lay.addWidget(self.state)

        self.details = QWidget()
        form = QFormLayout(self.details)
        form.setContentsMargins(0, 0, 0, 0)
        self.url = QLineEdit()
        self.model = QLineEdit()
        for name, field in (("Base URL", self.url), ("Model", self.model)):
            field.setReadOnly(True)
            line = QHBoxLayout()
            line.addWidget(field, 1)
            line.addWidget(copy_button(field.text))
            form.addRow(name, line)
        key = QLabel("API key: any (none is needed on 127.0.0.1)")
        key.setObjectName("gaugeNote")
        form.addRow("", key)
        lay.addWidget(self.details)

        self.tabs = QTabWidget()
        self.snippets: dict[str, QPlainTextEdit] = {}
        mono = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont)
        for name in ("curl", "Python"):
            page = QWidget()
            pl = QVBoxLayout(page)
            edit = QPlainTextEdit()
            edit.setReadOnly(True)
            edit.setFont(mono)
            edit.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
            pl.addWidget(edit, 1)
            pl.addWidget(
                copy_button(edit.toPlainText, f"Copy the {name} example"), 0, Qt.AlignmentFlag.AlignRight
            )
            self.snippets[name] = edit
            self.tabs.addTab(page, name)
        lay.addWidget(self.tabs, 1)

        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.close)
        lay.addWidget(buttons)

        server.stateChanged.connect(self.refresh)
        session.pairLoaded.connect(self.refresh)  # (a bound slot: disconnected when the dialog goes)
        self.refresh()

    def _port_changed(self, port: int) -> None:
        s = self.session
        if port != s.settings.server_port:
            s.apply_settings(replace(s.settings, server_port=port))

    def refresh(self, _why: object = None) -> None:
        """Show the server's state, and the URL, model and examples while it serves."""
        s = self.server
        on = s.state in ("starting", "on")
        self.switch.blockSignals(True)
        self.switch.setChecked(on)
        self.switch.blockSignals(False)
        self.port.setEnabled(s.state in ("off", "failed"))
        model = s.model_id
        if s.state == "on":
            text = (
                f"Serving <b>{model}</b> at {s.base_url}"
                if model
                else (f"Listening at {s.base_url}; requests get 503 until a pair is loaded.")
            )
        elif s.state == "failed":
            text = f'<span style="color:#a40e26">{s.error}</span>'
        else:
            text = {"starting": "Starting…", "stopping": "Stopping…"}.get(s.state, "Off.")
        self.state.setText(text)
        self.details.setEnabled(s.state == "on")
        self.tabs.setEnabled(s.state == "on")
        url = s.base_url if s.state in ("starting", "on") else f"http://127.0.0.1:{self.port.value()}/v1"
        self.url.setText(url)
        self.model.setText(model)
        for name, code in examples(url, model or "MODEL").items():
            self.snippets[name].setPlainText(code)
