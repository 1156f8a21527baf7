"""Checkpoint loading: GGUF layout, tensor specs, HF directory round trip."""

from __future__ import annotations

import json

import pytest
import torch

from enclave_worker.engine import CheckpointError, load_gguf, load_hf_dir, tensor_specs


def test_gguf_config_and_specs(checkpoint):
    cfg = checkpoint.config
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_key_value_heads"]) == (576, 30, 3)
    assert cfg["tie_word_embeddings"] is True and cfg["eos_token_id"] == 2
    specs = tensor_specs(cfg)
    assert sorted(s.name for s in specs) == sorted(checkpoint.tensors)
    for s in specs:
        t = checkpoint.tensors[s.name]
        assert tuple(t.shape) == s.shape and t.dtype == s.dtype == torch.float32
    assert checkpoint.chat_template and "<|im_start|>" in checkpoint.chat_template


def test_missing_files_raise_typed_errors(tmp_path):
    with pytest.raises(CheckpointError):
        load_gguf(tmp_path / "nope.gguf")
    with pytest.raises(CheckpointError):
        load_hf_dir(tmp_path)


def test_hf_dir_round_trip(checkpoint, tmp_path):
    st = pytest.importorskip("safetensors.torch")
    names = list(checkpoint.tensors)
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
    for file, part in shards.items():
        st.save_file({n: checkpoint.tensors[n] for n in part}, str(tmp_path / file))
    weight_map = {n: f for f, part in shards.items() for n in part}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (tmp_path / "config.json").write_text(json.dumps(checkpoint.config))
    (tmp_path / "tokenizer.json").write_text(checkpoint.tokenizer_json)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": checkpoint.chat_template}))
    loaded = load_hf_dir(tmp_path)
    assert list(loaded.tensors) == names
    assert all(torch.equal(loaded.tensors[n], checkpoint.tensors[n]) for n in names)
    assert loaded.chat_template == checkpoint.chat_template
    assert loaded.config["hidden_size"] == checkpoint.config["hidden_size"]
