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


def _write_hf_dir(checkpoint, tmp_path) -> list[str]:
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
    return names


def test_hf_dir_round_trip(checkpoint, tmp_path):
    names = _write_hf_dir(checkpoint, tmp_path)
    loaded = load_hf_dir(tmp_path)
    assert list(loaded.tensors) == names
    assert all(torch.equal(loaded.tensors[n], checkpoint.tensors[n]) for n in names)
    assert loaded.chat_template == checkpoint.chat_template
    assert loaded.config["hidden_size"] == checkpoint.config["hidden_size"]


def test_streamed_hf_dir_reads_each_tensor_when_the_build_takes_it(checkpoint, tmp_path):
    """``stream=True``: nothing is read at load; the build reads every tensor exactly once, as it takes it
    (so a bf16 checkpoint is never held whole beside the int8 codes it becomes); the model is the same
    as from the tensors read up front (the same logits)."""
    import dataclasses

    from enclave_worker.engine import EngineConfig, LLMEngine
    from enclave_worker.engine.lazy_tensors import LazyTensors
    from enclave_worker.engine.models import model_tensors
    from enclave_worker.engine.safetensors_reader import safetensors_readers

    names = _write_hf_dir(checkpoint, tmp_path)
    streamed = load_hf_dir(tmp_path, stream=True)
    assert isinstance(streamed.tensors, LazyTensors) and list(streamed.tensors) == names
    assert "lm_head.weight" not in streamed.tensors and streamed.config["tie_word_embeddings"] is True
    reads: dict[str, int] = {}

    def counted(name, read):
        def reader():
            reads[name] = reads.get(name, 0) + 1
            return read()

        return reader

    files = sorted(tmp_path.glob("*.safetensors"))
    lazy = LazyTensors({n: counted(n, r) for f in files for n, r in safetensors_readers(f).items()})
    cfg = EngineConfig(dtype="int8", max_num_seqs=1, kv_cache_memory_bytes=8 << 20, num_threads=1, max_model_len=64)
    engine = LLMEngine.from_checkpoint(dataclasses.replace(streamed, tensors=lazy), cfg)
    assert reads == dict.fromkeys(names, 1) and len(lazy) == 0
    eager = LLMEngine.from_checkpoint(load_hf_dir(tmp_path), cfg)
    got, ref = model_tensors(engine.model), model_tensors(eager.model)  # the held weights, in build order
    assert len(got) == len(ref) and all(torch.equal(a, b) for a, b in zip(got, ref, strict=True))


def test_lazy_tensors_read_on_access():
    """A name check or a listing reads nothing; each access reads afresh; pop reads once and removes;
    a value set is kept as it is."""
    from enclave_worker.engine.lazy_tensors import LazyTensors

    reads = []

    def reader(value):
        def read():
            reads.append(value)
            return torch.full((2,), float(value))

        return read

    lazy = LazyTensors({"a": reader(1), "b": reader(2)})
    assert "a" in lazy and "c" not in lazy and list(lazy) == ["a", "b"] and len(lazy) == 2 and reads == []
    first, second = lazy["a"], lazy["a"]
    assert torch.equal(first, second) and first is not second and reads == [1, 1]
    assert torch.equal(lazy.pop("b"), torch.full((2,), 2.0)) and "b" not in lazy and reads == [1, 1, 2]
    mine = torch.zeros(3)
    lazy["c"] = mine
    assert lazy["c"] is mine and lazy.pop("missing", None) is None and list(lazy) == ["a", "c"]
