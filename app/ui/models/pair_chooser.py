"""Custom pair chooser: a target and a draft, each a local GGUF file or a Hub file, vetted before loading.

Each side accepts a local path (or *Browse…*), ``hf://owner/repo/file.gguf[@rev]``, ``owner/repo/file.gguf``,
``owner/repo file.gguf``, a ``https://huggingface.co/owner/repo/blob/main/file.gguf`` link, or a catalog
id (``qwen3-8b:Q8_0``). *Check* runs the vocabulary compatibility check on a worker thread: local files
are judged from their headers, Hub files from their first megabytes (HTTP Range requests), so nothing
big is downloaded before the verdict. An incompatible pair cannot be loaded; a compatible pair on the Hub
can be downloaded, then loaded. A target with its own multi-token-prediction (MTP) layers needs no draft:
the draft may be left empty. The draft picker offers what the catalog has for a catalog target: its own MTP
layers, the heads trained for it (an EAGLE-3 head, a Gemma 4 assistant: never another target's), and its
pairs' draft models.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtWidgets import (
    QComboBox,
    QFileDialog,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.gguf.arch import ArchFacts, arch_facts
from app.gguf.compat import Compatibility, check_compatible
from app.gguf.drafts import mtp_layers
from app.ui.models.downloads import DownloadManager
from app.ui.shared.richtext import escape
from app.ui.shared.wording import describe_pair_drafting
from models_registry.catalog import Catalog, CatalogModel, default_catalog
from models_registry.hub import HubError, cached_model
from models_registry.refs import resolve_model_ref
from models_registry.remote import HfRef, ModelFacts, parse_hf_ref, read_ref_metadata
from models_registry.units import format_bytes

log = logging.getLogger("tandem.ui")

__all__ = ["CheckResult", "PairChooser", "normalize_ref", "run_check"]

GGUF_FILTER = "GGUF models (*.gguf);;All files (*)"
_REPO_FILE = re.compile(
    r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:/|\s+)(?P<file>\S+\.gguf)(?P<rev>@\S+)?$", re.I
)
_HF_URL = re.compile(
    r"^https?://(?:www\.)?(?:huggingface\.co|hf\.co)/(?P<repo>[^/]+/[^/]+)/(?:blob|resolve)/(?P<rev>[^/]+)/"
    r"(?P<file>[^?#]+\.gguf)(?:[?#].*)?$",
    re.I,
)


def normalize_ref(text: str) -> str:
    """Turn what the user typed into a local path, an ``hf://`` reference or a catalog id (unchecked)."""
    t = text.strip().strip("\"'")
    if not t:
        raise ValueError("empty: choose a file or type a Hub reference")
    if t.startswith("hf://"):
        return t
    m = _HF_URL.match(t)
    if m:
        rev = "" if m["rev"] == "main" else f"@{m['rev']}"
        return f"hf://{m['repo']}/{m['file']}{rev}"
    p = Path(t).expanduser()
    if p.exists() or p.is_absolute() or t.startswith((".", "~")):
        return str(p)
    m = _REPO_FILE.match(t)
    if m:
        return f"hf://{m['repo']}/{m['file']}{m['rev'] or ''}"
    return t  # catalog id, or an error from resolve_model_ref


@dataclass(frozen=True)
class CheckResult:
    """Outcome of one check: the verdict, or the error that prevented one."""

    compat: Compatibility | None
    target: Path | HfRef | None = None
    draft: Path | HfRef | None = None
    target_facts: ModelFacts | None = None
    draft_facts: ModelFacts | None = None
    error: str = ""
    target_arch: ArchFacts | None = None
    draft_arch: ArchFacts | None = None

    @property
    def ok(self) -> bool:
        return self.compat is not None and self.compat.ok

    @property
    def local(self) -> bool:
        return isinstance(self.target, Path) and (self.draft is None or isinstance(self.draft, Path))


def _describe_error(role: str, e: BaseException) -> str:
    if isinstance(e, FileNotFoundError):
        return f"{role}: file not found ({e.filename or e})"
    if isinstance(e, OSError):
        return f"{role}: cannot read the file: {e.strerror or e}"
    return f"{role}: {e}"


def run_check(target_text: str, draft_text: str, **kwargs: Any) -> CheckResult:
    """Resolve both references and compare their vocabularies (blocking; never raises). With no draft,
    the target must carry multi-token-prediction layers: it drafts with them."""
    refs: list[Path | HfRef] = []
    metas = []
    facts: list[ModelFacts] = []
    roles = [("Target", target_text), ("Draft", draft_text)][: 2 if draft_text.strip() else 1]
    for role, text in roles:
        try:
            ref = resolve_model_ref(normalize_ref(text))
            meta, f = read_ref_metadata(ref, **kwargs)
        except (ValueError, HubError, OSError) as e:
            return CheckResult(None, *[*refs, None, None][:2], error=_describe_error(role, e))
        except Exception as e:  # unexpected: report, never crash the GUI
            log.exception("pair check failed")
            return CheckResult(None, error=f"{role}: unexpected error: {type(e).__name__}: {e}")
        refs.append(ref)
        metas.append(meta)
        facts.append(f)
    if len(metas) == 1:
        n = mtp_layers(metas[0])
        if not n:
            why = "Draft: none given, and the target has no multi-token-prediction layers: choose a draft."
            return CheckResult(None, refs[0], None, facts[0], None, why, arch_facts(metas[0]))
        own = f"the target drafts with its own {n} multi-token-prediction layer{'s' * (n > 1)}"
        return CheckResult(Compatibility(True, own, rule="mtp"), refs[0], None, facts[0], None, "",
                           arch_facts(metas[0]))  # fmt: skip
    compat = check_compatible(metas[0], metas[1])
    target_arch, draft_arch = (arch_facts(m) for m in metas)
    return CheckResult(compat, refs[0], refs[1], facts[0], facts[1], "", target_arch, draft_arch)


def _facts_text(ref: Path | HfRef | None, f: ModelFacts | None, arch: ArchFacts | None = None) -> str:
    if f is None:
        return ""
    if arch is not None:
        return f"{arch.words}\n{_facts_text(ref, f)}"
    bits = [f.architecture or "?"]
    if f.n_layers:
        bits.append(f"{f.n_layers} layers")
    if f.vocab_size:
        bits.append(f"{f.vocab_size:,} tokens")
    if f.context_length:
        bits.append(f"ctx {f.context_length:,}")
    if f.file_size:
        bits.append(format_bytes(f.file_size))
    where = "local file" if isinstance(ref, Path) else "on the Hub"
    if isinstance(ref, HfRef) and f.bytes_read is not None:
        where += f", header read: {format_bytes(f.bytes_read)}"
    return f"{', '.join(bits)} ({where})"


_STYLE = """
#pairVerdict { border-radius: 6px; padding: 8px 10px; }
#pairVerdict[verdict="ok"] { background: #dafbe1; color: #116329; border: 1px solid #aceebb; }
#pairVerdict[verdict="bad"] { background: #ffebe9; color: #a40e26; border: 1px solid #ffcecb; }
#pairVerdict[verdict="error"] { background: #fff8c5; color: #7d4e00; border: 1px solid #eed888; }
#pairVerdict[verdict="busy"], #pairVerdict[verdict="none"] { background: #f6f8fa; color: #57606a;
    border: 1px solid #e1e4e8; }
#pairFacts { color: #57606a; }
#pairHint { color: #57606a; }
"""


class PairChooser(QWidget):
    """Pick a target and a draft (local or Hub), Check them, then Load (or Download) the pair."""

    loadRequested = Signal(str, str)  # target path, draft path
    checked = Signal(object)  # CheckResult

    _post = Signal(object)  # check thread -> GUI thread

    def __init__(
        self,
        downloads: DownloadManager | None = None,
        parent: QWidget | None = None,
        *,
        check_kwargs: dict[str, Any] | None = None,
        catalog: Catalog | None = None,
    ) -> None:
        super().__init__(parent)
        self.downloads = downloads
        self.catalog = catalog or default_catalog()
        self.check_kwargs = dict(check_kwargs or {})
        self.result: CheckResult | None = None
        self._generation = 0
        self._thread: threading.Thread | None = None
        self._closed = False
        self._post.connect(self._on_result, Qt.ConnectionType.QueuedConnection)
        self.setStyleSheet(_STYLE)

        lay = QVBoxLayout(self)
        lay.setContentsMargins(10, 10, 10, 10)
        lay.setSpacing(8)
        hint = QLabel(
            "Any two GGUF models that share a tokenizer can run as a pair: a large <b>target</b> "
            "and a small <b>draft</b>. Use a local file, or a Hub file as <code>hf://owner/repo/file.gguf"
            "</code> or <code>owner/repo file.gguf</code>: Check reads only the file headers. A target "
            "with its own MTP layers needs no draft."
        )
        hint.setObjectName("pairHint")
        hint.setWordWrap(True)
        lay.addWidget(hint)
        grid = QGridLayout()
        grid.setHorizontalSpacing(6)
        self.target_edit = QLineEdit()
        self.draft_edit = QLineEdit()
        self.target_facts = QLabel()
        self.draft_facts = QLabel()
        for row, (name, edit, facts) in enumerate(
            (("Target", self.target_edit, self.target_facts), ("Draft", self.draft_edit, self.draft_facts))
        ):
            edit.setPlaceholderText("/path/to/model.gguf  or  hf://owner/repo/model.gguf")
            edit.setClearButtonEnabled(True)
            edit.textChanged.connect(self._inputs_changed)
            edit.returnPressed.connect(self.check)
            browse = QPushButton("Browse…")
            browse.clicked.connect(lambda _c=False, e=edit, n=name: self._browse(e, n))
            facts.setObjectName("pairFacts")
            facts.setWordWrap(True)
            grid.addWidget(QLabel(f"<b>{name}</b>"), row * 2, 0)
            grid.addWidget(edit, row * 2, 1)
            grid.addWidget(browse, row * 2, 2)
            grid.addWidget(facts, row * 2 + 1, 1, 1, 2)
        self.draft_picker = QComboBox()
        self.draft_picker.setToolTip("The drafts the catalog offers for this target")
        self.draft_picker.activated.connect(self._pick_draft)
        self.picker_label = QLabel("Drafts for it")
        grid.addWidget(self.picker_label, 4, 0)
        grid.addWidget(self.draft_picker, 4, 1, 1, 2)
        grid.setColumnStretch(1, 1)
        lay.addLayout(grid)
        self.target_edit.textChanged.connect(self._refresh_picker)
        self._refresh_picker()

        buttons = QHBoxLayout()
        self.swap_button = QPushButton("Swap")
        self.swap_button.setToolTip("Exchange target and draft")
        self.swap_button.clicked.connect(self.swap)
        self.check_button = QPushButton("Check")
        self.check_button.setDefault(True)
        self.check_button.clicked.connect(self.check)
        self.download_button = QPushButton("Download pair")
        self.download_button.clicked.connect(self.download)
        self.load_button = QPushButton("Load pair")
        self.load_button.clicked.connect(self.load)
        buttons.addWidget(self.swap_button)
        buttons.addStretch(1)
        for b in (self.check_button, self.download_button, self.load_button):
            buttons.addWidget(b)
        lay.addLayout(buttons)

        self.verdict = QLabel()
        self.verdict.setObjectName("pairVerdict")
        self.verdict.setWordWrap(True)
        self.verdict.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        lay.addWidget(self.verdict)
        lay.addStretch(1)
        if downloads is not None:
            downloads.fileFinished.connect(self._download_finished)
        self._show("none", "Choose a target and a draft, then press Check.")
        self._update_buttons()

    # -- public -------------------------------------------------------------------------------------
    def set_target(self, text: str) -> None:
        self.target_edit.setText(text)

    def set_draft(self, text: str) -> None:
        self.draft_edit.setText(text)

    def swap(self) -> None:
        t, d = self.target_edit.text(), self.draft_edit.text()
        self.target_edit.setText(d)
        self.draft_edit.setText(t)

    @property
    def checking(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def check(self) -> None:
        """Start the compatibility check of the current inputs on a worker thread."""
        if self._closed:
            return
        t, d = self.target_edit.text(), self.draft_edit.text()
        if not t.strip():
            self._show("error", "Choose a target (and a draft, unless it drafts with its own MTP layers).")
            return
        self._generation += 1
        gen = self._generation
        self.result = None
        self.target_facts.clear()
        self.draft_facts.clear()
        remote = any(not Path(normalize_ref_safe(x)).exists() for x in (t, d) if x.strip())
        self._show("busy", "Checking… (reading the file headers" + (" from the Hub)" if remote else ")"))
        kwargs = dict(self.check_kwargs)
        old = self._thread

        def work() -> None:
            if old is not None:
                old.join()  # one check at a time: the older one's result is dropped anyway
            res = run_check(t, d, **kwargs)
            self._post.emit((gen, res))

        self._thread = threading.Thread(target=work, name="tandem-pair-check", daemon=True)
        self._thread.start()
        self._update_buttons()

    def load(self) -> None:
        r = self.result
        if r is None or not r.ok or not r.local:
            return
        self.loadRequested.emit(str(r.target), "" if r.draft is None else str(r.draft))

    def download(self) -> None:
        """Queue the Hub files of a compatible pair in the download manager."""
        r = self.result
        if r is None or not r.ok or self.downloads is None:
            return
        for role, ref in (("target", r.target), ("draft", r.draft)):
            if isinstance(ref, HfRef):
                self.downloads.enqueue(
                    ref.repo_id, ref.filename, revision=ref.revision, group="custom-pair",
                    label=f"{ref.filename} ({role}, {ref.repo_id})",
                    expected_size=(r.target_facts if role == "target" else r.draft_facts).file_size,  # type: ignore[union-attr]
                )  # fmt: skip
        self._show("ok", self.verdict.text().split("<br>")[0] + "<br>Downloading: see the Downloads tab.")
        self._update_buttons()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Drop pending results and join the check thread."""
        self._closed = True
        self._generation += 1
        if self._thread is not None:
            self._thread.join(timeout)

    # -- internals ----------------------------------------------------------------------------------
    def _browse(self, edit: QLineEdit, role: str) -> None:
        cur = edit.text().strip()
        start = (
            str(Path(cur).expanduser().parent)
            if cur and Path(cur).expanduser().exists()
            else str(Path.home())
        )
        path, _ = QFileDialog.getOpenFileName(self, f"Choose the {role.lower()} model", start, GGUF_FILTER)
        if path:
            edit.setText(path)

    def _inputs_changed(self) -> None:
        if self.result is not None or self.checking:
            self._generation += 1  # a running check is for other inputs now
            self.result = None
            self.target_facts.clear()
            self.draft_facts.clear()
            self._show("none", "Inputs changed: press Check.")
        self._update_buttons()

    @Slot(object)
    def _on_result(self, msg: tuple[int, CheckResult]) -> None:
        gen, res = msg
        if gen != self._generation or self._closed:
            self._update_buttons()
            return
        self.result = res
        self.target_facts.setText(_facts_text(res.target, res.target_facts, res.target_arch))
        self.draft_facts.setText(_facts_text(res.draft, res.draft_facts, res.draft_arch))
        self._render_result()
        self.checked.emit(res)

    def _render_result(self) -> None:
        res = self.result
        if res is None:
            return
        if res.compat is None:
            self._show("error", f"<b>Could not check the pair.</b> {escape(res.error)}")
        elif not res.ok:
            self._show(
                "bad", f"<b>✗ Incompatible: this pair cannot run together.</b><br>{escape(res.compat.reason)}"
            )
        else:
            extra = "Ready to load." if res.local else "Download the pair to load it (Hub files)."
            if res.draft is None:
                self._show("ok", f"<b>✓ No draft needed</b>: {escape(res.compat.reason)}.<br>{extra}")
                self._update_buttons()
                return
            if res.target_arch is not None and res.draft_arch is not None:
                extra = f"{escape(describe_pair_drafting(res.target_arch, res.draft_arch))}.<br>{extra}"
            self._show("ok", f"<b>✓ Compatible</b>: the draft's vocabulary matches the target's.<br>{extra}")
        self._update_buttons()

    def _download_finished(self, _key: int, _path: str) -> None:
        r = self.result
        if r is None or r.local:
            return
        refs = []
        for ref in (r.target, r.draft):
            if isinstance(ref, HfRef):
                hit = cached_model(ref.repo_id, ref.filename, revision=ref.revision)
                refs.append(hit if hit is not None else ref)
            else:
                refs.append(ref)
        if refs != [r.target, r.draft]:
            self.result = dataclasses.replace(r, target=refs[0], draft=refs[1])
            self._render_result()

    def _show(self, verdict: str, html: str) -> None:
        self.verdict.setText(html)
        if self.verdict.property("verdict") != verdict:
            self.verdict.setProperty("verdict", verdict)
            self.verdict.style().unpolish(self.verdict)
            self.verdict.style().polish(self.verdict)

    def _update_buttons(self) -> None:
        r = self.result
        self.check_button.setEnabled(bool(self.target_edit.text().strip()) and not self._closed)
        self.load_button.setEnabled(r is not None and r.ok and r.local)
        remote = r is not None and r.ok and not r.local
        self.download_button.setVisible(remote and self.downloads is not None)
        self.download_button.setEnabled(remote)
        if r is not None and r.compat is not None and not r.ok:
            self.load_button.setToolTip(f"Incompatible pair: {r.compat.reason}")
        elif r is None:
            self.load_button.setToolTip("Check the pair first")
        elif not r.local:
            self.load_button.setToolTip("Download the Hub files first")
        else:
            self.load_button.setToolTip("")

    # -- the draft picker ---------------------------------------------------------------------------
    def target_model(self) -> CatalogModel | None:
        """The catalog model the target is: a catalog id, a Hub file of the catalog, or a local file of
        a catalog file's name."""
        ref = normalize_ref_safe(self.target_edit.text().strip())
        if ref.startswith("hf://"):
            try:
                h = parse_hf_ref(ref)
            except ValueError:
                return None
            hit = self.catalog.find_file(h.repo_id, h.filename)
            return hit[0] if hit else None
        mid = ref.partition(":")[0]
        if mid in self.catalog.models:
            return self.catalog.models[mid]
        hit = self.catalog.find_filename(Path(ref).name) if ref.endswith(".gguf") else None
        return hit[0] if hit else None

    def _refresh_picker(self) -> None:
        m = self.target_model()
        options = self.catalog.draft_options(m.id) if m is not None else ()
        self.draft_picker.clear()
        self.draft_picker.addItem("Choose a draft the catalog offers…", None)
        for o in options:
            self.draft_picker.addItem(o.words, (o.kind, o.draft))
        for w in (self.draft_picker, self.picker_label):
            w.setVisible(bool(options))

    def _pick_draft(self, index: int) -> None:
        choice = self.draft_picker.itemData(index)
        if choice is not None:
            kind, draft = choice
            self.draft_edit.setText("" if kind == "mtp" else draft)


def normalize_ref_safe(text: str) -> str:
    try:
        return normalize_ref(text)
    except ValueError:
        return text
