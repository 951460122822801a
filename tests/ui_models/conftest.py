"""The Models panel's fixtures (defined in ``models_panel_kit``, beside its constants)."""

from models_panel_kit import make_panel, no_threads_left, served  # noqa: F401
