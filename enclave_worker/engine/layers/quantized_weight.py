"""A weight kept in a quantized layout from the checkpoint to the kernel (no fp32 copy of the model).

Three schemes, each the layout of one kernel (layers/quantized_linear.py):

- ``int4``: codes uint8 [N, K/2], byte i of a row = q[2i] | q[2i+1] << 4 (q in 0..15); ``scales`` and
  ``zeros`` float32 [N, K/g]; w[n, k] = (q - 8) * scale[n, k // g] + zero[n, k // g] (the formula of
  torch's int4pack kernels). ``perm`` (int64 [K], optional): the codes' column k holds the checkpoint's
  input column perm[k] (GPTQ act-order), so the layer reads x[:, perm].
- ``int8``: codes int8 [N, K]; ``scales`` float32 [N] (group_size 0: a scale per output channel) or
  [N, K/32] (group_size 32: a scale per block of 32 along K, GGUF Q8_0's own); w = q * scale[n(, k // 32)].
- ``fp8``: codes float8_e4m3fn [N, K], ``scales`` float32 [N]; w = float(q) * scale[n].

A ``QuantizedWeight`` is a torch.Tensor subclass whose data are the codes, so it travels through the
checkpoint's tensor dict and the model builders unchanged; ``torch.cat`` along rows (the fused QKV and
gate/up projections) concatenates every component, or, for parts in different schemes (a GGUF Q4_K_M
keeps V in Q6_K), keeps them as row blocks the layer runs one after the other.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import CheckpointError

SCHEMES = ("int4", "int8", "fp8")
INT4_GROUP_SIZES = (32, 64, 128, 256)  # what torch's CPU int4pack kernel accepts
INT8_BLOCK = 32  # an int8 weight's block scales: per 32 along K (layers/q8_blocks.py)


@dataclass(frozen=True)
class QuantSpec:
    scheme: str  # "int4" | "int8" | "fp8" | "rows" (row blocks of other specs, after a mixed concat)
    shape: tuple[int, int]  # the logical weight [out_features, in_features]
    group_size: int = 0  # int4; int8: 32 for block scales, 0 for a scale per channel
    source: str = ""  # what the checkpoint held, e.g. "gguf:Q4_K", "awq", "gptq", "compressed-tensors:fp8"

    def to_json(self) -> dict[str, Any]:
        return {"scheme": self.scheme, "shape": list(self.shape), "group_size": self.group_size,
                "source": self.source}


class QuantizedWeight(torch.Tensor):
    """The codes of a quantized weight, with its scales (and zeros, perm) and ``spec`` attached."""

    spec: QuantSpec
    scales: torch.Tensor
    zeros: torch.Tensor | None
    perm: torch.Tensor | None
    parts: tuple[QuantizedWeight, ...]

    @staticmethod
    def __new__(cls, codes: torch.Tensor, spec: QuantSpec, scales: torch.Tensor, zeros: torch.Tensor | None = None,
                perm: torch.Tensor | None = None, parts: tuple[QuantizedWeight, ...] = ()) -> QuantizedWeight:
        obj = torch.Tensor._make_subclass(cls, codes)
        obj.spec, obj.scales, obj.zeros, obj.perm, obj.parts = spec, scales, zeros, perm, parts
        return obj

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # everything is set in __new__
        pass

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.cat:
            return concat_rows(list(args[0]), kwargs.get("dim", args[1] if len(args) > 1 else 0))
        if func is torch.Tensor.is_contiguous:
            return False  # never fused by aliasing adjacent storage (models/llama.py): cat keeps the scales
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)

    def codes(self) -> torch.Tensor:
        """The codes as a plain tensor (no subclass)."""
        return self.as_subclass(torch.Tensor)

    def permute_rows(self, index: torch.Tensor) -> QuantizedWeight:
        """The same weight with its output rows reordered (llama.cpp's Q/K layout undone)."""
        zeros = None if self.zeros is None else self.zeros[index].contiguous()
        return QuantizedWeight(self.codes()[index].contiguous(), self.spec, self.scales[index].contiguous(), zeros,
                               self.perm)


def concat_rows(parts: list[QuantizedWeight], dim: int) -> QuantizedWeight:
    if dim != 0 or not all(isinstance(p, QuantizedWeight) for p in parts):
        raise CheckpointError("quantized weights concatenate only with each other, along their rows")
    first = parts[0].spec
    rows = sum(p.spec.shape[0] for p in parts)
    same = all(p.spec.scheme == first.scheme != "rows" and p.spec.shape[1] == first.shape[1]
               and p.spec.group_size == first.group_size for p in parts)
    perms = [p.perm for p in parts]
    p0 = perms[0]
    same_perm = all(q is None for q in perms) or (p0 is not None and all(q is not None and torch.equal(q, p0)
                                                                         for q in perms))
    if same and same_perm:
        zs = [p.zeros for p in parts]
        zeros = None if zs[0] is None else torch.cat([z for z in zs if z is not None])
        spec = QuantSpec(first.scheme, (rows, first.shape[1]), first.group_size,
                         "+".join(sorted({p.spec.source for p in parts})))
        with torch._C.DisableTorchFunctionSubclass():
            codes = torch.cat([p.codes() for p in parts])
        return QuantizedWeight(codes, spec, torch.cat([p.scales for p in parts]), zeros, perms[0])
    flat = tuple(q for p in parts for q in (p.parts or (p,)))
    return QuantizedWeight(torch.empty(0, dtype=torch.uint8), QuantSpec("rows", (rows, first.shape[1])),
                           torch.empty(0), parts=flat)


def dequantize(w: QuantizedWeight) -> torch.Tensor:
    """The float32 weight [N, K] a quantized weight stands for (tests, and the reference of the docs' losses)."""
    n, k = w.spec.shape
    if w.spec.scheme == "rows":
        return torch.cat([dequantize(p) for p in w.parts])
    codes = w.codes()
    if w.spec.scheme == "int8" and w.spec.group_size:
        g = w.spec.group_size
        return (codes.float().reshape(n, k // g, g) * w.scales[..., None]).reshape(n, k)
    if w.spec.scheme == "int8":
        return codes.float() * w.scales[:, None]
    if w.spec.scheme == "fp8":
        return codes.float() * w.scales[:, None]
    q = torch.stack([codes & 0xF, codes >> 4], -1).reshape(n, k).float()
    g = w.spec.group_size
    assert w.zeros is not None
    out = ((q - 8).reshape(n, k // g, g) * w.scales[..., None] + w.zeros[..., None]).reshape(n, k)
    if w.perm is not None:
        original = torch.empty_like(out)
        original[:, w.perm] = out
        out = original
    return out


_COMPONENTS = ("scales", "zeros", "perm")
_CODE_DTYPES = {"int4": torch.uint8, "int8": torch.int8, "fp8": torch.float8_e4m3fn}


def validate(w: QuantizedWeight, name: str) -> None:
    """Every component's dtype and shape agrees with the spec (a hostile or truncated tensor is refused)."""
    s = w.spec
    if s.scheme not in SCHEMES:
        raise CheckpointError(f"{name}: unknown quantization scheme {s.scheme!r}")
    n, k = s.shape
    codes = w.codes()
    want: dict[str, tuple[tuple[int, ...], torch.dtype] | None] = {"scales": ((n,), torch.float32), "zeros": None,
                                                                     "perm": None}
    code_shape: tuple[int, ...] = (n, k)
    if s.scheme == "int8" and s.group_size:
        if s.group_size != INT8_BLOCK or k % s.group_size:
            raise CheckpointError(f"{name}: int8 block size {s.group_size} does not fit in_features {k} "
                                  f"(the kernel takes {INT8_BLOCK})")
        want["scales"] = ((n, k // s.group_size), torch.float32)
    if s.scheme == "int4":
        if s.group_size not in INT4_GROUP_SIZES or k % s.group_size:
            raise CheckpointError(f"{name}: int4 group size {s.group_size} does not fit in_features {k} "
                                  f"(the kernel takes {INT4_GROUP_SIZES})")
        code_shape = (n, k // 2)
        want["scales"] = want["zeros"] = ((n, k // s.group_size), torch.float32)
        if w.perm is not None:
            want["perm"] = ((k,), torch.int64)
            if not torch.equal(torch.sort(w.perm).values, torch.arange(k)):
                raise CheckpointError(f"{name}: the input permutation is not a permutation of {k} columns")
    if codes.dtype != _CODE_DTYPES[s.scheme] or tuple(codes.shape) != code_shape:
        raise CheckpointError(f"{name}: {s.scheme} codes are {codes.dtype} {tuple(codes.shape)}, "
                              f"expected {_CODE_DTYPES[s.scheme]} {code_shape}")
    for comp in _COMPONENTS:
        t, exp = getattr(w, comp), want[comp]
        if exp is None:
            if t is not None and comp != "perm":
                raise CheckpointError(f"{name}: unexpected {comp} for {s.scheme}")
            continue
        if t is None or tuple(t.shape) != exp[0] or t.dtype != exp[1]:
            got = None if t is None else (t.dtype, tuple(t.shape))
            raise CheckpointError(f"{name}: {comp} is {got}, expected {exp[1]} {exp[0]}")
    if not bool(torch.isfinite(w.scales).all()) or (w.zeros is not None and not bool(torch.isfinite(w.zeros).all())):
        raise CheckpointError(f"{name}: non-finite quantization scales")


# ---------------------------------------------------------------- package (de)serialisation


def flatten(tensors: Mapping[str, torch.Tensor]) -> tuple[list[tuple[str, torch.Tensor]], dict[str, Any]]:
    """Plain tensors for the package (name -> codes, name.scales, name.zeros, name.perm; fp8 codes as
    uint8 bytes) and the quantization metadata the package's metadata JSON carries."""
    out: list[tuple[str, torch.Tensor]] = []
    meta: dict[str, Any] = {}
    for name, t in tensors.items():
        if not isinstance(t, QuantizedWeight):
            out.append((name, t))
            continue
        codes = t.codes()
        out.append((name, codes.view(torch.uint8) if codes.dtype == torch.float8_e4m3fn else codes))
        for comp in _COMPONENTS:
            part = getattr(t, comp)
            if part is not None:
                out.append((f"{name}.{comp}", part))
        meta[name] = t.spec.to_json()
    return out, meta


def unflatten(tensors: MutableMapping[str, torch.Tensor], meta: Any) -> MutableMapping[str, torch.Tensor]:
    """The inverse of ``flatten`` on a decrypted package's tensors (views, no copies), each checked;
    without quantized weights, the mapping itself (a streamed package's stays lazy)."""
    if not meta:
        return tensors
    if not isinstance(meta, dict):
        raise CheckpointError("the package's quantization metadata is not an object")
    out = dict(tensors)
    for name, raw in meta.items():
        try:
            spec = QuantSpec(str(raw["scheme"]), (int(raw["shape"][0]), int(raw["shape"][1])),
                             int(raw.get("group_size", 0)), str(raw.get("source", "")))
            codes = out.pop(name)
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise CheckpointError(f"bad quantization metadata for {name!r}: {exc!r}") from exc
        if spec.scheme == "fp8" and codes.dtype == torch.uint8:
            codes = codes.view(torch.float8_e4m3fn)
        scales = out.pop(f"{name}.scales", None)
        if scales is None:
            raise CheckpointError(f"{name}: the package has no scales for this quantized weight")
        w = QuantizedWeight(codes, spec, scales, out.pop(f"{name}.zeros", None), out.pop(f"{name}.perm", None))
        validate(w, name)
        out[name] = w
    return out
