"""The speed estimate's arithmetic against hand-computed figures, on hand-made machines (no timing)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import gguf
import numpy as np
import pytest

from app.gguf import memory
from app.gguf.meta import read_metadata_file
from models_registry import fit, fit_report, speed
from models_registry.catalog import CatalogModel, Pair, QuantFile
from models_registry.fit import Gpu, Machine
from models_registry.measured import SpeedStore
from models_registry.speed import Device

GiB = 1024**3


def model(mid: str, *, layers: int, kv_heads: int, head_dim: int, size: int, params: int) -> CatalogModel:
    return CatalogModel(
        id=mid, name=mid, repo=f"acme/{mid}", family="x", tokenizer="x", architecture="llama", params=params,
        n_layers=layers, n_kv_heads=kv_heads, head_dim=head_dim, context_length=32768, license="mit",
        gated=False, files={"Q4_K_M": QuantFile("Q4_K_M", f"{mid}.gguf", size)},
    )  # fmt: skip


TARGET = model("t7b", layers=32, kv_heads=8, head_dim=128, size=4_000_000_000, params=7_000_000_000)
DRAFT = model("d05b", layers=24, kv_heads=2, head_dim=64, size=500_000_000, params=500_000_000)
PAIR = Pair("t7b+d05b", "t7b", "d05b", n_max=8, p_min=0.0, good_for="tests")
# the target's bytes per token: 4e9 of weights + 1024 tokens of KV at 2*32*8*128*2 = 131,072 bytes each
T_BYTES = 4_000_000_000 + 1024 * 131_072  # 4,134,217,728
D_BYTES = 500_000_000 + 1024 * (2 * 24 * 2 * 64 * 2)  # 512,582,912


def pair_fit(machine: Machine) -> fit.PairFit:
    return fit.fit_pair(fit.estimate_pair(TARGET, DRAFT, n_ctx=4096), machine, pair=PAIR)


def test_kv_and_step_hand_computed() -> None:
    assert speed.kv_bytes_per_token(32, 8, 128) == 131_072
    assert speed.step_seconds(4_000_000_000, 131_072, Device(0.0, 20e9)) == pytest.approx(T_BYTES / 20e9)
    # no GPU bandwidth: everything is read at the CPU's, whatever the share says
    assert speed.step_seconds(4_000_000_000, 131_072, Device(1.0, 20e9)) == pytest.approx(T_BYTES / 20e9)
    split = Device(0.75, 20e9, 200e9)
    assert speed.step_seconds(4_000_000_000, 131_072, split) == pytest.approx(
        0.75 * T_BYTES / 200e9 + 0.25 * T_BYTES / 20e9
    )
    # GPU time 0.75/200 against CPU time 0.25/20: 0.00375 / (0.00375 + 0.0125)
    assert speed.gpu_time_share(split) == pytest.approx(0.00375 / 0.01625)


def test_round_arithmetic() -> None:
    assert speed.expected_tokens(0.75, 1) == pytest.approx(1.75)
    assert speed.expected_tokens(0.75, 3) == pytest.approx(1 + 0.75 + 0.5625 + 0.421875)
    assert speed.expected_tokens(1.0, 4) == 5
    assert speed.verify_cost(1) == 1.0
    assert speed.verify_cost(4) == pytest.approx(1 + 3 * 0.6)  # CPU: 2.8 steps, the EPYC's 2.78-3.05
    assert speed.verify_cost(16, gpu_share=1.0) == pytest.approx(1 + 15 * 0.02)  # GPU: about one step
    # measured costs win, interpolated between the batches measured, the default slope past them
    costs = {4: 1.7, 8: 3.1}
    assert speed.verify_cost(4, measured=costs) == 1.7
    assert speed.verify_cost(2, measured=costs) == pytest.approx(1 + 0.7 / 3)
    assert speed.verify_cost(6, measured=costs) == pytest.approx(2.4)
    assert speed.verify_cost(10, measured=costs) == pytest.approx(3.1 + 2 * 0.6)


def test_speculation_picks_the_best_draft_length() -> None:
    # a draft at 1/10 of the target's step on a GPU: long drafts pay
    gpu = speed.speculate(0.010, 0.001, acceptance=0.8, max_draft=8, gpu_share=1.0)
    by_k = {k: speed.expected_tokens(0.8, k) / (k * 0.001 + (1 + 0.02 * k) * 0.010) for k in range(1, 9)}
    assert gpu.draft_length == max(by_k, key=by_k.__getitem__)
    assert gpu.tokens_per_second == pytest.approx(max(by_k.values()))
    assert gpu.tokens_per_second > 100  # better than plain decoding's 100 tokens/s
    # the same pair on a CPU, a draft right 60 % of the time: a verify batch costs 0.6 step a token,
    # and drafting loses
    cpu = speed.speculate(0.010, 0.001, acceptance=0.6, max_draft=8)
    assert cpu.draft_length == 1 and cpu.tokens_per_second == pytest.approx(1.6 / (0.001 + 0.016))
    assert cpu.tokens_per_second < 100


def test_pair_speed_cpu_only() -> None:
    laptop = Machine(16 * GiB, 12 * GiB, 2, cpu_bandwidth=20e9)
    f = pair_fit(laptop)
    assert f.verdict == "cpu"
    s = fit.pair_speed(f, laptop, TARGET, DRAFT)
    assert s.plain == pytest.approx(20e9 / T_BYTES)  # 4.84 tokens/s
    t, d = T_BYTES / 20e9, D_BYTES / 20e9
    k1 = 1.75 / (d + 1.6 * t)  # one drafted token, a batch of 2 at 1.6 steps
    assert (s.draft_length, s.speculative) == (1, pytest.approx(k1))
    assert s.acceptance == speed.ACCEPTANCE
    assert (s.plain_source, s.speculative_source, s.best, s.source) == (
        "estimated", "estimated", pytest.approx(k1), "estimated",
    )  # fmt: skip
    # not measured: 20 GB/s is assumed
    assert fit.pair_speed(f, Machine(16 * GiB, 12 * GiB, 2), TARGET, DRAFT).plain == pytest.approx(s.plain)


def test_pair_speed_all_on_the_gpu() -> None:
    pc = Machine(32 * GiB, 28 * GiB, 8, (Gpu("NVIDIA GeForce RTX 4090", "cuda", 24 * GiB, 23 * GiB),), 50e9)
    f = pair_fit(pc)
    assert f.verdict == "gpu"
    read = 0.6 * 1008e9  # GPU_EFFICIENCY of the table's peak
    assert pc.gpu_read_bandwidth == pytest.approx(read)
    s = fit.pair_speed(f, pc, TARGET, DRAFT)
    assert s.plain == pytest.approx(read / T_BYTES)  # about 146 tokens/s
    t, d = T_BYTES / read, D_BYTES / read
    best = max(speed.expected_tokens(0.75, k) / (k * d + (1 + 0.02 * k) * t) for k in range(1, 9))
    assert s.speculative == pytest.approx(best) and s.draft_length > 1
    assert s.speculative > s.plain


def test_pair_speed_partial_offload() -> None:
    # the fit test's 6 GiB machine: 22 of the 32 target layers on the GPU, the draft there too
    mid = Machine(32 * GiB, 24 * GiB, 8, (Gpu("NVIDIA GeForce RTX 4060", "cuda", 6 * GiB, 6 * GiB),), 40e9)
    f = fit.fit_pair(fit.estimate_pair(TARGET, DRAFT, n_ctx=4096), mid, pair=PAIR)
    assert f.verdict == "partial"
    layers = f.gpu_layers
    gpu = 0.6 * 272e9
    s = fit.pair_speed(f, mid, TARGET, DRAFT)
    share = layers / 32
    t = share * T_BYTES / gpu + (1 - share) * T_BYTES / 40e9
    assert s.plain == pytest.approx(1 / t)
    d = D_BYTES / gpu
    g = (share / gpu) / (share / gpu + (1 - share) / 40e9)  # the GPU's share of the target's step time
    best = max(
        speed.expected_tokens(0.75, k) / (k * d + (1 + (g * 0.02 + (1 - g) * 0.6) * k) * t)
        for k in range(1, 9)
    )
    assert s.speculative == pytest.approx(best)


def test_measurements_replace_the_arithmetic(tmp_path) -> None:
    laptop = Machine(16 * GiB, 12 * GiB, 2, cpu_bandwidth=20e9)
    f = pair_fit(laptop)
    store = SpeedStore(tmp_path / "speeds.json")
    store.record("t7b.gguf", 4_000_000_000, 6.0, placement="gpu")  # another placement: not used here
    assert fit.pair_speed(f, laptop, TARGET, DRAFT, measured=store).plain_source == "estimated"
    store.record("t7b.gguf", 4_000_000_000, 6.0)
    store.record("d05b.gguf", 500_000_000, 60.0)
    store.record(
        "t7b.gguf", 4_000_000_000, 5.0, mode="speculative", draft=("d05b.gguf", 500_000_000), acceptance=0.9
    )
    s = fit.pair_speed(f, laptop, TARGET, DRAFT, measured=store)
    assert (s.plain, s.plain_source) == (6.0, "measured")
    assert (s.speculative, s.speculative_source, s.acceptance) == (5.0, "measured", 0.9)
    assert (s.best, s.source) == (6.0, "measured")
    # without a speculative run, the estimate runs on the measured steps and acceptance
    store2 = SpeedStore(tmp_path / "s2.json")
    store2.record("t7b.gguf", 4_000_000_000, 6.0)
    store2.record("d05b.gguf", 500_000_000, 60.0)
    s2 = fit.pair_speed(f, laptop, TARGET, DRAFT, measured=store2)
    assert s2.speculative_source == "estimated"
    assert s2.speculative == pytest.approx(1.75 / (1 / 60 + 1.6 / 6))


# ------------------------------------------------------------------------------ mixtures of experts

# a Qwen3-30B-A3B-like target (48 layers, 4 KV heads of 128, 128 experts, 8 per token) and a dense 30B
# of the same file size
MOE = dataclasses.replace(
    model("moe30b", layers=48, kv_heads=4, head_dim=128, size=18_000_000_000, params=30_500_000_000),
    active_params=3_300_000_000, experts=128, experts_used=8,
)  # fmt: skip
DENSE = model("dense30b", layers=48, kv_heads=4, head_dim=128, size=18_000_000_000, params=30_500_000_000)
SMALL = model("d06b", layers=28, kv_heads=8, head_dim=128, size=600_000_000, params=600_000_000)


def test_experts_used_by_a_batch() -> None:
    e = speed.Experts(shared=1e9, routed=16e9, count=128, used=8)
    assert e.distinct(1) == pytest.approx(8)
    assert e.distinct(2) == pytest.approx(128 * (1 - (120 / 128) ** 2))  # 15.5
    assert e.distinct(1000) == pytest.approx(128)  # at most every expert
    assert e.bytes_read(1) == pytest.approx(1e9 + 16e9 * 8 / 128) == 2e9
    assert e.read_ratio(2) == pytest.approx((1e9 + 16e9 * 15.5 / 128) / 2e9)
    # from the parameters: routed = (params - active) / (1 - u/E); a token reads the active ones' bytes
    m = speed.Experts.from_params(18e9, 30_500_000_000, 3_300_000_000, 128, 8)
    assert m.routed / 18e9 * 30.5e9 == pytest.approx(27.2e9 / (1 - 8 / 128))
    assert m.bytes_read(1) == pytest.approx(18e9 * 3.3 / 30.5)
    # a verify batch reads more experts: on top of the dense cost, the more bytes over a step's
    assert speed.verify_cost(4, experts=e) == pytest.approx(1 + 3 * 0.6 + e.read_ratio(4) - 1)
    assert speed.verify_cost(4, experts=e, measured={4: 2.0}) == 2.0  # measured costs include it
    assert speed.verify_cost(6, experts=e, measured={4: 2.0}) == pytest.approx(
        2.0 + 2 * 0.6 + e.read_ratio(6) - e.read_ratio(4)
    )
    dense_k = speed.speculate(0.1, 0.01, max_draft=8, gpu_share=1.0)
    moe_k = speed.speculate(0.1, 0.01, max_draft=8, gpu_share=1.0, experts=e)
    assert moe_k.draft_length <= dense_k.draft_length and moe_k.tokens_per_second < dense_k.tokens_per_second


def test_moe_estimated_far_faster_than_a_dense_model_of_its_size() -> None:
    box = Machine(64 * GiB, 56 * GiB, 16, cpu_bandwidth=60e9)
    pair = Pair("p", "moe30b", "d06b", n_max=8, p_min=0.0, good_for="tests")
    moe_fit = fit.fit_pair(fit.estimate_pair(MOE, SMALL, n_ctx=4096), box, pair=pair)
    dense_fit = fit.fit_pair(fit.estimate_pair(DENSE, SMALL, n_ctx=4096), box, pair=pair)
    assert moe_fit.need.total == dense_fit.need.total  # the same memory: every expert is loaded
    moe, dense = fit.pair_speed(moe_fit, box, MOE, SMALL), fit.pair_speed(dense_fit, box, DENSE, SMALL)
    kv = 1024 * speed.kv_bytes_per_token(48, 4, 128)
    assert fit.active_weights(MOE, MOE.file()) == 18_000_000_000 * 33 // 305
    assert moe.plain == pytest.approx(60e9 / (18e9 * 33 / 305 + kv), rel=1e-6)
    assert moe.plain > 6 * dense.plain  # 3.3B of 30.5B parameters read per token
    # drafting pays less on a mixture: a verify batch reads more experts
    assert moe.speculative / moe.plain < dense.speculative / dense.plain


def test_moe_experts_from_a_header(tmp_path: Path) -> None:
    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "qwen3moe")
    w.add_block_count(1)
    w.add_expert_count(4)
    w.add_expert_used_count(1)
    w.add_tensor("blk.0.ffn_up_exps.weight", np.zeros((4, 8, 16), dtype=np.float32))  # 2048 bytes
    w.add_tensor("blk.0.ffn_up_shexp.weight", np.zeros((8, 16), dtype=np.float32))  # shared: 512
    w.add_tensor("blk.0.attn_q.weight", np.zeros((16, 16), dtype=np.float32))  # 1024
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    meta = read_metadata_file(tmp_path / "m.gguf", tensor_infos=True)
    assert memory.expert_weights(meta) == (2048, 1536)
    e = speed.Experts.from_header(meta, 3584)
    assert e is not None and (e.shared, e.routed, e.count, e.used) == (1536, 2048, 4, 1)
    assert e.bytes_read(1) == 1536 + 512  # a token reads one expert of four
    assert speed.Experts.from_header(read_metadata_file(tmp_path / "m.gguf"), 3584) is None  # no tensors


def test_fit_report_names_a_moe_targets_active_parameters() -> None:
    box = Machine(64 * GiB, 56 * GiB, 16, cpu_bandwidth=60e9)
    pair = Pair("moe+small", "moe30b", "d06b", n_max=8, p_min=0.0, good_for="tests")
    f = fit.fit_pair(fit.estimate_pair(MOE, SMALL, n_ctx=4096), box, pair=pair)
    choice = fit.Choice(f, fit.pair_speed(f, box, MOE, SMALL), MOE.params, MOE.active_params)
    assert choice.moe
    lines = fit_report.report_lines(box, [choice], choice, n_ctx=4096, min_speed=15)
    assert any("moe30b: mixture of experts, 3.3B of 30.5B parameters active per token" in x for x in lines)
    data = fit_report.report_data(box, [choice], choice, n_ctx=4096, min_speed=15)["pairs"][0]
    assert (data["target_active_params"], data["target_moe"]) == (3_300_000_000, True)
