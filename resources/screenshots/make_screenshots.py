"""Take README's screenshots from the real window: a real reply from a real model pair, then the models tab.

    xvfb-run -a -s "-screen 0 1400x900x24" python resources/screenshots/make_screenshots.py \\
        --target TARGET.gguf --draft DRAFT.gguf [--prompt TEXT] [--mode speculative]

Uses a throw-away data folder, so your own conversations and settings are untouched.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True)
    p.add_argument("--draft")
    p.add_argument(
        "--prompt", default="Write a Python function that checks whether a string is a palindrome."
    )
    p.add_argument("--mode", default="auto", choices=("auto", "model", "lookup"))
    p.add_argument("--max-tokens", type=int, default=160)
    p.add_argument("--out", type=Path, default=HERE)
    args = p.parse_args()
    os.environ.setdefault("TANDEM_DATA_DIR", tempfile.mkdtemp(prefix="tandem-shots-"))

    from PySide6.QtCore import QEventLoop, QTimer
    from PySide6.QtWidgets import QApplication

    from app.ui.main_window import MainWindow
    from app.ui.models.models_install import install_models_panel
    from app.ui.shared.theme import apply_theme

    app = QApplication(sys.argv[:1])
    app.setApplicationName("Tandem")
    apply_theme(app)  # type: ignore[arg-type]
    window = MainWindow()
    panel = install_models_panel(window.session)
    window.add_panel("Models", panel)
    window.panel_width(panel, 640)
    window.apply_settings(
        dataclasses.replace(window.settings, draft_source=args.mode, max_tokens=args.max_tokens)
    )
    window.resize(1400, 900)
    window.show()

    def wait_for(signal, timeout_s: float) -> None:
        loop = QEventLoop()
        signal.connect(loop.quit)
        QTimer.singleShot(int(timeout_s * 1000), loop.quit)
        loop.exec()

    window.load_pair(args.target, args.draft)
    wait_for(window.modelLoaded, 300)
    window.composer.setPlainText(args.prompt)
    window.send()
    wait_for(window.replyFinished, 900)
    QTimer.singleShot(300, lambda: None)
    app.processEvents()
    args.out.mkdir(parents=True, exist_ok=True)
    window.grab().save(str(args.out / "chat.png"))
    window.side_tabs.setCurrentWidget(panel)
    for _ in range(20):
        app.processEvents()
    window.grab().save(str(args.out / "models.png"))
    print(f"saved {args.out / 'chat.png'} and {args.out / 'models.png'}")
    panel.shutdown()
    window.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
