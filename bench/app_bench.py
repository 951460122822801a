"""Benchmark (not a test): does the desktop app slow generation down, and does its event loop stall?

Runs the same chat reply headless through ``EngineClient`` and through the real ``MainWindow`` (offscreen
unless a display is set) and prints decode tokens/s for both, the rate the window actually showed tokens
at, and the event loop's longest stall while the reply streamed (a 5 ms QTimer records the gaps).

    python -m bench.app_bench                      # tiny generated models
    python -m bench.app_bench --target T.gguf --draft D.gguf --runs 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

PROMPT = "Write a long story"


def _settings(args: argparse.Namespace):
    from app.ui.core.settings import AppSettings

    return AppSettings(
        speculative=args.mode != "plain",
        draft_source={"speculative": "model", "lookup": "lookup"}.get(args.mode, "auto"),
        n_max=args.n_max,
        adaptive=False,
        max_tokens=args.max_tokens,
        n_ctx=args.ctx,
        n_threads=args.threads,
        gpu_layers=args.gpu_layers,
        gpu_layers_draft=args.gpu_layers,
    )


def headless(args: argparse.Namespace, target: str, draft: str | None) -> list[dict]:
    """Decode tokens/s of the same reply generated through the client, without any window."""
    from app.engine import EngineClient
    from app.engine.events import Finished, Step

    s = _settings(args)
    out = []
    with EngineClient() as client:
        client.load(s.load(target, draft))
        gs = s.generation(has_draft=bool(draft))
        for _ in range(args.runs + 1):  # the first run warms up
            first = last = None
            for ev in client.generate(messages=[{"role": "user", "content": args.prompt}], settings=gs):
                now = time.perf_counter()
                if isinstance(ev, Step) and ev.tokens:
                    first = first or now
                    last = now
                elif isinstance(ev, Finished):
                    out.append(_figures(ev, first, last))
    return out[1:]


def _figures(fin, first: float | None, last: float | None) -> dict:
    wall = (last - first) if first and last and last > first else 0.0
    return {
        "tokens": fin.stats.n_generated,
        "engine_tps": fin.stats.decode_tokens_per_second,
        "seen_tps": (fin.stats.n_generated - 1) / wall if wall else 0.0,
        "acceptance": fin.stats.acceptance_rate,
    }


def in_app(args: argparse.Namespace, target: str, draft: str | None) -> list[dict]:
    """The same reply through the real window; tokens/s as shown on screen and event-loop stalls."""
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen" if not os.environ.get("DISPLAY") else "")
    os.environ["TANDEM_DATA_DIR"] = tempfile.mkdtemp(prefix="tandem-bench-")
    from PySide6.QtCore import QEventLoop, QTimer
    from PySide6.QtWidgets import QApplication

    from app.ui.main_window import MainWindow
    from app.ui.shared.theme import apply_theme

    app = QApplication.instance() or QApplication(sys.argv[:1])
    apply_theme(app)  # type: ignore[arg-type]
    w = MainWindow()
    w.resize(1280, 800)
    w.show()
    w.apply_settings(replace(_settings(args), last_target=target, last_draft=draft or ""))

    def wait(signal, timeout_s: float = 600) -> tuple:
        loop, got = QEventLoop(), []
        signal.connect(lambda *a: (got.append(a), loop.quit()))
        QTimer.singleShot(int(timeout_s * 1000), loop.quit)
        loop.exec()
        if not got:
            raise TimeoutError(f"no {signal} within {timeout_s} s")
        return got[0]

    w.load_pair(target, draft)
    wait(w.modelLoaded)
    gaps: list[float] = []
    ticks = [time.perf_counter()]

    def tick() -> None:
        now = time.perf_counter()
        gaps.append(now - ticks[0])
        ticks[0] = now

    timer = QTimer()
    timer.setInterval(5)
    timer.timeout.connect(tick)
    seen: list[tuple[float, int]] = []
    w.worker.steps.connect(
        lambda batch: seen.append((time.perf_counter(), sum(len(s.tokens) for s in batch)))
    )
    out = []
    try:
        for _ in range(args.runs + 1):
            w.new_conversation()
            seen.clear()
            gaps.clear()
            ticks[0] = time.perf_counter()
            timer.start()
            w.composer.setPlainText(args.prompt)
            w.send()
            wait(w.replyFinished)
            timer.stop()
            fin = w.meter.finished
            first, last = (seen[0][0], seen[-1][0]) if seen else (None, None)
            fig = _figures(fin, first, last)
            fig["seen_tps"] = (sum(n for _, n in seen[1:]) / (last - first)) if seen and last > first else 0.0
            fig["max_stall_ms"] = max(gaps, default=0.0) * 1000
            fig["p99_stall_ms"] = sorted(gaps)[int(len(gaps) * 0.99)] * 1000 if gaps else 0.0
            fig["renders_per_s"] = w.render_count / (last - first) if seen and last > first else 0.0
            out.append(fig)
    finally:
        w.close()
    return out[1:]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", help="target GGUF (default: tiny generated models)")
    p.add_argument("--draft", help="draft GGUF")
    p.add_argument("--mode", default="speculative", choices=("speculative", "auto", "lookup", "plain"))
    p.add_argument("--n-max", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=600)
    p.add_argument("--ctx", type=int, default=2048)
    p.add_argument("--threads", type=int, default=0, help="0 = llama.cpp's default")
    p.add_argument("--gpu-layers", default="auto", metavar="auto|all|cpu|N")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--prompt", default=PROMPT, help="the user message (a long reply measures best)")
    args = p.parse_args(argv)
    if args.target:
        target, draft = args.target, args.draft
    else:
        from app.tiny_gguf import write_tiny_pair

        t, d = write_tiny_pair(Path(tempfile.mkdtemp(prefix="tandem-tiny-")))
        target, draft = str(t), str(d)
        args.threads = args.threads or 1

    head = headless(args, target, draft)
    app = in_app(args, target, draft)

    def med(rows: list[dict], key: str) -> float:
        return statistics.median(r[key] for r in rows)

    print(
        f"target {Path(target).name}, draft {Path(draft).name if draft else '-'}, mode {args.mode}, "
        f"n_max {args.n_max}, {args.runs} runs (medians), reply of {int(med(head, 'tokens'))} tokens"
    )
    print(f"{'':28}{'headless':>12}{'in the app':>12}")
    print(f"{'engine decode tokens/s':28}{med(head, 'engine_tps'):12.1f}{med(app, 'engine_tps'):12.1f}")
    print(f"{'tokens/s seen by consumer':28}{med(head, 'seen_tps'):12.1f}{med(app, 'seen_tps'):12.1f}")
    print(f"{'acceptance':28}{med(head, 'acceptance'):12.0%}{med(app, 'acceptance'):12.0%}")
    print(
        f"event loop: longest stall {max(r['max_stall_ms'] for r in app):.1f} ms, "
        f"p99 gap {med(app, 'p99_stall_ms'):.1f} ms (timer every 5 ms), "
        f"{med(app, 'renders_per_s'):.0f} re-renders/s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
