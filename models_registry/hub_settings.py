"""Hub settings read from the environment at call time: endpoint, offline mode and whether a token is set.

``HF_ENDPOINT``, ``HF_HUB_OFFLINE`` and ``HF_TOKEN`` are read on every call (huggingface_hub reads some
of them once, at import), so a change of environment takes effect without restarting the app.
"""

from __future__ import annotations

import os

from huggingface_hub import constants, get_token

__all__ = ["LIBRARY_NAME", "has_token", "hub_endpoint", "is_offline"]

#: Sent in the User-Agent of every Hub request.
LIBRARY_NAME = "tandem"


def _truthy(value: str | None) -> bool:
    return (value or "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def hub_endpoint() -> str:
    """``HF_ENDPOINT`` (read now, not at import), else huggingface_hub's endpoint."""
    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def is_offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` is set (now, or when huggingface_hub was imported)."""
    return _truthy(os.environ.get("HF_HUB_OFFLINE")) or constants.is_offline_mode()


def has_token(token: str | bool | None) -> bool:
    """Whether requests made with `token` (huggingface_hub's convention) carry one.

    A string is the token itself, False means none, None or True use the saved or ``HF_TOKEN`` token.
    """
    if isinstance(token, str):
        return bool(token)
    if token is False:
        return False
    return bool(get_token())
