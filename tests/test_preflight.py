"""The check before Qt starts: no display, missing system libraries, offscreen; `tandem` end to end."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from app import preflight
from app.preflight import check, missing_libraries, qt_platforms

ROOT = Path(__file__).resolve().parent.parent
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux: ldd, X11 sockets")

LDD_XCB_MISSING = """\
\tlinux-vdso.so.1 (0x00007ffd)
\tlibQt6XcbQpa.so.6 => /venv/PySide6/Qt/plugins/platforms/../../lib/libQt6XcbQpa.so.6 (0x00007f10)
\tlibxcb-cursor.so.0 => not found
\tlibxcb-icccm.so.4 => not found
\tlibxcb.so.1 => /lib/x86_64-linux-gnu/libxcb.so.1 (0x00007f20)
\tlibxkbcommon-x11.so.0 => not found
\tlibxcb-icccm.so.4 => not found
\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f30)
"""
LDD_CLEAN = "\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f30)\n\t/lib64/ld-linux-x86-64.so.2\n"


@pytest.fixture
def plugins(tmp_path: Path) -> Path:
    """A fake Qt plugins/platforms folder with xcb, wayland and offscreen plugins (empty files)."""
    folder = tmp_path / "Qt" / "plugins" / "platforms"
    folder.mkdir(parents=True)
    for name in ("xcb", "wayland", "offscreen", "minimal"):
        (folder / f"libq{name}.so").touch()
    return folder


def fake_ldd(outputs: dict[str, str]):
    """An ldd that answers from ``outputs`` by file name (clean for the others), recording its calls."""
    calls: list[str] = []

    def ldd(path: Path, env) -> str:
        calls.append(path.name)
        return outputs.get(path.name, LDD_CLEAN)

    ldd.calls = calls  # type: ignore[attr-defined]
    return ldd


def test_platforms_qt_tries():
    assert qt_platforms({}) == ["xcb"]
    assert qt_platforms({"XDG_SESSION_TYPE": "x11"}) == ["xcb"]
    assert qt_platforms({"XDG_SESSION_TYPE": "wayland"}) == ["wayland", "xcb"]
    assert qt_platforms({"QT_QPA_PLATFORM": "offscreen"}) == ["offscreen"]
    assert qt_platforms({"QT_QPA_PLATFORM": "wayland;xcb:nograb", "XDG_SESSION_TYPE": "x11"}) == [
        "wayland",
        "xcb",
    ]


def test_missing_libraries_are_read_from_ldd_output():
    assert missing_libraries(LDD_XCB_MISSING) == [
        "libxcb-cursor.so.0",
        "libxcb-icccm.so.4",
        "libxkbcommon-x11.so.0",
    ]
    assert missing_libraries(LDD_CLEAN) == []


def test_missing_libraries_are_named_with_apt_and_dnf_packages(plugins: Path):
    ldd = fake_ldd({"libqxcb.so": LDD_XCB_MISSING})
    msg = check({"DISPLAY": ":0"}, system="linux", dirs=[plugins], ldd=ldd, probe=False)
    assert msg is not None
    assert "Qt's xcb platform plugin needs system libraries that are missing" in msg
    assert "libxcb-cursor.so.0 libxcb-icccm.so.4 libxkbcommon-x11.so.0" in msg
    assert "sudo apt install libxcb-cursor0 libxcb-icccm4 libxkbcommon-x11-0" in msg
    assert "sudo dnf install xcb-util-cursor xcb-util-wm libxkbcommon-x11" in msg
    assert str(plugins / "libqxcb.so") in msg
    assert "tandem generate" in msg
    assert ldd.calls == ["libqxcb.so"]  # no Qt lib folder beside the fake plugin: only the plugin


def test_qt_libraries_beside_the_plugin_are_checked_too(plugins: Path):
    lib = plugins.parent.parent / "lib"
    lib.mkdir()
    (lib / "libQt6XcbQpa.so.6").touch()
    (lib / "libQt6Widgets.so.6").touch()
    ldd = fake_ldd({"libQt6XcbQpa.so.6": "\tlibxcb-xinerama.so.0 => not found\n"})
    msg = check({"DISPLAY": ":0"}, system="linux", dirs=[plugins], ldd=ldd, probe=False)
    assert sorted(ldd.calls) == ["libQt6Widgets.so.6", "libQt6XcbQpa.so.6", "libqxcb.so"]
    assert msg is not None and "apt install libxcb-xinerama0" in msg and "dnf install libxcb" in msg


def test_unknown_and_qt_own_libraries(plugins: Path):
    out = "\tlibfancy.so.3 => not found\n\tlibQt6Gui.so.6 => not found\n\tlibEGL.so.1 => not found\n"
    msg = check(
        {"DISPLAY": ":0"}, system="linux", dirs=[plugins], ldd=fake_ldd({"libqxcb.so": out}), probe=False
    )
    assert msg is not None
    assert "apt install libegl1" in msg and "dnf install mesa-libEGL" in msg
    assert "Find the package of libfancy.so.3" in msg
    assert "libQt6Gui.so.6 belong to Qt itself: reinstall" in msg


def test_no_display():
    for env in ({}, {"XDG_SESSION_TYPE": "wayland"}, {"QT_QPA_PLATFORM": "xcb"}):
        msg = check(env, system="linux", dirs=[], probe=False)
        assert msg is not None, env
        assert "there is no display" in msg
        assert "For a server without a screen, use\n`tandem generate ...`" in msg
    assert "DISPLAY is not set" in (check({}, system="linux", dirs=[]) or "")


def test_no_display_wins_over_missing_libraries(plugins: Path):
    msg = check({}, system="linux", dirs=[plugins], ldd=fake_ldd({"libqxcb.so": LDD_XCB_MISSING}))
    assert msg is not None and "there is no display" in msg and "apt install" not in msg


def test_offscreen_passes(plugins: Path):
    ldd = fake_ldd({"libqxcb.so": LDD_XCB_MISSING})  # xcb broken: does not matter offscreen
    assert check({"QT_QPA_PLATFORM": "offscreen"}, system="linux", dirs=[plugins], ldd=ldd) is None
    assert ldd.calls == ["libqoffscreen.so"]
    assert check({"QT_QPA_PLATFORM": "minimal"}, system="linux", dirs=[], probe=False) is None


@linux_only
def test_offscreen_passes_with_the_real_plugin_and_ldd():
    dirs = preflight.platforms_dirs({})
    assert any((d / "libqoffscreen.so").is_file() for d in dirs), dirs
    assert check({"QT_QPA_PLATFORM": "offscreen"}) is None


def test_qt_takes_the_first_platform_that_starts(plugins: Path):
    env = {"XDG_SESSION_TYPE": "wayland", "WAYLAND_DISPLAY": "wayland-0", "DISPLAY": ":0"}
    broken = "\tlibwayland-cursor.so.0 => not found\n"
    kw = {"system": "linux", "dirs": [plugins], "probe": False}
    assert check(env, ldd=fake_ldd({"libqwayland.so": broken}), **kw) is None  # falls back to xcb
    assert check(env, ldd=fake_ldd({"libqxcb.so": LDD_XCB_MISSING}), **kw) is None  # wayland starts
    both = check(env, ldd=fake_ldd({"libqwayland.so": broken, "libqxcb.so": LDD_XCB_MISSING}), **kw)
    assert both is not None and "platform plugins (wayland, xcb)" in both
    assert "libwayland-cursor0" in both and "libxcb-cursor0" in both
    # without DISPLAY, xcb is no fallback: wayland's missing library is the message
    no_x = check({**env, "DISPLAY": ""}, ldd=fake_ldd({"libqwayland.so": broken}), **kw)
    assert no_x is not None and "Qt's wayland platform plugin needs" in no_x


def test_an_unknown_platform_lists_the_available_ones(plugins: Path):
    msg = check({"QT_QPA_PLATFORM": "offscren"}, system="linux", dirs=[plugins], ldd=fake_ldd({}))
    assert msg == (
        'tandem: Qt has no platform plugin "offscren" (QT_QPA_PLATFORM); '
        "available: minimal, offscreen, wayland, xcb."
    )


def test_macos_windows_and_the_override_skip_the_check():
    assert check({}, system="darwin", dirs=[]) is None
    assert check({}, system="win32", dirs=[]) is None
    assert check({"TANDEM_SKIP_PREFLIGHT": "1"}, system="linux", dirs=[]) is None


def _free_display() -> int:
    """An X display number with nothing listening (abstract socket name and TCP port both free)."""
    for n in range(4711, 4800):
        with socket.socket(socket.AF_UNIX) as u, socket.socket() as t:
            try:
                u.bind(f"\0/tmp/.X11-unix/X{n}")
                t.bind(("127.0.0.1", 6000 + n))
            except OSError:
                continue
        if not Path(f"/tmp/.X11-unix/X{n}").exists():
            return n
    pytest.skip("no free X display number")


@linux_only
def test_a_display_nobody_answers_is_no_display():
    n = _free_display()
    msg = check({"DISPLAY": f":{n}"}, system="linux", dirs=[])
    assert msg is not None and f"no X server answers at DISPLAY=:{n}" in msg
    with socket.socket(socket.AF_UNIX) as server:  # something listening: the check goes on
        server.bind(f"\0/tmp/.X11-unix/X{n}")
        server.listen(1)
        assert check({"DISPLAY": f":{n}.0"}, system="linux", dirs=[]) is None
    with socket.socket() as server:
        server.bind(("127.0.0.1", 6000 + n))
        server.listen(1)
        assert check({"DISPLAY": f"127.0.0.1:{n}"}, system="linux", dirs=[]) is None


def test_the_module_imports_no_qt():
    code = (
        "import sys, app.preflight as p; p.check({}); "
        "print(sorted(m for m in sys.modules if m.startswith(('PySide6', 'shiboken6'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def _tandem() -> list[str]:
    exe = Path(sys.executable).with_name("tandem")
    return [str(exe)] if exe.is_file() else [sys.executable, "-m", "app.cli"]


@pytest.mark.skipif(sys.platform in ("darwin", "win32"), reason="a display is always there")
def test_tandem_without_a_display_says_so_and_exits_1(tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    env.pop("XDG_SESSION_TYPE", None)
    env["TANDEM_DATA_DIR"] = str(tmp_path)
    proc = subprocess.run(_tandem(), env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, (proc.returncode, proc.stderr)  # not -6 (SIGABRT) nor 134
    assert "there is no display" in proc.stderr
    assert "tandem generate" in proc.stderr
    assert "core dumped" not in proc.stderr and "Aborted" not in proc.stderr
    assert not list(tmp_path.glob("core*"))


def test_ldd_runs_in_a_child_process(tmp_path: Path):
    if shutil.which("ldd") is None:
        assert preflight.run_ldd(tmp_path, {}) is None
        return
    assert preflight.run_ldd(Path(sys.executable).resolve(), dict(os.environ)) is not None
