"""Command-line front end of the registry: ``models catalog|list|fit`` and ``download``.

`add_subcommands` registers the commands on an argparse subparsers object; every parser gets a
``handler`` default, so the caller runs ``args.handler(args)`` (see `run`) and exits with its code.
`resolve_model_ref` and `check_refs` (which serve ``tandem check``) live in `refs` and are re-exported.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TextIO

from . import bandwidth
from . import fit as fitmod
from .catalog import CatalogError, CatalogModel, QuantFile, default_catalog
from .fit_report import report_data, report_lines
from .hf_cache import hub_cache_dir
from .hub_errors import HubError
from .library import list_local, list_partials
from .measured import SpeedStore
from .parts import download_model
from .refs import check_refs, resolve_model_ref
from .units import format_bytes

__all__ = [
    "add_subcommands",
    "build_parser",
    "check_refs",
    "cmd_download",
    "cmd_models_catalog",
    "cmd_models_fit",
    "cmd_models_list",
    "main",
    "resolve_model_ref",
    "run",
]

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


def _err(msg: str, code: int = EXIT_ERROR) -> int:
    print(f"tandem: error: {msg}", file=sys.stderr)
    return code


# -------------------------------------------------------------------------------------- handlers


def cmd_models_catalog(args: argparse.Namespace) -> int:
    """Print the curated pairs (or, with --json, the pairs and models as JSON)."""
    try:
        cat = default_catalog()
    except CatalogError as e:
        return _err(str(e))
    if getattr(args, "json", False):
        print(json.dumps(cat.to_data(), indent=2))
        return EXIT_OK

    def line(role: str, m: CatalogModel, qf: QuantFile) -> str:
        parts = f", {len(qf.parts)} parts" if qf.split else ""
        return f"  {role:<7} {m.name:<28} {m.repo}/{qf.file} ({qf.quant}, {format_bytes(qf.size)}{parts})"

    for p in cat.pairs:
        t, d = cat.model(p.target), cat.model(p.draft)
        tf, df = t.file(), d.file()
        approx = "~" if tf.size_approx or df.size_approx else ""
        print(f"{p.id}")
        print(line("target", t, tf))
        print(line("draft", d, df))
        gated = "  [gated: needs HF_TOKEN]" if t.gated or d.gated else ""
        print(f"  total   {approx}{format_bytes(tf.size + df.size)}, draft n_max={p.n_max} p_min={p.p_min}, "
              f"licence {t.license}{gated}")  # fmt: skip
        print(f"  good for: {p.good_for}")
        drafting = cat.drafting(p)
        # a recurrent memory (how drafts roll back), a target's own MTP layers or a head: say how it drafts
        if drafting.longest_snapshot_draft is not None or drafting.target_mtp_layers or drafting.draft_kind:
            print(f"  {drafting.words}")
    return EXIT_OK


def cmd_models_list(args: argparse.Namespace) -> int:
    """Print the GGUF files in the HF cache and the user folders, and any partial downloads."""
    folders = getattr(args, "folder", None) or None
    try:
        models = list_local(folders=folders)
        partials = list_partials()
    except (OSError, CatalogError) as e:
        return _err(str(e))
    if not models:
        print(f"no GGUF models found (HF cache: {hub_cache_dir()})")
    for m in models:
        tag = f"  [{m.catalog_id} {m.quant}]" if m.catalog_id else ""
        where = f"{m.repo_id}/{m.filename}@{(m.commit or '')[:8]}" if m.source == "hf-cache" else m.filename
        print(f"{format_bytes(m.size):>9}  {where}{tag}\n           {m.path}")
    for pd in partials:
        size = format_bytes(pd.size)
        print(f"{size:>9}  partial download of {pd.repo_id or '?'} (resumes on next download)\n"
              f"           {pd.path}")  # fmt: skip
    return EXIT_OK


def cmd_models_fit(args: argparse.Namespace) -> int:
    """Print, for every catalog pair, whether it fits this machine, how fast it will answer, and the pick.

    ``args.gpus``: the GPUs as `fit.Gpu` records (``tandem`` builds them from the engine's device list);
    absent or None, they are guessed (`fit.detect_machine`)."""
    if args.ctx <= 0:
        return _err("--ctx must be positive", EXIT_USAGE)
    min_speed = getattr(args, "min_speed", fitmod.MIN_SPEED)
    if min_speed < 0:
        return _err("--min-speed must not be negative", EXIT_USAGE)
    try:
        bw = bandwidth.cpu_bandwidth(remeasure=getattr(args, "measure_bandwidth", False))
        machine = fitmod.detect_machine(getattr(args, "gpus", None), bandwidth=bw)
        choices = fitmod.rank_catalog(machine, n_ctx=args.ctx, measured=SpeedStore())
        best = fitmod.choose(choices, min_speed=min_speed)
    except CatalogError as e:
        return _err(str(e))
    if getattr(args, "json", False):
        print(json.dumps(report_data(machine, choices, best, n_ctx=args.ctx, min_speed=min_speed), indent=2))
    else:
        print("\n".join(report_lines(machine, choices, best, n_ctx=args.ctx, min_speed=min_speed)))
    return EXIT_OK


class _ProgressBar:
    """Text progress bar on a stream (stderr), redrawn in place."""

    def __init__(self, label: str, stream: TextIO | None = None) -> None:
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.tty = getattr(self.stream, "isatty", lambda: False)()
        self._last_plain = -1.0

    def __call__(self, done: int, total: int, speed: float, eta: float | None) -> None:
        frac = done / total if total else 1.0
        width = 30
        bar = "#" * int(frac * width) + "-" * (width - int(frac * width))
        eta_s = "--:--" if eta is None else time.strftime("%H:%M:%S", time.gmtime(eta)) if eta >= 3600 else (
            f"{int(eta) // 60:02d}:{int(eta) % 60:02d}")  # fmt: skip
        figures = f"{format_bytes(done)}/{format_bytes(total)} {format_bytes(speed)}/s"
        line = f"{self.label} [{bar}] {frac:6.1%} {figures} ETA {eta_s}"
        if self.tty:
            self.stream.write("\r" + line + "\x1b[K")
        elif frac - self._last_plain >= 0.05 or done == total:  # log-friendly: every 5 %
            self._last_plain = frac
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


def cmd_download(args: argparse.Namespace) -> int:
    """Download REPO FILE into the HF cache (every part of a split model, named by any part); prints
    the path llama.cpp opens (the first part) on stdout."""
    bar = _ProgressBar(args.file)
    cancel = threading.Event()
    try:
        path = download_model(args.repo, args.file, revision=args.revision, progress=bar, cancel=cancel)
    except KeyboardInterrupt:
        cancel.set()
        bar.close()
        return _err("interrupted: the partial download is kept; run the same command to resume",
                    EXIT_INTERRUPTED)  # fmt: skip
    except HubError as e:
        bar.close()
        return _err(str(e))
    bar.close()
    print(path)
    return EXIT_OK


# ----------------------------------------------------------------------------------------- wiring

Handler = Callable[[argparse.Namespace], int]


def add_subcommands(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``models {catalog,list,fit}`` and ``download`` (each sets ``handler``)."""
    models = subparsers.add_parser("models", help="curated pairs, local models, memory fit")
    msub = models.add_subparsers(dest="models_command", metavar="SUBCOMMAND", required=True)

    cat = msub.add_parser("catalog", help="list the curated target/draft pairs")
    cat.add_argument("--json", action="store_true", help="print pairs and models as JSON")
    cat.set_defaults(handler=cmd_models_catalog)

    lst = msub.add_parser("list", help="list GGUF models on disk (HF cache and your folders)")
    lst.add_argument("--folder", action="append", type=Path, metavar="DIR",
                     help="also look in DIR (repeatable; default: the folders saved by the app)")  # fmt: skip
    lst.set_defaults(handler=cmd_models_list)

    fit = msub.add_parser("fit", help="which catalog pairs fit this machine")
    fit.add_argument(
        "--ctx", type=int, default=4096, metavar="N", help="context size in tokens (default 4096)"
    )
    fit.add_argument("--min-speed", type=float, default=fitmod.MIN_SPEED, metavar="TOK_S",
                     help=f"recommend the largest pair expected to reach this many tokens/s "
                          f"(default {fitmod.MIN_SPEED:g}; if none does, the fastest)")  # fmt: skip
    fit.add_argument("--json", action="store_true", help="print the machine, the pairs and the pick as JSON")
    fit.add_argument("--measure-bandwidth", action="store_true",
                     help="measure the memory bandwidth again (it is measured once and kept)")  # fmt: skip
    fit.set_defaults(handler=cmd_models_fit)

    dl = subparsers.add_parser("download", help="download a GGUF file from the Hugging Face Hub (resumable)")
    dl.add_argument("repo", metavar="REPO", help="Hub repository, e.g. Qwen/Qwen2.5-Coder-7B-Instruct-GGUF")
    dl.add_argument(
        "file", metavar="FILE", help="file in the repository, e.g. qwen2.5-coder-7b-instruct-q4_k_m.gguf"
    )
    dl.add_argument("--revision", default=None, metavar="R", help="branch, tag or commit (default main)")
    dl.set_defaults(handler=cmd_download)


def build_parser() -> argparse.ArgumentParser:
    """A standalone parser with just these commands (``python -m models_registry.cli``)."""
    parser = argparse.ArgumentParser(prog="tandem", description="Tandem model registry commands.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    add_subcommands(sub)
    return parser


def run(args: argparse.Namespace) -> int:
    """Run the handler argparse selected."""
    return args.handler(args)


def main(argv: Sequence[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
