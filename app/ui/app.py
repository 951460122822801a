"""Entry point of the desktop app: ``run_app(argv, target, draft)``."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from PySide6.QtWidgets import QApplication

from app.ui.main_window import MainWindow
from app.ui.models.models_install import install_models_panel
from app.ui.models.servers_view import attach_servers
from app.ui.shared.theme import apply_theme


def run_app(argv: Sequence[str] | None = None, target: str | None = None, draft: str | None = None) -> int:
    """Open the main window (loading ``target``/``draft`` if given, else the last pair used) and run Qt.

    Returns the application's exit code.
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    app = QApplication.instance() or QApplication(list(argv if argv is not None else sys.argv))
    app.setApplicationName("Tandem")
    app.setOrganizationName("Tandem")
    apply_theme(app)  # type: ignore[arg-type]
    window = MainWindow()
    panel = install_models_panel(window.session)
    window.add_panel("Models", panel)
    # the Servers tab sends the chat to a remote server (also from the Server menu)
    attach_servers(window.session, panel.servers, window.local_server.menu)
    window.panel_width(panel, 640)  # the catalog table needs room while its tab is open
    window.show()
    if panel.should_show_first_run() and not target:
        window.side_tabs.setCurrentWidget(panel)  # no models yet: show the recommendation
    if target:
        window.load_pair(target, draft)
    elif window.settings.last_target and Path(window.settings.last_target).is_file():
        last_draft = window.settings.last_draft
        window.load_pair(
            window.settings.last_target, last_draft if last_draft and Path(last_draft).is_file() else None
        )
    try:
        return app.exec()
    finally:
        panel.shutdown()
        window.shutdown()


if __name__ == "__main__":  # python -m app.ui.app [TARGET [DRAFT]]
    args = sys.argv[1:]
    sys.exit(run_app(sys.argv, args[0] if args else None, args[1] if len(args) > 1 else None))
