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
