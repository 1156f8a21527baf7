"""`sealed encrypt` refuses, before writing anything, a model the sealed engine cannot run: one line
naming the architecture (or the feature) and pointing to the vLLM backend."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from typer.testing import CliRunner

from api.cli.main import build
from api.tenant_tools import encrypt_checkpoint
from enclave_worker.engine.checkpoint import Checkpoint
from enclave_worker.engine.models.spec import UnsupportedArchitecture
from protocol.package.signing import SigningKey

BASE = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 16, "intermediate_size": 32,
        "num_hidden_layers": 1, "num_attention_heads": 2, "vocab_size": 40}

CASES = [  # (config change, what the one line must name)
    ({"architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox"}, "GPTNeoXForCausalLM"),
    ({"architectures": ["DeepseekV3ForCausalLM"]}, "DeepseekV3ForCausalLM"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "yarn"),
    ({"hidden_act": "relu2"}, "relu2"),
    ({"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "layer_types": ["full_attention"] * 3},
     "layer_types"),
]


def _src(root: Path, config: dict) -> Path:
    root.mkdir()
    (root / "config.json").write_text(json.dumps(config))
    (root / "tokenizer.json").write_text('{"model": {"type": "BPE"}}')
    save_file({"model.embed_tokens.weight": torch.zeros(40, 16)}, str(root / "model.safetensors"))
    return root


@pytest.mark.parametrize(("change", "named"), CASES, ids=[c[1] for c in CASES])
def test_encrypt_refuses_an_unsupported_model_in_one_line(tmp_path: Path, change: dict, named: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SEALED_MASTER_KEY", raising=False)
    src = _src(tmp_path / "src", {**BASE, **change})
    runner, app = CliRunner(), build()
    res = runner.invoke(app, ["keys", "import-pubkey", "--home", str(tmp_path / "home")])
    assert res.exit_code == 0, res.output
    (tmp_path / "broker.pub").write_text(res.stdout)
    pkg = tmp_path / "pkg"
    res = runner.invoke(app, ["encrypt", str(src), "--tenant", "acme", "--out", str(pkg), "--model", "m",
                              "--signing-key", str(tmp_path / "signing.pem"),
                              "--broker-import-key", str(tmp_path / "broker.pub")])
    assert res.exit_code == 2, res.output
    line = res.stderr.strip()
    assert "\n" not in line and named in line and "vLLM" in line, line
    assert "Traceback" not in res.output
    assert not pkg.exists() and not (tmp_path / "pkg.datakey.json").exists()


def test_encrypt_checkpoint_checks_before_writing(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key: SigningKey = Ed25519PrivateKey.generate()
    checkpoint = Checkpoint({**BASE, "architectures": ["MambaForCausalLM"]}, {"w": torch.zeros(2)}, "{}", None)
    with pytest.raises(UnsupportedArchitecture, match=r"MambaForCausalLM.*vLLM"):
        encrypt_checkpoint(checkpoint, tmp_path / "pkg", tenant="acme", model="m", version="v1", signing_key=key)
    assert not (tmp_path / "pkg").exists()
