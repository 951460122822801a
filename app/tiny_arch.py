"""Builder of tiny, real GGUF models of non-llama architectures, for tests and benchmarks.

``qwen35`` (Qwen3.5: Gated DeltaNet linear-attention layers, a full-attention layer every
``full_attention_interval`` layers: hybrid memory), ``gemma3`` (sliding-window attention on some layers,
global on the others: iSWA), ``qwen3moe`` (attention with a mixture of experts) and ``mamba2`` (a pure
state-space model: recurrent memory only); also ``qwen3`` and ``qwen2`` (Qwen2.5: Q/K/V projections
with biases), dense attention models. Each file has the tokenizer and ChatML template of
:mod:`app.tiny_gguf` (509 tokens) and random weights that llama.cpp loads and generates with.

Tensor names, shapes and header keys follow the pinned llama.cpp (llama-cpp-python 0.3.36):
``src/llama-arch.cpp`` (names), ``src/models/{qwen35,gemma3,qwen3moe,mamba2}.cpp`` (hyperparameters read
and ``create_tensor`` shapes, ggml order: ``ne0`` first) and ``conversion/{qwen,gemma,mamba}.py`` (how a
real checkpoint fills them: norms stored with their +1 applied, ``ssm_a = -exp(A_log)``, ``dt_bias``).

A *draft* is a target's weights plus gaussian noise of ``noise`` times each tensor's standard deviation
(``base_seed`` names the target), as in :mod:`app.tiny_gguf`. ``shape`` overrides the dimensions, e.g.
:data:`QWEN35_2B_SHAPE` (Qwen3.5-2B); big matrices are then written as random quantized blocks directly
(seconds for GBs): see :func:`write_tiny_model`; ``quant="Q4_K_M"`` gives each tensor the type
llama.cpp's quantizer would (:mod:`app.tiny_quants`).

Imports only numpy, gguf, the standard library, :mod:`app.tiny_gguf`, :mod:`app.tiny_quants` and
:mod:`app.tiny_shapes` (the shapes).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal, NamedTuple

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter, LlamaFileType
from gguf.quants import quant_shape_to_byte_shape, quantize

from app.tiny_gguf import CHATML_TEMPLATE, add_hparams, add_tokenizer, build_tokenizer
from app.tiny_quants import q4_k_m_type, random_blocks
from app.tiny_shapes import DEFAULT_NOISE, DEFAULT_SHAPES, DENSE_2B_SHAPE, QWEN35_0_8B_SHAPE, QWEN35_2B_SHAPE

__all__ = [
    "ARCHS",
    "DEFAULT_NOISE",
    "DEFAULT_SHAPES",
    "DENSE_2B_SHAPE",
    "QWEN35_0_8B_SHAPE",
    "QWEN35_2B_SHAPE",
    "count_params",
    "model_shape",
    "write_tiny_arch_pair",
    "write_tiny_model",
]

Arch = Literal["qwen35", "gemma3", "qwen3moe", "mamba2", "qwen3", "qwen2", "step35"]
Quant = Literal["F32", "Q4_0", "Q8_0", "Q4_K_M"]
ARCHS: tuple[str, ...] = ("qwen35", "gemma3", "qwen3moe", "mamba2")

RAW_MIN_ELEMENTS = 1 << 20
"""Quantized matrices of at least this many values are random quantized blocks, not quantized floats."""

_QTYPES = {"Q4_0": GGMLQuantizationType.Q4_0, "Q8_0": GGMLQuantizationType.Q8_0}
_FILE_TYPES = {
    "F32": LlamaFileType.ALL_F32,
    "Q4_0": LlamaFileType.MOSTLY_Q4_0,
    "Q8_0": LlamaFileType.MOSTLY_Q8_0,
    "Q4_K_M": LlamaFileType.MOSTLY_Q4_K_M,
}


class _T(NamedTuple):
    """One tensor: name, ggml shape (``ne0`` first: a matrix's input size), how to draw it, a gain."""

    name: str
    ne: tuple[int, ...]
    init: str  # mat | embd | f32mat | norm | bias | ones | zeros | conv | a | dt_bias
    gain: float = 1.0


def model_shape(arch: str, shape: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The hyperparameters of ``arch``: its tiny defaults updated with ``shape`` (unknown keys refused)."""
    if arch not in DEFAULT_SHAPES:
        raise ValueError(f"unknown architecture {arch!r}: expected one of {', '.join(ARCHS)}")
    out = dict(DEFAULT_SHAPES[arch])
    unknown = set(shape or {}) - set(out)
    if unknown:
        raise ValueError(f"unknown {arch} shape keys {sorted(unknown)}; known: {sorted(out)}")
    out.update(shape or {})
    if not out["n_vocab"]:
        out["n_vocab"] = build_tokenizer("a").n_vocab
    return out


def count_params(arch: str, shape: Mapping[str, Any] | None = None) -> int:
    """Parameters of ``arch`` at ``shape`` (what ``llama_model_n_params`` reports for the written file)."""
    return sum(int(np.prod(t.ne)) for t in _plan(arch, model_shape(arch, shape))[1])


def _attention(p: str, s: dict[str, Any], q_mult: int = 1, rg: float = 1.0) -> list[_T]:
    """Q/K/V/O projections and per-head Q/K norms (``create_tensor_qkv`` with separate Q, K, V)."""
    e, hd = s["n_embd"], s["head_dim"]
    return [
        _T(p + "attn_q.weight", (e, hd * s["n_head"] * q_mult), "mat", 2.0),
        _T(p + "attn_k.weight", (e, hd * s["n_head_kv"]), "mat", 2.0),
        _T(p + "attn_v.weight", (e, hd * s["n_head_kv"]), "mat"),
        _T(p + "attn_output.weight", (hd * s["n_head"], e), "mat", rg),
        _T(p + "attn_q_norm.weight", (hd,), "norm"),
        _T(p + "attn_k_norm.weight", (hd,), "norm"),
    ]


def _ffn(p: str, n_embd: int, n_ff: int, rg: float = 1.0) -> list[_T]:
    return [
        _T(p + "ffn_gate.weight", (n_embd, n_ff), "mat"),
        _T(p + "ffn_up.weight", (n_embd, n_ff), "mat"),
        _T(p + "ffn_down.weight", (n_ff, n_embd), "mat", rg),
    ]


def _plan(arch: str, s: dict[str, Any]) -> tuple[dict[str, Any], list[_T]]:
    """The header keys (without the ``<arch>.`` prefix) and the tensors of ``arch`` at shape ``s``."""
    e, n_layer = s["n_embd"], s["n_layer"]
    # Projections back into the residual stream scaled by 1/sqrt(n_layer) (GPT-2's initialisation does
    # about this): without it a random deep model is chaotic, and a draft of 24 layers agrees with its
    # target as little at noise 0.003 as one of 4 layers at 0.03.
    rg = float(1.0 / np.sqrt(n_layer))
    kv: dict[str, Any] = {
        "context_length": s["n_ctx_train"],
        "embedding_length": e,
        "block_count": n_layer,
        "attention.layer_norm_rms_epsilon": float(s["rms_eps"]),
    }
    # gemma3 scales embeddings by sqrt(n_embd). Tied embeddings must be small: the current token's own row
    # would otherwise dominate the logits (random weights would repeat the input token for ever).
    embd_gain = 0.5 / np.sqrt(e) if arch == "gemma3" else 2.0 / np.sqrt(e) if s["tied"] else 0.5
    tensors = [
        _T("token_embd.weight", (e, s["n_vocab"]), "embd", embd_gain),
        _T("output_norm.weight", (e,), "norm"),
    ]
    if not s["tied"]:
        tensors.append(_T("output.weight", (e, s["n_vocab"]), "mat", 4.0))
    if arch in ("qwen35", "gemma3", "qwen3moe", "qwen3", "qwen2", "step35"):
        kv |= {
            "feed_forward_length": s["n_ff"],
            "attention.head_count": s["n_head"],
            "attention.head_count_kv": s["n_head_kv"],
            "attention.key_length": s["head_dim"],
            "attention.value_length": s["head_dim"],
            "rope.freq_base": float(s["rope_freq_base"]),
        }
    if arch == "qwen35":
        d_state, n_group, dt_rank = s["ssm_d_state"], s["ssm_n_group"], s["ssm_dt_rank"]
        if dt_rank % n_group:
            raise ValueError(
                "qwen35: ssm_dt_rank (value heads) must be a multiple of ssm_n_group (key heads)"
            )
        if 2 * sum(s["rope_sections"]) > s["n_rot"] or s["n_rot"] > s["head_dim"]:
            raise ValueError("qwen35: rope_sections must cover at most n_rot / 2 pairs, n_rot <= head_dim")
        key_dim, value_dim = d_state * n_group, d_state * dt_rank  # value head dim == key head dim
        kv |= {
            "rope.dimension_count": s["n_rot"],
            "rope.dimension_sections": [int(x) for x in s["rope_sections"]],
            "full_attention_interval": s["full_attention_interval"],
            "ssm.conv_kernel": s["ssm_d_conv"],
            "ssm.state_size": d_state,
            "ssm.group_count": n_group,
            "ssm.time_step_rank": dt_rank,
            "ssm.inner_size": value_dim,
        }
        for i in range(n_layer):
            p = f"blk.{i}."
            tensors += [
                _T(p + "attn_norm.weight", (e,), "norm"),
                _T(p + "post_attention_norm.weight", (e,), "norm"),
            ]
            if (i + 1) % s["full_attention_interval"]:  # a Gated DeltaNet layer
                tensors += [
                    _T(p + "attn_qkv.weight", (e, 2 * key_dim + value_dim), "mat"),
                    _T(p + "attn_gate.weight", (e, value_dim), "mat"),
                    _T(p + "ssm_conv1d.weight", (s["ssm_d_conv"], 2 * key_dim + value_dim), "conv"),
                    _T(p + "ssm_dt.bias", (dt_rank,), "dt_bias"),
                    _T(p + "ssm_a", (dt_rank,), "a"),
                    _T(p + "ssm_beta.weight", (e, dt_rank), "f32mat"),
                    _T(p + "ssm_alpha.weight", (e, dt_rank), "f32mat", 0.5),
                    _T(p + "ssm_norm.weight", (d_state,), "norm"),
                    _T(p + "ssm_out.weight", (value_dim, e), "mat", rg),
                ]
            else:  # full attention: the Q projection also holds a per-head output gate
                tensors += _attention(p, s, q_mult=2, rg=rg)
            tensors += _ffn(p, e, s["n_ff"], rg)
    elif arch == "gemma3":
        kv |= {
            "attention.sliding_window": s["sliding_window"],
            "attention.sliding_window_pattern": s["sliding_window_pattern"],
            "rope.freq_base_swa": float(s["rope_freq_base_swa"]),
        }
        for i in range(n_layer):
            p = f"blk.{i}."
            tensors += [_T(p + "attn_norm.weight", (e,), "norm"), *_attention(p, s)]
            # the branches' outputs are normalised: their post-norms carry the depth scaling
            tensors += [
                _T(p + "post_attention_norm.weight", (e,), "norm", rg),
                _T(p + "ffn_norm.weight", (e,), "norm"),
            ]
            tensors += [*_ffn(p, e, s["n_ff"]), _T(p + "post_ffw_norm.weight", (e,), "norm", rg)]
    elif arch == "qwen2":
        hd, kv_dim = s["head_dim"], s["head_dim"] * s["n_head_kv"]
        if hd * s["n_head"] != e:
            raise ValueError("qwen2: n_head * head_dim must equal n_embd")
        for i in range(n_layer):
            p = f"blk.{i}."
            tensors += [_T(p + "attn_norm.weight", (e,), "norm")]
            for x, width, gain in (("q", e, 2.0), ("k", kv_dim, 2.0), ("v", kv_dim, 1.0)):
                tensors += [_T(f"{p}attn_{x}.weight", (e, width), "mat", gain), _T(f"{p}attn_{x}.bias", (width,), "bias")]  # fmt: skip  # noqa: E501
            tensors += [_T(p + "attn_output.weight", (e, e), "mat", rg), _T(p + "ffn_norm.weight", (e,), "norm")]  # fmt: skip  # noqa: E501
            tensors += _ffn(p, e, s["n_ff"], rg)
    elif arch == "qwen3" or arch == "step35":
        if arch == "step35":  # even layers see the window, odd ones everything
            kv |= {"attention.sliding_window": s["sliding_window"], "expert_feed_forward_length": 0}
            kv["attention.sliding_window_pattern"] = [int(i % 2 == 0) for i in range(n_layer)]
        for i in range(n_layer):
            p = f"blk.{i}."
            tensors += [_T(p + "attn_norm.weight", (e,), "norm"), *_attention(p, s, rg=rg)]
            tensors += [_T(p + "ffn_norm.weight", (e,), "norm"), *_ffn(p, e, s["n_ff"], rg)]
    elif arch == "qwen3moe":
        n_exp, n_ff_exp = s["n_expert"], s["n_ff_exp"]
        if not 0 < s["n_expert_used"] <= n_exp:
            raise ValueError("qwen3moe: need 0 < n_expert_used <= n_expert")
        kv |= {
            "expert_count": n_exp,
            "expert_used_count": s["n_expert_used"],
            "expert_feed_forward_length": n_ff_exp,
        }
        for i in range(n_layer):
            p = f"blk.{i}."
            tensors += [_T(p + "attn_norm.weight", (e,), "norm"), *_attention(p, s, rg=rg)]
            tensors += [
                _T(p + "ffn_norm.weight", (e,), "norm"),
                _T(p + "ffn_gate_inp.weight", (e, n_exp), "f32mat", 2.0),  # the router: F32 as in real files
                _T(p + "ffn_gate_exps.weight", (e, n_ff_exp, n_exp), "mat"),
                _T(p + "ffn_down_exps.weight", (n_ff_exp, e, n_exp), "mat", rg),
                _T(p + "ffn_up_exps.weight", (e, n_ff_exp, n_exp), "mat"),
            ]
    elif arch == "mamba2":
        d_inner, d_state, n_group = s["ssm_d_inner"], s["ssm_d_state"], s["ssm_n_group"]
        n_head = s["ssm_dt_rank"]
        if d_inner % n_head or d_inner % n_group:
            raise ValueError("mamba2: ssm_d_inner must be a multiple of ssm_dt_rank (heads) and ssm_n_group")
        conv_dim = d_inner + 2 * n_group * d_state
        kv |= {
            "feed_forward_length": 0,  # unused, but written by llama.cpp's converter
            "attention.head_count": 0,
            "ssm.conv_kernel": s["ssm_d_conv"],
            "ssm.inner_size": d_inner,
            "ssm.state_size": d_state,
            "ssm.time_step_rank": n_head,
            "ssm.group_count": n_group,
        }
        for i in range(n_layer):
            p = f"blk.{i}."
            tensors += [
                _T(p + "attn_norm.weight", (e,), "norm"),
                _T(p + "ssm_in.weight", (e, d_inner + conv_dim + n_head), "mat"),  # z, xBC, dt
                _T(p + "ssm_conv1d.weight", (s["ssm_d_conv"], conv_dim), "conv"),
                _T(p + "ssm_conv1d.bias", (conv_dim,), "zeros"),
                _T(p + "ssm_dt.bias", (n_head,), "dt_bias"),
                _T(p + "ssm_a", (1, n_head), "a"),
                _T(p + "ssm_d", (1, n_head), "ones"),
                _T(p + "ssm_norm.weight", (d_inner // n_group, n_group), "norm"),
                _T(p + "ssm_out.weight", (d_inner, e), "mat", rg),
            ]
    return kv, tensors


def _draw(t: _T, rng: np.random.Generator) -> np.ndarray:
    """Random F32 values of tensor ``t`` (numpy shape: ggml's reversed), at scales that keep the output
    non-degenerate and the recurrent state bounded."""
    shape = t.ne[::-1]
    if t.init in ("mat", "f32mat", "conv"):
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(t.gain / np.sqrt(t.ne[0]))
    if t.init == "embd":
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(t.gain)
    if t.init == "norm":
        return (t.gain * (1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32))).astype(np.float32)
    if t.init == "bias":
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(0.1)
    if t.init in ("ones", "zeros"):
        return np.full(shape, 1.0 if t.init == "ones" else 0.0, dtype=np.float32)
    if t.init == "eh":  # an MTP block's input projection: mostly the token's own embedding
        return np.hstack(
            [np.eye(shape[0], dtype=np.float32), 0.1 * _draw(t._replace(init="mat"), rng)[:, shape[0] :]]
        )
    if t.init == "a":  # -exp(A_log) with A in [1, 16], as Mamba2 and Gated DeltaNet initialise it
        return -rng.uniform(1.0, 16.0, shape).astype(np.float32)
    if t.init == "dt_bias":  # softplus(dt_bias) = dt, log-uniform in [0.001, 0.1]
        dt = np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), shape))
        return (dt + np.log(-np.expm1(-dt))).astype(np.float32)
    raise AssertionError(t.init)


def _quantizable(t: _T, quant: str) -> bool:
    return quant in (*_QTYPES, "Q4_K_M") and t.init in ("mat", "embd") and t.ne[0] % 32 == 0


def _qtype(t: _T, quant: str, s: dict[str, Any]) -> GGMLQuantizationType:
    """The type a quantizable tensor is stored as: ``quant``, or per tensor in a Q4_K_M file."""
    if quant == "Q4_K_M":
        return q4_k_m_type(t.name, t.ne[0], s["n_layer"], tied=s["tied"])
    return _QTYPES[quant]


def _std(t: _T) -> float:
    """The standard deviation :func:`_draw` gives a matrix."""
    return t.gain if t.init == "embd" else t.gain / float(np.sqrt(t.ne[0]))


def write_tiny_model(
    path: str | Path,
    arch: Arch,
    *,
    seed: int = 0,
    base_seed: int | None = None,
    noise: float = 0.0,
    quant: Quant = "F32",
    shape: Mapping[str, Any] | None = None,
    name: str | None = None,
    mtp: int = 0,
    values: Mapping[str, Callable[[], np.ndarray]] | None = None,
) -> Path:
    """Write a GGUF of architecture ``arch`` with random weights to ``path`` and return the path.
    ``mtp``: multi-token-prediction blocks after the trunk (:mod:`app.tiny_mtp`).

    ``shape`` overrides hyperparameters of :data:`DEFAULT_SHAPES` (see :func:`model_shape`), e.g.
    :data:`QWEN35_2B_SHAPE`; an ``n_vocab`` above 509 pads the vocabulary with tokens ``<padN>``.

    Weights are drawn tensor by tensor from ``numpy.random.default_rng([seed, i])``. With ``base_seed``
    they are the weights of model ``base_seed`` plus gaussian noise (from ``seed``) of ``noise`` times each
    tensor's standard deviation: a draft of that model. Deterministic.

    ``quant`` "Q4_0" or "Q8_0" quantizes the weight matrices (norms, biases, convolutions, state-space
    parameters and the MoE router stay F32); "Q4_K_M" gives each matrix the type llama.cpp's quantizer
    would (:func:`app.tiny_quants.q4_k_m_type`), always as random blocks (no draft ``noise``). Matrices
    of at least :data:`RAW_MIN_ELEMENTS` values are written as random quantized blocks directly
    (:mod:`app.tiny_quants`), which takes seconds for a 2B model where quantizing floats would take
    many minutes; "F32" is refused for models above 2**28 parameters.

    ``values`` gives some tensors chosen values instead (by name: a function returning the array in
    numpy's shape, called when the tensor is written): a matrix the file quantizes is stored as Q8_0,
    anything else as F32.

    At a real shape a draft is far more sensitive to ``noise`` than a tiny one (24 layers, 248320 logits
    with small gaps): about 0.01 gives the ~60% agreement that :data:`DEFAULT_NOISE` gives the tiny ones
    (measured at :data:`QWEN35_0_8B_SHAPE` and :data:`QWEN35_2B_SHAPE`, Q4_0). Most tokens such a model
    generates are ``<padN>`` ones, its vocabulary being mostly padding.
    """
    if quant not in _FILE_TYPES:
        raise ValueError(f"quant must be one of {', '.join(_FILE_TYPES)}, not {quant!r}")
    s = model_shape(arch, shape)
    values = values or {}
    kv, tensors = _plan(arch, s)
    if mtp:
        from app.tiny_mtp import add_mtp_blocks

        add_mtp_blocks(arch, s, mtp, kv, tensors)
    n_params = sum(int(np.prod(t.ne)) for t in tensors)
    if quant == "F32" and n_params > 1 << 28:
        raise ValueError(f"{n_params:,} parameters in F32: give quant='Q4_0' or 'Q8_0' for a model this big")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = GGUFWriter(path, arch)
    writer.add_name(name or f"tiny-{arch}")
    writer.add_file_type(_FILE_TYPES[quant])
    writer.add_vocab_size(s["n_vocab"])
    add_hparams(writer, arch, kv)

    add_tokenizer(writer, build_tokenizer("a"), s["n_vocab"])
    writer.add_chat_template(CHATML_TEMPLATE)

    # Tensor infos first, data afterwards one tensor at a time: a big model never sits in memory whole.
    for t in tensors:
        np_shape = t.ne[::-1]
        if _quantizable(t, quant):
            qtype = GGMLQuantizationType.Q8_0 if t.name in values else _qtype(t, quant, s)
            byte_shape = quant_shape_to_byte_shape(np_shape, qtype)
            writer.add_tensor_info(
                t.name, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)), raw_dtype=qtype
            )
        else:
            writer.add_tensor_info(t.name, np_shape, np.dtype(np.float32), 4 * int(np.prod(np_shape)))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for i, t in enumerate(tensors):
        if t.name in values:
            w = np.asarray(values[t.name](), dtype=np.float32).reshape(t.ne[::-1])
            q8 = GGMLQuantizationType.Q8_0
            writer.write_tensor_data(quantize(w, q8) if _quantizable(t, quant) else w)
            continue
        rng = np.random.default_rng([seed if base_seed is None else base_seed, i])
        noise_rng = None if base_seed is None else np.random.default_rng([seed, i, 1])
        if _quantizable(t, quant) and (quant == "Q4_K_M" or int(np.prod(t.ne)) >= RAW_MIN_ELEMENTS):
            qtype = _qtype(t, quant, s)
            blocks = random_blocks(qtype, int(np.prod(t.ne)), _std(t), rng, noise_rng, noise)
            writer.write_tensor_data(blocks.reshape(quant_shape_to_byte_shape(t.ne[::-1], qtype)))
            continue
        w = _draw(t, rng)
        if noise_rng is not None and noise > 0:
            w = w + np.float32(noise * float(w.std())) * noise_rng.standard_normal(w.shape, dtype=np.float32)
            if t.init == "a":
                w = np.minimum(w, np.float32(-1e-3))  # a decay must stay a decay
            w = w.astype(np.float32)
        writer.write_tensor_data(quantize(w, _QTYPES[quant]) if _quantizable(t, quant) else w)
    writer.close()
    return path


def write_tiny_arch_pair(
    directory: str | Path,
    arch: Arch,
    *,
    noise: float | None = None,
    quant: Quant = "F32",
) -> tuple[Path, Path]:
    """Write a target (seed 0) of ``arch`` and its draft (its weights plus ``noise``, by default
    :data:`DEFAULT_NOISE` of the architecture) into ``directory``; both share the tokenizer."""
    directory = Path(directory)
    suffix = "" if quant == "F32" else f"-{quant.lower()}"
    target = write_tiny_model(
        directory / f"tiny-{arch}-target{suffix}.gguf", arch, seed=0, quant=quant, name=f"tiny-{arch}-target"
    )
    draft = write_tiny_model(
        directory / f"tiny-{arch}-draft{suffix}.gguf",
        arch,
        seed=1,
        base_seed=0,
        noise=DEFAULT_NOISE[arch] if noise is None else noise,
        quant=quant,
        name=f"tiny-{arch}-draft",
    )
    return target, draft
