"""The GPU check (bench.gpu_check) without a GPU: its synthetic Q4_K_M models, the dry run, the replay with
a given table, its checks that models sit on the GPU, each GPU step's machinery on the CPU, and the script
that makes what it carries."""

from __future__ import annotations

import json
import subprocess
import tarfile
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader
from gguf.quants import dequantize

from app.tiny_arch import count_params, write_tiny_model
from app.tiny_quants import SPREAD, Q, noisy_blocks, q4_k_m_type, random_blocks
from bench import gpu_check
from bench.gpu_check import measured_table
from bench.gpu_costs import NotOnGPU, check_on_gpu, gpu_buffer_bytes, measure, offload_lines
from bench.gpu_engine import check_engine_on_gpu, predicted_round_ms, run_engine, run_explore
from bench.gpu_lossless import PROMPTS, run_lossless
from bench.gpu_models import QWEN25_0_5B_SHAPE, QWEN25_7B_SHAPE, TINY_TARGET_SHAPE, write_models
from bench.gpu_replay import SETS

REPO = Path(__file__).resolve().parents[1]


def test_q4_k_m_types_follow_llama_cpp() -> None:
    """Q6_K for the output, V and FFN-down projections of use_more_bits' layers; fallbacks for rows of 896."""
    n = 28  # Qwen2.5-7B: layers 0-2 and 24-27, then every third from 5
    assert q4_k_m_type("output.weight", 3584, n, tied=False) == Q.Q6_K
    assert q4_k_m_type("token_embd.weight", 3584, n, tied=False) == Q.Q4_K
    assert q4_k_m_type("token_embd.weight", 896, 24, tied=True) == Q.Q8_0  # the 0.5B's tied output
    more = [i for i in range(n) if q4_k_m_type(f"blk.{i}.attn_v.weight", 3584, n, tied=False) == Q.Q6_K]
    assert more == [0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 24, 25, 26, 27]
    assert q4_k_m_type("blk.5.ffn_down.weight", 18944, n, tied=False) == Q.Q6_K
    assert q4_k_m_type("blk.4.ffn_down.weight", 18944, n, tied=False) == Q.Q4_K
    assert q4_k_m_type("blk.4.attn_q.weight", 3584, n, tied=False) == Q.Q4_K
    assert q4_k_m_type("blk.4.attn_q.weight", 896, 24, tied=True) == Q.Q5_0
    assert q4_k_m_type("blk.0.attn_v.weight", 896, 24, tied=True) == Q.Q8_0


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K, Q.Q5_0, Q.Q8_0, Q.Q4_0])
def test_random_blocks_are_finite_with_the_spread_asked(qtype: Q) -> None:
    rng = np.random.default_rng(0)
    for std in (0.02, 0.0014):  # the second gives subnormal f16 scales, as real files have
        values = dequantize(random_blocks(qtype, 256 * 2048, std, rng), qtype)
        assert np.isfinite(values).all()
        assert values.std() == pytest.approx(std, rel=0.05)
        assert abs(values.mean()) < 0.05 * std


def test_legacy_blocks_are_the_noisy_writer() -> None:
    a = random_blocks(Q.Q8_0, 32 * 64, 0.1, np.random.default_rng(3))
    b = noisy_blocks(Q.Q8_0, 32 * 64, 0.1, np.random.default_rng(3))
    assert (a == b).all()
    with pytest.raises(ValueError, match="noise"):
        random_blocks(Q.Q4_K, 256, 0.1, np.random.default_rng(0), np.random.default_rng(1), 0.01)
    assert set(SPREAD) == {Q.Q4_K, Q.Q6_K, Q.Q5_0}


def test_real_shapes_are_qwen25() -> None:
    assert count_params("qwen2", QWEN25_7B_SHAPE) == 7_615_616_512  # Qwen2.5-7B's count
    assert count_params("qwen2", QWEN25_0_5B_SHAPE) == 494_147_456  # 0.5B's, less 128 padding rows


def test_qwen2_q4_k_m_loads_and_drafts_for_itself(tmp_path: Path) -> None:
    """llama.cpp loads the synthetic Q4_K_M qwen2 (biases and all), and a target drafting for itself
    is accepted every time, as the GPU check's engine step expects."""
    from app.engine.engine import Engine, LoadSettings
    from app.engine.settings import GenerationSettings

    path = write_tiny_model(tmp_path / "q.gguf", "qwen2", quant="Q4_K_M", shape=TINY_TARGET_SHAPE)
    types = {t.name: t.tensor_type for t in GGUFReader(path).tensors}
    assert types["output.weight"] == Q.Q6_K and types["blk.0.attn_q.bias"] == Q.F32
    assert types["blk.3.ffn_down.weight"] == Q.Q6_K and types["blk.1.ffn_down.weight"] == Q.Q4_K
    with Engine(LoadSettings(str(path), str(path), n_ctx=256, n_threads=1)) as engine:
        assert engine.target.n_params == count_params("qwen2", TINY_TARGET_SHAPE)
        prompt = list(range(10, 40))
        plain = engine.run(prompt, GenerationSettings(mode="plain", max_tokens=24))
        spec = engine.run(
            prompt, GenerationSettings(mode="speculative", n_max=4, adaptive=False, max_tokens=24)
        )
    assert spec.tokens == plain.tokens
    assert spec.stats.acceptance_rate == 1.0


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return write_models(tmp_path_factory.mktemp("gpu-models"), "tiny")


def test_dry_run_writes_models_and_replays(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "check.json"
    argv = [
        "--dry-run",
        "--shapes",
        "tiny",
        "--replay-limit",
        "4",
        "--out",
        str(out),
        "--workdir",
        str(tmp_path),
    ]
    assert gpu_check.main(argv) == 0
    data = json.loads(out.read_text())
    assert data["steps"] == ["models", "replay"] and data["dry_run"]
    for role in ("target", "draft"):
        assert Path(data["models"][role]["path"]).stat().st_size == data["models"][role]["bytes"]
    assert SETS["single-turn"].exists(), "the prepared single-turn replies ship with the repository"
    for name, path in SETS.items():
        if not path.exists():
            continue
        r = data["replay"][name]
        assert r["replies"] == 4 and r["table"].startswith("recorded")
        assert {"auto (lookup)", "auto", "spec3", "spec5", "lookup bound"} <= set(r["speedup"])
        assert all(0.2 < v < 50 for row in r["speedup"].values() for v in row.values())
    printed = capsys.readouterr().out
    assert "replay [single-turn, 4 replies" in printed and "models (tiny shapes)" in printed


def test_replay_with_the_gpu_table_and_a_measured_one(tmp_path: Path) -> None:
    gpu = tmp_path / "gpu.json"
    argv = ["--dry-run", "--steps", "replay", "--ratios", "gpu", "--replay-limit", "3", "--out", str(gpu)]
    assert gpu_check.main(argv) == 0
    single = json.loads(gpu.read_text())["replay"]["single-turn"]
    assert single["table"].startswith("gpu") and single["speedup"]["lookup bound"]["all"] > 1.0
    # an earlier check's measured table, replayed again here
    ratios = [1.0, *np.linspace(1.01, 1.6, 63).round(3).tolist()]
    ctx = {"target": {"ratio": ratios}, "draft": {"ratio": [0.1] * 64}}
    (tmp_path / "measured.json").write_text(
        json.dumps({"primary": "cuda", "costs": {"cuda": {"contexts": {"512": ctx, "4096": ctx}}}})
    )
    again = tmp_path / "again.json"
    argv = [
        "--dry-run",
        "--steps",
        "replay",
        "--ratios",
        str(tmp_path / "measured.json"),
        "--out",
        str(again),
    ]
    argv += ["--replay-limit", "3"]
    assert gpu_check.main(argv) == 0
    single = json.loads(again.read_text())["replay"]["single-turn"]
    assert single["table"].startswith("measured") and single["ratios"] == ratios


def test_offload_checks_fail_loudly() -> None:
    lines = [
        "load_tensors: offloading 28 repeating layers to GPU",
        "load_tensors: offloaded 29/29 layers to GPU",
        "load_tensors:   CPU_Mapped model buffer size =   292.36 MiB",
        "load_tensors:        CUDA0 model buffer size =  4168.78 MiB",
        "load_tensors:    CUDA_Host model buffer size =   100.00 MiB",
    ]
    assert offload_lines(lines) == [(29, 29)]
    assert gpu_buffer_bytes(lines) == int(4168.78 * 2**20)
    assert check_on_gpu("t", lines, 10 << 30, 5 << 30, 4 << 30)["offloaded"] == (29, 29)
    with pytest.raises(NotOnGPU, match="only 20 of 29"):
        check_on_gpu("t", ["load_tensors: offloaded 20/29 layers to GPU"], 10 << 30, 5 << 30, 4 << 30)
    with pytest.raises(NotOnGPU, match="no 'offloaded"):
        check_on_gpu("t", ["load_tensors: CPU model buffer size"], 0, 0, 4 << 30)
    with pytest.raises(NotOnGPU, match="in GPU buffers"):  # the line says all layers, the buffers do not
        check_on_gpu("t", lines[:3], 0, 0, 4 << 30)
    with pytest.raises(NotOnGPU, match="not on the GPU"):
        check_on_gpu("t", lines, 10 << 30, 10 << 30, 4 << 30)  # nothing left the free memory
    with pytest.raises(NotOnGPU, match="1 GPU offloads for 2"):
        check_engine_on_gpu(lines, 2, allow_cpu=False, file_bytes=4 << 30)
    with pytest.raises(NotOnGPU, match="4169 MiB of 8192 MiB"):
        check_engine_on_gpu([*lines, lines[1]], 2, allow_cpu=False, file_bytes=8 << 30)
    assert check_engine_on_gpu([], 2, allow_cpu=True) == []


def test_cost_table_machinery_on_the_cpu(tiny_models: dict) -> None:
    from app.engine.llama import supports_gpu_offload

    t, d = tiny_models["target"]["path"], tiny_models["draft"]["path"]
    if not supports_gpu_offload():
        with pytest.raises(NotOnGPU, match="no GPU device"):
            measure(t, d, contexts=(32,), max_batch=2, reps=1)
    got = measure(t, d, contexts=(32,), max_batch=4, reps=2, allow_cpu=True, threads=1)
    c = got["contexts"]["32"]
    assert c["target"]["ratio"][0] == 1.0 and len(c["target"]["ratio"]) == len(c["draft"]["ratio"]) == 4
    assert all(
        q1 <= r <= q3
        for q1, r, q3 in zip(c["target"]["q1"], c["target"]["ratio"], c["target"]["q3"], strict=True)
    )
    assert predicted_round_ms(c, 3) == pytest.approx(
        c["target"]["step_ms"] * (c["target"]["ratio"][1] + 2 + c["target"]["ratio"][3])
    )
    assert predicted_round_ms(c, 7) is None
    # the step as plain decoding takes it, timed back to back: a plain round's prediction, and the
    # step the table is given in for replaying
    assert c["target"]["run_step_ms"] > 0 and predicted_round_ms(c, 0) == c["target"]["run_step_ms"]
    ratios, draft, _ = measured_table(got, "32")
    scale = c["target"]["step_ms"] / c["target"]["run_step_ms"]
    assert ratios[0] == 1.0 and ratios[1] == pytest.approx(c["target"]["ratio"][1] * scale)
    assert draft[0] == pytest.approx(c["draft"]["ratio"][0] * scale)
    assert measured_table(got, "32", in_run=False)[0][1] == c["target"]["ratio"][1]


def test_a_table_without_a_step_timed_in_a_run_is_given_in_plain_rounds() -> None:
    """A table recorded before steps were timed in a run (an H200: 5.17 ms a step between batches,
    4.07 ms a plain round in the same check's engine step) is given in plain rounds where the plain
    round's time is known, else as timed."""
    c = {"target": {"step_ms": 5.17, "ratio": [1.0, 1.1]}, "draft": {"ratio": [0.7, 0.94]}}
    costs = {"contexts": {"512": c}}
    ratios, draft, used = measured_table(costs, "512", plain_ms=4.07)
    assert used == "512" and ratios == pytest.approx([1.0, 1.1 * 5.17 / 4.07])
    assert draft == pytest.approx([0.7 * 5.17 / 4.07, 0.94 * 5.17 / 4.07])
    assert measured_table(costs, "512")[0] == [1.0, 1.1]


def test_engine_and_lossless_steps_on_the_cpu(tiny_models: dict, tmp_path: Path) -> None:
    """The engine process with the target as its own draft accepts every draft; the tiny pairs stay
    lossless (the same code paths the GPU run takes, with allow_cpu)."""
    table = {"target": {"step_ms": 1.0, "ratio": [1.0, 1.2, 1.3, 1.4, 1.5]}}
    e = run_engine(
        tiny_models["target"]["path"],
        table,
        ks=(3,),
        max_tokens=24,
        repeats=1,
        n_ctx=512,
        allow_cpu=True,
        threads=1,
    )
    assert e["modes"]["spec3"]["same_as_plain"] and e["modes"]["spec3"]["acceptance"] == 1.0
    assert e["modes"]["spec3"]["predicted_ms"] == pytest.approx(1.2 + 2 + 1.4)
    assert e["modes"]["plain"]["round_ms"] > 0
    assert e["auto_costs"]["ratios"]  # what auto mode timed at load and kept, as the next session reads it
    lo = run_lossless(
        tmp_path,
        pairs=("llama",),
        max_tokens=16,
        n_maxes=(4,),
        prompts=PROMPTS[:1],
        allow_cpu=True,
        threads=1,
    )
    assert lo["total"]["runs"] == 3 and lo["total"]["failures"] == 0 and not lo["errors"]


def test_explore_step_runs_auto_beside_plain_with_a_draft_that_is_never_right(tiny_models: dict) -> None:
    """Auto mode and plain decoding interleaved, as the app loads the synthetic pair (its draft has
    random weights of its own); the output is plain's, and the summary says what auto's rounds were."""
    x = run_explore(
        tiny_models["target"]["path"],
        tiny_models["draft"]["path"],
        max_tokens=16,
        repeats=2,
        n_ctx=512,
        allow_cpu=True,
        threads=1,
    )
    assert x["same_as_plain"]
    assert [len(v) for v in x["tokens_per_second"].values()] == [2] * 4  # plain, auto, each serial too
    assert len(x["auto_over_plain"]) == 2 and x["auto_over_plain_median"] > 0
    assert sum(r["rounds"] for r in x["auto_rounds"].values()) >= 2  # its rounds, by what drafted them
    line = next(t for t in gpu_check.summary_lines({"explore": x}) if t.startswith("explore"))
    assert "auto / plain" in line and "same as plain: True" in line
    queued = next(t for t in gpu_check.summary_lines({"explore": x}) if t.startswith("explore, queued"))
    assert "of the same mode serial" in queued  # on a CPU nothing is queued: 1.0x within noise
    assert all(q == 0 for runs in x["rounds_queued_wasted"].values() for _, q, _ in runs)


def _fake_sdist(root: Path) -> Path:
    src = root / "llama_cpp_python-0.3.36"
    ll = "vendor/llama.cpp"
    dirs = [".git", "docs", "llama_cpp/lib", f"{ll}/models", f"{ll}/docs", f"{ll}/src/models", f"{ll}/common"]
    for d in [*dirs, f"{ll}/ggml/src/ggml-cuda", f"{ll}/ggml/src/ggml-sycl", f"{ll}/tools/mtmd"]:
        (src / d).mkdir(parents=True, exist_ok=True)
        (src / d / "f.txt").write_text("x")
    for f in ("CMakeLists.txt", "vendor/llama.cpp/CMakeLists.txt", "vendor/llama.cpp/convert_hf_to_gguf.py"):
        (src / f).write_text("x")
    tgz = root / "sdist.tar.gz"
    with tarfile.open(tgz, "w:gz") as t:
        t.add(src, arcname=src.name)
    return tgz


def test_carry_script_strips_what_a_build_does_not_need(tmp_path: Path) -> None:
    out = tmp_path / "carry"
    env = {"TANDEM_GPU_CARRY_DIR": str(out), "TANDEM_GPU_CARRY_NO_WHEELS": "1", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        ["bash", str(REPO / "packaging/gpu-carry.sh"), str(_fake_sdist(tmp_path))],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    with tarfile.open(out / "llama-cpp-python-0.3.36-src.tar.gz") as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    assert (
        "vendor/llama.cpp/src/models/f.txt" in names and "vendor/llama.cpp/ggml/src/ggml-cuda/f.txt" in names
    )
    assert "llama_cpp/lib/f.txt" in names and "CMakeLists.txt" in names
    for gone in ("vendor/llama.cpp/models/f.txt", "vendor/llama.cpp/docs/f.txt", ".git/f.txt", "docs/f.txt",
                 "vendor/llama.cpp/tools/mtmd/f.txt", "vendor/llama.cpp/ggml/src/ggml-sycl/f.txt",
                 "vendor/llama.cpp/convert_hf_to_gguf.py"):  # fmt: skip
        assert gone not in names
    assert subprocess.run(["bash", "-n", str(REPO / "packaging/gpu-build.sh")]).returncode == 0
    env |= {"GPU_RUN_DRY": "1", "OUT": str(tmp_path / "out")}
    proc = subprocess.run(
        ["bash", str(REPO / "packaging/gpu-run.sh"), "--reps", "5"], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert "-m bench.gpu_check --out " + str(tmp_path / "out/gpu-check.json") in proc.stdout
    assert "--backend cuda=/tmp/tandem-site --reps 5" in proc.stdout and "--deadline" in proc.stdout


def test_carry_script_packs_a_cuda_build_made_elsewhere(tmp_path: Path) -> None:
    """A site built here for the GPU (with the toolkit, no GPU) travels as one archive, each library
    once; a site without the CUDA backend is refused."""
    site = tmp_path / "site"
    lib = site / "llama_cpp/lib"
    lib.mkdir(parents=True)
    (site / "llama_cpp/__init__.py").write_text("")
    (lib / "libllama.so").write_text("x")
    env = {
        "TANDEM_GPU_CARRY_DIR": str(tmp_path / "carry"),
        "TANDEM_GPU_CARRY_NO_WHEELS": "1",
        "TANDEM_GPU_CARRY_CUDA_SITE": str(site),
        "PATH": "/usr/bin:/bin",
    }
    script = ["bash", str(REPO / "packaging/gpu-carry.sh"), str(_fake_sdist(tmp_path))]
    proc = subprocess.run(script, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "has no CUDA backend" in proc.stderr
    (lib / "libggml-cuda.so").write_text("x")
    (lib / "libmtmd.so").write_text("x")
    proc = subprocess.run(script, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    with tarfile.open(tmp_path / "carry/cuda-site.tar.xz") as t:
        names = set(t.getnames())
    want = {"./llama_cpp/__init__.py", "./llama_cpp/lib/libggml-cuda.so", "./llama_cpp/lib/libllama.so"}
    assert want <= names
    assert "./llama_cpp/lib/libmtmd.so" not in names


def test_the_bytes_a_full_offload_puts_on_the_gpu_leave_out_the_token_embeddings(tmp_path: Path) -> None:
    """A tiny model's file is mostly vocabulary metadata; what must reach the GPU is its tensors less
    the token embeddings llama.cpp keeps in host memory."""
    from gguf import GGUFReader

    from app.tiny_gguf import write_tiny_pair
    from bench.gpu_costs import gpu_bound_bytes

    target, _ = write_tiny_pair(tmp_path)
    tensors = {t.name: int(t.n_bytes) for t in GGUFReader(str(target)).tensors}
    assert gpu_bound_bytes(target) == sum(tensors.values()) - tensors["token_embd.weight"]
    assert 0 < gpu_bound_bytes(target) < target.stat().st_size
