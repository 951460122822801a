"""Memory-fit arithmetic against hand-computed numbers, on hand-made machines."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import gguf
import numpy as np
import pytest

from app.engine import Device
from app.gguf import memory
from app.gguf.layers import layer_layout
from app.gguf.meta import GGUFMetadata
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


# ------------------------------------------------------------------ layers: hybrid, recurrent, windows


def header(arch: str, **kv: object) -> GGUFMetadata:
    """A header of `arch` with ``<arch>.<key>`` values (dots written as __)."""
    keys = {f"{arch}.{k.replace('__', '.')}": v for k, v in kv.items()}
    return GGUFMetadata(version=3, n_tensors=0, kv={"general.architecture": arch, **keys}, bytes_read=0)


def test_swa_cells_follow_llama_cpp() -> None:
    # pad(min(n_ctx, window + n_ubatch 512), 256)
    assert memory.swa_cells(8192, 1024) == 1536 and memory.swa_cells(1000, 1024) == 1024
    assert memory.swa_cells(32768, 4096) == 4608 and memory.swa_cells(4096, 128) == 768
    # 2 of 4 layers slide: 2 * 8192 + 2 * 1536 cells of 1 head * (64 + 64) * 2 bytes
    assert fit.kv_cache_bytes(4, 8192, 1, 64, sliding_layers=2, sliding_window=1024) == (
        (2 * 8192 + 2 * 1536) * 256
    )


def test_plain_attention_header_as_before() -> None:
    meta = header("llama", block_count=32, attention__head_count=32, attention__head_count_kv=8,
                  embedding_length=4096)  # fmt: skip
    fp = memory.footprint(meta, 10, 4096)
    assert (fp.kv, fp.recurrent, fp.n_layer) == (fit.kv_cache_bytes(32, 4096, 8, 128), 0, 32)


def test_qwen35_hybrid_header() -> None:
    meta = header(
        "qwen35", block_count=24, attention__head_count=8, attention__head_count_kv=2,
        attention__key_length=256, attention__value_length=256, embedding_length=1024,
        ssm__conv_kernel=4, ssm__inner_size=2048, ssm__state_size=128, ssm__group_count=16,
        ssm__time_step_rank=16, full_attention_interval=4,
    )  # fmt: skip
    lay = layer_layout(meta)
    assert (lay.kv_layers, lay.recurrent_layers, lay.sliding_layers) == (6, 18, 0)  # every 4th attends
    # n_embd_r = (4 - 1) * (2048 + 2 * 16 * 128) = 18432, n_embd_s = 128 * 2048 = 262144; f32, 18 layers
    assert lay.recurrent_state == (18432 + 262144) * 4 * 18 == 20_201_472
    fp = memory.footprint(meta, 1000, 4096)
    assert fp.kv == 6 * 4096 * 2 * (256 + 256) * 2 == 50_331_648
    assert fp.recurrent == 20_201_472 * (1 + memory.RECURRENT_SNAPSHOTS) == 343_425_024
    assert memory.footprint(meta, 1000, 4096, snapshots=0).recurrent == 20_201_472
    assert fp.checkpoints == memory.CHECKPOINT_SLOTS * 20_201_472  # the engine's saved copies
    assert fp.total == 1000 + 50_331_648 + 343_425_024 + fp.checkpoints + memory.COMPUTE_BUFFER
    # an explicit per-layer list of recurrent layers wins over the interval
    listed = GGUFMetadata(3, 0, {**meta.kv, "qwen35.attention.recurrent_layers": [True, False] * 12}, 0)
    assert (layer_layout(listed).kv_layers, layer_layout(listed).recurrent_layers) == (12, 12)


def test_nemotron_h_per_layer_arrays() -> None:
    # recurrent: no KV heads and no feed-forward; attention: KV heads; MLP layers hold nothing
    meta = header(
        "nemotron_h", block_count=6, attention__head_count=8, attention__head_count_kv=[0, 0, 2, 0, 0, 0],
        feed_forward_length=[0, 1024, 0, 0, 1024, 0], attention__key_length=128,
        attention__value_length=128, embedding_length=1024, ssm__conv_kernel=4, ssm__inner_size=1024,
        ssm__state_size=64, ssm__group_count=8,
    )  # fmt: skip
    lay = layer_layout(meta)
    assert (lay.kv_layers, lay.recurrent_layers) == (1, 3)
    # (3 * (1024 + 2 * 8 * 64) + 64 * 1024) * 4 bytes * 3 layers
    assert lay.recurrent_state == (6144 + 65536) * 4 * 3 == 860_160
    assert memory.footprint(meta, 0, 1000).kv == 1000 * 2 * 256 * 2


def test_recurrent_headers() -> None:
    mamba2 = header("mamba2", block_count=4, embedding_length=768, ssm__conv_kernel=4, ssm__inner_size=1536,
                    ssm__state_size=128, ssm__group_count=1)  # fmt: skip
    fp = memory.footprint(mamba2, 0, 4096)
    # (3 * (1536 + 2 * 128) + 128 * 1536) * 4 bytes * 4 layers; mamba2 keeps no snapshots
    assert (fp.kv, fp.recurrent) == (0, (5376 + 196608) * 4 * 4)
    rwkv = header("rwkv7", block_count=2, embedding_length=512, wkv__head_size=64)
    assert layer_layout(rwkv).recurrent_state == (2 * 512 + 512 * 64) * 4 * 2 == 270_336
    lfm2 = header("lfm2", block_count=4, attention__head_count=16, attention__head_count_kv=[0, 0, 8, 0],
                  embedding_length=1024, shortconv__l_cache=3)  # fmt: skip
    lay = layer_layout(lfm2)
    assert (lay.kv_layers, lay.recurrent_state) == (1, 1024 * 2 * 4 * 3)
    assert memory.footprint(lfm2, 0, 100).recurrent == 1024 * 2 * 4 * 3 * 17


def test_sliding_window_headers() -> None:
    gemma3 = header("gemma3", block_count=12, attention__head_count=8, attention__head_count_kv=4,
                    attention__key_length=256, attention__value_length=256, attention__sliding_window=1024,
                    embedding_length=2048)  # fmt: skip
    lay = layer_layout(gemma3)
    assert (lay.kv_layers, lay.sliding_layers, lay.sliding_window) == (12, 10, 1024)  # layers 5, 11 global
    assert memory.footprint(gemma3, 0, 8192).kv == (2 * 8192 + 10 * 1536) * 4 * 512 * 2 == 130_023_424
    no_window = header("gemma3", **{k.split(".", 1)[1].replace(".", "__"): v for k, v in gemma3.kv.items()
                                    if k.startswith("gemma3.") and "sliding" not in k})  # fmt: skip
    assert layer_layout(no_window).sliding_layers == 0  # llama.cpp slides only with the header's window
    oss = header("gpt-oss", block_count=4, attention__head_count=64, attention__head_count_kv=8,
                 attention__key_length=64, attention__value_length=64,
                 attention__sliding_window=128)  # fmt: skip
    assert (layer_layout(oss).sliding_layers, memory.footprint(oss, 0, 4096).kv) == (
        2, (2 * 4096 + 2 * 768) * 8 * 128 * 2,
    )  # fmt: skip
    listed = header("gemma4", block_count=3, attention__head_count_kv=1, attention__key_length=64,
                    attention__sliding_window=512,
                    attention__sliding_window_pattern=[True, True, False])  # fmt: skip
    assert layer_layout(listed).sliding_layers == 2


def test_written_header_with_per_layer_kv_heads(tmp_path: Path) -> None:
    """A real GGUF file: granitehybrid with ``head_count_kv`` as a per-layer array (0: a Mamba2 layer)."""
    w = gguf.GGUFWriter(str(tmp_path / "h.gguf"), "granitehybrid")
    w.add_block_count(4)
    w.add_embedding_length(512)
    w.add_head_count(8)
    w.add_head_count_kv([0, 4, 0, 0])
    w.add_ssm_conv_kernel(4)
    w.add_ssm_inner_size(1024)
    w.add_ssm_state_size(64)
    w.add_ssm_group_count(1)
    w.add_tensor("t", np.zeros(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    fp = memory.file_footprint(tmp_path / "h.gguf", 2048)
    # one attention layer: 4 heads * (64 + 64); 3 Mamba2 layers of (3 * (1024 + 128) + 64 * 1024) f32
    assert fp.kv == 2048 * 4 * 128 * 2
    assert fp.recurrent == (3456 + 65536) * 4 * 3  # granitehybrid keeps no snapshots


def test_catalog_hybrid_and_window_estimates() -> None:
    base = dict(layers=24, kv_heads=2, head_dim=256, ctx=262144, size=500_000_000, params=800_000_000)
    hybrid = dataclasses.replace(model("h", **base), architecture="qwen35", kv_layers=6,
                                 recurrent_state=20_201_472)  # fmt: skip
    need = fit.estimate_model(hybrid, n_ctx=4096)
    assert need.kv == 50_331_648 and need.recurrent == 20_201_472 * 17
    assert need.checkpoints == 2 * 20_201_472  # the engine's saved copies, in RAM
    assert need.total == 500_000_000 + 50_331_648 + 20_201_472 * 19 + fit.COMPUTE_BUFFER
    swa = dataclasses.replace(model("s", **base), architecture="gemma3", sliding_window=1024,
                              sliding_layers=20)  # fmt: skip
    assert fit.estimate_model(swa, n_ctx=8192).kv == (4 * 8192 + 20 * 1536) * 2 * 512 * 2


def test_a_draft_keeps_no_snapshots_and_a_full_window() -> None:
    """The engine gives a draft model no recurrent snapshots and a full-size sliding-window cache."""
    hybrid = header(
        "qwen35", block_count=8, attention__head_count=4, attention__head_count_kv=1,
        attention__key_length=64, attention__value_length=64, embedding_length=256, ssm__conv_kernel=4,
        ssm__inner_size=256, ssm__state_size=16, ssm__group_count=2,
    )  # fmt: skip
    state = layer_layout(hybrid).recurrent_state
    assert memory.footprint(hybrid, 0, 512).recurrent == state * 17
    assert memory.footprint(hybrid, 0, 512, draft=True).recurrent == state
    gemma3 = header("gemma3", block_count=6, attention__head_count_kv=1, attention__key_length=64,
                    attention__value_length=64, attention__sliding_window=512)  # fmt: skip
    assert memory.footprint(gemma3, 0, 8192).kv == (8192 + 5 * 1024) * 128 * 2
    assert memory.footprint(gemma3, 0, 8192, draft=True).kv == 6 * 8192 * 128 * 2
    base = dict(layers=24, kv_heads=2, head_dim=256, ctx=262144, size=500_000_000, params=800_000_000)
    small = dataclasses.replace(model("h", **base), architecture="qwen35", kv_layers=6, recurrent_state=1000)
    assert fit.estimate_model(small, draft=True).recurrent == 1000
    swa = dataclasses.replace(model("s", **base), architecture="gemma3", sliding_window=1024,
                              sliding_layers=20)  # fmt: skip
    assert fit.estimate_model(swa, n_ctx=8192, draft=True).kv == fit.kv_cache_bytes(24, 8192, 2, 256)
    need = fit.estimate_pair(dataclasses.replace(small, params=900_000_000), small)
    assert (need.target.recurrent, need.draft.recurrent) == (17_000, 1000)
