"""Memory bandwidth: the CPU's, measured once on this machine and cached; a GPU's, from a table.

Decoding reads every weight once per token, so a device's memory bandwidth bounds its tokens/s
(`models_registry.speed`).

**CPU**: `probe_cpu_bandwidth` streams over a buffer far larger than any L3 cache (512 MiB, at most an
eighth of the free RAM), one numpy reduction per thread over its own slice (numpy releases the GIL in
them), best of five passes: a few hundred ms, most of it filling the buffer. `cpu_bandwidth` keeps the
figure in ``bandwidth.json`` in the app's data folder and measures again only on request
(``remeasure``) or when the CPU is another one.

**GPU**: no probe without a GPU to run it on, so `gpu_bandwidth` looks the device's name up in
`GPU_TABLE` (the makers' peak figures, GB/s) and falls back to a conservative default by kind:
`DEFAULT_GPU` for an unknown discrete GPU, `DEFAULT_APPLE` for an unknown Apple chip, and for an
integrated GPU (which reads system RAM) the CPU's own bandwidth.
"""

from __future__ import annotations

import json
import logging
import math
import os
import platform
import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

import numpy as np
import psutil

from .datadir import data_dir, write_json_atomic

__all__ = [
    "DEFAULT_APPLE",
    "DEFAULT_CPU",
    "DEFAULT_GPU",
    "GPU_TABLE",
    "Bandwidth",
    "bandwidth_file",
    "cached_cpu_bandwidth",
    "cpu_bandwidth",
    "cpu_name",
    "gpu_bandwidth",
    "probe_cpu_bandwidth",
]

log = logging.getLogger("tandem.registry")

GB = 1e9
MiB = 1024**2
FILE_NAME = "bandwidth.json"
PROBE_BYTES = 512 * MiB
PROBE_PASSES = 5
PROBE_THREADS = 8

#: assumed CPU bandwidth until measured: a dual-channel DDR4 laptop under load (conservative)
DEFAULT_CPU = 20 * GB
#: an unknown discrete GPU: an entry-level card of the last years (conservative)
DEFAULT_GPU = 200 * GB
#: an unknown Apple chip (the base M2/M3 have 100 GB/s)
DEFAULT_APPLE = 100 * GB

#: peak memory bandwidth in GB/s by device name (as ggml describes the device: "NVIDIA GeForce RTX 4060
#: Laptop GPU", "Apple M2 Pro"); the longest entry whose words all appear in the name wins
GPU_TABLE: dict[str, float] = {
    # Apple M-series (unified memory; the binned Max chips are the slower figure)
    "apple m1": 68, "apple m1 pro": 200, "apple m1 max": 400, "apple m1 ultra": 800,
    "apple m2": 100, "apple m2 pro": 200, "apple m2 max": 400, "apple m2 ultra": 800,
    "apple m3": 100, "apple m3 pro": 150, "apple m3 max": 300, "apple m3 ultra": 819,
    "apple m4": 120, "apple m4 pro": 273, "apple m4 max": 410, "apple m5": 153,
    # NVIDIA laptop GPUs
    "rtx 5090 laptop": 896, "rtx 5080 laptop": 896, "rtx 5070 ti laptop": 672, "rtx 5070 laptop": 384,
    "rtx 5060 laptop": 384, "rtx 4090 laptop": 576, "rtx 4080 laptop": 432, "rtx 4070 laptop": 256,
    "rtx 4060 laptop": 256, "rtx 4050 laptop": 192, "rtx 3080 ti laptop": 512, "rtx 3080 laptop": 384,
    "rtx 3070 ti laptop": 448, "rtx 3070 laptop": 384, "rtx 3060 laptop": 336, "rtx 3050 ti laptop": 192,
    "rtx 3050 laptop": 192, "rtx 2060 laptop": 336, "rtx 2070 laptop": 384, "rtx 2080 laptop": 384,
    # NVIDIA desktop GPUs
    "rtx 5090": 1792, "rtx 5080": 960, "rtx 5070 ti": 896, "rtx 5070": 672, "rtx 5060 ti": 448,
    "rtx 5060": 448, "rtx 4090": 1008, "rtx 4080 super": 736, "rtx 4080": 717, "rtx 4070 ti super": 672,
    "rtx 4070 ti": 504, "rtx 4070 super": 504, "rtx 4070": 504, "rtx 4060 ti": 288, "rtx 4060": 272,
    "rtx 3090 ti": 1008, "rtx 3090": 936, "rtx 3080 ti": 912, "rtx 3080": 760, "rtx 3070 ti": 608,
    "rtx 3070": 448, "rtx 3060 ti": 448, "rtx 3060": 360, "rtx 3050": 224, "rtx 2080 ti": 616,
    "rtx 2080": 448, "rtx 2070": 448, "rtx 2060": 336, "gtx 1660": 192, "gtx 1650": 128,
    "gtx 1080 ti": 484, "gtx 1080": 320, "gtx 1070": 256,
    # NVIDIA workstation and data-centre GPUs
    "rtx 6000 ada": 960, "rtx a6000": 768, "rtx a4000": 448, "rtx a2000": 288, "tesla t4": 320, "t4": 320,
    "l4": 300, "a10": 600, "l40s": 864, "v100": 900, "a100": 1555, "h100": 2000,
    # AMD and Intel
    "rx 7900 xtx": 960, "rx 7900 xt": 800, "rx 7800 xt": 624, "rx 7700 xt": 432, "rx 7600": 288,
    "rx 6900 xt": 512, "rx 6800 xt": 512, "rx 6700 xt": 384, "rx 6600": 224, "mi300x": 5300,
    "arc a770": 560, "arc a750": 512, "arc b580": 456,
}  # fmt: skip

Source = Literal["measured", "cached", "assumed"]


@dataclass(frozen=True)
class Bandwidth:
    """The CPU's memory bandwidth (bytes/s) and where the figure comes from."""

    bytes_per_second: float
    source: Source
    measured_at: str = ""  # ISO time of the measurement ("" if assumed)

    @property
    def measured(self) -> bool:
        return self.source != "assumed"


# ---------------------------------------------------------------------------------------------- GPU


def gpu_bandwidth(
    name: str, *, apple: bool = False, integrated: bool = False, cpu: float = DEFAULT_CPU
) -> float:
    """Peak bandwidth (bytes/s) of the GPU called `name`: `GPU_TABLE`, else the default for its kind
    (an integrated GPU reads system RAM: `cpu`, the CPU's bandwidth)."""
    words = set(re.findall(r"[a-z0-9]+", name.lower()))
    best = ""
    for key in GPU_TABLE:
        if len(key) > len(best) and set(key.split()) <= words:
            best = key
    if best:
        return GPU_TABLE[best] * GB
    if apple or "apple" in words:
        return DEFAULT_APPLE
    return cpu if integrated else DEFAULT_GPU


# ---------------------------------------------------------------------------------------------- CPU


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux, else what `platform` says)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def probe_cpu_bandwidth(
    *,
    nbytes: int = PROBE_BYTES,
    passes: int = PROBE_PASSES,
    threads: int | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """Bytes/s read by a streaming pass over `nbytes` (split across `threads`), best of `passes`."""
    cap = max(64 * MiB, psutil.virtual_memory().available // 8)
    n = max(1, min(nbytes, cap) // 8)
    buf = np.ones(n, dtype=np.float64)  # written once: every page is in RAM before timing
    workers = max(1, threads or min(psutil.cpu_count(logical=False) or os.cpu_count() or 1, PROBE_THREADS))
    chunks = np.array_split(buf, workers)
    best = math.inf
    with ThreadPoolExecutor(workers) as pool:
        for _ in range(max(1, passes)):
            t0 = clock()
            list(pool.map(np.sum, chunks))
            best = min(best, clock() - t0)
    return buf.nbytes / best if best > 0 else math.inf


def bandwidth_file() -> Path:
    """``<data folder>/bandwidth.json``."""
    return data_dir() / FILE_NAME


def _identity() -> dict[str, object]:
    return {"cpu": cpu_name(), "cores": psutil.cpu_count(logical=False) or os.cpu_count() or 1}


def cached_cpu_bandwidth(path: Path | None = None) -> Bandwidth | None:
    """The cached measurement if there is one for this CPU (never measures)."""
    p = path or bandwidth_file()
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        log.warning("ignoring unreadable bandwidth cache %s: %s", p, e)
        return None
    if not isinstance(data, dict) or any(data.get(k) != v for k, v in _identity().items()):
        return None
    value = data.get("bytes_per_second")
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        log.warning("ignoring bandwidth cache %s: no usable figure", p)
        return None
    return Bandwidth(float(value), "cached", str(data.get("measured_at", "")))


def cpu_bandwidth(
    *,
    remeasure: bool = False,
    path: Path | None = None,
    probe: Callable[[], float] = probe_cpu_bandwidth,
    now: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
) -> Bandwidth:
    """This machine's CPU bandwidth: the cached figure, else (or with `remeasure`) measured and cached.

    A failed probe or an unwritable cache is logged; without a figure the result is `DEFAULT_CPU`,
    "assumed"."""
    p = path or bandwidth_file()
    if not remeasure:
        cached = cached_cpu_bandwidth(p)
        if cached is not None:
            return cached
    try:
        value = float(probe())
    except (MemoryError, OSError, ValueError) as e:
        log.warning("could not measure the memory bandwidth: %s", e)
        return Bandwidth(DEFAULT_CPU, "assumed")
    if not math.isfinite(value) or value <= 0:
        return Bandwidth(DEFAULT_CPU, "assumed")
    stamp = now().isoformat(timespec="seconds")
    record = {**_identity(), "bytes_per_second": value, "measured_at": stamp}
    try:
        write_json_atomic(p, record)
    except OSError as e:
        log.warning("could not cache the memory bandwidth in %s: %s", p, e)
    return Bandwidth(value, "measured", stamp)
