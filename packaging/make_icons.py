"""Render resources/icon.svg into the icons the installers need: PNGs, tandem.ico and tandem.icns.

    python packaging/make_icons.py OUT_DIR

Uses Qt (PySide6's QtSvg renderer and its ico/icns image writers), headless.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication, QImage, QPainter
from PySide6.QtSvg import QSvgRenderer

ROOT = Path(__file__).resolve().parent.parent
SIZES = (16, 32, 48, 64, 128, 256, 512)


def render(renderer: QSvgRenderer, size: int) -> QImage:
    image = QImage(size, size, QImage.Format.Format_ARGB32)
    image.fill(Qt.GlobalColor.transparent)
    painter = QPainter(image)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    renderer.render(painter)
    painter.end()
    return image


def main(argv: list[str]) -> int:
    out = Path(argv[0] if argv else "build/icons")
    out.mkdir(parents=True, exist_ok=True)
    _app = QGuiApplication.instance() or QGuiApplication(["make_icons"])
    renderer = QSvgRenderer(str(ROOT / "resources" / "icon.svg"))
    if not renderer.isValid():
        print("make_icons: resources/icon.svg is not a valid SVG", file=sys.stderr)
        return 1
    for size in SIZES:
        render(renderer, size).save(str(out / f"tandem-{size}.png"))
    written = [f"tandem-{s}.png" for s in SIZES]
    if render(renderer, 256).save(str(out / "tandem.ico")):
        written.append("tandem.ico")
    if render(renderer, 512).save(str(out / "tandem.icns")):
        written.append("tandem.icns")
    print(f"icons: {out}: {', '.join(written)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
