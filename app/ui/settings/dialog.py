"""The Settings dialog: generation, sampling and loading options, edited as an :class:`AppSettings`."""

from __future__ import annotations

from dataclasses import replace

from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.engine import EngineError, parse_gpu_layers
from app.ui.core.settings import AppSettings
from app.ui.core.workers import EngineWorker
from app.ui.settings.history_box import HistoryBox

SOURCES = (
    ("auto", "Auto (whatever pays)"),
    ("model", "The draft: a draft model, an EAGLE-3 head or a Gemma 4 assistant"),
    ("lookup", "Prompt lookup"),
    ("mtp", "The model's own MTP layers"),
)


def _spin(lo: int, hi: int, value: int, special: str = "") -> QSpinBox:
    s = QSpinBox()
    s.setRange(lo, hi)
    s.setValue(value)
    if special:
        s.setSpecialValueText(special)
    return s


GPU_CHOICES = (("auto", "Auto (as many as fit)"), ("all", "All layers"), ("cpu", "CPU only"))


def _gpu_combo(value: str) -> QComboBox:
    """Auto, all, CPU only, or a layer count typed in."""
    c = QComboBox()
    c.setEditable(True)
    for key, label in GPU_CHOICES:
        c.addItem(label, key)
    _set_gpu(c, value)
    return c


def _set_gpu(c: QComboBox, value: str) -> None:
    i = c.findData(value)
    if i >= 0:
        c.setCurrentIndex(i)
    else:
        c.setEditText(value)


def _gpu_value(c: QComboBox) -> str:
    """The choice as the settings keep it ("auto", "all", "cpu" or a count); unreadable text: auto."""
    text = c.currentText().strip()
    i = c.findText(text)
    if i >= 0:
        return str(c.itemData(i))
    try:
        return str(parse_gpu_layers(text)) if parse_gpu_layers(text) is not None else "auto"
    except EngineError:
        return "auto"


def _dspin(lo: float, hi: float, value: float, step: float, decimals: int = 2) -> QDoubleSpinBox:
    s = QDoubleSpinBox()
    s.setRange(lo, hi)
    s.setDecimals(decimals)
    s.setSingleStep(step)
    s.setValue(value)
    return s


class SettingsDialog(QDialog):
    """Edits a copy of the settings; :meth:`result_settings` returns the edited copy."""

    def __init__(
        self, settings: AppSettings, parent: QWidget | None = None, worker: EngineWorker | None = None
    ):
        super().__init__(parent)
        self.setWindowTitle("Settings")
        self.setObjectName("settingsDialog")
        self._base = settings
        s = settings
        layout = QVBoxLayout(self)
        columns = QHBoxLayout()
        layout.addLayout(columns)
        left, right = QVBoxLayout(), QVBoxLayout()
        columns.addLayout(left)
        columns.addLayout(right)

        spec = QGroupBox("Speculative decoding")
        f = QFormLayout(spec)
        self.speculative = QCheckBox("Draft tokens and verify them in one batch")
        self.speculative.setChecked(s.speculative)
        self.source = QComboBox()
        for key, label in SOURCES:
            self.source.addItem(label, key)
        self.source.setCurrentIndex(max(0, [k for k, _ in SOURCES].index(s.draft_source)))
        self.n_max = _spin(1, 64, s.n_max)
        self.n_min = _spin(0, 64, s.n_min)
        self.p_min = _dspin(0.0, 1.0, s.p_min, 0.05)
        self.adaptive = QCheckBox("Adapt the draft length to recent acceptance")
        self.adaptive.setChecked(s.adaptive)
        f.addRow(self.speculative)
        f.addRow("Draft source", self.source)
        f.addRow("Max draft tokens (n_max)", self.n_max)
        f.addRow("Min draft tokens (n_min)", self.n_min)
        f.addRow("Min draft confidence (p_min)", self.p_min)
        f.addRow(self.adaptive)
        left.addWidget(spec)

        samp = QGroupBox("Sampling")
        f = QFormLayout(samp)
        self.temperature = _dspin(0.0, 5.0, s.temperature, 0.1)
        self.top_p = _dspin(0.01, 1.0, s.top_p, 0.05)
        self.top_k = _spin(0, 1000, s.top_k, "off")
        self.min_p = _dspin(0.0, 0.99, s.min_p, 0.01)
        self.repeat_penalty = _dspin(0.5, 3.0, s.repeat_penalty, 0.05)
        self.seed = _spin(-1, 2**31 - 1, s.seed, "random")
        self.max_tokens = _spin(1, 131072, s.max_tokens)
        f.addRow("Temperature (0 = greedy)", self.temperature)
        f.addRow("Top-p", self.top_p)
        f.addRow("Top-k", self.top_k)
        f.addRow("Min-p", self.min_p)
        f.addRow("Repetition penalty", self.repeat_penalty)
        f.addRow("Seed", self.seed)
        f.addRow("Max tokens per reply", self.max_tokens)
        right.addWidget(samp)

        load = QGroupBox("Loading (changes reload the models)")
        f = QFormLayout(load)
        self.n_ctx = _spin(256, 1_048_576, s.n_ctx)
        self.n_ctx.setSingleStep(1024)
        self.gpu_target = _gpu_combo(s.gpu_layers)
        self.gpu_draft = _gpu_combo(s.gpu_layers_draft)
        self.threads = _spin(0, 256, s.n_threads, "automatic")
        f.addRow("Context size (tokens)", self.n_ctx)
        f.addRow("GPU layers, target", self.gpu_target)
        f.addRow("GPU layers, draft", self.gpu_draft)
        f.addRow("CPU threads", self.threads)
        left.addWidget(load)
        left.addStretch(1)
        models = QGroupBox("Models")
        f = QFormLayout(models)
        self.min_speed = _dspin(1.0, 1000.0, s.min_speed, 1.0, decimals=0)
        self.min_speed.setSuffix(" tokens/s")
        self.min_speed.setToolTip(
            "The Models panel recommends the largest pair expected to answer at least this fast on this "
            "machine (the fastest one if none does)"
        )
        f.addRow("Usable speed", self.min_speed)
        right.addWidget(models)
        note = QLabel(
            "GPU layers: Auto puts the draft and as many target layers as fit on the GPU (all of both "
            "where they fit); type a number to offload that many layers."
        )
        note.setWordWrap(True)
        note.setObjectName("gaugeNote")
        right.addWidget(note)
        self.history = HistoryBox(worker, settings.keep_history) if worker is not None else None
        if self.history is not None:
            right.addWidget(self.history)
        right.addStretch(1)

        buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok
            | QDialogButtonBox.StandardButton.Cancel
            | QDialogButtonBox.StandardButton.RestoreDefaults
        )
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        buttons.button(QDialogButtonBox.StandardButton.RestoreDefaults).clicked.connect(self._defaults)
        layout.addWidget(buttons)
        self.speculative.toggled.connect(self._sync)
        self.adaptive.toggled.connect(self._sync)
        self._sync()

    def _sync(self) -> None:
        on = self.speculative.isChecked()
        for w in (self.source, self.n_max, self.p_min, self.adaptive):
            w.setEnabled(on)
        self.n_min.setEnabled(on and self.adaptive.isChecked())

    def _defaults(self) -> None:
        d = AppSettings()
        self.speculative.setChecked(d.speculative)
        self.source.setCurrentIndex(0)
        for w, v in (
            (self.n_max, d.n_max),
            (self.n_min, d.n_min),
            (self.p_min, d.p_min),
            (self.temperature, d.temperature),
            (self.top_p, d.top_p),
            (self.top_k, d.top_k),
            (self.min_p, d.min_p),
            (self.repeat_penalty, d.repeat_penalty),
            (self.seed, d.seed),
            (self.max_tokens, d.max_tokens),
            (self.n_ctx, d.n_ctx),
            (self.threads, d.n_threads),
            (self.min_speed, d.min_speed),
        ):
            w.setValue(v)
        self.adaptive.setChecked(d.adaptive)
        _set_gpu(self.gpu_target, d.gpu_layers)
        _set_gpu(self.gpu_draft, d.gpu_layers_draft)

    def result_settings(self) -> AppSettings:
        keep = self.history.learn.isChecked() if self.history is not None else self._base.keep_history
        return replace(self._result_settings(), keep_history=keep)

    def _result_settings(self) -> AppSettings:
        n_max = self.n_max.value()
        return replace(
            self._base,
            speculative=self.speculative.isChecked(),
            draft_source=str(self.source.currentData()),
            n_max=n_max,
            n_min=min(self.n_min.value(), n_max),
            p_min=self.p_min.value(),
            adaptive=self.adaptive.isChecked(),
            temperature=self.temperature.value(),
            top_p=self.top_p.value(),
            top_k=self.top_k.value(),
            min_p=self.min_p.value(),
            repeat_penalty=self.repeat_penalty.value(),
            seed=self.seed.value(),
            max_tokens=self.max_tokens.value(),
            n_ctx=self.n_ctx.value(),
            gpu_layers=_gpu_value(self.gpu_target),
            gpu_layers_draft=_gpu_value(self.gpu_draft),
            n_threads=self.threads.value(),
            min_speed=self.min_speed.value(),
        )
