"""The engine on a real Vulkan device: Mesa's lavapipe (a conformant Vulkan 1.3 device that runs on the
CPU, Debian package ``mesa-vulkan-drivers``), through llama.cpp's Vulkan backend, on the tiny models.

Auto offload never chooses a software renderer, so these tests choose it explicitly, the project's way:
``GGML_VK_VISIBLE_DEVICES=0`` (llama.cpp skips a CPU-type Vulkan device unless this names it) with
GPU layers asked for (``--gpu-layers all``, ``n_gpu_layers=-1``), or ``TANDEM_ALLOW_SOFTWARE_GPU=1``
where auto's own plan is under test. Every test checks that the layers really went to the Vulkan device
(llama.cpp's own buffers, read by ``Model._offload_report``): a silent fall-back to the CPU fails.

They need a Vulkan build of llama.cpp and a Vulkan device; elsewhere (the CPU venv of README's test
command) they are skipped with the reason, and with ``TANDEM_REQUIRE_VULKAN=1`` (``.ci/run``'s Vulkan
step) that reason is a failure instead. Mesa's shader cache (``MESA_SHADER_CACHE_DIR``, default
``~/.cache/tandem/mesa-shader-cache``) is kept between tests and runs: lavapipe compiles every pipeline
on first use, which takes far longer than the tiny models' decoding.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.engine import (
    EngineClient,
    EngineCrashedError,
    EngineInfo,
    Finished,
    GenerationSettings,
    LoadSettings,
)
from app.engine.info import Device
from app.engine.offload import ALL, ALLOW_SOFTWARE_ENV, gpu_budget, gpu_device, plan_offload
from app.engine.sampling import SamplingParams
from app.gguf.memory import Footprint, MiB, file_footprint
from app.tiny_gguf import write_tiny_llama

# a fixture's setup counts too: the first load on a fresh Mesa cache compiles every pipeline it uses
pytestmark = pytest.mark.timeout(1800)

ROOT = Path(__file__).resolve().parent.parent
VK_DEVICE = os.environ.get("TANDEM_TEST_VK_DEVICE", "0")  # the Vulkan device index of lavapipe
REQUIRE = os.environ.get("TANDEM_REQUIRE_VULKAN", "") == "1"
SHADER_CACHE = os.environ.get("MESA_SHADER_CACHE_DIR") or str(
    Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tandem" / "mesa-shader-cache"
)
PROMPTS = ("def add(a, b):", "The quick brown fox", "One, two, three, one, two, three, one, two,")
N_TOKENS = 24
# F32 weights: a batch and single tokens agree to ~1e-5 on lavapipe too; only a near-tie may flip a choice
TIE_TOLERANCE = 1e-3
MODES = (
    ("speculative", {"adaptive": False, "n_max": 4}),
    ("speculative", {"adaptive": True}),
    ("lookup", {}),
    ("auto", {}),
)

_PROBE = """
import json
from app.engine.devices import backends, devices
print(json.dumps({"backends": backends(), "devices": [d.__dict__ for d in devices()]}))
"""


# lavapipe compiles each pipeline on first use; 4-wide vectors and no LLVM optimization passes make that
# 3.5 times cheaper here (20 s instead of 69 s for a single token's pipelines), and the tiny models do
# not feel the slower code. A value already in the environment is kept.
LAVAPIPE_COMPILE = {"LP_NATIVE_VECTOR_WIDTH": "128", "GALLIVM_PERF": "nopt"}


def _env(**extra: str | None) -> dict[str, str]:
    env = {
        **LAVAPIPE_COMPILE,
        **os.environ,
        "GGML_VK_VISIBLE_DEVICES": VK_DEVICE,
        "MESA_SHADER_CACHE_DIR": SHADER_CACHE,
    }
    env.pop(ALLOW_SOFTWARE_ENV, None)
    for key, value in extra.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def _probe(**extra: str | None) -> dict[str, Any]:
    """What llama.cpp lists in a fresh process (its Vulkan backend reads the environment once)."""
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE],
        env=_env(**extra),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    if proc.returncode != 0:
        return {"error": (proc.stderr or proc.stdout).strip()[-600:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def lavapipe() -> Device:
    """The Vulkan device GGML_VK_VISIBLE_DEVICES names, as llama.cpp lists it; else skip (or fail)."""
    found = _probe()
    reason = ""
    if "error" in found:
        reason = f"llama.cpp could not list its devices: {found['error']}"
    elif "Vulkan" not in found["backends"]:
        reason = (
            "this llama.cpp build has no Vulkan backend (the CPU build): .ci/run runs these tests in its "
            "Vulkan venv (TANDEM_BACKEND=vulkan bash packaging/install-dev.sh)"
        )
    else:
        vulkan = [Device(**d) for d in found["devices"] if d["name"].startswith("Vulkan")]
        if not vulkan:
            reason = (
                f"Vulkan found no device with GGML_VK_VISIBLE_DEVICES={VK_DEVICE} "
                "(Debian: apt-get install mesa-vulkan-drivers gives lavapipe)"
            )
    if reason:
        if REQUIRE:
            pytest.fail(f"TANDEM_REQUIRE_VULKAN=1: {reason}")
        pytest.skip(reason)
    return vulkan[0]


@pytest.fixture
def vk_env(lavapipe: Device, monkeypatch: pytest.MonkeyPatch) -> None:
    """Engine processes started by the test see lavapipe and keep Mesa's shader cache."""
    for key, value in _env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv(ALLOW_SOFTWARE_ENV, raising=False)


def load_settings(pair, **kw: Any) -> LoadSettings:
    return LoadSettings(target=str(pair.target), draft=str(pair.draft), n_ctx=512, n_threads=1, **kw)


def greedy(mode: str = "plain", **kw: Any) -> GenerationSettings:
    return GenerationSettings(mode=mode, max_tokens=kw.pop("max_tokens", N_TOKENS), **kw)


def run(client: EngineClient, prompt: list[int], settings: GenerationSettings) -> Finished:
    last = None
    for event in client.generate(prompt=prompt, settings=settings):
        last = event
    assert isinstance(last, Finished)
    return last


def assert_on_lavapipe(info: EngineInfo, device: Device, *, target_layers: int | None = None) -> None:
    """Every model's layers on the Vulkan device (or ``target_layers`` of the target), as llama.cpp's
    own buffers show: a fall-back to the CPU fails here."""
    for model in (info.target, info.draft):
        if model is None:
            continue
        o = model.offload
        want = o.layers_total if model is info.draft or target_layers is None else target_layers
        assert o.layers_offloaded == want, (model.path, o)
        assert (o.backend, o.device, o.device_kind) == ("Vulkan", device.description, "software"), o
    assert info.backend == "Vulkan"
    assert f"on Vulkan ({device.description}, software renderer)" in info.placement()


@pytest.fixture(scope="module")
def on_device(tiny_pair, lavapipe: Device) -> Iterator[tuple[EngineClient, EngineInfo]]:
    """An engine process with both tiny models wholly on lavapipe (GGML_VK_VISIBLE_DEVICES + all)."""
    mp = pytest.MonkeyPatch()
    for key, value in _env().items():
        mp.setenv(key, value)
    try:
        client = EngineClient(start_timeout=300.0)
        client.start()
        info = client.load(load_settings(tiny_pair, n_gpu_layers=ALL))
        yield client, info
        client.shutdown()
    finally:
        mp.undo()


def same_or_tie(client: EngineClient, prompt: list[int], want: tuple[int, ...], got: tuple[int, ...]) -> bool:
    """Equal token for token, or the first difference is a numerical tie of the target. True if equal."""
    if want == got:
        return True
    i = next((j for j, (a, b) in enumerate(zip(want, got, strict=False)) if a != b), min(len(want), len(got)))
    gap = client.top2_gap([*prompt, *want[:i]])
    assert gap < TIE_TOLERANCE, (
        f"differ at token {i}, top-2 gap {gap:.4f}: not a tie\nplain: {want}\ngot:   {got}"
    )
    return False


# -- the device, as llama.cpp lists it, and auto offload ------------------------------------------


def test_lavapipe_is_listed_with_its_memory_and_the_plan_uses_it(lavapipe: Device, tiny_pair) -> None:
    assert lavapipe.kind == "GPU" and lavapipe.software, lavapipe  # ggml lists it as a (discrete) GPU
    assert "llvmpipe" in lavapipe.description
    assert 0 < lavapipe.memory_free <= lavapipe.memory_total, lavapipe
    # auto never plans for it; tests may (its real memory figures)
    assert gpu_device([lavapipe]) is None and gpu_device([lavapipe], allow_software=True) == lavapipe
    target = file_footprint(tiny_pair.target, 512)
    draft = file_footprint(tiny_pair.draft, 512, draft=True)
    plan = plan_offload(target, draft, lavapipe)
    assert (plan.target_layers, plan.draft_layers, plan.budget) == (ALL, ALL, gpu_budget(lavapipe))
    # a target larger than the device's memory: the draft whole and the layers that fit
    per_layer = max(lavapipe.memory_free // 40, 64 * MiB)
    big = Footprint(weights=per_layer * 64, n_layer=63, kv=per_layer)
    plan = plan_offload(big, draft, lavapipe)
    assert plan.draft_layers == ALL and 0 < plan.target_layers < 64, plan


def test_auto_keeps_both_models_on_the_cpu_and_says_why(
    vk_env, tiny_pair, lavapipe: Device, monkeypatch
) -> None:
    with EngineClient(start_timeout=300.0) as client:
        info = client.load(load_settings(tiny_pair))
    assert not info.target.offload.on_gpu and info.draft is not None and not info.draft.offload.on_gpu
    assert info.placement() == (
        f"CPU only (Vulkan device {lavapipe.description} is a software renderer, slower than the CPU: "
        "auto offload skips it (--gpu-layers all uses it))"
    )
    # without GGML_VK_VISIBLE_DEVICES llama.cpp itself skips it: a Vulkan build that finds no GPU
    if any(d["name"].startswith("Vulkan") for d in _probe(GGML_VK_VISIBLE_DEVICES=None).get("devices", [])):
        pytest.skip("this machine has a real Vulkan GPU besides lavapipe")
    monkeypatch.delenv("GGML_VK_VISIBLE_DEVICES")
    with EngineClient(start_timeout=300.0) as client:
        info = client.load(load_settings(tiny_pair))
    assert not info.target.offload.on_gpu and not info.gpu_offload
    assert info.placement() == (
        "CPU only (this build has Vulkan, but Vulkan found no GPU "
        "(no Vulkan driver, or only a software renderer))"
    )


# -- all layers on the device: lossless in every mode, sampling exact -------------------------------


def steady(info: EngineInfo) -> EngineInfo:
    """``info`` without what changes from one moment to the next (each device's free memory)."""
    return replace(info, devices=tuple(replace(d, memory_free=0) for d in info.devices))


def test_all_layers_on_lavapipe_greedy_equals_plain_in_every_mode(on_device, lavapipe: Device) -> None:
    client, info = on_device
    assert_on_lavapipe(info, lavapipe)
    # the same pair on the same devices (free memory is read live, so it moves between the two answers)
    assert steady(client.info().engine) == steady(info)
    ties, runs, drafted = 0, 0, 0
    for text in PROMPTS:
        prompt = client.tokenize(text)
        plain = run(client, prompt, greedy()).tokens
        assert len(plain) == N_TOKENS
        for mode, kw in MODES:
            fin = run(client, prompt, greedy(mode, **kw))
            runs += 1
            ties += not same_or_tie(client, prompt, plain, fin.tokens)
            drafted += fin.stats.n_drafted
    assert drafted > 0, "nothing was drafted: the comparison proves nothing"
    assert ties <= runs // 10, f"{ties} of {runs} replies parted at a tie"


def test_sampled_output_is_exact_on_lavapipe(on_device) -> None:
    """At temperature > 0 the joint law of the first two tokens is plain sampling's (chi-square), and
    a seed gives the same reply twice."""
    client, _ = on_device
    prompt = client.tokenize(PROMPTS[2])
    s = greedy("speculative", sampling=SamplingParams(temperature=0.9, top_p=0.95, seed=7), max_tokens=16)
    assert run(client, prompt, s).tokens == run(client, prompt, s).tokens
    n, prm = 300, {"temperature": 1.0, "top_k": 3}
    counts: dict[str, Counter] = {}
    for mode in ("plain", "speculative"):
        c: Counter = Counter()
        for i in range(n):
            s = greedy(mode, sampling=SamplingParams(seed=i, **prm), max_tokens=2, n_max=2, adaptive=False)
            c[run(client, prompt, s).tokens] += 1
        counts[mode] = c
    keys = sorted(set(counts["plain"]) | set(counts["speculative"]))
    a = np.array([counts["plain"][k] for k in keys], dtype=float)
    b = np.array([counts["speculative"][k] for k in keys], dtype=float)
    mask = (a + b) >= 10
    stat = (((a - b) ** 2) / (a + b))[mask].sum()
    dof = int(mask.sum()) - 1
    assert dof >= 1 and stat < 3 * dof + 15, f"chi2={stat:.1f} dof={dof}\n{counts}"


def test_a_split_target_on_lavapipe_and_the_cpu(vk_env, tiny_pair, lavapipe: Device) -> None:
    """One of the target's layers on the device, the rest on the CPU; the draft wholly on the device."""
    with EngineClient(start_timeout=300.0) as client:
        info = client.load(load_settings(tiny_pair, n_gpu_layers=1, n_gpu_layers_draft=ALL))
        assert_on_lavapipe(info, lavapipe, target_layers=1)
        assert info.target.offload.layers_offloaded < info.target.offload.layers_total
        for text in PROMPTS:
            prompt = client.tokenize(text)
            plain = run(client, prompt, greedy()).tokens
            for mode, kw in MODES:
                same_or_tie(client, prompt, plain, run(client, prompt, greedy(mode, **kw)).tokens)


# -- out of device memory, crashes, the CLI and the self-test ---------------------------------------


def _budget_layer(folder: Path) -> Path:
    """Build tests/vk_budget_layer.c: a Vulkan layer whose vkAllocateMemory enforces a budget."""
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        reason = "no C compiler for the Vulkan budget layer"
        pytest.fail(reason) if REQUIRE else pytest.skip(reason)
    folder.mkdir(parents=True, exist_ok=True)
    lib = folder / "libtandem_vk_budget.so"
    proc = subprocess.run(
        [
            cc,
            "-shared",
            "-fPIC",
            "-O1",
            "-o",
            str(lib),
            str(ROOT / "tests" / "vk_budget_layer.c"),
            "-lpthread",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        reason = f"the Vulkan budget layer did not build (Vulkan headers?): {proc.stderr.strip()[-400:]}"
        pytest.fail(reason) if REQUIRE else pytest.skip(reason)
    manifest = {
        "file_format_version": "1.1.2",
        "layer": {
            "name": "VK_LAYER_TANDEM_budget",
            "type": "GLOBAL",
            "library_path": f"./{lib.name}",
            "api_version": "1.3.0",
            "implementation_version": "1",
            "description": "tests: a device memory budget",
            "functions": {
                "vkGetInstanceProcAddr": "budget_GetInstanceProcAddr",
                "vkGetDeviceProcAddr": "budget_GetDeviceProcAddr",
            },
        },
    }
    (folder / "tandem_vk_budget.json").write_text(json.dumps(manifest), encoding="utf-8")
    return folder


def _stats(path: Path) -> dict[str, int]:
    return {k: int(v) for k, v in (line.split() for line in path.read_text().splitlines())}


def test_a_load_that_runs_out_of_device_memory_is_retried_with_fewer_layers(
    vk_env, tmp_path: Path, lavapipe: Device, monkeypatch
) -> None:
    """lavapipe reports the machine's memory; a layer refuses allocations past a budget, as a full GPU
    does. Auto plans every layer from the reported figures, the load runs out of device memory, and
    the engine loads again with fewer layers."""
    # heavy layers, a light context: the weights decide what fits
    model = write_tiny_llama(tmp_path / "heavy.gguf", n_embd=256, n_layer=8)
    layer = _budget_layer(tmp_path / "layer")
    stats = tmp_path / "stats"
    for key, value in {
        "VK_LAYER_PATH": str(layer),
        "VK_INSTANCE_LAYERS": "VK_LAYER_TANDEM_budget",
        "TANDEM_VK_BUDGET_STATS": str(stats),
        ALLOW_SOFTWARE_ENV: "1",
    }.items():
        monkeypatch.setenv(key, value)
    settings = LoadSettings(target=str(model), n_ctx=128, n_batch=64, n_threads=1)

    monkeypatch.setenv("TANDEM_VK_BUDGET", "0")  # no budget: every layer loads, and the largest buffer
    with EngineClient(start_timeout=300.0) as client:
        info = client.load(settings)
        prompt = client.tokenize(PROMPTS[0])
        run(client, prompt, greedy(max_tokens=4))
    assert_on_lavapipe(info, lavapipe)
    weights = _stats(stats)["largest"]  # every layer's weights, in one buffer
    assert weights > 8 * MiB, _stats(stats)

    monkeypatch.setenv("TANDEM_VK_BUDGET", str(weights - 1))
    with EngineClient(start_timeout=300.0) as client:
        info = client.load(settings)
        fin = run(client, prompt, greedy(max_tokens=4))
    o = info.target.offload
    assert o.failed_layers and o.failed_layers[0] == ALL, o
    assert 0 < o.layers_offloaded < o.layers_total, o
    assert (o.backend, o.device_kind) == ("Vulkan", "software")
    assert _stats(stats)["refused"] >= 1
    assert "fewer than planned: the GPU ran out of memory" in info.placement()
    assert len(fin.tokens) == 4


def test_the_engine_restarts_on_the_device_after_a_crash(vk_env, tiny_pair, lavapipe: Device) -> None:
    with EngineClient(auto_restart=True, start_timeout=300.0) as client:
        info = client.load(load_settings(tiny_pair, n_gpu_layers=ALL))
        assert_on_lavapipe(info, lavapipe)
        prompt = client.tokenize(PROMPTS[0])
        want = run(client, prompt, greedy("speculative")).tokens
        pid = client.pid
        with pytest.raises(EngineCrashedError, match="crashed"):
            client.crash("segfault")
        assert run(client, prompt, greedy("speculative")).tokens == want  # restarted, re-loaded
        assert client.pid != pid
        assert_on_lavapipe(client.info().engine, lavapipe)


def test_tandem_generate_on_lavapipe_names_the_device(tiny_pair, lavapipe: Device) -> None:
    cmd = [sys.executable, "-m", "app.cli", "generate", "--target", str(tiny_pair.target)]
    cmd += ["--draft", str(tiny_pair.draft), "--gpu-layers", "all", "--json", "--compare-plain"]
    cmd += ["--mode", "speculative", "--max-tokens", str(N_TOKENS), "--prompt", PROMPTS[0], "--threads", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=600, cwd=ROOT, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    info = out["engine"]
    for model in ("target", "draft"):
        o = info[model]["offload"]
        assert o["layers_offloaded"] == o["layers_total"] and o["backend"] == "Vulkan", o
    assert f"layers on Vulkan ({lavapipe.description}, software renderer)" in out["placement"]
    c = out["plain_comparison"]
    assert c["identical"] or c["top2_gap"] < TIE_TOLERANCE, c


def _self_test(**extra: str | None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app.cli", "--self-test"],
        capture_output=True,
        text=True,
        env=_env(**extra),
        timeout=600,
        cwd=ROOT,
        check=False,
    )


def test_the_self_test_on_lavapipe(lavapipe: Device) -> None:
    proc = _self_test(TANDEM_GPU_LAYERS="all")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"gpu: Vulkan: {lavapipe.description}, software renderer" in proc.stdout
    assert "backend: Vulkan" in proc.stdout and "self-test passed" in proc.stdout
    # auto: the CPU, and why
    proc = _self_test()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "gpu: none, the models run on the CPU (Vulkan device llvmpipe" in proc.stdout
    # GPU layers asked for where llama.cpp sees no device: the self-test fails, never a quiet CPU run
    proc = _self_test(TANDEM_GPU_LAYERS="all", GGML_VK_VISIBLE_DEVICES=None)
    if "gpu: Vulkan:" not in proc.stdout:  # (a machine with a real Vulkan GPU passes here)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert "asked for GPU layers, but the target runs on the CPU" in proc.stdout


# -- the Vulkan build's choice (no device needed: TANDEM_DRY_RUN with fake tools) ---------------------

_TOOLS = (
    "dirname",
    "grep",
    "cut",
    "sed",
    "head",
    "tail",
    "tr",
    "sort",
    "sha256sum",
    "mkdir",
    "env",
    "mktemp",
)
_TOOLS += ("cat", "rm", "bash")
_UNAME = '#!/bin/sh\ncase "$1" in -s) echo {0};; -m) echo x86_64;; *) echo {0} x86_64;; esac\n'


def _tool(folder: Path, name: str, text: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text, encoding="utf-8")
    (folder / name).chmod(0o755)


def _sdk(root: Path, patch: int) -> Path:
    """A Vulkan SDK folder as packaging/vulkan.sh reads it: headers of version 1.3.<patch>, glslc,
    SPIRV-Headers' CMake package and the loader."""
    inc = root / "include" / "vulkan"
    inc.mkdir(parents=True, exist_ok=True)
    (inc / "vulkan_core.h").write_text(
        f"#define VK_HEADER_VERSION {patch}\n"
        f"#define VK_HEADER_VERSION_COMPLETE VK_MAKE_API_VERSION(0, 1, 3, VK_HEADER_VERSION)\n",
        encoding="utf-8",
    )
    (inc / "vulkan.h").write_text("", encoding="utf-8")
    (inc / "vulkan.hpp").write_text("", encoding="utf-8")
    _tool(root / "bin", "glslc", "#!/bin/sh\n")
    (root / "share" / "SPIRV-Headers").mkdir(parents=True, exist_ok=True)
    (root / "share" / "SPIRV-Headers" / "SPIRV-HeadersConfig.cmake").write_text("", encoding="utf-8")
    (root / "lib").mkdir(exist_ok=True)
    (root / "lib" / "libvulkan.so").write_text("", encoding="utf-8")
    return root


def _choose(tmp_path: Path, system: str = "Linux", **env: str) -> subprocess.CompletedProcess[str]:
    fake = tmp_path / "fake-bin"
    _tool(fake, "uname", _UNAME.format(system))
    tools = tmp_path / "tools"
    tools.mkdir(exist_ok=True)
    for name in _TOOLS:
        real = shutil.which(name)
        if real is None:
            pytest.skip(f"needs {name}")
        if not (tools / name).exists():
            (tools / name).symlink_to(real)
    base = {
        "PATH": f"{fake}{os.pathsep}{tools}",
        "HOME": str(tmp_path),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "CUDA_HOME": str(tmp_path / "no-cuda"),
        "TANDEM_DRY_RUN": "1",
        "TANDEM_PORTABLE": "1",
        "TANDEM_VULKAN_SYSTEM_INCLUDES": str(tmp_path / "no-system-headers"),
    }
    return subprocess.run(
        [shutil.which("bash") or "/bin/bash", str(ROOT / "packaging" / "install-dev.sh")],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_install_dev_builds_vulkan_where_glslc_and_the_headers_are(tmp_path: Path) -> None:
    sdk = _sdk(tmp_path / "sdk", 275)
    proc = _choose(tmp_path, VULKAN_SDK=str(sdk))
    assert proc.returncode == 0, proc.stderr
    backend, what, args, wheels = proc.stdout.splitlines()
    assert backend == "backend: vulkan (glslc and the Vulkan headers found)"
    assert what == f"llama-cpp-python 0.3.36 for Vulkan (headers 1.3.275 in {sdk}/include) and CPU (AVX2)"
    assert args == f"CMAKE_ARGS: -DGGML_NATIVE=OFF -DGGML_VULKAN=on -DVulkan_INCLUDE_DIR={sdk}/include"
    # packaging/build.sh's flags for the same headers: one cached wheel
    key = f"0.3.36 -DGGML_NATIVE=OFF -DGGML_VULKAN=on -DVulkan_INCLUDE_DIR={sdk}/include Linux x86_64"
    assert wheels.endswith(hashlib.sha256(key.encode()).hexdigest()[:16])
    # not on a Mac; CUDA's toolkit and GPU still win; TANDEM_BACKEND=cpu keeps the CPU
    mac = _choose(tmp_path / "mac", system="Darwin", VULKAN_SDK=str(sdk))
    assert mac.stdout.startswith("backend: cpu") or mac.stdout.startswith("backend: metal"), mac.stdout
    cpu = _choose(tmp_path / "cpu", VULKAN_SDK=str(sdk), TANDEM_BACKEND="cpu")
    assert cpu.stdout.splitlines()[2] == "CMAKE_ARGS: -DGGML_NATIVE=OFF "


def test_install_dev_without_what_vulkan_needs(tmp_path: Path) -> None:
    """Headers older than 1.3.261 and no apt-get to fetch newer ones: the CPU, with the reason; forced,
    an error naming what is missing."""
    old = _sdk(tmp_path / "old", 239)
    proc = _choose(tmp_path, VULKAN_SDK=str(old))
    assert proc.returncode == 0, proc.stderr
    backend = proc.stdout.splitlines()[0]
    assert backend.startswith("backend: cpu (no Vulkan build: no Vulkan headers 1.3.261 or newer"), backend
    assert proc.stdout.splitlines()[2] == "CMAKE_ARGS: -DGGML_NATIVE=OFF "  # the CPU wheel's key
    forced = _choose(tmp_path, VULKAN_SDK=str(old), TANDEM_BACKEND="vulkan")
    assert forced.returncode == 1 and not forced.stdout
    assert "TANDEM_BACKEND=vulkan: no Vulkan headers 1.3.261 or newer" in forced.stderr
    # no glslc anywhere: no Vulkan build is even considered
    (old / "bin" / "glslc").unlink()
    proc = _choose(tmp_path / "b", VULKAN_SDK=str(old))
    assert proc.stdout.splitlines()[0] == "backend: cpu (no GPU backend found)"
    forced = _choose(tmp_path / "b", VULKAN_SDK=str(old), TANDEM_BACKEND="vulkan")
    assert forced.returncode == 1 and "no glslc" in forced.stderr
