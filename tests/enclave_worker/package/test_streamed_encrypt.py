"""`sealed encrypt` of an unquantized HF directory streams the tensors from their shards (sources.py):
the package is byte-for-byte the one an in-memory encryption makes (same key, same package id), the
shards are checked before anything is written, and what is malformed is refused with a typed error."""

from __future__ import annotations

import json
import secrets
from contextlib import ExitStack
from pathlib import Path

import pytest
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from safetensors.torch import save_file

from api.tenant_tools import StreamedCheckpoint, encrypt_checkpoint, load_source, open_source
from enclave_worker.engine.checkpoint import tensor_specs
from enclave_worker.engine.errors import CheckpointError
from enclave_worker.package import decrypt_package
from enclave_worker.package.sources import open_safetensors
from enclave_worker.package.writer import write_package
from protocol.package.errors import PackageFormatError

CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
          "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
          "head_dim": 32, "vocab_size": 300, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
          "max_position_embeddings": 256, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}


def _hf_dir(root: Path) -> Path:
    """Two shards (as HF writes them) with odd-sized tensors, so segments cross tensors and padding."""
    gen = torch.Generator().manual_seed(0)
    tensors = {s.name: torch.randn(s.shape, generator=gen).to(s.dtype) for s in tensor_specs(CONFIG, torch.bfloat16)}
    names = sorted(tensors)
    root.mkdir()
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2 :]}
    for file, members in shards.items():
        save_file({n: tensors[n] for n in members}, str(root / file))
    (root / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {n: f for f, members in shards.items() for n in members}}))
    (root / "config.json").write_text(json.dumps(CONFIG))
    (root / "tokenizer.json").write_text("{}")
    (root / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}", "eos_token": "x"}))
    return root


def test_streamed_package_equals_the_in_memory_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = _hf_dir(tmp_path / "model")
    key, signer = secrets.token_bytes(32), Ed25519PrivateKey.generate()
    monkeypatch.setattr("secrets.token_hex", lambda n: "ab" * n)  # the same package and key ids both times
    monkeypatch.setattr("secrets.token_bytes", lambda n: key)
    with ExitStack() as stack:
        streamed = open_source(src, stack)
        assert isinstance(streamed, StreamedCheckpoint)
        encrypt_checkpoint(streamed, tmp_path / "streamed", tenant="t1", model="m", version="v1",
                           signing_key=signer, segment_size=1000)
    encrypt_checkpoint(load_source(src), tmp_path / "memory", tenant="t1", model="m", version="v1",
                       signing_key=signer, segment_size=1000)
    for name in ("manifest.json", "payload.bin"):
        assert (tmp_path / "streamed" / name).read_bytes() == (tmp_path / "memory" / name).read_bytes(), name
    model = decrypt_package(tmp_path / "streamed", key)
    original = load_source(src)
    assert model.metadata["config"] == original.config
    for name, tensor in original.tensors.items():
        assert torch.equal(model.tensors[name], tensor), name


def _shard(path: Path, header: dict[str, object], data: bytes) -> Path:
    raw = json.dumps(header).encode()
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + data)
    return path


@pytest.mark.parametrize(("header", "data", "message"), [
    ({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 8, "inside the file"),
    ({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 16]}}, b"\0" * 16, "do not hold"),
    ({"w": {"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]}}, b"\0" * 16, "do not hold"),
    ({"w": {"dtype": "C64", "shape": [2], "data_offsets": [0, 16]}}, b"\0" * 16, "unsupported or malformed"),
    ({"w": {"dtype": "F32", "shape": [2]}}, b"\0" * 16, "unsupported or malformed"),
    ({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
      "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}, b"\0" * 16, "overlap"),
    ([1, 2], b"", "not a safetensors file"),
])
def test_malformed_shards_are_refused(tmp_path: Path, header: dict[str, object], data: bytes, message: str) -> None:
    path = _shard(tmp_path / "x.safetensors", header, data)
    with ExitStack() as stack, pytest.raises(PackageFormatError, match=message):
        open_safetensors(path, stack)


def test_header_length_past_the_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "x.safetensors"
    path.write_bytes((1 << 40).to_bytes(8, "little") + b"{}")
    with ExitStack() as stack, pytest.raises(PackageFormatError, match="header length"):
        open_safetensors(path, stack)


def test_bad_shard_or_duplicate_tensor_refused_before_writing(tmp_path: Path) -> None:
    src = _hf_dir(tmp_path / "model")
    first = src / "model-00001-of-00002.safetensors"
    second = src / "model-00002-of-00002.safetensors"
    second.write_bytes(first.read_bytes())  # every tensor of shard 1 appears twice
    with ExitStack() as stack, pytest.raises(CheckpointError, match="appear twice"):
        open_source(src, stack)
    first.write_bytes(first.read_bytes()[:100])  # truncated inside its header
    with ExitStack() as stack, pytest.raises(CheckpointError, match="cannot read"):
        open_source(src, stack)
    assert not (tmp_path / "pkg").exists()


def test_a_shard_that_shrinks_while_encrypting_is_a_typed_error(tmp_path: Path) -> None:
    src = _hf_dir(tmp_path / "model")
    with ExitStack() as stack:
        streamed = open_source(src, stack)
        shard = src / "model-00002-of-00002.safetensors"
        with open(shard, "r+b") as fh:
            fh.truncate(shard.stat().st_size // 2)
        with pytest.raises(PackageFormatError, match="cannot map"):
            write_package(tmp_path / "pkg", metadata={}, tensors=list(streamed.tensors.items()),
                          data_key=secrets.token_bytes(32), key_id="k", tenant="t1", model="m", version="v1",
                          signing_key=Ed25519PrivateKey.generate())
    assert not (tmp_path / "pkg" / "payload.bin").exists()
