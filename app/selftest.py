"""``tandem --self-test``: prove on this machine that the engine process starts, loads and decodes losslessly.

Loads a tiny real target + draft pair through the real :class:`~app.engine.EngineClient` (so the
engine's ``spawn`` child process must start: in a frozen app that needs ``multiprocessing.freeze_support``
in the entry point), generates greedily in plain and in speculative mode on a few prompts, and checks the
speculative reply is the plain reply token for token. Prints load time, tokens/s per mode, acceptance,
the backend, the GPU it found (or why the models stay on the CPU: no GPU, a build without GPU support, a
Vulkan build without a Vulkan driver, a software renderer auto offload skips) and every device llama.cpp
reports. Exit code 0 on success, 1 on a failed check, 2 when the engine could not start or load.

Layers go where auto offload puts them; ``TANDEM_GPU_LAYERS`` (auto, all, cpu or a count, as
``--gpu-layers``) asks for others, and then the self-test fails if the models stayed on the CPU:
``GGML_VK_VISIBLE_DEVICES=0 TANDEM_GPU_LAYERS=all tandem --self-test`` runs it on Mesa's lavapipe.

The tiny models come from ``resources/selftest/`` (written at build time into the packaged app, see
``packaging/build.sh``); a development checkout without them generates them into a temporary directory
with :func:`app.tiny_gguf.write_tiny_pair` (milliseconds). No Qt is imported: the self-test runs headless.
"""

from __future__ import annotations

import os
import platform
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from app import __version__

if TYPE_CHECKING:
    from app.engine import Device, EngineInfo

TARGET_NAME = "tiny-target.gguf"
DRAFT_NAME = "tiny-draft.gguf"

PROMPTS: tuple[str, ...] = (
    "The quick brown fox",
    "def fibonacci(n):\n",
    "Speculative decoding lets a small draft model",
)
MAX_TOKENS = 48
GPU_LAYERS_ENV = "TANDEM_GPU_LAYERS"


def bundled_models_dir() -> Path:
    """Where a packaged app keeps the self-test models (``resources/selftest`` in the app or checkout)."""
    if getattr(sys, "frozen", False):
        base = Path(getattr(sys, "_MEIPASS", Path(sys.executable).parent))
    else:
        base = Path(__file__).resolve().parent.parent
    return base / "resources" / "selftest"


def find_models(tmp_dir: Path | None = None) -> tuple[Path, Path, str]:
    """(target, draft, where): the bundled pair if present, else a pair generated into ``tmp_dir``."""
    bundled = bundled_models_dir()
    target, draft = bundled / TARGET_NAME, bundled / DRAFT_NAME
    if target.is_file() and draft.is_file():
        return target, draft, f"bundled ({bundled})"
    if tmp_dir is None:
        raise FileNotFoundError(f"self-test models not found in {bundled}")
    from app.tiny_gguf import write_tiny_pair

    target, draft = write_tiny_pair(tmp_dir)
    return target, draft, f"generated ({tmp_dir})"


def _describe_devices(info: EngineInfo) -> str:
    if not info.devices:
        return "none reported"

    def one(d: Device) -> str:
        kind = f"{d.kind}, software renderer" if d.software else d.kind
        memory = (
            f", {d.memory_free / 2**30:.1f}/{d.memory_total / 2**30:.1f} GiB free" if d.memory_total else ""
        )
        return f"{d.name} [{kind}{memory}] {d.description}".strip()

    return "; ".join(one(d) for d in info.devices)


def _describe_gpu(info: EngineInfo) -> str:
    """The GPU the models run on, or why none (the line a bug report needs first)."""
    used = [m.offload for m in (info.target, info.draft) if m is not None and m.offload.on_gpu]
    if used:
        o = used[0]
        kind = {"IGPU": ", integrated", "software": ", software renderer"}.get(o.device_kind, "")
        return f"{o.backend}: {o.device or '?'}{kind}"
    why = info.placement().removeprefix("CPU only (").removesuffix(")")  # one paren: the reason may hold some
    return f"none, the models run on the CPU ({why})"


def run_self_test(
    out: TextIO | None = None,
    prompts: Sequence[str] = PROMPTS,
    max_tokens: int = MAX_TOKENS,
    gpu_layers: str | None = None,
) -> int:
    """Run the self-test, printing figures to ``out`` (default stdout). Returns the process exit code.

    ``gpu_layers`` (default: ``$TANDEM_GPU_LAYERS``, else auto) as ``--gpu-layers``: any but auto and
    cpu must put layers on a GPU, or the self-test fails."""
    out = out if out is not None else sys.stdout
    gpu_layers = (gpu_layers if gpu_layers is not None else os.environ.get(GPU_LAYERS_ENV, "")) or "auto"
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # harmless; no Qt is imported here

    def say(line: str = "") -> None:
        print(line, file=out, flush=True)

    say(
        f"tandem {__version__} self-test: Python {platform.python_version()}, "
        f"{platform.system()} {platform.machine()}, frozen={bool(getattr(sys, 'frozen', False))}"
    )
    t0 = time.perf_counter()
    try:
        from app.engine import (
            EngineClient,
            Finished,
            GenerationSettings,
            LoadSettings,
            Mode,
            parse_gpu_layers,
        )
    except Exception as e:  # a broken bundle: a module left out
        say(f"self-test FAILED: cannot import the engine: {type(e).__name__}: {e}")
        return 2
    try:
        n_gpu_layers = parse_gpu_layers(gpu_layers)
    except Exception as e:
        say(f"self-test FAILED: {GPU_LAYERS_ENV}={gpu_layers}: {e}")
        return 2

    with tempfile.TemporaryDirectory(prefix="tandem-selftest-") as tmp:
        try:
            target, draft, where = find_models(Path(tmp))
        except Exception as e:
            say(f"self-test FAILED: no self-test models: {type(e).__name__}: {e}")
            return 2
        say(f"models: {where}")

        client = EngineClient(start_timeout=60.0)
        try:
            try:
                t_start = time.perf_counter()
                client.start()
                t_started = time.perf_counter()
                info = client.load(
                    LoadSettings(
                        target=str(target),
                        draft=str(draft),
                        n_ctx=512,
                        n_threads=1,
                        n_threads_draft=1,
                        n_gpu_layers=n_gpu_layers,
                    )
                )
                t_loaded = time.perf_counter()
            except Exception as e:
                say(f"self-test FAILED: the engine did not start or load: {type(e).__name__}: {e}")
                log_path = client.log_path
                if log_path:
                    say(f"engine log: {log_path}")
                return 2
            say(
                f"engine process: started in {t_started - t_start:.2f} s (pid {client.pid}), "
                f"models loaded in {t_loaded - t_started:.2f} s"
            )
            used = next(
                (m.offload.backend for m in (info.target, info.draft) if m and m.offload.on_gpu), "CPU"
            )
            also = f" (this llama.cpp also has {info.backend})" if info.backend != used else ""
            say(f"backend: {used}{also}")
            say(f"gpu: {_describe_gpu(info)}")
            say(f"placement: {info.placement()}")
            say(f"devices: {_describe_devices(info)}")
            failures: list[str] = []
            if n_gpu_layers not in (None, 0) and not info.target.offload.on_gpu:
                failures.append(
                    f"{GPU_LAYERS_ENV}={gpu_layers} asked for GPU layers, but the target runs on the CPU"
                )

            totals = {
                m: {"tokens": 0, "seconds": 0.0, "drafted": 0, "accepted": 0}
                for m in (Mode.PLAIN, Mode.SPECULATIVE)
            }
            for i, text in enumerate(prompts, 1):
                prompt = client.tokenize(text)
                replies: dict[Mode, Finished] = {}
                for mode in (Mode.PLAIN, Mode.SPECULATIVE):
                    settings = GenerationSettings(mode=mode, max_tokens=max_tokens, n_max=4, n_min=1)
                    finished = None
                    for event in client.generate(prompt=prompt, settings=settings):
                        if isinstance(event, Finished):
                            finished = event
                    if finished is None:
                        failures.append(f"prompt {i} {mode}: no Finished event")
                        continue
                    replies[mode] = finished
                    s = finished.stats
                    t = totals[mode]
                    t["tokens"] += s.n_generated
                    t["seconds"] += s.t_decode_s
                    t["drafted"] += s.n_drafted
                    t["accepted"] += s.n_accepted
                if len(replies) < 2:
                    continue
                plain, spec = replies[Mode.PLAIN].tokens, replies[Mode.SPECULATIVE].tokens
                same = plain == spec
                say(
                    f"prompt {i}: {len(plain)} tokens, speculative == plain: {'yes' if same else 'NO'}; "
                    f"acceptance {replies[Mode.SPECULATIVE].stats.acceptance_rate:.0%}"
                )
                if not same:
                    first = next(
                        (j for j, (a, b) in enumerate(zip(plain, spec, strict=False)) if a != b),
                        min(len(plain), len(spec)),
                    )
                    failures.append(f"prompt {i}: speculative differs from plain at token {first}")
                if not plain:
                    failures.append(f"prompt {i}: no tokens generated")
            for mode, t in totals.items():
                tps = t["tokens"] / t["seconds"] if t["seconds"] > 0 else 0.0
                extra = ""
                if mode is Mode.SPECULATIVE:
                    rate = t["accepted"] / t["drafted"] if t["drafted"] else 0.0
                    extra = f", acceptance {rate:.0%} ({t['accepted']}/{t['drafted']})"
                say(f"{mode:>11}: {t['tokens']} tokens, {tps:.0f} tok/s{extra}")
            if totals[Mode.SPECULATIVE]["drafted"] == 0:
                failures.append("speculative mode drafted nothing")
        except Exception as e:
            say(f"self-test FAILED: {type(e).__name__}: {e}")
            return 2
        finally:
            client.shutdown()

    if failures:
        for f in failures:
            say(f"self-test FAILED: {f}")
        return 1
    say(f"self-test passed in {time.perf_counter() - t0:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(run_self_test())
