"""GGUF headers of the architectures people run now (a hybrid, a mixture of experts), written with the
``gguf`` package for metadata tests: a shared vocabulary (so any two are compatible), the architecture's
keys and one tiny tensor. No weights: nothing here can be loaded."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

VOCAB = ["<unk>", "<s>", "</s>"] + [f"tok{i}" for i in range(3, 300)]

#: a Qwen3.5-like hybrid: every 4th layer attends, the others are Gated DeltaNet (recurrent) layers
HYBRID = {
    "block_count": 8, "embedding_length": 256, "attention.head_count": 4, "attention.head_count_kv": 1,
    "attention.key_length": 64, "attention.value_length": 64, "full_attention_interval": 4,
    "ssm.conv_kernel": 4, "ssm.inner_size": 256, "ssm.state_size": 16, "ssm.group_count": 2,
    "ssm.time_step_rank": 4, "context_length": 4096,
}  # fmt: skip
#: a Qwen3-30B-A3B-like mixture of experts: 128 experts, 8 per token
MOE = {
    "block_count": 4, "embedding_length": 256, "attention.head_count": 4, "attention.head_count_kv": 2,
    "expert_count": 128, "expert_used_count": 8, "context_length": 4096,
}  # fmt: skip


def write_header(path: Path, arch: str, keys: dict[str, int | list[int]]) -> Path:
    """A GGUF file of `arch` with ``<arch>.<key>`` values (lists as per-layer arrays) and `VOCAB`."""
    w = gguf.GGUFWriter(str(path), arch)
    for key, value in keys.items():
        if isinstance(value, list):
            w.add_array(f"{arch}.{key}", value)
        else:
            w.add_uint32(f"{arch}.{key}", value)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(VOCAB)
    w.add_add_bos_token(False)
    w.add_eos_token_id(2)
    w.add_tensor("t", np.zeros(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def hybrid_and_moe(folder: Path) -> tuple[Path, Path]:
    """A qwen35 hybrid and a qwen3moe mixture of experts in `folder`."""
    return (
        write_header(folder / "hybrid.gguf", "qwen35", HYBRID),
        write_header(folder / "moe.gguf", "qwen3moe", MOE),
    )
