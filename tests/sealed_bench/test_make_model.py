"""`sealed bench make-model`: real architectures' shapes, seeded random weights, an HF directory the
engine's loader reads and a GGUF of the same values (the smoke run: `--shape test-llama`, through the
real CLI)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from enclave_worker.engine.checkpoint import load_gguf, load_hf_dir, tensor_specs
from enclave_worker.engine.models import check_architecture
from sealed_bench import bench_make_model
from sealed_bench.make_model import SHAPES, MakeModelError, model_config, tensor_chunks
from sealed_bench.make_model_tokenizer import tokenizer_files
from tests.sealed_bench.test_bench_commands import run_bench

# Parameter counts published for each model (HF model cards / safetensors metadata).
PUBLISHED_PARAMS = {
    "llama-3.2-1b": 1_235_814_400,
    "llama-3.2-3b": 3_212_749_824,
    "llama-3.1-8b": 8_030_261_248,
    "qwen2.5-7b": 7_615_616_512,
}


@pytest.mark.parametrize("shape", sorted(PUBLISHED_PARAMS))
def test_real_shapes_have_the_published_parameter_count(shape: str) -> None:
    config = model_config(shape, "bf16")
    check_architecture(config)  # the sealed engine runs it
    params = sum(torch.Size(s.shape).numel() for s in tensor_specs(config, torch.bfloat16))
    assert params == PUBLISHED_PARAMS[shape]


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("made") / "tiny"
    report = run_bench("make_model", ["--shape", "test-llama", "--dtype", "bf16", "--out", str(out),
                                      "--gguf", "Q8_0", "--shard-mib", "8"], out.parent)
    return out, report


def test_checkpoint_loads_with_the_engines_loader(made: tuple[Path, dict[str, Any]]) -> None:
    out, report = made
    assert report["shards"] == 2 and len(list(out.glob("model-*-of-00002.safetensors"))) == 2
    checkpoint = load_hf_dir(out)
    config = model_config("test-llama", "bf16")
    specs = tensor_specs(config, torch.bfloat16)
    assert {n: (tuple(t.shape), t.dtype) for n, t in checkpoint.tensors.items()} == {
        s.name: (s.shape, s.dtype) for s in specs}
    assert report["weights_bytes"] == sum(t.numel() * t.element_size() for t in checkpoint.tensors.values())
    assert checkpoint.chat_template and "[PAD" not in checkpoint.chat_template
    # Seeded per tensor name: the same values are regenerated, whatever order they are asked in.
    spec = next(s for s in specs if s.name.endswith("layers.1.mlp.up_proj.weight"))
    again = torch.cat(list(tensor_chunks(spec, seed=0))).reshape(spec.shape)
    assert torch.equal(checkpoint.tensors[spec.name], again)
    assert not torch.equal(again, torch.cat(list(tensor_chunks(spec, seed=1))).reshape(spec.shape))
    assert torch.equal(checkpoint.tensors["model.norm.weight"], torch.ones(256, dtype=torch.bfloat16))


def test_gguf_holds_the_same_values(made: tuple[Path, dict[str, Any]]) -> None:
    out, _ = made
    hf = load_hf_dir(out).tensors
    gguf = load_gguf(out / "model-Q8_0.gguf")
    assert gguf.config["vocab_size"] == 49152 and gguf.config["num_key_value_heads"] == 2
    for name, tensor in hf.items():  # Q/K permuted on writing and back by the loader; Q8_0 error only
        assert torch.allclose(gguf.tensors[name], tensor.float(), atol=1e-3), name


def test_tokenizer_is_padded_to_the_vocabulary() -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(tokenizer_files(49152 + 10)["tokenizer.json"])
    assert tok.get_vocab_size() == 49162
    assert tok.decode([49161]) == "[PAD9]"
    ids = tok.encode("Hello world").ids
    assert ids and max(ids) < 49152 and tok.decode(ids) == "Hello world"


@pytest.mark.parametrize(("args", "message"), [
    (["--shape", "llama-3.2-1b", "--layers", "0"], "--layers must be 1..16"),
    (["--shape", "llama-3.2-1b", "--layers", "17"], "--layers must be 1..16"),
    (["--shape", "test-llama", "--gguf", "Q4_K"], "Q4_K needs llama.cpp's llama-quantize"),
    (["--shape", "test-llama", "--gguf", "F16"], "writes Q8_0, Q4_0 only"),
])
def test_bad_arguments_are_refused_before_writing(args: list[str], message: str, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "m"
    assert bench_make_model.main([*args, "--out", str(out)]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_unknown_shape_dtype_and_used_directory_are_refused(tmp_path: Path) -> None:
    with pytest.raises(MakeModelError, match="unknown shape"):
        model_config("llama-9", "bf16")
    with pytest.raises(MakeModelError, match="unknown dtype"):
        model_config("llama-3.2-1b", "int3")
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "keep.txt").write_text("x")
    assert bench_make_model.main(["--shape", "test-llama", "--out", str(tmp_path / "used")]) == 2
    assert [p.name for p in (tmp_path / "used").iterdir()] == ["keep.txt"]
    assert set(SHAPES) >= set(PUBLISHED_PARAMS)
    assert json.loads(json.dumps(SHAPES)) == SHAPES  # plain JSON: config.json is written from it


def test_made_model_runs_through_a_streamed_package(made: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    """`sealed encrypt`'s streamed path on the made checkpoint, decrypted as a worker does, builds the
    engine and gives the logits the engine gives from the directory itself."""
    from contextlib import ExitStack

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from api.tenant_tools import StreamedCheckpoint, encrypt_checkpoint, open_source
    from enclave_worker.engine import EngineConfig, LLMEngine
    from enclave_worker.engine.checkpoint import Checkpoint
    from enclave_worker.package import decrypt_package
    from tests.enclave_worker.engine.test_checkpoint_gguf_quant import _logits

    out, _ = made
    with ExitStack() as stack:
        source = open_source(out, stack)
        assert isinstance(source, StreamedCheckpoint)
        encrypted = encrypt_checkpoint(source, tmp_path / "pkg", tenant="t1", model="m", version="v1",
                                       signing_key=Ed25519PrivateKey.generate())
    model = decrypt_package(tmp_path / "pkg", encrypted.data_key)
    packaged = Checkpoint(model.metadata["config"], model.tensors, model.metadata["tokenizer_json"],
                          model.metadata["chat_template"])
    cfg = EngineConfig(max_num_seqs=2, kv_cache_memory_bytes=16 << 20, num_threads=1, max_model_len=128)
    ids = list(range(100, 140))
    got = _logits(LLMEngine.from_checkpoint(packaged, cfg), ids)
    assert torch.equal(got, _logits(LLMEngine.from_checkpoint(load_hf_dir(out), cfg), ids))
    assert got.shape == (len(ids), 49152) and bool(torch.isfinite(got).all())
