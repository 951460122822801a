"""Gather the licences of everything the packaged app bundles into resources/licenses/.

    python packaging/collect_licenses.py [--llama-cpp-license PATH] [OUT_DIR]

Walks the runtime requirements of the installed ``tandem`` distribution (no extras) and copies each
one's licence files from its dist-info; adds CPython's licence, llama.cpp's (from the llama-cpp-python
sdist: vendor/llama.cpp/LICENSE) and, for Qt / PySide6 / shiboken6 (whose wheels carry no licence
file), the LGPL-3.0 and GPL-3.0 texts. Writes THIRD-PARTY-NOTICES.txt listing them all.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import sysconfig
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
LICENSE_NAME = re.compile(r"(LICEN[CS]E|COPYING|NOTICE|AUTHORS)", re.IGNORECASE)
QT_DISTS = {"pyside6-essentials", "pyside6", "shiboken6"}
QT_NOTE = """\
Qt 6 and Qt for Python (PySide6, shiboken6) are used under the GNU Lesser General Public License
version 3 (LGPL-3.0-only; see LGPL-3.0.txt, which adds to GPL-3.0.txt). They are bundled unmodified as
separate shared libraries (Qt6*, libpyside6*, libshiboken6* and the PySide6 modules in the app folder),
which you may replace with your own builds of the same version. Source code: https://download.qt.io/
(Qt) and https://code.qt.io/cgit/pyside/pyside-setup.git/ (PySide6), or ask the Tandem maintainers.
"""


def runtime_dists(root: str = "tandem") -> list[metadata.Distribution]:
    """The installed distributions ``root`` needs at run time (its requirements, recursively, no extras)."""
    seen: dict[str, metadata.Distribution] = {}
    todo = [root]
    while todo:
        name = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in seen:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        seen[key] = dist
        for spec in dist.requires or []:
            req = Requirement(spec)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            todo.append(req.name)
    seen.pop(re.sub(r"[-_.]+", "-", root).lower(), None)
    return sorted(seen.values(), key=lambda d: d.metadata["Name"].lower())


def licence_files(dist: metadata.Distribution) -> list[Path]:
    files = []
    for f in dist.files or []:
        parts = f.parts
        if parts and parts[0].endswith(".dist-info") and LICENSE_NAME.search(f.name):
            files.append(Path(dist.locate_file(f)))
    return [p for p in files if p.is_file()]


def _find_llama_cpp_license(explicit: str | None) -> Path | None:
    candidates = [Path(explicit)] if explicit else []
    candidates += [
        ROOT / "build" / "llama.cpp-LICENSE",
        Path("/tmp/lcpp/llama_cpp_python-0.3.36/vendor/llama.cpp/LICENSE"),
        ROOT / "resources" / "licenses" / "llama.cpp-LICENSE.txt",  # the copy kept in the repository
    ]
    return next((p for p in candidates if p.is_file()), None)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", default=str(ROOT / "resources" / "licenses"))
    ap.add_argument("--llama-cpp-license", help="vendor/llama.cpp/LICENSE of the llama-cpp-python sdist")
    ap.add_argument(
        "--common-licenses",
        default="/usr/share/common-licenses",
        help="folder with the LGPL-3 and GPL-3 texts (Debian: /usr/share/common-licenses)",
    )
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lines = ["Tandem bundles the following components. Their licence texts are in this folder.", ""]

    py_license = Path(sysconfig.get_paths()["stdlib"]) / "LICENSE.txt"
    if py_license.is_file():
        shutil.copy(py_license, out / "Python-LICENSE.txt")
    lines.append(
        f"Python {sys.version.split()[0]} (interpreter and standard library): PSF License "
        "-- Python-LICENSE.txt"
    )

    llama = _find_llama_cpp_license(args.llama_cpp_license)
    if llama is not None:
        if llama.resolve() != (out / "llama.cpp-LICENSE.txt").resolve():
            shutil.copy(llama, out / "llama.cpp-LICENSE.txt")
        lines.append("llama.cpp / ggml (shared libraries libllama, libggml*): MIT -- llama.cpp-LICENSE.txt")
    else:
        print("collect_licenses: llama.cpp LICENSE not found (give --llama-cpp-license)", file=sys.stderr)

    common = Path(args.common_licenses)
    for dist in runtime_dists():
        name, version = dist.metadata["Name"], dist.version
        key = re.sub(r"[-_.]+", "-", name).lower()
        lic = dist.metadata.get("License-Expression") or dist.metadata.get("License") or ""
        lic = lic.splitlines()[0][:80] if lic else "see files"
        copied = []
        for i, src in enumerate(licence_files(dist)):
            rel = src.name if i == 0 else f"{src.parent.name}-{src.name}"
            dest = out / f"{key}-{rel}"
            if not dest.name.endswith((".txt", ".md", ".rst")):
                dest = dest.with_name(dest.name + ".txt")
            shutil.copy(src, dest)
            copied.append(dest.name)
        if key in QT_DISTS:
            for text, dest in (("LGPL-3", "LGPL-3.0.txt"), ("GPL-3", "GPL-3.0.txt")):
                if (common / text).is_file():
                    shutil.copy(common / text, out / dest)
            copied = ["LGPL-3.0.txt", "GPL-3.0.txt", "Qt-NOTICE.txt"]
            lic = "LGPL-3.0-only (Qt 6 and Qt for Python)"
        lines.append(f"{name} {version}: {lic} -- {', '.join(copied) or 'no licence file in the wheel'}")
    (out / "Qt-NOTICE.txt").write_text(QT_NOTE, encoding="utf-8")
    lines += ["", "Tandem itself: MIT."]
    (out / "THIRD-PARTY-NOTICES.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"licences: {out} ({len(list(out.iterdir()))} files)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
