"""The vLLM loader's view of a quantized package (enclave_worker/vllm_engine/weights.py): dense weights
under HF names, equal to the package's own dequantization, every plaintext copy zeroed. No vLLM needed:
the checks run on the real package writer and reader."""

from __future__ import annotations

import secrets
from pathlib import Path

import numpy as np
import pytest
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from enclave_worker.engine.checkpoint import load_hf_dir
from enclave_worker.engine.errors import CheckpointError
from enclave_worker.engine.layers.quantized_weight import QuantizedWeight, dequantize, flatten
from enclave_worker.package import DecryptedModel, decrypt_package
from enclave_worker.package.writer import write_package
from enclave_worker.vllm_engine.runtime import architecture_config
from enclave_worker.vllm_engine.weights import dense_tensors, vllm_note
from tests.enclave_worker.engine.hf_quant_writers import awq_layer, ct_layer, gptq_layer, write_dir

AWQ = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"}
GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": True, "sym": False}


def _package(tmp_path: Path, layers: dict[str, dict[str, torch.Tensor]], qc: dict) -> tuple[dict, DecryptedModel]:
    """The checkpoint as the engine loads it (QuantizedWeight), packaged and decrypted again."""
    g = torch.Generator().manual_seed(0)
    tensors = {f"{p}{k}": v for p, parts in layers.items() for k, v in parts.items()}
    tensors["model.norm.weight"] = torch.randn(64, generator=g)
    ck = load_hf_dir(write_dir(tmp_path / "src", tensors, qc, shards=2))
    flat, quantization = flatten(ck.tensors)
    key = secrets.token_bytes(32)
    write_package(tmp_path / "pkg", metadata={"config": ck.config, "quantization": quantization}, tensors=flat,
                  data_key=key, key_id="dek-test", tenant="t", model="m", version="1",
                  signing_key=Ed25519PrivateKey.generate())
    return ck.tensors, decrypt_package(tmp_path / "pkg", key)


def _awq(rng: np.random.Generator) -> tuple[dict[str, torch.Tensor], dict]:
    return awq_layer(rng)[0], AWQ


def _gptq(rng: np.random.Generator) -> tuple[dict[str, torch.Tensor], dict]:
    return gptq_layer(rng, True)[0], GPTQ  # act-order: the columns come back in the checkpoint's order


def _ct(*args: str):  # type: ignore[no-untyped-def]
    def make(rng: np.random.Generator) -> tuple[dict[str, torch.Tensor], dict]:
        parts, _, qc = ct_layer(rng, *args)
        return parts, qc
    return make


@pytest.mark.parametrize("make", [_awq, _gptq, _ct("W4A16"), _ct("FP8"), _ct("FP8", "channel")],
                         ids=["awq", "gptq", "ct-w4a16", "ct-fp8-tensor", "ct-fp8-channel"])
def test_quantized_package_reaches_vllm_dense_and_exact(tmp_path: Path, make) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(0)
    made = [make(rng) for _ in range(2)]
    layers = {f"model.layers.{i}.mlp.down_proj.": parts for i, (parts, _) in enumerate(made)}
    loaded, model = _package(tmp_path, layers, made[0][1])
    handed: list[tuple[str, torch.Tensor]] = []
    for name, tensor in dense_tensors(model):
        assert not isinstance(tensor, QuantizedWeight) and tensor.dtype == torch.float32
        ref = loaded[name]
        expected = dequantize(ref) if isinstance(ref, QuantizedWeight) else ref
        assert torch.equal(tensor, expected), name  # the package's own values
        assert int(model.buffer.count_nonzero()) > 0  # the rest of the package is still there
        handed.append((name, tensor))
    assert {n for n, _ in handed} == set(loaded)  # HF names only: no .scales, .zeros, .perm
    assert sum(isinstance(t, QuantizedWeight) for t in loaded.values()) == 2
    assert all(int(t.count_nonzero()) == 0 for _, t in handed)  # each copy zeroed once vLLM took it
    assert int(model.buffer.count_nonzero()) == 0


def test_a_partial_load_still_wipes_the_buffer(tmp_path: Path) -> None:
    """vLLM failing half way (the generator closed after one weight): the current copy and the buffer are zero."""
    layers = {f"model.layers.{i}.mlp.down_proj.": awq_layer(np.random.default_rng(i))[0] for i in range(2)}
    _, model = _package(tmp_path, layers, AWQ)
    it = dense_tensors(model)
    _, first = next(it)
    it.close()
    assert int(first.count_nonzero()) == 0 and int(model.buffer.count_nonzero()) == 0


def test_bad_quantization_metadata_is_refused_and_wiped(tmp_path: Path) -> None:
    _, model = _package(tmp_path, {"model.layers.0.mlp.down_proj.": awq_layer(np.random.default_rng(0))[0]}, AWQ)
    name = next(iter(model.metadata["quantization"]))
    model.metadata["quantization"][name]["shape"] = [1, 2]  # does not match the codes
    with pytest.raises(CheckpointError):
        list(dense_tensors(model))
    assert int(model.buffer.count_nonzero()) == 0


def test_vllm_reads_no_checkpoint_quantization_and_encrypt_says_how_it_serves() -> None:
    config = {"architectures": ["Qwen3ForCausalLM"], "quantization_config": AWQ, "_bos_token": "<s>"}
    assert architecture_config(config) == {"architectures": ["Qwen3ForCausalLM"]}
    note = vllm_note({"a": {"scheme": "int4", "source": "gguf:Q4_K"}, "b": {"scheme": "int8", "source": "gguf:Q6_K"}})
    assert note is not None and "gguf:Q4_K, gguf:Q6_K" in note and "dequantized" in note
    assert vllm_note(None) is None and vllm_note({}) is None
