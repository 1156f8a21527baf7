"""GGUF quantized blocks into the engine's kernel layouts (layers/quantized_weight.py), tensor by tensor.

Q4_0, Q4_1 and Q4_K are int4 with a scale and an offset per 32 weights: their 4-bit codes are copied
as they are and their block scales become the int4 kernel's scale and zero, so the only change is the
kernel's bf16 rounding of the scales. Q8_0 is the int8 kernel's own layout (layers/q8_blocks.py): codes
and block scales are kept exactly. Q5_K and Q6_K have no kernel of their own: each tensor is dequantized
a few rows at a time (gguf's reference code) and requantized to int8 per block of 32.
docs/engine.md states both losses; tests/enclave_worker/engine/test_checkpoint_gguf_quant.py measures them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .errors import CheckpointError
from .layers.q8_blocks import quantize_blocks
from .layers.quantized_weight import INT8_BLOCK, QuantizedWeight, QuantSpec

INT4_TYPES = ("Q4_0", "Q4_1", "Q4_K")
INT8_TYPES = ("Q8_0", "Q5_K", "Q6_K")
NATIVE_TYPES = INT4_TYPES + INT8_TYPES
_BLOCK_BYTES = {"Q4_0": (32, 18), "Q4_1": (32, 20), "Q4_K": (256, 144), "Q8_0": (32, 34), "Q5_K": (256, 176),
                "Q6_K": (256, 210)}


def _blocks(data: Any, qtype: str, shape: tuple[int, int], name: str) -> np.ndarray:
    """The tensor's bytes as [rows, blocks per row, block bytes], after checking their size."""
    n, k = shape
    per_block, nbytes = _BLOCK_BYTES[qtype]
    raw = np.asarray(data)
    if raw.dtype != np.uint8 or k % per_block or raw.size != n * (k // per_block) * nbytes:
        raise CheckpointError(f"GGUF tensor {name}: {qtype} data of {raw.size} bytes ({raw.dtype}) does not fit "
                              f"shape {shape} ({per_block}-weight blocks of {nbytes} bytes)")
    return raw.reshape(n, k // per_block, nbytes)


def _f16(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)[..., 0]


def _pack_pairs(q: np.ndarray, n: int, k: int) -> torch.Tensor:
    """4-bit codes [.., 32] in weight order -> uint8 [n, k/2], byte i = q[2i] | q[2i+1] << 4."""
    flat = q.reshape(n, k)
    return torch.from_numpy(np.ascontiguousarray(flat[:, 0::2] | (flat[:, 1::2] << 4)))


def gguf_int4(data: Any, qtype: str, shape: tuple[int, int], name: str) -> QuantizedWeight:
    """A Q4_0 / Q4_1 / Q4_K tensor as int4 codes with group-32 scales and zeros (no float weights)."""
    from gguf.quants import Q4_K

    n, k = shape
    b = _blocks(data, qtype, shape, name)
    if qtype in ("Q4_0", "Q4_1"):
        d = _f16(b[..., 0:2])  # [n, k/32]
        off = 2 if qtype == "Q4_0" else 4
        qs = b[..., off : off + 16]  # weight j in the low nibble of byte j, weight 16 + j in the high one
        q = np.concatenate([qs & 0xF, qs >> 4], axis=-1)
        zeros = np.zeros_like(d) if qtype == "Q4_0" else _f16(b[..., 2:4]) + 8.0 * d  # w = q d + m
        scales = d
    else:  # Q4_K: 256-weight super-blocks, 8 sub-blocks of 32 with 6-bit scales and mins
        nb = b.shape[1]
        d, dmin = _f16(b[..., 0:2])[..., None], _f16(b[..., 2:4])[..., None]  # [n, nb, 1]
        sc, mn = Q4_K.get_scale_min(np.ascontiguousarray(b[..., 4:16]).reshape(n * nb, 12))
        scales = (d * sc.reshape(n, nb, 8).astype(np.float32)).reshape(n, k // 32)
        mins = (dmin * mn.reshape(n, nb, 8).astype(np.float32)).reshape(n, k // 32)
        zeros = 8.0 * scales - mins  # w = d sc q - dmin m = (q - 8) scale + zero
        qs = b[..., 16:].reshape(n, nb, 4, 1, 32)  # chunk j: sub-block 2j low nibbles, 2j + 1 high nibbles
        q = np.concatenate([qs & 0xF, qs >> 4], axis=3)
    spec = QuantSpec("int4", shape, 32, f"gguf:{qtype}")
    return QuantizedWeight(_pack_pairs(q, n, k), spec, torch.from_numpy(np.ascontiguousarray(scales, np.float32)),
                           torch.from_numpy(np.ascontiguousarray(zeros, np.float32)))


_ROWS_PER_CHUNK = 256  # rows dequantized at a time: the float32 transient stays a few MB


def gguf_int8(data: Any, qtype: str, shape: tuple[int, int], name: str) -> QuantizedWeight:
    """A Q8_0 / Q5_K / Q6_K tensor as int8 codes with a scale per block of 32 along K. Q8_0 is that
    layout: its codes and (half-precision) scales are taken as they are. Q5_K and Q6_K are dequantized a
    few rows at a time (gguf's reference code) and requantized per block of 32: no float copy of the tensor."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    n, k = shape
    b = _blocks(data, qtype, shape, name)
    spec = QuantSpec("int8", shape, INT8_BLOCK, f"gguf:{qtype}")
    if qtype == "Q8_0":  # block: d (fp16), then 32 int8 codes
        codes = torch.from_numpy(np.ascontiguousarray(b[..., 2:]).view(np.int8).reshape(n, k))
        return QuantizedWeight(codes, spec, torch.from_numpy(np.ascontiguousarray(_f16(b[..., 0:2]))))
    flat = b.reshape(n, -1)
    codes = torch.empty((n, k), dtype=torch.int8)
    scales = torch.empty((n, k // INT8_BLOCK), dtype=torch.float32)
    for i in range(0, n, _ROWS_PER_CHUNK):
        w = torch.from_numpy(np.asarray(dequantize(flat[i : i + _ROWS_PER_CHUNK], GGMLQuantizationType[qtype]),
                                        dtype=np.float32).reshape(-1, k))
        if not bool(torch.isfinite(w).all()):
            raise CheckpointError(f"GGUF tensor {name}: non-finite {qtype} block scales")
        codes[i : i + w.shape[0]], scales[i : i + w.shape[0]] = quantize_blocks(w)
        w.zero_()  # the float rows: plaintext
    return QuantizedWeight(codes, spec, scales)


def gguf_native(data: Any, qtype: str, shape: tuple[int, ...], name: str) -> QuantizedWeight:
    """One GGUF linear weight in the engine's kernel layout; a type the engine has no path for is refused."""
    if qtype not in NATIVE_TYPES:
        raise CheckpointError(f"GGUF tensor {name} is {qtype}: the engine loads {', '.join(NATIVE_TYPES)}, "
                              "F32, F16 and BF16")
    if len(shape) != 2:
        raise CheckpointError(f"GGUF tensor {name}: a {qtype} linear weight must be 2-D, not {shape}")
    n, k = int(shape[0]), int(shape[1])
    w = (gguf_int4 if qtype in INT4_TYPES else gguf_int8)(data, qtype, (n, k), name)
    if not bool(torch.isfinite(w.scales).all()) or (w.zeros is not None and not bool(torch.isfinite(w.zeros).all())):
        raise CheckpointError(f"GGUF tensor {name}: non-finite {qtype} block scales")
    return w
