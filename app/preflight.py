"""Before Qt starts: is there a display, and can Qt's platform plugin load?

Qt aborts the process (a core dump) when no platform plugin can start: no display to connect to, or a
system library the plugin links to is missing (``libxcb-cursor0`` and friends on a fresh Linux). This
module finds out first, without importing Qt, and says what to do instead. The library check runs
``ldd`` in a child process, so nothing here can bring the main process down.

``check()`` returns the message to print, or ``None`` when the window can open. It only checks on
Linux and other X11/Wayland systems; macOS and Windows always pass. ``TANDEM_SKIP_PREFLIGHT=1`` skips
it.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

# platforms that draw without a screen (no DISPLAY or WAYLAND_DISPLAY needed)
HEADLESS = frozenset({"offscreen", "minimal", "minimalegl", "linuxfb", "eglfs", "vnc", "vkkhrdisplay"})

# Qt's own libraries, beside the plugin: missing means a broken PySide6, not a missing system package
_QT_OWN = ("libQt6", "libicu", "libpyside6", "libshiboken6")

# soname -> (Debian/Ubuntu package, Fedora package)
PACKAGES: dict[str, tuple[str, str]] = {
    "libxcb-cursor.so.0": ("libxcb-cursor0", "xcb-util-cursor"),
    "libxkbcommon-x11.so.0": ("libxkbcommon-x11-0", "libxkbcommon-x11"),
    "libxkbcommon.so.0": ("libxkbcommon0", "libxkbcommon"),
    "libxcb-icccm.so.4": ("libxcb-icccm4", "xcb-util-wm"),
    "libxcb-keysyms.so.1": ("libxcb-keysyms1", "xcb-util-keysyms"),
    "libxcb-image.so.0": ("libxcb-image0", "xcb-util-image"),
    "libxcb-util.so.1": ("libxcb-util1", "xcb-util"),
    "libxcb-render-util.so.0": ("libxcb-render-util0", "xcb-util-renderutil"),
    "libxcb-shape.so.0": ("libxcb-shape0", "libxcb"),
    "libxcb-xinerama.so.0": ("libxcb-xinerama0", "libxcb"),
    "libxcb-randr.so.0": ("libxcb-randr0", "libxcb"),
    "libxcb-render.so.0": ("libxcb-render0", "libxcb"),
    "libxcb-shm.so.0": ("libxcb-shm0", "libxcb"),
    "libxcb-sync.so.1": ("libxcb-sync1", "libxcb"),
    "libxcb-xfixes.so.0": ("libxcb-xfixes0", "libxcb"),
    "libxcb-xkb.so.1": ("libxcb-xkb1", "libxcb"),
    "libxcb-xinput.so.0": ("libxcb-xinput0", "libxcb"),
    "libxcb-glx.so.0": ("libxcb-glx0", "libxcb"),
    "libxcb.so.1": ("libxcb1", "libxcb"),
    "libX11-xcb.so.1": ("libx11-xcb1", "libX11-xcb"),
    "libX11.so.6": ("libx11-6", "libX11"),
    "libXau.so.6": ("libxau6", "libXau"),
    "libXdmcp.so.6": ("libxdmcp6", "libXdmcp"),
    "libSM.so.6": ("libsm6", "libSM"),
    "libICE.so.6": ("libice6", "libICE"),
    "libEGL.so.1": ("libegl1", "mesa-libEGL"),
    "libGL.so.1": ("libgl1", "mesa-libGL"),
    "libGLX.so.0": ("libglx0", "libglvnd-glx"),
    "libOpenGL.so.0": ("libopengl0", "libglvnd-opengl"),
    "libfontconfig.so.1": ("libfontconfig1", "fontconfig"),
    "libfreetype.so.6": ("libfreetype6", "freetype"),
    "libdbus-1.so.3": ("libdbus-1-3", "dbus-libs"),
    "libglib-2.0.so.0": ("libglib2.0-0", "glib2"),
    "libgthread-2.0.so.0": ("libglib2.0-0", "glib2"),
    "libwayland-client.so.0": ("libwayland-client0", "libwayland-client"),
    "libwayland-cursor.so.0": ("libwayland-cursor0", "libwayland-cursor"),
    "libwayland-egl.so.1": ("libwayland-egl1", "libwayland-egl"),
    "libpng16.so.16": ("libpng16-16", "libpng"),
    "libz.so.1": ("zlib1g", "zlib"),
    "libexpat.so.1": ("libexpat1", "expat"),
    "libzstd.so.1": ("libzstd1", "libzstd"),
}

_NOT_FOUND = re.compile(r"^\s*(\S+)\s+=>\s+not found\s*$", re.MULTILINE)

Ldd = Callable[[Path, Mapping[str, str]], "str | None"]


@dataclass(frozen=True)
class Platform:
    """One platform plugin Qt will try, and what this machine offers it."""

    name: str
    display: bool  # what it connects to is there (always true for headless platforms)
    display_note: str = ""  # why not, when not
    plugin: Path | None = None  # the plugin file, when found
    absent: bool = False  # the plugins folder was found and has no such plugin
    available: tuple[str, ...] = ()  # the plugins that folder has
    missing: tuple[str, ...] = ()  # shared libraries the plugin needs that the loader cannot find

    @property
    def ok(self) -> bool:
        return self.display and not self.absent and not self.missing


def qt_platforms(env: Mapping[str, str]) -> list[str]:
    """The platform plugins Qt tries, in its order (Qt 6: ``QT_QPA_PLATFORM``, else the session type)."""
    requested = env.get("QT_QPA_PLATFORM", "").strip()
    if requested:
        names = [p.split(":", 1)[0].strip() for p in requested.split(";")]
        return [n for n in names if n]
    if env.get("XDG_SESSION_TYPE") == "wayland":
        return ["wayland", "xcb"]  # Qt adds its default (xcb) as the fallback
    return ["xcb"]


def _x_server_answers(display: str, timeout: float = 2.0) -> bool | None:
    """Whether an X server listens at ``display`` (``:0``, ``unix:0``, ``host:10.0``); None: cannot tell."""
    m = re.fullmatch(r"(?P<host>[^:]*):(?P<num>\d+)(?:\.\d+)?", display.strip())
    if not m:
        return None
    host, num = m["host"], int(m["num"])
    if host in ("", "unix") or host.endswith("/unix"):
        path = f"/tmp/.X11-unix/X{num}"
        candidates = [path] + (["\0" + path] if sys.platform.startswith("linux") else [])
        for address in candidates:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(timeout)
                try:
                    s.connect(address)
                    return True
                except OSError:
                    continue
        if host == "unix":
            return False
        host = "localhost"  # ":N" falls back to TCP, as Xlib does
    try:
        with socket.create_connection((host, 6000 + num), timeout=timeout):
            return True
    except OSError:
        return False


def _wayland_socket(env: Mapping[str, str]) -> Path | None:
    name = env.get("WAYLAND_DISPLAY") or "wayland-0"  # libwayland's default
    if name.startswith("/"):
        return Path(name)
    runtime = env.get("XDG_RUNTIME_DIR")
    return Path(runtime) / name if runtime else None


def _display(name: str, env: Mapping[str, str], probe: bool) -> tuple[bool, str]:
    """Whether platform ``name`` has what it connects to, and why not."""
    if name in HEADLESS:
        return True, ""
    if name == "xcb":
        display = env.get("DISPLAY", "")
        if not display:
            return False, "DISPLAY is not set"
        if probe and _x_server_answers(display) is False:
            return False, f"no X server answers at DISPLAY={display}"
        return True, ""
    if name.startswith("wayland"):
        sock = _wayland_socket(env)
        if not env.get("WAYLAND_DISPLAY"):  # libwayland then tries wayland-0
            if probe and sock is not None and sock.exists():
                return True, ""
            return False, "WAYLAND_DISPLAY is not set"
        if probe and sock is not None and not sock.exists():
            return False, f"no Wayland compositor at {sock}"
        return True, ""
    return True, ""  # a platform we do not know: let Qt judge


def platforms_dirs(env: Mapping[str, str]) -> list[Path]:
    """Where Qt looks for platform plugins: the environment's overrides, then PySide6's own folder."""
    dirs: list[Path] = []
    if env.get("QT_QPA_PLATFORM_PLUGIN_PATH"):
        dirs.append(Path(env["QT_QPA_PLATFORM_PLUGIN_PATH"]))
    dirs += [Path(p) / "platforms" for p in env.get("QT_PLUGIN_PATH", "").split(os.pathsep) if p]
    roots: list[Path] = []
    try:
        spec = importlib.util.find_spec("PySide6")  # finds the package without importing it
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        roots += [Path(p) for p in spec.submodule_search_locations]
    if getattr(sys, "_MEIPASS", None):  # a frozen app
        roots.append(Path(sys._MEIPASS) / "PySide6")
    for root in roots:
        dirs += [root / "Qt" / "plugins" / "platforms", root / "plugins" / "platforms"]
    return dirs


def _plugin_file(name: str, folder: Path) -> Path | None:
    for stem in dict.fromkeys((name, name.split("-", 1)[0])):  # wayland-egl lives in libqwayland.so
        path = folder / f"libq{stem}.so"
        if path.is_file():
            return path
    return None


def run_ldd(path: Path, env: Mapping[str, str]) -> str | None:
    """``ldd path`` in a child process (its output), or None when ldd is not there or fails."""
    ldd = shutil.which("ldd")
    if ldd is None:
        return None
    try:
        out = subprocess.run(
            [ldd, str(path)], capture_output=True, text=True, timeout=20, env=dict(env), check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout + out.stderr


def missing_libraries(ldd_output: str) -> list[str]:
    """The ``not found`` sonames in ``ldd`` output, in order, each once."""
    return list(dict.fromkeys(_NOT_FOUND.findall(ldd_output)))


def _qt_libraries(plugin: Path, name: str) -> list[Path]:
    """Qt libraries the app needs beside the plugin itself (ldd lists their needs too; belt and braces)."""
    libdir = plugin.parent.parent.parent / "lib"  # PySide6/Qt/plugins/platforms -> PySide6/Qt/lib
    names = ["libQt6Widgets.so.6"]
    if name == "xcb":
        names.append("libQt6XcbQpa.so.6")
    elif name.startswith("wayland"):
        names.append("libQt6WaylandClient.so.6")
    return [libdir / n for n in names if (libdir / n).is_file()]


def check_platform(
    name: str, env: Mapping[str, str], *, dirs: Iterable[Path], ldd: Ldd = run_ldd, probe: bool = True
) -> Platform:
    """What platform ``name`` needs that this machine lacks (the display first, then the libraries)."""
    display, note = _display(name, env, probe)
    folder = next((d for d in dirs if d.is_dir()), None)
    if folder is None:
        return Platform(name, display, note)  # cannot find Qt's plugins: let Qt judge
    plugin = _plugin_file(name, folder)
    if plugin is None:
        available = tuple(sorted(p.name[4:-3] for p in folder.glob("libq*.so")))
        return Platform(name, display, note, absent=bool(available), available=available)
    missing: list[str] = []
    for path in [plugin, *_qt_libraries(plugin, name)]:
        output = ldd(path, env)
        if output:
            missing += missing_libraries(output)
    return Platform(name, display, note, plugin=plugin, missing=tuple(dict.fromkeys(missing)))


def no_display_message(platforms: list[Platform]) -> str:
    why = "; ".join(dict.fromkeys(p.display_note for p in platforms if p.display_note))
    return (
        f"tandem: there is no display to open the window on ({why}).\n"
        "Log in to a desktop session, or forward X (ssh -X). For a server without a screen, use\n"
        "`tandem generate ...` (see `tandem generate --help`); `tandem --self-test` checks the engine."
    )


def missing_message(platforms: list[Platform]) -> str:
    """What to install so that the plugins of ``platforms`` (Qt's candidates with a display) load."""
    missing = list(dict.fromkeys(lib for p in platforms for lib in p.missing))
    own = [lib for lib in missing if lib.startswith(_QT_OWN)]
    system = [lib for lib in missing if not lib.startswith(_QT_OWN)]
    names = [p.name for p in platforms]
    which = (
        f"{names[0]} platform plugin needs"
        if len(names) == 1
        else f"platform plugins ({', '.join(names)}) need"
    )
    lines = [
        f"tandem: the window cannot open: Qt's {which} system libraries that are missing:",
        "  " + " ".join(missing),
    ]
    known = [lib for lib in system if lib in PACKAGES]
    if known:
        apt = " ".join(dict.fromkeys(PACKAGES[lib][0] for lib in known))
        dnf = " ".join(dict.fromkeys(PACKAGES[lib][1] for lib in known))
        lines += [
            "Install them:",
            f"  Debian/Ubuntu: sudo apt install {apt}",
            f"  Fedora:        sudo dnf install {dnf}",
        ]
    unknown = [lib for lib in system if lib not in PACKAGES]
    if unknown:
        lines.append(
            f"Find the package of {' '.join(unknown)} with `apt-file search NAME` or `dnf provides '*/NAME'`."
        )
    if own:
        lines.append(f"{' '.join(own)} belong to Qt itself: reinstall Tandem (PySide6 is incomplete).")
    lines += [f"(plugin: {p.plugin})" for p in platforms if p.plugin is not None]
    lines.append("The command line works without them: `tandem generate ...`, `tandem --help`.")
    return "\n".join(lines)


def absent_message(platform: Platform) -> str:
    return (
        f'tandem: Qt has no platform plugin "{platform.name}" (QT_QPA_PLATFORM); '
        f"available: {', '.join(platform.available)}."
    )


def check(
    env: Mapping[str, str] | None = None,
    *,
    system: str | None = None,
    dirs: Iterable[Path] | None = None,
    ldd: Ldd = run_ldd,
    probe: bool = True,
) -> str | None:
    """The message that says why the window cannot open, or None when it can (as far as we can tell).

    ``dirs`` (where the platform plugins are), ``ldd`` (a path's ``ldd`` output) and ``probe`` (connect to
    the display's socket) are there for tests.
    """
    env = os.environ if env is None else env
    system = sys.platform if system is None else system
    if env.get("TANDEM_SKIP_PREFLIGHT") == "1" or system.startswith(("win", "darwin", "cygwin")):
        return None
    folders = platforms_dirs(env) if dirs is None else list(dirs)
    platforms = [check_platform(n, env, dirs=folders, ldd=ldd, probe=probe) for n in qt_platforms(env)]
    if any(p.ok for p in platforms):
        return None  # Qt tries them in order and takes the first that starts
    shown = [p for p in platforms if p.display]
    if not shown:
        return no_display_message(platforms)
    if shown[0].absent:
        return absent_message(shown[0])
    return missing_message([p for p in shown if p.missing])
