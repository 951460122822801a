"""The compute devices llama.cpp can use: ggml's backend registry, read through ctypes.

With ``llama.py``, the only module that calls into llama.cpp (here its ``libggml``). Which of these
devices auto offload uses, and why none, is decided in :mod:`app.engine.offload` (pure functions).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import llama_cpp

from app.engine.errors import LlamaError
from app.engine.info import Device
from app.engine.offload import backend_of, is_software, used_gpu

_DEVICE_KINDS = {0: "CPU", 1: "GPU", 2: "IGPU", 3: "ACCEL", 4: "META"}
_lib: ctypes.CDLL | None = None  # opened once, its functions declared once


def _init() -> None:
    from app.engine.llama import init_backend  # llama.py re-exports this module's functions

    init_backend()


def _lib_dir() -> Path:
    return Path(llama_cpp.__file__).parent / "lib"


def _ggml_lib() -> ctypes.CDLL | None:
    """The ggml library llama.cpp already uses (its soname first: a wheel may hold a second copy of
    the file under the unversioned name, and opening that would load a separate ggml instance)."""
    global _lib
    if _lib is not None:
        return _lib
    lib_dir = _lib_dir()
    for name in ("libggml.so.0", "libggml.so", "libggml.0.dylib", "libggml.dylib", "ggml.dll"):
        path = lib_dir / name
        if path.exists():
            try:
                lib = ctypes.CDLL(str(path))
                lib.ggml_backend_dev_count  # noqa: B018 -- probe the symbol
            except (OSError, AttributeError):
                continue
            _declare(lib)
            _lib = lib
            return lib
    return None


def _declare(lib: ctypes.CDLL) -> None:
    p, size = ctypes.c_void_p, ctypes.c_size_t
    lib.ggml_backend_dev_count.restype = size
    lib.ggml_backend_dev_get.restype = p
    lib.ggml_backend_dev_get.argtypes = [size]
    for fn in ("ggml_backend_dev_name", "ggml_backend_dev_description"):
        getattr(lib, fn).restype = ctypes.c_char_p
        getattr(lib, fn).argtypes = [p]
    lib.ggml_backend_dev_type.restype = ctypes.c_int
    lib.ggml_backend_dev_type.argtypes = [p]
    lib.ggml_backend_dev_memory.argtypes = [p, ctypes.POINTER(size), ctypes.POINTER(size)]
    lib.ggml_backend_reg_count.restype = size
    lib.ggml_backend_reg_get.restype = p
    lib.ggml_backend_reg_get.argtypes = [size]
    lib.ggml_backend_reg_name.restype = ctypes.c_char_p
    lib.ggml_backend_reg_name.argtypes = [p]
    lib.ggml_backend_reg_dev_count.restype = size
    lib.ggml_backend_reg_dev_count.argtypes = [p]
    lib.ggml_backend_dev_by_name.restype = p
    lib.ggml_backend_dev_by_name.argtypes = [ctypes.c_char_p]


def devices() -> list[Device]:
    """The compute devices llama.cpp can use in this process. A software renderer (Mesa's llvmpipe,
    SwiftShader) is listed as ggml lists it, a GPU, and marked ``software``."""
    _init()
    lib = _ggml_lib()
    if lib is None:
        return [Device("CPU", "CPU", "CPU", 0, 0)]
    out = []
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        device = Device(
            name=(lib.ggml_backend_dev_name(dev) or b"").decode(errors="replace"),
            description=(lib.ggml_backend_dev_description(dev) or b"").decode(errors="replace"),
            kind=_DEVICE_KINDS.get(lib.ggml_backend_dev_type(dev), "?"),
            memory_free=free.value,
            memory_total=total.value,
        )
        out.append(replace(device, software=is_software(device)))
    return out


def backends() -> dict[str, int]:
    """The backends built into this llama.cpp and how many devices each found, e.g.
    ``{"CPU": 1, "Vulkan": 0}`` (a Vulkan build on a machine without a Vulkan driver)."""
    _init()
    lib = _ggml_lib()
    if lib is None:
        return {"CPU": 1}
    out: dict[str, int] = {}
    for i in range(lib.ggml_backend_reg_count()):
        reg = lib.ggml_backend_reg_get(i)
        name = (lib.ggml_backend_reg_name(reg) or b"").decode(errors="replace")
        out[name] = int(lib.ggml_backend_reg_dev_count(reg))
    return out


def device_list(names: Sequence[str]) -> ctypes.Array:
    """A NULL-terminated array of ggml devices by name, for ``llama_model_params.devices`` (an empty
    one: no GPU at all, not even for a large batch's matrix products)."""
    _init()
    lib = _ggml_lib()
    handles = []
    for name in names:
        handle = lib.ggml_backend_dev_by_name(name.encode()) if lib is not None else None
        if not handle:
            raise LlamaError(f"no ggml device named {name}")
        handles.append(handle)
    return (ctypes.c_void_p * (len(handles) + 1))(*handles, None)


def backend_name() -> str:
    """ "CUDA", "Metal", "Vulkan", ... for the GPU llama.cpp offloads to, else "CPU"."""
    gpu = used_gpu(devices())
    return backend_of(gpu) if gpu is not None else "CPU"
