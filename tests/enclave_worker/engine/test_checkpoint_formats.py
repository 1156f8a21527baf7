"""Format acceptance (issue 48): every checkpoint format the engine reads, one table.

Each format's checkpoint is made by the format's own reference tooling where one installs here (gguf's
quantizer for Q4_0, Q4_1 and Q8_0; the compressed-tensors package for W4A16 and FP8; safetensors for
the dense dtypes) or packed to its written specification (gguf 0.19 has no k-quant quantizer; AWQ and
GPTQ have no installable reference tool: hf_quant_writers.py). For each:

- the load's own peak resident memory, measured in a fresh interpreter (quant_helpers.peak_loads), stays
  under a stated fraction of the model's float32 size: no float32 copy of the model is ever made (the
  quantized formats load at a quarter of it or less, the dense ones at their own size once);
- every linear comes back in the kernel layout the table names (none through float32), and the loaded
  weights and their outputs through the engine's kernel match the format's reference dequantization (gguf's
  ``dequantize``, compressed-tensors' ``decompress``, the AWQ/GPTQ formula w = (q - z) * s) within the
  stated tolerances.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from enclave_worker.engine import checkpoint
from enclave_worker.engine.layers.quantized_linear import quantized_linear
from enclave_worker.engine.layers.quantized_weight import QuantizedWeight
from enclave_worker.engine.layers.quantized_weight import dequantize as dequantize_weight
from tests.enclave_worker.engine.hf_quant_writers import awq_layer, ct_layer, gptq_layer, write_dir
from tests.enclave_worker.engine.quant_helpers import peak_loads, write_mixed_gguf

N = K = 1024  # HF formats: LAYERS down_proj weights of [N, K], 64 MiB as float32
LAYERS = 16
CHECKED = (0, LAYERS - 1)  # the layers compared with their reference (all of them are loaded)
GGUF_LAYERS, GGUF_HIDDEN, GGUF_INTER = 8, 512, 2048  # 116 MiB of linears as float32
GGUF_NAMES = {"ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj", "attn_v": "self_attn.v_proj"}

Refs = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Format:
    write: Callable[[Path], tuple[str, Refs]]  # -> the load (an expression over `checkpoint`), references
    peak: float  # bound on the load's peak memory, as a fraction of the model's float32 size
    scheme: str | None  # the kernel layout every linear loads into; None: dense, in the file's dtype
    exact: float  # bound on the relative L2 error of the loaded weights against the reference
    out: float  # the same for their output through the engine's kernel (bf16 activations, FP8 e4m3, int8 per block)


def _hf(layer: Callable[[np.random.Generator], tuple[dict[str, torch.Tensor], torch.Tensor, dict]]
        ) -> Callable[[Path], tuple[str, Refs]]:
    def write(path: Path) -> tuple[str, Refs]:
        rng = np.random.default_rng(7)
        tensors, refs, qc = {}, {}, {}
        for i in range(LAYERS):
            parts, ref, qc = layer(rng)
            p = f"model.layers.{i}.mlp.down_proj."
            tensors.update({p + k: v for k, v in parts.items()})
            if i in CHECKED:
                refs[p + "weight"] = ref
        write_dir(path, tensors, qc, shards=2)
        return f"checkpoint.load_hf_dir({str(path)!r})", refs
    return write


def _dense(dtype: torch.dtype) -> Callable[[Path], tuple[str, Refs]]:
    def write(path: Path) -> tuple[str, Refs]:
        g = torch.Generator().manual_seed(7)
        tensors = {f"model.layers.{i}.mlp.down_proj.weight": torch.randn(N, K, generator=g).to(dtype)
                   for i in range(LAYERS)}
        write_dir(path, tensors, shards=3)  # sharded, with the index
        return f"checkpoint.load_hf_dir({str(path)!r})", {n: t for n, t in tensors.items() if n.split(".")[2] in
                                                            {str(i) for i in CHECKED}}
    return write


def _gguf(qtype: str) -> Callable[[Path], tuple[str, Refs]]:
    def write(path: Path) -> tuple[str, Refs]:
        import gguf
        from gguf.quants import dequantize

        file = path.with_suffix(".gguf")
        write_mixed_gguf(file, hidden=GGUF_HIDDEN, inter=GGUF_INTER, layers=GGUF_LAYERS, qtype=qtype)
        refs = {}
        for t in gguf.GGUFReader(str(file)).tensors:  # the reference: gguf's own dequantization of the file
            kind, blk, rest = [*t.name.split(".", 2), "", ""][:3]
            if kind == "blk" and int(blk) in (0, GGUF_LAYERS - 1) and rest.removesuffix(".weight") in GGUF_NAMES:
                shape = tuple(int(d) for d in reversed(t.shape.tolist()))
                refs[f"model.layers.{blk}.{GGUF_NAMES[rest.removesuffix('.weight')]}.weight"] = torch.from_numpy(
                    np.asarray(dequantize(t.data, t.tensor_type), np.float32).reshape(shape).copy())
        return f"checkpoint.load_gguf({str(file)!r}, native=True)", refs
    return write


def _awq(rng: np.random.Generator) -> tuple[dict[str, torch.Tensor], torch.Tensor, dict]:
    parts, ref = awq_layer(rng, N, K, 128)
    return parts, ref, {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"}


def _gptq(rng: np.random.Generator) -> tuple[dict[str, torch.Tensor], torch.Tensor, dict]:
    parts, ref = gptq_layer(rng, True, N, K, 128)  # act-order: a permuted g_idx
    return parts, ref, {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": True, "sym": False}


def _ct(preset: str, strategy: str | None = None, symmetric: bool = True) -> Callable[[Path], tuple[str, Refs]]:
    """One layer compressed by compressed-tensors (seconds a layer on this machine), its copies the others."""
    made: list[tuple[dict[str, torch.Tensor], torch.Tensor, dict]] = []

    def layer(rng: np.random.Generator) -> tuple[dict[str, torch.Tensor], torch.Tensor, dict]:
        if not made:
            made.append(ct_layer(rng, preset, strategy, symmetric, N, K))
        parts, ref, qc = made[0]
        return {k: v.clone() for k, v in parts.items()}, ref, qc
    return _hf(layer)


FORMATS: dict[str, Format] = {
    # dense: read in the file's dtype, each byte once (no shard held whole beside its tensors)
    "safetensors-fp32": Format(_dense(torch.float32), 1.25, None, 0.0, 0.0),
    "safetensors-bf16": Format(_dense(torch.bfloat16), 1.25 / 2, None, 0.0, 0.0),
    "safetensors-fp16": Format(_dense(torch.float16), 1.25 / 2, None, 0.0, 0.0),
    # int4 kernel over the file's own codes: the scales' bf16 rounding in the kernel only
    "gguf-Q4_0": Format(_gguf("Q4_0"), 0.5, "int4", 1e-6, 0.01),
    "gguf-Q4_1": Format(_gguf("Q4_1"), 0.5, "int4", 1e-6, 0.01),
    "gguf-Q4_K": Format(_gguf("Q4_K"), 0.5, "int4", 1e-6, 0.01),
    # requantized to int8 per block of 32 a few rows at a time (the mapped file's pages count too); the
    # int8 kernel quantizes activations per block of 32 (about 0.3% of the output)
    "gguf-Q5_K": Format(_gguf("Q5_K"), 0.75, "int8", 0.01, 0.02),
    "gguf-Q6_K": Format(_gguf("Q6_K"), 0.75, "int8", 0.01, 0.02),
    # Q8_0 is the int8 kernel's own layout: its codes and scales exactly
    "gguf-Q8_0": Format(_gguf("Q8_0"), 0.75, "int8", 1e-6, 0.02),
    "awq": Format(_hf(_awq), 0.5, "int4", 1e-6, 0.01),
    "gptq-act-order": Format(_hf(_gptq), 0.5, "int4", 1e-6, 0.01),
    "ct-w4a16-group": Format(_ct("W4A16"), 0.5, "int4", 1e-6, 0.01),
    "ct-w4a16-channel": Format(_ct("W4A16", "channel"), 0.5, "int4", 1e-6, 0.01),
    "ct-w4a16-asymmetric": Format(_ct("W4A16", None, False), 0.5, "int4", 1e-6, 0.01),
    # FP8 codes as they are; the kernel quantizes activations to e4m3 per token
    "ct-fp8-tensor": Format(_ct("FP8"), 0.5, "fp8", 1e-6, 0.08),
    "ct-fp8-channel": Format(_ct("FP8", "channel"), 0.5, "fp8", 1e-6, 0.08),
}


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, Refs]]:
    root = tmp_path_factory.mktemp("formats")
    return {name: fmt.write(root / name) for name, fmt in FORMATS.items()}


@pytest.fixture(scope="module")
def peaks(written: dict[str, tuple[str, Refs]]) -> dict[str, dict[str, int]]:
    """Every format's load in one fresh interpreter, each with its own peak."""
    rows = peak_loads(*(load for load, _ in written.values()), warm_up=(written["gguf-Q4_K"][0],))
    return dict(zip(written, rows, strict=True))


@pytest.mark.parametrize("name", FORMATS)
def test_format_loads_without_an_fp32_copy_of_the_model(name: str, peaks: dict[str, dict[str, int]]) -> None:
    fmt, row = FORMATS[name], peaks[name]
    linears = 4 * N * K * LAYERS if not name.startswith("gguf") else \
        4 * GGUF_LAYERS * GGUF_HIDDEN * (2 * GGUF_HIDDEN + 2 * GGUF_HIDDEN // 4 + 3 * GGUF_INTER)
    if fmt.scheme is None:
        assert row["quantized_fp32"] == 0 and row["fp32"] == linears
        size = linears // 4 * torch.tensor([], dtype=_DTYPES[name]).element_size()
        assert row["peak"] > 0.9 * size, row  # the measurement sees the load
    else:
        assert row["quantized_fp32"] == linears, row  # every linear came back quantized
    assert row["peak"] < fmt.peak * row["fp32"], (name, row)


_DTYPES = {"safetensors-fp32": torch.float32, "safetensors-bf16": torch.bfloat16, "safetensors-fp16": torch.float16}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("name", FORMATS)
def test_format_matches_its_reference_dequantization(name: str, written: dict[str, tuple[str, Refs]]) -> None:
    fmt = FORMATS[name]
    load, refs = written[name]
    ck = eval(load, {"checkpoint": checkpoint})  # the same call the memory probe made
    assert len(refs) >= 2
    for tensor_name, ref in refs.items():
        w = ck.tensors[tensor_name]
        if fmt.scheme is None:
            assert not isinstance(w, QuantizedWeight) and w.dtype == ref.dtype and torch.equal(w, ref)
            continue
        assert isinstance(w, QuantizedWeight) and w.spec.scheme == fmt.scheme, (tensor_name, w)
        assert _rel(dequantize_weight(w), ref) < fmt.exact, tensor_name
        x = torch.randn(4, ref.shape[1], generator=torch.Generator().manual_seed(3))
        y = quantized_linear(w, None, torch.float32, "cpu")(x)
        assert _rel(y, x @ ref.T) < fmt.out, tensor_name
