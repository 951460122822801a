"""Memory-fit arithmetic against hand-computed numbers, on hand-made machines."""

from __future__ import annotations

import pytest

from app.engine import Device
from models_registry import bandwidth, fit, machine
from models_registry.catalog import CatalogModel, QuantFile, default_catalog
from models_registry.fit import Gpu, Machine

GiB, MiB = 1024**3, 1024**2


def model(
    mid: str, *, layers: int, kv_heads: int, head_dim: int, ctx: int, size: int, params: int
) -> CatalogModel:
    return CatalogModel(
        id=mid, name=mid, repo=f"acme/{mid}", family="x", tokenizer="x", architecture="llama", params=params,
        n_layers=layers, n_kv_heads=kv_heads, head_dim=head_dim, context_length=ctx, license="mit",
        gated=False, files={"Q4_K_M": QuantFile("Q4_K_M", f"{mid}.gguf", size)},
    )  # fmt: skip


# a 7B llama-like target with GQA (32 layers, 8 KV heads of 128) and a Llama-3.2-1B-like draft
TARGET = model(
    "t7b", layers=32, kv_heads=8, head_dim=128, ctx=131072, size=4_000_000_000, params=7_000_000_000
)
DRAFT = model("d1b", layers=16, kv_heads=8, head_dim=64, ctx=131072, size=1_300_000_000, params=1_200_000_000)


def test_kv_cache_hand_computed() -> None:
    # 2 (K,V) * 32 layers * 4096 ctx * 8 heads * 128 dims * 2 bytes = 536,870,912 = 512 MiB
    assert fit.kv_cache_bytes(32, 4096, 8, 128) == 536_870_912 == 512 * MiB
    # Qwen2.5-7B: 28 layers, 4 KV heads of 128, 32k ctx: 2*28*32768*4*128*2 = 1.75 GiB
    assert fit.kv_cache_bytes(28, 32768, 4, 128) == 1_879_048_192
    # Gemma-3-27B at 8k: 2*62*8192*16*128*2
    assert fit.kv_cache_bytes(62, 8192, 16, 128) == 4_160_749_568
    # distinct value length (e.g. MLA-style heads): n_layers*n_ctx*n_kv*(k+v)*2
    assert fit.kv_cache_bytes(2, 10, 1, 192, value_dim=128) == 2 * 10 * 1 * 320 * 2


def test_pair_need_hand_computed() -> None:
    need = fit.estimate_pair(TARGET, DRAFT, n_ctx=4096)
    assert need.target.kv == 536_870_912
    assert need.draft.kv == 2 * 16 * 4096 * 8 * 64 * 2 == 134_217_728
    # weights 5.3e9 + KV 671,088,640 + 2 compute buffers + runtime overhead
    expected = 5_300_000_000 + 671_088_640 + 2 * fit.COMPUTE_BUFFER + fit.RUNTIME_OVERHEAD
    assert need.total == expected == 7_313_265_920
    assert need.target.per_layer == (4_000_000_000 + 536_870_912) // 32 == 141_777_216


def test_context_is_capped_at_trained_length() -> None:
    small = model("s", layers=2, kv_heads=1, head_dim=64, ctx=2048, size=10, params=1)
    assert fit.estimate_model(small, n_ctx=8192).n_ctx == 2048


def test_verdicts_on_hand_made_machines() -> None:
    need = fit.estimate_pair(TARGET, DRAFT, n_ctx=4096)
    cuda = lambda free: Gpu("RTX", "cuda", total=free, free=free)  # noqa: E731

    big = Machine(64 * GiB, 48 * GiB, 8, (cuda(12 * GiB),))
    f = fit.fit_pair(need, big)
    assert (f.verdict, f.gpu_layers, f.summary) == ("gpu", 32, "fits fully on GPU")
    assert f.comfortable

    # 6 GiB VRAM -> budget 6 GiB - 512 MiB = 5,905,580,032; the draft, compute buffers and overhead take
    # 1,836,870,912 + 402,653,184 + 536,870,912 = 2,776,395,008; the remaining 3,129,185,024 hold
    # 22 whole target layers of 141,777,216 bytes; the other 10 (1,417,772,160 bytes) go to RAM.
    mid = Machine(32 * GiB, 24 * GiB, 8, (cuda(6 * GiB),))
    f = fit.fit_pair(need, mid)
    assert (f.verdict, f.gpu_layers) == ("partial", 22)
    assert f.summary == "fits with 22 target layers offloaded to the GPU (10 on CPU)"

    cpu = Machine(16 * GiB, 12 * GiB, 4)
    assert fit.fit_pair(need, cpu).summary == "fits on CPU only"
    assert fit.fit_pair(need, cpu).cpu_budget == 12 * GiB  # available RAM, below 90 % of total

    tiny = Machine(8 * GiB, 6 * GiB, 4)
    f = fit.fit_pair(need, tiny)
    assert (f.verdict, f.summary, f.comfortable) == ("none", "does not fit", False)


def test_apple_unified_memory() -> None:
    assert fit.metal_working_set(16 * GiB) == int(16 * GiB * 2 / 3)
    assert fit.metal_working_set(64 * GiB) == 48 * GiB
    need = fit.estimate_pair(TARGET, DRAFT, n_ctx=4096)
    ws = fit.metal_working_set(16 * GiB)  # 10.67 GiB >= 7.3 GB needed
    mac16 = Machine(16 * GiB, 14 * GiB, 8, (Gpu("M2", "metal", ws, ws, unified=True),))
    assert fit.fit_pair(need, mac16).verdict == "gpu"
    ws8 = fit.metal_working_set(8 * GiB)  # 5.33 GiB: partial, and everything must also fit in RAM
    mac8 = Machine(8 * GiB, 7.5 * GiB, 8, (Gpu("M1", "metal", ws8, ws8, unified=True),))
    f = fit.fit_pair(need, mac8)
    assert f.verdict == "partial" and 0 < f.gpu_layers < 32


def test_gpus_from_the_engines_devices() -> None:
    cpu = Device("CPU", "AMD EPYC", "CPU", 24 * GiB, 24 * GiB)
    cuda = Device("CUDA0", "NVIDIA GeForce RTX 4090", "GPU", 23000 * MiB, 24564 * MiB)
    t4 = Device("CUDA1", "Tesla T4", "GPU", 15000 * MiB, 15360 * MiB)
    metal = Device("Metal", "Apple M2 Pro", "GPU", 21 * GiB, 21 * GiB)
    igpu = Device("Vulkan0", "Intel(R) Iris(R) Xe Graphics", "IGPU", 8 * GiB, 8 * GiB)
    blas = Device("BLAS", "OpenBLAS", "ACCEL", 0, 0)
    gpus = fit.gpus_from_devices([cpu, cuda, t4, blas])
    assert gpus == (
        Gpu("NVIDIA GeForce RTX 4090", "cuda", 24564 * MiB, 23000 * MiB),
        Gpu("Tesla T4", "cuda", 15360 * MiB, 15000 * MiB),
    )
    m = Machine(64 * GiB, 60 * GiB, 16, gpus)
    assert m.gpu_budget == (23000 + 15000) * MiB - 2 * fit.GPU_RESERVE
    # layers split by budget, read one GPU after the other: 0.6 of 1008 and of 320 GB/s, harmonically
    b1, b2 = 23000 * MiB - fit.GPU_RESERVE, 15000 * MiB - fit.GPU_RESERVE
    expected = 1 / ((b1 / (b1 + b2)) / (0.6 * 1008e9) + (b2 / (b1 + b2)) / (0.6 * 320e9))
    assert m.gpu_read_bandwidth == pytest.approx(expected)
    (mac,) = fit.gpus_from_devices([metal])
    assert (mac.kind, mac.unified, mac.budget, mac.peak_bandwidth()) == ("metal", True, 21 * GiB, 200e9)
    (xe,) = fit.gpus_from_devices([igpu])
    assert (xe.kind, xe.unified, xe.peak_bandwidth(cpu=40e9)) == ("vulkan", True, 40e9)
    assert fit.gpus_from_devices([cpu]) == ()


def test_detect_machine_takes_the_gpus_as_data(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine.platform, "system", lambda: "Linux")
    m = fit.detect_machine()  # the engine did not answer: guessed, and no GPU off a Mac
    assert m.gpus == () and m.gpu_source == "guessed" and m.total_ram > 0 and m.physical_cores >= 1
    assert (m.cpu_bandwidth, m.bandwidth_source, m.ram_bandwidth) == (None, "assumed", bandwidth.DEFAULT_CPU)
    rtx = Gpu("NVIDIA GeForce RTX 4060", "cuda", 8 * GiB, 7 * GiB)
    m = fit.detect_machine([rtx], bandwidth=bandwidth.Bandwidth(31e9, "cached"))
    assert (m.gpus, m.gpu_source, m.cpu_bandwidth, m.bandwidth_source) == ((rtx,), "engine", 31e9, "cached")
    assert fit.detect_machine(()).gpus == ()  # the engine lists no GPU
    monkeypatch.setattr(machine.platform, "system", lambda: "Darwin")
    monkeypatch.setattr(machine.platform, "machine", lambda: "arm64")
    (apple,) = fit.detect_machine().gpus
    assert apple.kind == "metal" and apple.unified and apple.total == fit.metal_working_set(m.total_ram)


def test_recommendation_by_speed() -> None:
    cat = default_catalog()
    # 2 cores, no GPU, the AMD EPYC's bandwidth: only a target of a few billion parameters is usable
    epyc = Machine(24 * GiB, 23 * GiB, 2, cpu_bandwidth=25e9)
    best = fit.recommend(epyc)
    assert best is not None and best.pair is not None and best.verdict == "cpu"
    assert cat.model(best.pair.target).params <= 4_000_000_000
    choices = fit.rank_catalog(epyc)
    pick = fit.choose(choices)
    assert pick is not None and pick.fit == best
    usable = [c for c in choices if c.fit.verdict != "none" and c.speed.best >= fit.MIN_SPEED]
    if usable:  # the largest usable target, else the fastest pair that fits
        assert pick.params == max(c.params for c in usable) and "reaches" in fit.why(pick)
    else:
        assert pick.speed.best == max(c.speed.best for c in choices if c.fit.verdict != "none")
        assert fit.why(pick) == "no pair reaches 15 tokens/s here: the fastest"
    # the memory alone would have taken a 14B target or larger
    largest = max(cat.model(c.pair.target).params for c in choices if c.fit.verdict != "none")
    assert largest >= 14_000_000_000
    assert fit.recommend(epyc, min_speed=0.0).pair.target != best.pair.target  # type: ignore[union-attr]

    # a big Mac: the largest target that reaches the speed, not the 70B that merely fits
    mac = Machine(128 * GiB, 120 * GiB, 16, (Gpu("Apple M3 Max", "metal", 96 * GiB, 96 * GiB, unified=True),))
    choices = fit.rank_catalog(mac)
    best = fit.recommend(mac)
    assert best is not None and best.pair is not None and best.verdict == "gpu"
    seventy = next(c for c in choices if c.pair.target == "llama-3.3-70b-instruct")
    assert seventy.fit.verdict == "gpu" and seventy.speed.best < fit.MIN_SPEED
    chosen = next(c for c in choices if c.pair.id == best.pair.id)
    assert chosen.speed.best >= fit.MIN_SPEED
    assert all(c.params <= chosen.params for c in choices if c.fit.comfortable and c.speed.best >= 15)
    # with no speed asked for, the largest comfortable fit, as a memory-only pick would have it
    assert fit.recommend(mac, min_speed=0.0).pair.target == "llama-3.3-70b-instruct"  # type: ignore[union-attr]

    # 24 GB card: fast enough everywhere on the GPU, so the largest target that fits comfortably there
    pc = Machine(64 * GiB, 56 * GiB, 16, (Gpu("RTX 4090", "cuda", 24 * GiB, 23 * GiB),))
    fits = fit.fit_catalog(pc)
    assert any(f.verdict == "gpu" and not f.comfortable for f in fits)
    best = fit.recommend(pc, n_ctx=4096)
    assert best is not None and best.pair is not None and best.verdict == "gpu" and best.comfortable
    comfy = [cat.model(f.pair.target).params for f in fits if f.verdict == "gpu" and f.comfortable and f.pair]
    assert cat.model(best.pair.target).params == max(comfy)

    assert fit.recommend(Machine(2 * GiB, 1 * GiB, 2)) is None
