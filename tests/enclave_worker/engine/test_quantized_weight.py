"""QuantizedWeight: fused-row concatenation (same and mixed schemes), and the package round trip
(flatten for `sealed encrypt`, unflatten in the worker) with its checks on hostile metadata."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from enclave_worker.engine.checkpoint import Checkpoint
from enclave_worker.engine.checkpoint_gguf_quant import gguf_native
from enclave_worker.engine.checkpoint_hf_quant import ct_fp8
from enclave_worker.engine.errors import CheckpointError
from enclave_worker.engine.layers.linear import LinearOptions, make_linear
from enclave_worker.engine.layers.quantized_linear import RowBlocksLinear
from enclave_worker.engine.layers.quantized_weight import (
    QuantizedWeight,
    QuantSpec,
    dequantize,
    flatten,
    unflatten,
)

K = 256


def _gguf(qtype: str, n: int, seed: int) -> QuantizedWeight:
    from gguf import GGMLQuantizationType
    from gguf.quants import GGML_QUANT_SIZES

    rng = np.random.default_rng(seed)
    per_block, nbytes = GGML_QUANT_SIZES[GGMLQuantizationType[qtype]]
    b = rng.integers(0, 256, (n, K // per_block, nbytes), dtype=np.uint8)
    d = np.full((n, K // per_block, 1), 0.01, np.float16).view(np.uint8)
    b[..., -2:] = d  # Q6_K's d is last
    if qtype != "Q6_K":
        b[..., 0:2] = d
    if qtype in ("Q4_K", "Q4_1"):  # dmin / m
        b[..., 2:4] = np.full((n, K // per_block, 1), 0.004, np.float16).view(np.uint8)
    return gguf_native(b.reshape(n, -1), qtype, (n, K), "t")


def _fp8(n: int) -> QuantizedWeight:
    w = torch.randn(n, K, generator=torch.Generator().manual_seed(n)).to(torch.float8_e4m3fn)
    return ct_fp8({"p.weight": w, "p.weight_scale": torch.tensor([[0.02]] * n)}, "p.")


def test_cat_same_scheme_concatenates_components():
    q, k = _gguf("Q4_K", 64, 0), _gguf("Q4_K", 32, 1)
    fused = torch.cat([q, k], dim=0)
    assert isinstance(fused, QuantizedWeight) and fused.spec.shape == (96, K) and fused.spec.scheme == "int4"
    assert torch.equal(dequantize(fused), torch.cat([dequantize(q), dequantize(k)]))


def test_cat_mixed_schemes_runs_row_blocks():
    """A Q4_K_M-style QKV: Q and K in Q4_K (int4), V in Q6_K (int8): each in its own kernel."""
    parts = [_gguf("Q4_K", 64, 0), _gguf("Q4_K", 32, 1), _gguf("Q6_K", 32, 2)]
    fused = torch.cat(parts, dim=0)
    assert fused.spec.scheme == "rows" and fused.spec.shape == (128, K)
    bias = torch.randn(128)
    layer = make_linear(fused, bias, LinearOptions())
    assert isinstance(layer, RowBlocksLinear)
    x = torch.randn(3, K)
    ref = x @ torch.cat([dequantize(p) for p in parts]).T + bias
    assert float((layer(x) - ref).norm() / ref.norm()) < 0.01


def test_cat_refuses_a_dense_part():
    with pytest.raises(CheckpointError, match="only with each other"):
        torch.cat([_gguf("Q4_0", 32, 0), torch.zeros(32, K)], dim=0)


def test_package_round_trip(tmp_path):
    """`sealed encrypt`'s writer and the worker's reader: codes, scales and schemes come back as they were."""
    from api.tenant_tools import encrypt_checkpoint
    from enclave_worker.package import decrypt_package

    tensors = {"a.weight": _gguf("Q4_1", 64, 0), "b.weight": _gguf("Q8_0", 64, 1), "c.weight": _fp8(64),
               "norm.weight": torch.ones(K)}
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": K, "num_hidden_layers": 1,
              "num_attention_heads": 2, "num_key_value_heads": 2, "intermediate_size": 64, "vocab_size": 32,
              "rms_norm_eps": 1e-5}  # `sealed encrypt` checks the architecture first (models/__init__.py)
    ck = Checkpoint(config=config, tensors=dict(tensors), tokenizer_json="{}",
                    chat_template=None)
    enc = encrypt_checkpoint(ck, tmp_path / "pkg", tenant="t", model="m", version="v1",
                             signing_key=Ed25519PrivateKey.generate())
    model = decrypt_package(tmp_path / "pkg", enc.data_key)
    assert model.metadata["quantization"]["a.weight"]["source"] == "gguf:Q4_1"
    back = unflatten(model.tensors, model.metadata["quantization"])
    assert set(back) == set(tensors)
    for name, t in tensors.items():
        got = back[name]
        if isinstance(t, QuantizedWeight):
            assert isinstance(got, QuantizedWeight) and got.spec == t.spec
            assert torch.equal(dequantize(got), dequantize(t))
        else:
            assert torch.equal(got, t)


def _flat(w: QuantizedWeight) -> tuple[dict[str, torch.Tensor], dict]:
    items, meta = flatten({"w": w})
    return dict(items), meta


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda t, m: t.pop("w.scales"), "no scales"),
    (lambda t, m: t.update({"w": t["w"][:-1]}), "codes are"),  # truncated rows
    (lambda t, m: t.update({"w.zeros": t["w.zeros"][:, :-1]}), "zeros is"),
    (lambda t, m: t.update({"w.scales": torch.full_like(t["w.scales"], float("nan"))}), "non-finite"),
    (lambda t, m: m["w"].update({"scheme": "int3"}), "unknown quantization scheme"),
    (lambda t, m: m["w"].update({"group_size": 48}), "group size 48"),
    (lambda t, m: m["w"].update({"shape": [64]}), "bad quantization metadata"),
    (lambda t, m: t.update({"w.perm": torch.zeros(K, dtype=torch.int64)}), "not a permutation"),
])
def test_unflatten_refuses_bad_components(mutate, message):
    tensors, meta = _flat(_gguf("Q4_0", 64, 0))
    mutate(tensors, meta)
    with pytest.raises(CheckpointError, match=message):
        unflatten(tensors, meta)


def test_unflatten_refuses_metadata_of_the_wrong_type():
    with pytest.raises(CheckpointError, match="not an object"):
        unflatten({}, ["w"])


def test_spec_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        QuantSpec("int4", (1, 32)).scheme = "int8"  # type: ignore[misc]
