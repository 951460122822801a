"""API keys kept in the OS keyring, or in a file only the user can read where no keyring works."""

from __future__ import annotations

import json
import os
import stat
import sys

import keyring
import pytest
from keyring.backend import KeyringBackend
from keyring.backends import fail

from app.ui.core.secrets import SERVICE, Secrets


class MemoryKeyring(KeyringBackend):
    """A keyring in a dict (what the OS keyring would do)."""

    priority = 1  # type: ignore[assignment]

    def __init__(self) -> None:
        super().__init__()
        self.items: dict[tuple[str, str], str] = {}

    def get_password(self, service: str, username: str) -> str | None:
        return self.items.get((service, username))

    def set_password(self, service: str, username: str, password: str) -> None:
        self.items[(service, username)] = password

    def delete_password(self, service: str, username: str) -> None:
        self.items.pop((service, username))


class RefusingKeyring(MemoryKeyring):
    """A keyring that is there but refuses (a locked Secret Service)."""

    def set_password(self, service: str, username: str, password: str) -> None:
        raise keyring.errors.PasswordSetError("locked")


@pytest.fixture
def use_keyring():
    """Set a keyring backend for one test, then put the previous one back."""
    before = keyring.get_keyring()
    yield keyring.set_keyring
    keyring.set_keyring(before)


def test_without_a_keyring_keys_go_to_a_file_only_the_user_reads(tmp_path, use_keyring) -> None:
    use_keyring(fail.Keyring())
    s = Secrets(tmp_path)
    assert s.where == "a private file"
    assert s.get("server/a") is None
    assert s.set("server/a", "k1") == "file" and s.set("server/b", "k2") == "file"
    assert s.get("server/a") == "k1" and Secrets(tmp_path).get("server/b") == "k2"
    assert json.loads((tmp_path / "secrets.json").read_text()) == {"server/a": "k1", "server/b": "k2"}
    if sys.platform != "win32":
        assert stat.S_IMODE(os.stat(tmp_path / "secrets.json").st_mode) == 0o600
    s.delete("server/a")
    assert s.get("server/a") is None and s.get("server/b") == "k2"
    assert not list(tmp_path.glob("*.tmp"))


def test_with_a_keyring_keys_stay_out_of_files(tmp_path, use_keyring) -> None:
    ring = MemoryKeyring()
    use_keyring(ring)
    s = Secrets(tmp_path)
    assert s.where == "the OS keyring"
    assert s.set("server/a", "k1") == "keyring"
    assert ring.items == {(SERVICE, "server/a"): "k1"} and s.get("server/a") == "k1"
    assert not (tmp_path / "secrets.json").exists()
    s.delete("server/a")
    assert ring.items == {} and s.get("server/a") is None
    s.delete("server/never")  # nothing to delete: no error


def test_a_key_kept_in_the_file_moves_to_a_keyring_that_appears(tmp_path, use_keyring) -> None:
    use_keyring(fail.Keyring())
    Secrets(tmp_path).set("server/a", "old")
    ring = MemoryKeyring()
    use_keyring(ring)
    s = Secrets(tmp_path)
    assert s.get("server/a") == "old"  # still found
    assert s.set("server/a", "new") == "keyring"
    assert json.loads((tmp_path / "secrets.json").read_text()) == {} and s.get("server/a") == "new"


def test_a_refusing_keyring_and_use_keyring_false_fall_back_to_the_file(tmp_path, use_keyring) -> None:
    ring = RefusingKeyring()
    use_keyring(ring)
    assert Secrets(tmp_path).set("server/a", "k") == "file" and Secrets(tmp_path).get("server/a") == "k"
    use_keyring(MemoryKeyring())
    only_file = Secrets(tmp_path / "other", use_keyring=False)
    assert only_file.where == "a private file" and only_file.set("x", "y") == "file"
    assert keyring.get_keyring().items == {}  # type: ignore[attr-defined]


def test_an_unreadable_file_reads_as_empty(tmp_path, use_keyring) -> None:
    use_keyring(fail.Keyring())
    (tmp_path / "secrets.json").write_text("{not json")
    s = Secrets(tmp_path)
    assert s.get("a") is None
    s.set("a", "b")
    assert s.get("a") == "b"
