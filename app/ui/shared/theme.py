"""The app's look: a light Fusion palette, a stylesheet and the window icon (kept in code so an installed
package needs no data files; ``resources/`` holds copies for packaging)."""

from __future__ import annotations

from PySide6.QtCore import QByteArray
from PySide6.QtGui import QColor, QIcon, QPalette, QPixmap
from PySide6.QtWidgets import QApplication

ICON_SVG = """<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 64 64">
<rect x="2" y="2" width="60" height="60" rx="14" fill="#2f6fde"/>
<circle cx="24" cy="32" r="11" fill="none" stroke="#ffffff" stroke-width="5"/>
<circle cx="40" cy="32" r="11" fill="none" stroke="#a9c6ff" stroke-width="5"/>
</svg>"""

STYLESHEET = """
QMainWindow, QDialog { background: #ffffff; }
#sidebar { background: #f4f5f7; border-right: 1px solid #e1e4e8; }
#sidebar QListWidget { background: transparent; border: none; outline: none; }
#sidebar QListWidget::item { padding: 7px 8px; border-radius: 6px; color: #24292f; }
#sidebar QListWidget::item:selected { background: #dfe7f7; color: #0b2e6f; }
#sidebar QListWidget::item:hover:!selected { background: #eaecef; }
#newChat { background: #2f6fde; color: white; border: none; border-radius: 6px; padding: 7px 10px;
           font-weight: 600; }
#newChat:hover { background: #2a63c7; }
#chatHeader { border-bottom: 1px solid #eceef1; }
#chatTitle { font-size: 15px; font-weight: 600; color: #24292f; }
#chatInner { background: #ffffff; }
#placeholder { color: #57606a; padding: 60px 20px; }
#message_user { background: #eef3fc; border-radius: 10px; }
#message_assistant { background: #ffffff; border: 1px solid #eceef1; border-radius: 10px; }
#message_error { background: #fff1f0; border: 1px solid #f5c2c0; border-radius: 10px; color: #8a1c17; }
#who { font-weight: 600; color: #57606a; font-size: 12px; }
#messageInfo { color: #8c959f; font-size: 11px; }
#messageAction { border: none; color: #57606a; padding: 2px 6px; border-radius: 4px; font-size: 11px; }
#messageAction:hover { background: #eaecef; color: #24292f; }
#codeBlock { background: #f6f8fa; border: 1px solid #e1e4e8; border-radius: 6px; }
#codeHeader { background: #eef1f4; border-top-left-radius: 6px; border-top-right-radius: 6px;
              border-bottom: 1px solid #e1e4e8; }
#codeLang { color: #57606a; font-size: 11px; }
#copyCode { border: none; color: #2f6fde; padding: 2px 8px; font-size: 11px; border-radius: 4px; }
#copyCode:hover { background: #dfe7f7; }
#composerBox { border-top: 1px solid #eceef1; }
#composer { border: 1px solid #d0d7de; border-radius: 8px; padding: 6px 8px; background: #ffffff; }
#composer:focus { border-color: #2f6fde; }
#sendButton { background: #2f6fde; color: white; border: none; border-radius: 8px; padding: 8px 18px;
              font-weight: 600; min-width: 64px; }
#sendButton:hover { background: #2a63c7; }
#sendButton:disabled { background: #b8c7e6; }
#systemPrompt { border: 1px solid #d0d7de; border-radius: 6px; padding: 4px 6px; background: #fbfbfc; }
#linkButton { border: none; color: #2f6fde; padding: 2px 6px; }
#linkButton:hover { text-decoration: underline; }
#sideTabs::pane { border: none; border-left: 1px solid #e1e4e8; }
#gauges { background: #fafbfc; }
#gaugeCaption { color: #57606a; font-size: 11px; }
#gaugeValue { color: #24292f; font-size: 20px; font-weight: 600; }
#gaugeNote { color: #8c959f; font-size: 11px; }
#draftStatus { color: #24292f; background: #eef3fc; border-radius: 6px; padding: 6px 8px; }
QStatusBar { background: #f4f5f7; border-top: 1px solid #e1e4e8; color: #57606a; }
QStatusBar QLabel { padding: 0 8px; }
"""


def app_icon() -> QIcon:
    pix = QPixmap()
    pix.loadFromData(QByteArray(ICON_SVG.encode()), "SVG")
    return QIcon(pix)


def apply_theme(app: QApplication) -> None:
    """Fusion style, a light palette (the stylesheet assumes light colours) and the stylesheet."""
    app.setStyle("Fusion")
    pal = QPalette()
    for role, color in (
        (QPalette.ColorRole.Window, "#ffffff"),
        (QPalette.ColorRole.WindowText, "#24292f"),
        (QPalette.ColorRole.Base, "#ffffff"),
        (QPalette.ColorRole.AlternateBase, "#f6f8fa"),
        (QPalette.ColorRole.Text, "#24292f"),
        (QPalette.ColorRole.Button, "#f4f5f7"),
        (QPalette.ColorRole.ButtonText, "#24292f"),
        (QPalette.ColorRole.Highlight, "#2f6fde"),
        (QPalette.ColorRole.HighlightedText, "#ffffff"),
        (QPalette.ColorRole.ToolTipBase, "#ffffff"),
        (QPalette.ColorRole.ToolTipText, "#24292f"),
        (QPalette.ColorRole.PlaceholderText, "#8c959f"),
        (QPalette.ColorRole.Link, "#2f6fde"),
    ):
        pal.setColor(role, QColor(color))
    app.setPalette(pal)
    app.setStyleSheet(STYLESHEET)
    app.setWindowIcon(app_icon())
