"""Where the models run: the offload plan ("auto"), the retry with fewer layers, split models."""

from __future__ import annotations

from dataclasses import replace

import pytest

from app.engine import EngineInfo, ModelInfo, Offload, parse_gpu_layers
from app.engine.engine import Engine, LoadSettings
from app.engine.errors import EngineError, ModelLoadError
from app.engine.info import Device
from app.engine.llama import _model_buffers
from app.engine.offload import (
    ALL,
    ALLOW_SOFTWARE_ENV,
    AUTO,
    backend_of,
    choose_device,
    fewer_layers,
    gpu_budget,
    gpu_device,
    gpus_for,
    is_software,
    load_with_fewer_layers,
    no_gpu_reason,
    plan_offload,
    used_gpu,
)
from app.gguf.memory import COMPUTE_BUFFER, GPU_RESERVE, Footprint, GiB, MiB, file_footprint
from app.gguf.split import first_part, model_bytes, part_names, split_info
from app.tiny_gguf import write_tiny_llama

TARGET = Footprint(weights=4 * GiB, n_layer=31, kv=512 * MiB)  # 32 offloadable layers
DRAFT = Footprint(weights=500 * MiB, n_layer=23, kv=96 * MiB)


def gpu(free: int, name: str = "CUDA0", kind: str = "GPU") -> Device:
    return Device(name, "NVIDIA GeForce RTX 4060 Laptop GPU", kind, free, free)


def test_a_cpu_only_build_keeps_everything_on_the_cpu() -> None:
    plan = plan_offload(TARGET, DRAFT, None)
    assert (plan.target_layers, plan.draft_layers) == (0, 0) and not plan.on_gpu


def test_everything_goes_on_a_gpu_where_it_fits() -> None:
    plan = plan_offload(TARGET, DRAFT, gpu(16 * GiB))
    assert (plan.target_layers, plan.draft_layers) == (ALL, ALL)
    assert plan.budget == 16 * GiB - GPU_RESERVE


def test_the_draft_whole_and_as_many_target_layers_as_fit() -> None:
    free = GPU_RESERVE + DRAFT.total + COMPUTE_BUFFER + 10 * TARGET.per_layer + TARGET.per_layer // 2
    plan = plan_offload(TARGET, DRAFT, gpu(free))
    assert plan.draft_layers == ALL
    assert plan.target_layers == 10  # what the rest of the budget holds, no more
    # a smaller GPU: fewer target layers; too small even for the draft: it stays on the CPU
    assert plan_offload(TARGET, DRAFT, gpu(free - 4 * TARGET.per_layer)).target_layers == 6
    tiny = plan_offload(TARGET, DRAFT, gpu(GPU_RESERVE + DRAFT.total // 2))
    assert (tiny.target_layers, tiny.draft_layers) == (0, 0)


def test_an_explicit_layer_count_is_kept() -> None:
    plan = plan_offload(TARGET, DRAFT, gpu(64 * GiB), target_request=0, draft_request=AUTO)
    assert (plan.target_layers, plan.draft_layers) == (0, ALL)
    assert plan_offload(TARGET, None, gpu(GiB), target_request=ALL).target_layers == ALL
    assert plan_offload(TARGET, DRAFT, None, target_request=12, draft_request=ALL).target_layers == 12
    # both counts given: kept as given, with or without the models' footprints (the engine reads none then)
    plan = plan_offload(Footprint(0, 1, 0), None, gpu(GiB), target_request=1, draft_request=ALL)
    assert (plan.target_layers, plan.draft_layers) == (1, ALL)


def test_unified_memory_keeps_no_display_reserve() -> None:
    assert gpu_budget(Device("MTL0", "Apple M3", "GPU", 10 * GiB, 10 * GiB)) == 10 * GiB
    assert gpu_budget(gpu(10 * GiB)) == 10 * GiB - GPU_RESERVE


def test_a_load_that_runs_out_of_gpu_memory_is_retried_with_fewer_layers() -> None:
    tried: list[int] = []

    def load(layers: int) -> str:
        tried.append(layers)
        if layers > 5 or layers < 0:
            raise ModelLoadError("llama.cpp could not load m.gguf: failed to allocate CUDA0 buffer")
        return f"loaded with {layers}"

    result, layers, failed = load_with_fewer_layers(load, ALL, 32, retry=True)
    assert result == "loaded with 4" and layers == 4
    assert failed == (ALL, 16, 8) and tried == [ALL, 16, 8, 4]
    with pytest.raises(ModelLoadError):  # a layer count the user chose is not second-guessed
        load_with_fewer_layers(load, 20, 32, retry=False)
    assert [fewer_layers(n, 32) for n in (ALL, 32, 3, 1, 0)] == [16, 16, 1, 0, 0]


def test_gpu_layers_words() -> None:
    assert [parse_gpu_layers(w) for w in ("auto", "ALL", "cpu", "0", "12")] == [None, -1, 0, 0, 12]
    with pytest.raises(EngineError, match="auto, all, cpu"):
        parse_gpu_layers("lots")
    with pytest.raises(EngineError):
        LoadSettings(target="t.gguf", n_gpu_layers=-2)


def _info(target: Offload, draft: Offload | None, *, gpu_offload: bool, devices=()) -> EngineInfo:
    def model(o: Offload) -> ModelInfo:
        return ModelInfo("m.gguf", "llama 1B", 1, 1, o.layers_total - 1, 10, o, 2)

    return EngineInfo(
        "CUDA" if gpu_offload else "CPU",
        tuple(devices),
        4096,
        model(target),
        draft and model(draft),
        gpu_offload,
    )


def test_the_placement_says_where_each_model_runs() -> None:
    cpu = Offload(-1, 0, 29, "CPU")
    assert (
        _info(cpu, cpu, gpu_offload=False).placement() == "CPU only (this llama.cpp build has no GPU support)"
    )
    assert _info(cpu, None, gpu_offload=True).placement() == "CPU only (no GPU found)"
    on = Offload(-1, 29, 29, "CUDA", "NVIDIA GeForce RTX 4060")
    part = Offload(None, 14, 29, "CUDA", "NVIDIA GeForce RTX 4060", failed_layers=(29,))  # type: ignore[arg-type]
    text = _info(part, on, gpu_offload=True, devices=[gpu(8 * GiB)]).placement()
    assert text == (
        "target: 14/29 layers on CUDA (NVIDIA GeForce RTX 4060), fewer than planned: the GPU ran out "
        "of memory with 29; draft: 29/29 layers on CUDA (NVIDIA GeForce RTX 4060)"
    )


def test_a_split_model_loads_from_any_part_and_counts_every_part(tmp_path) -> None:
    first = write_tiny_llama(tmp_path / "tiny.gguf", split_tensors=8)
    names = part_names(first.name)
    assert first.name == "tiny-00001-of-00003.gguf" and len(names) == 3
    assert split_info(names[2]) == ("tiny", 3, 3) and split_info("tiny.gguf") is None
    assert first_part(tmp_path / names[1]) == first
    size = model_bytes(tmp_path / names[2])
    assert size == sum((tmp_path / n).stat().st_size for n in names)
    assert file_footprint(tmp_path / names[1], 256).weights == size
    single = write_tiny_llama(tmp_path / "single" / "tiny.gguf")
    with Engine(LoadSettings(target=str(tmp_path / names[1]), n_ctx=256)) as split_eng:
        with Engine(LoadSettings(target=str(single), n_ctx=256)) as single_eng:
            prompt = single_eng.tokenize("Hello world")
            want = single_eng.run(prompt).tokens
            assert split_eng.run(prompt).tokens == want  # the same weights, in three files
        info = split_eng.info()
        assert info.target.n_layer == 2 and info.target.offload.layers_offloaded == 0
    (tmp_path / names[2]).unlink()
    with pytest.raises(ModelLoadError, match=r"missing: tiny-00003-of-00003\.gguf"):
        Engine(LoadSettings(target=str(first), n_ctx=256))


# --------------------------------------------------------------------------------------------------
# Which device: a real GPU (never a software renderer), discrete before integrated, or why none
# --------------------------------------------------------------------------------------------------

LAVAPIPE = Device(
    "Vulkan0", "llvmpipe (LLVM 15.0.6, 256 bits)", "GPU", 24 * GiB, 24 * GiB
)  # as ggml lists it
SWIFTSHADER = Device("Vulkan1", "SwiftShader Device (Subzero)", "GPU", 4 * GiB, 4 * GiB)
RADEON_IGPU = Device("Vulkan1", "AMD Radeon 780M (RADV PHOENIX)", "IGPU", 12 * GiB, 16 * GiB)
RADEON = Device("Vulkan2", "AMD Radeon RX 7600 (RADV NAVI33)", "GPU", 7 * GiB, 8 * GiB)
CPU = Device("CPU", "AMD Ryzen 7 7840HS", "CPU", 30 * GiB, 32 * GiB)


def test_a_software_renderer_is_never_chosen_by_auto(monkeypatch) -> None:
    monkeypatch.delenv(ALLOW_SOFTWARE_ENV, raising=False)
    assert is_software(LAVAPIPE) and is_software(SWIFTSHADER) and not is_software(RADEON)
    assert gpu_device([CPU, LAVAPIPE, SWIFTSHADER]) is None
    assert gpu_device([CPU, LAVAPIPE, RADEON_IGPU]) == RADEON_IGPU
    why = no_gpu_reason([CPU, LAVAPIPE], {"CPU": 1, "Vulkan": 1})
    assert why.startswith("Vulkan device llvmpipe (LLVM 15.0.6, 256 bits) is a software renderer")
    assert "--gpu-layers all uses it" in why
    # tests and CI may plan for it (its real memory figures)
    assert gpu_device([CPU, LAVAPIPE], allow_software=True) == LAVAPIPE
    monkeypatch.setenv(ALLOW_SOFTWARE_ENV, "1")
    assert gpu_device([CPU, LAVAPIPE]) == LAVAPIPE


def test_a_skipped_software_renderer_is_hidden_from_llama_cpp() -> None:
    # llama.cpp sends a large batch's matrix products to any GPU it sees, whatever the layers: a plan
    # without a GPU while a software renderer is visible names no GPU at all
    assert gpus_for([CPU, LAVAPIPE], None) == ()
    assert gpus_for([CPU], None) is None and gpus_for([CPU, RADEON], RADEON) is None


def test_a_discrete_gpu_before_an_integrated_one() -> None:
    # llama.cpp itself uses integrated GPUs only where no discrete one is present
    assert gpu_device([CPU, RADEON_IGPU, RADEON]) == RADEON == used_gpu([CPU, RADEON_IGPU, RADEON])
    assert gpu_device([CPU, RADEON_IGPU]) == RADEON_IGPU
    assert backend_of(RADEON) == "Vulkan" and backend_of(Device("MTL0", "Apple M3", "GPU", 1, 1)) == "Metal"


def test_why_the_models_stay_on_the_cpu() -> None:
    assert no_gpu_reason([CPU], {"CPU": 1}, gpu_offload=False) == "this llama.cpp build has no GPU support"
    # a Vulkan build on a machine without a Vulkan driver (or with only lavapipe, which ggml skips)
    assert no_gpu_reason([CPU], {"CPU": 1, "Vulkan": 0}, gpu_offload=False) == (
        "this build has Vulkan, but Vulkan found no GPU (no Vulkan driver, or only a software renderer)"
    )
    assert no_gpu_reason([CPU], {"CPU": 1, "CUDA": 0}, gpu_offload=False).endswith("found no GPU (no driver)")
    assert no_gpu_reason([CPU], {"CPU": 1, "BLAS": 1}, gpu_offload=True) == "no GPU found"


def test_the_device_auto_plans_for_and_an_explicit_request(monkeypatch) -> None:
    monkeypatch.delenv(ALLOW_SOFTWARE_ENV, raising=False)
    found, regs = [CPU, LAVAPIPE], {"CPU": 1, "Vulkan": 1}
    device, why = choose_device(found, regs, gpu_offload=True)
    assert device is None and "software renderer" in why
    # GPU layers asked for explicitly go where llama.cpp puts them (GGML_VK_VISIBLE_DEVICES=0 --gpu-layers
    # all: lavapipe), and an automatic draft follows them
    assert choose_device(found, regs, gpu_offload=True, target_request=ALL) == (LAVAPIPE, "")
    assert choose_device(found, regs, gpu_offload=True, target_request=0) == (None, why)
    # both explicit: no reason to give
    assert choose_device([CPU], {"CPU": 1}, gpu_offload=False, target_request=0, draft_request=0) == (
        None,
        "",
    )
    assert choose_device([CPU, RADEON], regs, gpu_offload=True) == (RADEON, "")


def test_a_gpu_too_small_for_the_draft_is_skipped_with_the_reason() -> None:
    small = Device("Vulkan0", "Intel(R) UHD Graphics 620", "IGPU", DRAFT.total // 2, 2 * GiB)
    plan = plan_offload(TARGET, DRAFT, small)
    assert (plan.target_layers, plan.draft_layers, plan.device) == (0, 0, None)
    assert plan.reason.startswith(
        "Intel(R) UHD Graphics 620 has 490 MiB free for models, the draft needs 980 MiB"
    )
    # a target count asked for is kept
    assert plan_offload(TARGET, DRAFT, small, target_request=4).target_layers == 4
    assert plan_offload(TARGET, DRAFT, gpu(16 * GiB)).reason == ""


def test_the_placement_names_the_device_kind_and_the_reason() -> None:
    soft = Offload(-1, 3, 3, "Vulkan", "llvmpipe (LLVM 15.0.6, 256 bits)", device_kind="software")
    assert soft.describe() == "3/3 layers on Vulkan (llvmpipe (LLVM 15.0.6, 256 bits), software renderer)"
    igpu = Offload(-1, 29, 29, "Vulkan", "AMD Radeon 780M (RADV PHOENIX)", device_kind="IGPU")
    assert igpu.describe() == "29/29 layers on Vulkan (AMD Radeon 780M (RADV PHOENIX), integrated GPU)"
    cpu = Offload(0, 0, 29, "CPU")
    note = "Vulkan device llvmpipe is a software renderer, slower than the CPU: auto offload skips it"
    info = replace(_info(cpu, cpu, gpu_offload=True, devices=[LAVAPIPE]), offload_note=note)
    assert info.placement() == f"CPU only ({note})"
    info = replace(_info(cpu, cpu, gpu_offload=False), offload_note="this build has Vulkan, but ...")
    assert info.placement() == "CPU only (this build has Vulkan, but ...)"


def test_the_weights_buffers_from_llama_cpp_s_log() -> None:
    log = [
        "load_tensors: loading model tensors, this can take a while... (mmap = true)",
        "load_tensors: offloading output layer to GPU",
        "load_tensors: offloaded 3/3 layers to GPU",
        "load_tensors:      Vulkan0 model buffer size =     0.59 MiB",
        "load_tensors:   CPU_Mapped model buffer size =     0.14 MiB",
    ]
    assert _model_buffers(["something else", *log]) == ["Vulkan0", "CPU_Mapped"]
    assert _model_buffers([*log, log[0], "load_tensors:   CPU_Mapped model buffer size =     0.59 MiB"]) == [
        "CPU_Mapped"
    ]  # the last load only
    assert _model_buffers(["llama_context: n_ctx = 256"]) is None
