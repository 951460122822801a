"""``install_models_panel(session)``: the Models panel, following the session: Load goes to
``session.load_pair`` (with a catalog pair's suggested draft settings), the context size and the usable
speed follow the session's settings, the machine's GPUs come from the session's engine (its device list),
the memory bandwidth is measured once (off the GUI thread) and kept."""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

from PySide6.QtCore import QCoreApplication, SignalInstance

from app.ui.core.settings import AppSettings
from app.ui.models.models_panel import ModelsPanel
from models_registry.catalog import Pair


class PanelSession(Protocol):
    """What the Models panel uses of `app.ui.core.session.Session`."""

    settings: AppSettings
    settingsChanged: SignalInstance
    pairLoaded: SignalInstance
    client: Any

    def apply_settings(self, new: AppSettings) -> None: ...

    def load_pair(self, target: str, draft: str | None = None) -> None: ...


def install_models_panel(session: PanelSession, **kwargs: Any) -> ModelsPanel:
    """Create the Models panel and connect it to ``session`` (the caller places it, e.g. with the
    window's ``add_panel("Models", panel)``). Keyword arguments go to `ModelsPanel`; ``n_ctx`` and
    ``min_speed`` default to the session's settings, and the panel follows them as they change. Unless
    a ``machine`` is given, the GPUs come from the session's engine (``session.client.info()``, asked
    off the GUI thread, and every ``pairLoaded`` EngineInfo) and the bandwidth is measured once. The
    panel's ``shutdown()`` runs when the application quits (call it earlier if you like)."""
    kwargs.setdefault("n_ctx", session.settings.n_ctx)
    kwargs.setdefault("min_speed", session.settings.min_speed)
    detect = "machine" not in kwargs
    panel = ModelsPanel(**kwargs)
    if detect:
        panel.detect_machine_in_background(getattr(session.client, "info", None))
        session.pairLoaded.connect(lambda info: panel.set_devices(info.devices, info.gpu_offload))

    def follow(new: AppSettings) -> None:
        panel.set_n_ctx(new.n_ctx)
        panel.set_min_speed(new.min_speed)

    session.settingsChanged.connect(follow)

    def load(target: str, draft: str, pair: Pair | None) -> None:
        current = session.settings
        if pair is not None and (current.n_max, current.p_min) != (pair.n_max, pair.p_min):
            session.apply_settings(dataclasses.replace(current, n_max=pair.n_max, p_min=pair.p_min))
        session.load_pair(target, draft)

    panel.pairLoadRequested.connect(load)
    app = QCoreApplication.instance()
    if app is not None:
        app.aboutToQuit.connect(panel.shutdown)
    return panel
