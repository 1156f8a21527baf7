"""Tenant CLI flow on HF directories (single file and sharded): encrypt with the data key sealed to
the broker's import key, import it broker-side, decrypt; the clear key is never on disk."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from safetensors.torch import save_file
from typer.testing import CliRunner

from api.broker_state import local_broker_keys
from api.cli.main import build
from api.home import Home
from enclave_worker.package import decrypt_package
from key_broker.keystore import DataKeyRegistry, LocalKeyStore
from protocol.model_ref import ModelRef

CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 16,
          "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "vocab_size": 40}


def _hf_dir(root: Path, sharded: bool) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    tensors = {"model.embed_tokens.weight": torch.randn(40, 16, generator=gen),
               "model.norm.weight": torch.randn(16, generator=gen).to(torch.bfloat16),
               "lm_head.weight": torch.randn(40, 16, generator=gen).to(torch.float16)}
    root.mkdir()
    (root / "config.json").write_text(json.dumps(CONFIG))
    (root / "tokenizer.json").write_text('{"model": {"type": "BPE"}}')
    (root / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    if sharded:
        names = sorted(tensors)
        shards = {"model-00001-of-00002.safetensors": names[:1],
                  "model-00002-of-00002.safetensors": names[1:]}
        for file, keys in shards.items():
            save_file({k: tensors[k] for k in keys}, str(root / file))
        weight_map = {k: f for f, keys in shards.items() for k in keys}
        (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    else:
        save_file(tensors, str(root / "model.safetensors"))
    return tensors


def _signer_args(tmp_path: Path, method: str) -> list[str]:
    if method == "ed25519":
        return ["--signing-key", str(tmp_path / "signing.pem")]
    key = ec.generate_private_key(ec.SECP256R1())
    (tmp_path / "ec.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                        serialization.PrivateFormat.PKCS8,
                                                        serialization.NoEncryption()))
    return ["--model-signing-key", str(tmp_path / "ec.pem")]


@pytest.mark.parametrize(("sharded", "method"), [(False, "ed25519"), (True, "ed25519"), (False, "model-signing")],
                         ids=["single", "sharded", "single-model-signing"])
def test_encrypt_seal_import_decrypt(tmp_path: Path, sharded: bool, method: str,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    tensors = _hf_dir(tmp_path / "src", sharded)
    home = tmp_path / "home"
    runner, app = CliRunner(), build()
    res = runner.invoke(app, ["keys", "import-pubkey", "--home", str(home)])
    assert res.exit_code == 0, res.output
    (tmp_path / "broker.pub").write_text(res.stdout)
    pkg = tmp_path / "pkg"
    res = runner.invoke(app, ["encrypt", str(tmp_path / "src"), "--tenant", "acme", "--out", str(pkg),
                              "--model", "tiny", *_signer_args(tmp_path, method),
                              "--broker-import-key", str(tmp_path / "broker.pub")])
    assert res.exit_code == 0, res.output
    sealed = tmp_path / "pkg.datakey.json"
    assert sealed.exists()
    res = runner.invoke(app, ["keys", "import", "--tenant", "acme", "--model", "tiny", "--version", "v1",
                              "--sealed-key", str(sealed), "--package", str(pkg), "--home", str(home)])
    assert res.exit_code == 0, res.output
    layout = Home(home)
    keystore = LocalKeyStore(layout.broker / "keystore", local_broker_keys(layout).master_key)  # sealed (sim)
    data_key, record = DataKeyRegistry(layout.broker / "keystore", keystore).data_key(ModelRef("acme", "tiny", "v1"))
    model = decrypt_package(pkg, data_key)
    assert record.model_digest == model.manifest.plaintext_digest
    assert model.signer.startswith("ecdsa-" if method == "model-signing" else "ed25519:")
    for name, t in tensors.items():
        assert torch.equal(model.tensors[name], t)
    assert model.metadata["chat_template"] == "{{ messages }}"
    # The clear data key is in no file anywhere under the test's directory.
    for path in tmp_path.rglob("*"):
        if path.is_file():
            blob = path.read_bytes()
            assert data_key not in blob and data_key.hex().encode() not in blob, path


def _encrypt_args(tmp_path: Path, *extra: str) -> list[str]:
    res = CliRunner().invoke(build(), ["keys", "import-pubkey", "--home", str(tmp_path / "home")])
    assert res.exit_code == 0, res.output
    (tmp_path / "broker.pub").write_text(res.stdout)
    return ["encrypt", str(tmp_path / "src"), "--tenant", "acme", "--out", str(tmp_path / "pkg"), "--model", "tiny",
            "--signing-key", str(tmp_path / "signing.pem"), "--broker-import-key", str(tmp_path / "broker.pub"),
            *extra]


def test_threads_option_reaches_the_segment_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--threads 3` encrypts on three threads (the count the segment loop gets), and the package decrypts."""
    import enclave_worker.package.writer as writer

    tensors = _hf_dir(tmp_path / "src", sharded=True)
    seen: list[int] = []
    real = writer.encrypt_segments

    def spy(*args: object, threads: int, **kwargs: object) -> None:
        seen.append(threads)
        real(*args, threads=threads, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(writer, "encrypt_segments", spy)
    res = CliRunner().invoke(build(), _encrypt_args(tmp_path, "--threads", "3"))
    assert res.exit_code == 0, res.output
    assert seen == [3]
    home = Home(tmp_path / "home")
    res = CliRunner().invoke(build(), ["keys", "import", "--tenant", "acme", "--model", "tiny", "--version", "v1",
                                       "--sealed-key", str(tmp_path / "pkg.datakey.json"),
                                       "--package", str(tmp_path / "pkg"), "--home", str(home.root)])
    assert res.exit_code == 0, res.output
    keystore = LocalKeyStore(home.broker / "keystore", local_broker_keys(home).master_key)
    data_key, _ = DataKeyRegistry(home.broker / "keystore", keystore).data_key(ModelRef("acme", "tiny", "v1"))
    model = decrypt_package(tmp_path / "pkg", data_key)
    for name, t in tensors.items():
        assert torch.equal(model.tensors[name], t)


@pytest.mark.parametrize("threads", ["0", "-2"])
def test_threads_below_one_is_refused_before_any_work(tmp_path: Path, threads: str) -> None:
    _hf_dir(tmp_path / "src", sharded=False)
    res = CliRunner().invoke(build(), _encrypt_args(tmp_path, "--threads", threads))
    assert res.exit_code == 2
    assert f"--threads must be at least 1, not {threads}" in res.output
    assert not (tmp_path / "pkg").exists() and not (tmp_path / "pkg.datakey.json").exists()
    assert not (tmp_path / "signing.pem").exists()
