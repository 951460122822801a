"""Secrets the app keeps (remote servers' API keys): in the OS keyring where one works (the ``keyring``
package: macOS Keychain, Windows Credential Locker, the Secret Service on Linux), otherwise in a file
only the user can read (mode 0600) in the app's data folder. Never in the settings file. No Qt here.

``keyring`` is imported on first use. A keyring that is missing or refuses (``keyring.backends.fail``,
a locked or absent Secret Service) sends the secret to the file instead; a secret found in the file
is still found after a keyring appears.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger("tandem.ui")

__all__ = ["SERVICE", "Secrets"]

SERVICE = "Tandem"
FILE_NAME = "secrets.json"


class Secrets:
    """Named secrets under ``directory`` (the file fallback); ``use_keyring`` False: the file only."""

    def __init__(self, directory: Path, *, use_keyring: bool = True) -> None:
        self.path = Path(directory) / FILE_NAME
        self.use_keyring = use_keyring

    # -- the keyring --------------------------------------------------------------------------------
    def _keyring(self) -> Any:
        """The keyring module when a usable backend is configured, else None."""
        if not self.use_keyring:
            return None
        try:
            import keyring
            from keyring.backends import fail

            if isinstance(keyring.get_keyring(), fail.Keyring):
                return None
            return keyring
        except Exception as e:  # a broken installation: the file will do
            log.warning("the OS keyring is not available (%s): keys go to %s", e, self.path)
            return None

    @property
    def where(self) -> str:
        """Where a new secret goes, for the user: "the OS keyring" or "a private file"."""
        return "the OS keyring" if self._keyring() is not None else "a private file"

    # -- API ----------------------------------------------------------------------------------------
    def get(self, name: str) -> str | None:
        kr = self._keyring()
        if kr is not None:
            try:
                value = kr.get_password(SERVICE, name)
            except Exception as e:
                log.warning("reading %s from the OS keyring failed: %s", name, e)
            else:
                if value is not None:
                    return value
        return self._read().get(name)

    def set(self, name: str, value: str) -> str:
        """Keep ``value`` under ``name``; returns where it went ("keyring" or "file")."""
        kr = self._keyring()
        if kr is not None:
            try:
                kr.set_password(SERVICE, name, value)
            except Exception as e:
                log.warning("the OS keyring refused %s (%s): keeping it in %s", name, e, self.path)
            else:
                self._drop(name)  # an older copy in the file
                return "keyring"
        data = self._read()
        data[name] = value
        self._write(data)
        return "file"

    def delete(self, name: str) -> None:
        kr = self._keyring()
        if kr is not None:
            with contextlib.suppress(Exception):  # not there, or the keyring refuses: nothing to keep
                kr.delete_password(SERVICE, name)
        self._drop(name)

    # -- the file -----------------------------------------------------------------------------------
    def _read(self) -> dict[str, str]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            log.warning("ignoring the unreadable secrets file %s: %s", self.path, e)
            return {}
        return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, str)}

    def _drop(self, name: str) -> None:
        data = self._read()
        if name in data:
            del data[name]
            self._write(data)

    def _write(self, data: dict[str, str]) -> None:
        """Write the file readable by the user only (created 0600, never wider, replaced atomically)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2)
        with contextlib.suppress(OSError):  # a umask cannot widen it, but be explicit (no-op on Windows)
            os.chmod(tmp, 0o600)
        os.replace(tmp, self.path)
