"""One catalog pair as the Models panel shows it: size, licence, fit badge, expected speed and download
status, worked out from the catalog, this machine, the speeds measured here, the files on disk and the
download queue."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from app.ui.models.downloads import DONE, DOWNLOADING, FAILED, QUEUED, DownloadManager
from models_registry import library
from models_registry.catalog import Catalog, CatalogModel, Pair
from models_registry.fit import Machine, PairFit, PairSpeed, estimate_pair, fit_pair, pair_speed
from models_registry.fit_report import speed_text
from models_registry.measured import SpeedStore
from models_registry.units import format_bytes

__all__ = [
    "Badge",
    "PairRow",
    "catalog_order",
    "fit_badge",
    "local_path",
    "machine_text",
    "make_row",
    "speed_label",
    "speed_tooltip",
]

GREEN = ("#116329", "#dafbe1")
AMBER = ("#7d4e00", "#fff1c2")
BLUE = ("#0550ae", "#ddf4ff")
RED = ("#a40e26", "#ffebe9")
GREY = ("#57606a", "#eaeef2")

Badge = tuple[str, str, str]  # text, foreground, background


def fit_badge(fit: PairFit) -> Badge:
    """Short coloured label for a fit verdict."""
    tight = "" if fit.comfortable or fit.verdict == "none" else " (tight)"
    if fit.verdict == "gpu":
        return ("GPU" + tight, *GREEN)
    if fit.verdict == "partial":
        return (f"Partly on GPU: {fit.gpu_layers}/{fit.need.target.n_layers} layers{tight}", *AMBER)
    if fit.verdict == "cpu":
        return ("CPU only" + tight, *BLUE)
    return ("Does not fit", *RED)


def speed_label(s: PairSpeed) -> str:
    """The speed to expect, short: ``~12 tok/s`` (estimated) or ``12 tok/s`` (measured here)."""
    return ("" if s.source == "measured" else "~") + f"{s.best:.0f} tok/s"


def speed_tooltip(s: PairSpeed) -> str:
    """Both figures and where they come from."""
    how = {"measured": "measured on this machine", "estimated": "estimated from the memory bandwidth"}
    return (
        f"Plain decoding: {speed_text(s.plain, s.plain_source)} tokens/s ({how[s.plain_source]})\n"
        f"With the draft ({s.draft_length} drafted per round, {s.acceptance:.0%} accepted): "
        f"{speed_text(s.speculative, s.speculative_source)} tokens/s ({how[s.speculative_source]})\n"
        "Auto mode drafts only where it pays, so expect the faster of the two."
    )


_RANK = {"gpu": 3, "partial": 2, "cpu": 1, "none": 0}


def catalog_order(row: PairRow) -> tuple[bool, int, bool]:
    """Sort key of the catalog: the recommended pair first, then the best fit, comfortable before tight."""
    return (not row.recommended, -_RANK[row.fit.verdict], not row.fit.comfortable)


@dataclass(frozen=True)
class PairRow:
    """One catalog pair as the table shows it (quantizations as chosen in the detail pane)."""

    pair: Pair
    target: CatalogModel
    draft: CatalogModel
    target_quant: str
    draft_quant: str
    fit: PairFit
    recommended: bool = False
    status: str = "missing"  # installed | partial | downloading | queued | failed | missing
    progress: float = 0.0  # of the pair's download, while downloading
    error: str = ""
    target_path: Path | None = None
    draft_path: Path | None = None
    speed: PairSpeed | None = None  # expected decode speed where the fit puts it

    @property
    def size(self) -> int:
        return self.target.file(self.target_quant).size + self.draft.file(self.draft_quant).size

    @property
    def size_approx(self) -> bool:
        return (
            self.target.file(self.target_quant).size_approx or self.draft.file(self.draft_quant).size_approx
        )

    @property
    def size_text(self) -> str:
        return ("~" if self.size_approx else "") + format_bytes(self.size)

    @property
    def gated(self) -> bool:
        return self.target.gated or self.draft.gated

    @property
    def licence_text(self) -> str:
        lic = self.target.license if self.target.license == self.draft.license else (
            f"{self.target.license} / {self.draft.license}")  # fmt: skip
        return lic + (" · gated" if self.gated else "")

    @property
    def installed(self) -> bool:
        return self.target_path is not None and self.draft_path is not None

    def status_badge(self) -> Badge | None:
        if self.status == "installed":
            return ("Installed", *GREEN)
        if self.status == "downloading":
            return (f"Downloading {self.progress:.0%}", *BLUE)
        if self.status == "queued":
            return ("Queued", *GREY)
        if self.status == "partial":
            return ("Partly downloaded", *AMBER)
        if self.status == "failed":
            return ("Download failed", *RED)
        return None


def machine_text(m: Machine, n_ctx: int) -> str:
    """The machine the fit badges and speeds are for: RAM, cores, memory bandwidth, GPUs and the context
    size assumed."""
    gpus = ", ".join(f"{g.name} ({format_bytes(g.total)}{', unified' if g.unified else ''})" for g in m.gpus)
    bw = f"{m.ram_bandwidth / 1e9:.0f} GB/s" + ("" if m.bandwidth_source != "assumed" else " assumed")
    return (
        f"This machine: {format_bytes(m.total_ram)} RAM ({format_bytes(m.available_ram)} free, {bw}), "
        f"{m.physical_cores} cores, GPU: {gpus or 'none'} · fit at {n_ctx:,} tokens of context"
    )


def local_path(m: CatalogModel, quant: str, local: list[library.LocalModel]) -> Path | None:
    """Where a catalog model's quantization is on disk (the cache's ``main`` revision preferred), if it is."""
    fname = m.file(quant).file
    best = None
    for lm in local:
        if lm.source == "hf-cache" and (lm.repo_id or "").lower() == m.repo.lower() and lm.filename == fname:
            if "main" in lm.refs:
                return lm.path
            best = best or lm.path
        elif lm.source == "folder" and lm.catalog_id == m.id and lm.quant == quant:
            best = best or lm.path
    return best


def make_row(
    p: Pair,
    *,
    catalog: Catalog,
    machine: Machine,
    n_ctx: int,
    quants: dict[str, tuple[str, str]],
    local: list[library.LocalModel],
    partials: list[library.PartialDownload],
    downloads: DownloadManager,
    recommended: PairFit | None,
    measured: SpeedStore | None = None,
) -> PairRow:
    """The row of pair ``p`` at the chosen quantizations (``quants``, else the defaults); its speed from
    what `measured` knows of its files, else estimated."""
    t, d = catalog.model(p.target), catalog.model(p.draft)
    tq, dq = quants.get(p.id, (t.default_quant, d.default_quant))
    need = estimate_pair(t, d, n_ctx=n_ctx, target_quant=tq, draft_quant=dq)
    fit = fit_pair(need, machine, pair=p)
    speed = pair_speed(fit, machine, t, d, target_quant=tq, draft_quant=dq, measured=measured)
    rec = recommended is not None and recommended.pair is not None and recommended.pair.id == p.id
    tpath, dpath = local_path(t, tq, local), local_path(d, dq, local)
    items = [downloads.find(m.repo, m.file(q).file) for m, q in ((t, tq), (d, dq))]
    live = [it for it in items if it is not None]

    def has_partial(m: CatalogModel) -> bool:
        return any((pd.repo_id or "").lower() == m.repo.lower() for pd in partials)

    status, progress, error = "missing", 0.0, ""
    if tpath and dpath:
        status = "installed"
    elif any(it.state == DOWNLOADING for it in live) or (
        any(it.state == QUEUED for it in live) and any(it.state == DONE for it in live)
    ):
        status = "downloading"
        done = sum(it.done for it in live) + sum(
            m.file(q).size for m, q, path in ((t, tq, tpath), (d, dq, dpath))
            if path is not None and not any(it.filename == m.file(q).file for it in live)
        )  # fmt: skip
        progress = min(1.0, done / max(1, t.file(tq).size + d.file(dq).size))
        if all(it.total for it in live) and len(live) == 2:
            progress = min(1.0, sum(it.done for it in live) / max(1, sum(it.total for it in live)))
    elif any(it.state == QUEUED for it in live):
        status = "queued"
    elif any(it.state == FAILED for it in live):
        status = "failed"
        error = next(it.error for it in live if it.state == FAILED)
    elif tpath or dpath or any(it.done for it in live) or has_partial(t) or has_partial(d):
        status = "partial"
    return PairRow(p, t, d, tq, dq, fit, rec, status, progress, error, tpath, dpath, speed)
