"""Random quantized blocks of the types a Q4_K_M file holds (Q4_K, Q6_K and their fallbacks Q5_0, Q8_0),
and which type each tensor of a Q4_K_M file gets, as the pinned llama.cpp's quantizer chooses it.

For benchmarks on models of a real shape (:mod:`app.tiny_arch`, ``quant="Q4_K_M"``): a 7B model's
matrices are written as random bytes with their scales set, in seconds, since quantizing floats to
k-quants would take many minutes (and the ``gguf`` package cannot). Every block decodes to finite
values with a chosen standard deviation and a mean near 0. Block layouts follow ggml's
``ggml-common.h``:

- ``block_q4_K`` (256 values, 144 bytes): f16 ``d``, f16 ``dmin``, 12 bytes of eight 6-bit scales and
  eight 6-bit mins, 128 bytes of 4-bit quants; a value is ``d * sc * q - dmin * m``.
- ``block_q6_K`` (256 values, 210 bytes): 128 bytes of low 4 bits, 64 of high 2 bits, sixteen int8
  scales, f16 ``d``; a value is ``d * sc * (q - 32)``.
- ``block_q5_0`` (32 values, 22 bytes): f16 ``d``, 4 bytes of high bits, 16 of low nibbles;
  ``d * (q - 16)``.
- ``block_q8_0`` (32 values, 34 bytes): f16 ``d``, 32 int8; ``d * q``.

Imports only numpy and gguf.
"""

from __future__ import annotations

import re

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

__all__ = ["F16_MIN", "SPREAD", "noisy_blocks", "q4_k_m_type", "random_blocks"]

Q = GGMLQuantizationType

F16_MIN = 2.0**-24
"""f16's smallest positive number: a block's ``d`` is never below it (never 0). Small matrices get
subnormal scales, as real files do (a Q6_K FFN down projection of std 0.0014 has a ``d`` near 1e-6)."""

# The standard deviation of a block's values in units of its d, for random bytes: Q4_K with
# dmin = 7.5 d (so that the mean is 0): d * (sc * q - 7.5 m), sc, m uniform in 0..63 and q in 0..15;
# Q6_K: int8 scales times (q - 32) with q uniform in 0..63; Q5_0: q - 16.
_E_SC2 = 63 * 127 / 6  # E[sc^2] for sc uniform in 0..63
SPREAD: dict[Q, float] = {
    Q.Q4_K: float(np.sqrt(_E_SC2 * 77.5 - (31.5 * 7.5) ** 2 + 7.5**2 * (64**2 - 1) / 12)),
    Q.Q6_K: float(np.sqrt((256**2 - 1) / 12 * ((64**2 - 1) / 12 + 0.25))),
    Q.Q5_0: float(np.sqrt((32**2 - 1) / 12 + 0.25)),
}
# the standard deviation of a uniformly random quant (nibble - 8 of Q4_0, int8 of Q8_0), in units of d
_LEGACY_SPREAD = {Q.Q4_0: float(np.sqrt((16**2 - 1) / 12)), Q.Q8_0: float(np.sqrt((256**2 - 1) / 12))}
# where a block's f16 d sits (byte offset), and Q4_K's dmin
_D_AT = {Q.Q4_K: 0, Q.Q6_K: 208, Q.Q5_0: 0}


def _f16_bytes(x: float) -> tuple[int, int]:
    lo, hi = np.frombuffer(np.float16(x).tobytes(), dtype=np.uint8)
    return int(lo), int(hi)


def random_blocks(
    qtype: Q,
    n_values: int,
    std: float,
    rng: np.random.Generator,
    noise_rng: np.random.Generator | None = None,
    noise: float = 0.0,
) -> np.ndarray:
    """``n_values`` values (a multiple of the type's block size) as random blocks of ``qtype``, one
    row of bytes per block, whose values have about ``std`` as standard deviation and mean 0 (each
    block's d has a random sign where the quants' mean is not 0; Q4_K's mins cancel it).

    Q4_0 and Q8_0 are :func:`noisy_blocks` (a draft's ``noise`` too); the other types take no noise."""
    if qtype in _LEGACY_SPREAD:
        return noisy_blocks(qtype, n_values, std, rng, noise_rng, noise)
    if noise_rng is not None and noise > 0:
        raise ValueError(f"no draft noise for {qtype.name} blocks: give Q4_0 or Q8_0")
    if qtype not in SPREAD:
        raise ValueError(
            f"no random blocks for {qtype.name}: expected one of {', '.join(t.name for t in SPREAD)}"
        )
    block, size = GGML_QUANT_SIZES[qtype]
    if n_values % block:
        raise ValueError(f"{n_values} values are not whole {qtype.name} blocks of {block}")
    n = n_values // block
    data = np.frombuffer(bytearray(rng.bytes(n * size)), dtype=np.uint8).reshape(n, size)
    d = max(std / SPREAD[qtype], F16_MIN)
    at = _D_AT[qtype]
    lo, hi = _f16_bytes(d)
    data[:, at] = lo
    if qtype == Q.Q4_K:
        data[:, at + 1] = hi
        data[:, 2], data[:, 3] = _f16_bytes(7.5 * d)  # dmin: d * sc * q - dmin * m has mean 0
    elif qtype == Q.Q6_K:
        data[:, at + 1] = hi  # int8 scales have mean -0.5 and q - 32 too: the mean is d / 4, ~0
    else:  # Q5_0's quants q - 16 have mean -0.5: a random sign per block
        data[:, at + 1] = (data[:, at + 1] & 0x80) | hi
    return data


_BLK = re.compile(r"blk\.(\d+)\.")


def _more_bits(i: int, n: int) -> bool:
    """llama.cpp's ``use_more_bits``: the first and last eighth of the layers and every third between."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def q4_k_m_type(name: str, ne0: int, n_layer: int, *, tied: bool) -> Q:
    """The type llama.cpp's quantizer gives tensor ``name`` (a weight matrix of rows of ``ne0``) in a
    Q4_K_M file of a dense model of ``n_layer`` layers (``src/llama-quant.cpp``): the output matrix
    (the token embeddings where they are tied to it) Q6_K, or Q8_0 where its rows are not whole
    256-value blocks; V projections and FFN down projections of the layers ``use_more_bits`` picks Q6_K;
    the rest Q4_K. A k-quant on rows that are not whole blocks falls back to Q5_0 (Q4_K) or Q8_0 (Q6_K),
    as for Qwen2.5-0.5B's rows of 896."""
    output = name == "output.weight" or (tied and name == "token_embd.weight")
    if output:
        return Q.Q6_K if ne0 % 256 == 0 else Q.Q8_0
    m = _BLK.match(name)
    layer = int(m.group(1)) if m else -1
    more = m is not None and ("attn_v.weight" in name or "ffn_down" in name) and _more_bits(layer, n_layer)
    want = Q.Q6_K if more else Q.Q4_K
    if ne0 % 256 == 0:
        return want
    return Q.Q8_0 if want == Q.Q6_K else Q.Q5_0


def noisy_blocks(
    qtype: Q,
    n_values: int,
    std: float,
    rng: np.random.Generator,
    noise_rng: np.random.Generator | None = None,
    noise: float = 0.0,
) -> np.ndarray:
    """Random Q4_0 or Q8_0 blocks (uniform quants, one scale of a random sign per block, giving ``std``),
    one row of bytes per block; with ``noise_rng``, those of a draft of the same ``rng``'s model.

    A draft's noise replaces a random fraction (a binomial count, at uniform positions) of the quant
    bytes with fresh random ones: ``noise**2 / 2`` of Q8_0's, ``noise**2 / 4`` of Q4_0's (two quants a
    byte), which deviates from the base by about ``noise`` relative, like gaussian noise on floats.
    """
    block, block_bytes = GGML_QUANT_SIZES[qtype]
    data = np.frombuffer(bytearray(rng.bytes(n_values // block * block_bytes)), dtype=np.uint8)
    data = data.reshape(-1, block_bytes)
    lo, hi = np.frombuffer(np.float16(std / _LEGACY_SPREAD[qtype]).tobytes(), dtype=np.uint8)
    data[:, 0] = lo
    data[:, 1] = (data[:, 1] & 0x80) | hi  # a random sign per block: uniform quants have mean -0.5
    if noise_rng is not None and noise > 0:
        n_quant_bytes = data.shape[0] * (block_bytes - 2)
        per_byte = 4 if qtype == Q.Q4_0 else 2  # a Q4_0 byte holds two quants
        where = noise_rng.integers(
            0, n_quant_bytes, noise_rng.binomial(n_quant_bytes, min(1.0, noise**2 / per_byte))
        )
        fresh = noise_rng.integers(0, 256, len(where), dtype=np.uint8)
        data[where // (block_bytes - 2), 2 + where % (block_bytes - 2)] = fresh
    return data
