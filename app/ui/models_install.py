"""``install_models_panel(window)``: add the Models panel to the main window and route Load to
``window.load_pair``; the machine's GPUs come from the window's engine (its device list), the memory
bandwidth is measured once (off the GUI thread) and kept."""

from __future__ import annotations

import dataclasses
from typing import Any

from PySide6.QtCore import QCoreApplication

from app.ui.models_panel import ModelsPanel
from models_registry.catalog import Pair


def install_models_panel(window: Any, **kwargs: Any) -> ModelsPanel:
    """Create the Models panel, add it with ``window.add_panel("Models", panel)`` and route Load to
    ``window.load_pair(target, draft)``, applying the catalog pair's suggested draft settings (n_max,
    p_min) through ``window.apply_settings`` when the window has one. Keyword arguments go to
    `ModelsPanel`; ``n_ctx`` and ``min_speed`` default to ``window.settings``'s, and the panel follows
    them when ``window.apply_settings`` changes them. Unless a ``machine`` is given, the GPUs come from
    the window's engine (``window.client.info()``, asked off the GUI thread, and every ``modelLoaded``
    EngineInfo) and the bandwidth is measured once. The panel's ``shutdown()`` runs when the application
    quits (call it earlier from the window's own shutdown if you like)."""
    settings = getattr(window, "settings", None)
    if "n_ctx" not in kwargs and isinstance(getattr(settings, "n_ctx", None), int):
        kwargs["n_ctx"] = settings.n_ctx  # type: ignore[union-attr]
    if "min_speed" not in kwargs and isinstance(getattr(settings, "min_speed", None), float):
        kwargs["min_speed"] = settings.min_speed  # type: ignore[union-attr]
    detect = "machine" not in kwargs
    panel = ModelsPanel(**kwargs)
    window.add_panel("Models", panel)
    if detect:
        client = getattr(window, "client", None)
        panel.detect_machine_in_background(getattr(client, "info", None))
        loaded = getattr(window, "modelLoaded", None)
        if loaded is not None:
            loaded.connect(lambda info: panel.set_devices(info.devices, info.gpu_offload))

    apply_settings = getattr(window, "apply_settings", None)
    if callable(apply_settings):

        def apply_and_follow(new: Any) -> None:
            apply_settings(new)
            if isinstance(getattr(new, "n_ctx", None), int):
                panel.set_n_ctx(new.n_ctx)
            if isinstance(getattr(new, "min_speed", None), float):
                panel.set_min_speed(new.min_speed)

        window.apply_settings = apply_and_follow  # the window has no settings signal to connect to

    def load(target: str, draft: str, pair: Pair | None) -> None:
        current = getattr(window, "settings", None)
        apply = getattr(window, "apply_settings", None)
        if pair is not None and current is not None and callable(apply) and dataclasses.is_dataclass(current):
            names = {f.name for f in dataclasses.fields(current)}
            if {"n_max", "p_min"} <= names and (current.n_max, current.p_min) != (pair.n_max, pair.p_min):
                apply(dataclasses.replace(current, n_max=pair.n_max, p_min=pair.p_min))
        window.load_pair(target, draft)

    panel.pairLoadRequested.connect(load)
    app = QCoreApplication.instance()
    if app is not None:
        app.aboutToQuit.connect(panel.shutdown)
    return panel
