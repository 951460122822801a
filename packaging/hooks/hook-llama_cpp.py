"""PyInstaller hook for llama-cpp-python: bundle llama.cpp's shared libraries.

llama_cpp loads ``llama_cpp/lib/libllama.so`` (``llama.dll``, ``libllama.dylib``) with ctypes at import
time, so PyInstaller's import analysis never sees it. This hook collects ``llama_cpp/lib`` into the same
place in the bundle (the package finds it there through ``__file__``), and:

- keeps one file per library: a wheel cannot hold symlinks, so ``libllama.so``, ``libllama.so.0`` and
  ``libllama.so.0.5.0`` are three copies; the loader needs the plain name (ctypes) and the soname
  (``DT_NEEDED`` of the others), the fully versioned copy is dropped;
- leaves out ``mtmd`` (multimodal projector library; loaded lazily by llama_cpp, never used by Tandem);
- collects the CPU backend variants of a ``GGML_BACKEND_DL`` + ``GGML_CPU_ALL_VARIANTS`` build
  (``libggml-cpu-<variant>.so``, installed by llama.cpp's CMake into ``<prefix>/bin`` or ``lib``) into
  ``ggml-backends/``; the spec then moves them next to the executable, where ggml's
  ``ggml_backend_load_all()`` looks for them. The ``sapphirerapids`` variant (AMX) is left out: some
  virtual machines advertise AMX but fault on its instructions (SIGILL on ``tilezero``), and ggml picks
  the variant from CPUID alone. Set ``TANDEM_KEEP_AMX=1`` to keep it.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path

# (no PyInstaller import: the tests run this file as a plain script to check what it collects)
_spec = importlib.util.find_spec("llama_cpp")
if _spec is None or _spec.origin is None:
    raise ImportError("llama_cpp is not installed in the build environment")
pkg_dir = Path(_spec.origin).parent
lib_dir = pkg_dir / "lib"

SKIP_STEMS = ("libmtmd", "mtmd", "libllava", "llava")
EXCLUDED_VARIANTS = () if os.environ.get("TANDEM_KEEP_AMX") == "1" else ("sapphirerapids",)

# 'libx.so' and 'libx.so.0' are kept; 'libx.so.0.25.3' (three or more version parts) is a copy.
_FULL_VERSION = re.compile(r"\.so(\.\d+){2,}$")
_CPU_VARIANT = re.compile(r"^(lib)?ggml-cpu-(?P<variant>[\w.]+)\.(so|dll|dylib)$")


def _wanted(path: Path) -> bool:
    name = path.name
    if not path.is_file() or name.startswith(SKIP_STEMS):
        return False
    if _CPU_VARIANT.match(name):
        return False  # collected separately
    if _FULL_VERSION.search(name):
        return False
    return name.endswith((".so", ".dll", ".dylib")) or re.search(r"\.so\.\d+$", name) is not None


def cpu_variant_files() -> list[Path]:
    """The ``libggml-cpu-<variant>`` modules of a GGML_BACKEND_DL build, wherever CMake installed them."""
    site = pkg_dir.parent
    found: dict[str, Path] = {}
    for folder in (
        lib_dir,
        site / "bin",
        site / "lib",
        pkg_dir / "bin",
        Path(sys.prefix) / "bin",
        Path(sys.prefix) / "lib",
    ):
        if not folder.is_dir():
            continue
        for path in folder.iterdir():
            m = _CPU_VARIANT.match(path.name)
            if m and path.is_file() and m.group("variant") not in EXCLUDED_VARIANTS:
                found.setdefault(path.name, path)
    return sorted(found.values())


variants = cpu_variant_files()
# In a GGML_BACKEND_DL build every backend (ggml-cuda, ggml-vulkan, ...) is a module found by
# ggml_backend_load_all() beside the executable, not a library libggml links to.
_DL_BACKEND = re.compile(r"^(lib)?ggml-(?!base)[a-z]+\.(so|dll|dylib)$")
binaries = []
for path in sorted(lib_dir.glob("*")):
    if _wanted(path):
        dl_module = bool(variants) and _DL_BACKEND.match(path.name) is not None
        binaries.append((str(path), "ggml-backends" if dl_module else "llama_cpp/lib"))
binaries += [(str(p), "ggml-backends") for p in variants]

# the ctypes bindings only; the server, its FastAPI stack and the high-level chat formats' optional
# extras are not used by Tandem
excludedimports = ["llama_cpp.server", "uvicorn", "fastapi", "sse_starlette", "starlette_context"]
