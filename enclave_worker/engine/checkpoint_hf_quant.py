"""HF quantized checkpoints (AWQ, GPTQ, compressed-tensors W4A16 and FP8) into the engine's kernel
layouts (layers/quantized_weight.py), one weight at a time, without float weights.

The 4-bit formats all compute w = (q - z) * s per group of input columns; the int4 kernel computes
(q - 8) * scale + zero, so the codes are only unpacked from the format's int32 words and re-paired,
and zero = (8 - z) * s. compressed-tensors FP8 weights are the FP8 kernel's codes as they are; a
per-tensor scale is broadcast to every channel. Layouts, from the formats' own code and docs:

- AWQ (AutoAWQ GEMM): qweight int32 [K, N/8], qzeros int32 [K/g, N/8], nibble i of a word holds
  column 8c + (0, 2, 4, 6, 1, 3, 5, 7)[i]; scales fp16 [K/g, N].
- GPTQ (AutoGPTQ): qweight int32 [K/8, N], nibble i of word r holds row 8r + i; qzeros int32 [G, N/8]
  holding z - 1 ("gptq") or z ("gptq_v2"); scales fp16 [G, N]; g_idx int32 [K] the group of each input
  column (act-order: not k // g, and the layer permutes its input).
- compressed-tensors pack-quantized: weight_packed int32 [N, K/8], nibble i of word c holds column
  8c + i as q + 8; weight_scale [N, K/g] (group) or [N, 1] (channel); weight_zero_point (asymmetric)
  int32 [N/8, K/g] packed along rows; weight_shape [2].
- compressed-tensors float-quantized: weight float8_e4m3fn [N, K]; weight_scale [N, 1] or [1].
"""

from __future__ import annotations

import sys
from collections.abc import MutableMapping
from typing import Any

import torch

from .errors import CheckpointError
from .layers.quantized_weight import INT4_GROUP_SIZES, QuantizedWeight, QuantSpec, validate

_AWQ_UNDO = (0, 4, 1, 5, 2, 6, 3, 7)  # natural column j is nibble _AWQ_UNDO[j] of an AWQ word
assert sys.byteorder == "little"  # safetensors and GGUF data are little-endian; so is every CPU we run on


def _nibbles(words: torch.Tensor, name: str) -> torch.Tensor:
    """int32 [..., C] -> uint8 [..., C, 8]: nibble i of each word (i = 0 the lowest bits)."""
    if words.dtype != torch.int32:
        raise CheckpointError(f"{name}: packed 4-bit weights must be int32, not {words.dtype}")
    # Byte j of a little-endian word holds nibbles 2j (low) and 2j + 1: uint8 work, a byte a weight at most.
    b = words.contiguous().view(torch.uint8).reshape(*words.shape, 4)
    return torch.stack([b & 0xF, b >> 4], -1).reshape(*words.shape, 8)


def _pair(q: torch.Tensor) -> torch.Tensor:
    """uint8 codes [N, K] (0..15) -> the int4 layout's bytes [N, K/2]."""
    return (q[:, 0::2] | (q[:, 1::2] << 4)).contiguous()


def _group_size(g: int, k: int, name: str) -> tuple[int, int]:
    """(the checkpoint's group, the kernel's group): a per-channel scale (-1 or k) repeats over groups."""
    if g in (-1, 0, k):
        kernel = next((s for s in (128, 64, 32) if k % s == 0), 0)
        if not kernel:
            raise CheckpointError(f"{name}: in_features {k} is not a multiple of 32")
        return k, kernel
    if g not in INT4_GROUP_SIZES or k % g:
        raise CheckpointError(f"{name}: group size {g} with in_features {k}: the int4 kernel takes "
                              f"{INT4_GROUP_SIZES}")
    return g, g


def _int4(q_nk: torch.Tensor, s_ng: torch.Tensor, z_ng: torch.Tensor, g: int, kernel_g: int, source: str,
          perm: torch.Tensor | None, name: str) -> QuantizedWeight:
    """Codes [N, K] 0..15 with w = (q - z) * s per checkpoint group -> the int4 kernel's layout."""
    n, k = q_nk.shape
    s, z = s_ng.float(), z_ng.float()
    if kernel_g != g:  # per-channel: the same scale for every kernel group
        s, z = s.repeat_interleave(k // kernel_g, 1), z.repeat_interleave(k // kernel_g, 1)
    w = QuantizedWeight(_pair(q_nk), QuantSpec("int4", (n, k), kernel_g, source), s.contiguous(),
                        ((8.0 - z) * s).contiguous(), perm)
    validate(w, name)
    return w


def _take(tensors: MutableMapping[str, torch.Tensor], name: str) -> torch.Tensor:
    try:
        return tensors.pop(name)
    except KeyError:
        raise CheckpointError(f"the checkpoint has no tensor {name}") from None


def _shape_check(t: torch.Tensor, shape: tuple[int, ...], name: str) -> None:
    if tuple(t.shape) != shape:
        raise CheckpointError(f"{name}: shape {tuple(t.shape)}, expected {shape}")


def awq(tensors: MutableMapping[str, torch.Tensor], p: str, g: int) -> QuantizedWeight:
    qweight, qzeros, scales = _take(tensors, p + "qweight"), _take(tensors, p + "qzeros"), _take(tensors, p + "scales")
    if qweight.dim() != 2:
        raise CheckpointError(f"{p}qweight: must be 2-D, not {tuple(qweight.shape)}")
    k, n = qweight.shape[0], qweight.shape[1] * 8
    g, kg = _group_size(g, k, p + "qweight")
    _shape_check(qzeros, (k // g, n // 8), p + "qzeros")
    _shape_check(scales, (k // g, n), p + "scales")
    undo = list(_AWQ_UNDO)
    q = _nibbles(qweight, p + "qweight")[..., undo].reshape(k, n).T
    z = _nibbles(qzeros, p + "qzeros")[..., undo].reshape(k // g, n).T
    return _int4(q.contiguous(), scales.T, z, g, kg, "awq", None, p + "qweight")


def gptq(tensors: MutableMapping[str, torch.Tensor], p: str, g: int, v2: bool) -> QuantizedWeight:
    qweight, qzeros, scales = _take(tensors, p + "qweight"), _take(tensors, p + "qzeros"), _take(tensors, p + "scales")
    g_idx = tensors.pop(p + "g_idx", None)
    if qweight.dim() != 2:
        raise CheckpointError(f"{p}qweight: must be 2-D, not {tuple(qweight.shape)}")
    k, n = qweight.shape[0] * 8, qweight.shape[1]
    g, kg = _group_size(g, k, p + "qweight")
    groups = k // g
    _shape_check(qzeros, (groups, n // 8), p + "qzeros")
    _shape_check(scales, (groups, n), p + "scales")
    q = _nibbles(qweight, p + "qweight").permute(0, 2, 1).reshape(k, n).T.contiguous()  # [N, K]
    z = _nibbles(qzeros, p + "qzeros").reshape(groups, n).T.float() + (0.0 if v2 else 1.0)
    perm = None
    if g_idx is not None:
        _shape_check(g_idx, (k,), p + "g_idx")
        g_idx = g_idx.long()
        if not torch.equal(g_idx, torch.arange(k) // g):  # act-order: sort the columns by their group
            if g_idx.min() < 0 or not torch.equal(torch.bincount(g_idx, minlength=groups), torch.full((groups,), g)):
                raise CheckpointError(f"{p}g_idx: groups must each hold {g} of the {k} input columns")
            perm = torch.sort(g_idx, stable=True).indices
            q = q[:, perm].contiguous()
    return _int4(q, scales.T, z, g, kg, "gptq_v2" if v2 else "gptq", perm, p + "qweight")


def ct_int4(tensors: MutableMapping[str, torch.Tensor], p: str, args: dict[str, Any]) -> QuantizedWeight:
    packed, scale = _take(tensors, p + "weight_packed"), _take(tensors, p + "weight_scale")
    shape_t = tensors.pop(p + "weight_shape", None)
    if packed.dim() != 2:
        raise CheckpointError(f"{p}weight_packed: must be 2-D, not {tuple(packed.shape)}")
    n, k = packed.shape[0], packed.shape[1] * 8
    if shape_t is not None and [int(v) for v in shape_t.tolist()] != [n, k]:
        raise CheckpointError(f"{p}weight_shape {shape_t.tolist()} does not match the packed weight [{n}, {k}]")
    strategy = args.get("strategy")
    g, kg = _group_size(int(args.get("group_size") or -1) if strategy == "group" else -1, k, p + "weight_packed")
    _shape_check(scale, (n, k // g), p + "weight_scale")
    q = _nibbles(packed, p + "weight_packed").reshape(n, k)
    zp = tensors.pop(p + "weight_zero_point", None)
    if args.get("symmetric", True):
        z = torch.full((n, k // g), 8.0)
    else:  # stored signed, packed along rows (pack_to_int32(..., packed_dim=0)) as zp + 8
        if zp is None:
            raise CheckpointError(f"{p}: an asymmetric scheme needs weight_zero_point")
        _shape_check(zp, ((n + 7) // 8, k // g), p + "weight_zero_point")
        z = _nibbles(zp, p + "weight_zero_point").permute(0, 2, 1).reshape(-1, k // g)[:n].float()
    return _int4(q, scale, z, g, kg, "compressed-tensors:w4a16", None, p + "weight_packed")


def ct_fp8(tensors: MutableMapping[str, torch.Tensor], p: str) -> QuantizedWeight:
    w, scale = _take(tensors, p + "weight"), _take(tensors, p + "weight_scale")
    tensors.pop(p + "input_scale", None)  # activations are scaled per token at run time (docs/engine.md)
    if w.dtype != torch.float8_e4m3fn or w.dim() != 2:
        raise CheckpointError(f"{p}weight: FP8 weights must be 2-D float8_e4m3fn, not {w.dtype} {tuple(w.shape)}")
    n = w.shape[0]
    if scale.numel() == 1:
        s = scale.float().reshape(1).expand(n).contiguous()
    elif tuple(scale.shape) in ((n, 1), (n,)):
        s = scale.float().reshape(n).contiguous()
    else:
        raise CheckpointError(f"{p}weight_scale: shape {tuple(scale.shape)} is neither per tensor nor per "
                              f"channel of {n} rows (block FP8 is not served)")
    out = QuantizedWeight(w, QuantSpec("fp8", (n, w.shape[1]), 0, "compressed-tensors:fp8"), s)
    validate(out, p + "weight")
    return out


def _ct_args(qc: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The one config group's weight arguments (one scheme per checkpoint)."""
    groups = qc.get("config_groups") or {}
    if len(groups) != 1:
        raise CheckpointError(f"compressed-tensors: {len(groups)} config groups; the engine serves one scheme")
    group = next(iter(groups.values()))
    weights = group.get("weights") or {}
    fmt = group.get("format") or qc.get("format")
    kind = (weights.get("type"), weights.get("num_bits"))
    if fmt == "pack-quantized" and kind == ("int", 4) and weights.get("strategy") in ("group", "channel"):
        return "w4a16", weights
    if fmt in ("float-quantized", "naive-quantized") and kind == ("float", 8) and \
            weights.get("strategy") in ("tensor", "channel"):
        return "fp8", weights
    raise CheckpointError(f"compressed-tensors format {fmt!r} with weights {kind} strategy "
                          f"{weights.get('strategy')!r}: the engine serves pack-quantized int4 (group, channel) "
                          "and float-quantized FP8 (tensor, channel)")


def convert(config: dict[str, Any], tensors: MutableMapping[str, torch.Tensor]) -> None:
    """Replace each quantized layer's tensors in ``tensors`` by one QuantizedWeight at ``<layer>.weight``."""
    qc = config.get("quantization_config")
    if not qc:
        return
    method = qc.get("quant_method")
    bits = qc.get("bits", 4)
    if method in ("awq", "gptq") and bits != 4:
        raise CheckpointError(f"{method} with {bits} bits: the engine serves 4-bit {method}")
    if method == "awq" and str(qc.get("version", "gemm")).lower() != "gemm":
        raise CheckpointError(f"AWQ version {qc.get('version')!r}: the engine serves the GEMM layout")
    if method == "awq" and not qc.get("zero_point", True):
        raise CheckpointError("AWQ without zero points: the engine serves zero_point=True")
    if method == "compressed-tensors":
        kind, args = _ct_args(qc)
        marker = "weight_packed" if kind == "w4a16" else "weight_scale"
    elif method in ("awq", "gptq"):
        marker = "qweight"
    else:
        raise CheckpointError(f"quantization method {method!r}: the engine serves awq, gptq and compressed-tensors")
    prefixes = [name[: -len(marker)] for name in tensors if name.endswith("." + marker)]
    if not prefixes:
        raise CheckpointError(f"a {method} checkpoint without any quantized tensor ({marker})")
    for p in prefixes:
        if method == "awq":
            w = awq(tensors, p, int(qc.get("group_size", 128)))
        elif method == "gptq":
            w = gptq(tensors, p, int(qc.get("group_size", 128)), qc.get("checkpoint_format") == "gptq_v2")
        elif kind == "w4a16":
            w = ct_int4(tensors, p, args)
        else:
            w = ct_fp8(tensors, p)
        tensors[p + "weight"] = w
