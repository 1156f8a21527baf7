"""The sentence encoder (models/bert.py, embedder.py) against its reference implementations.

golden/minilm_sentence_transformers.json holds what sentence-transformers 6.2.0 gives for
all-MiniLM-L6-v2 (provenance in the file). It was made with sentence-transformers installed beside
.venv (`pip install --target DIR sentence-transformers scipy scikit-learn narwhals cloudpickle`) by
`SentenceTransformer(model_dir).encode(texts, batch_size=3)`; the suite does not install
sentence-transformers (it pulls scipy and scikit-learn for nothing else), and checks the live
transformers BertModel, with the pooling the model's files state, as a second reference."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from enclave_worker.engine.embedder import Embedder
from enclave_worker.engine.encoder_checkpoint import load_encoder_dir, sentence_pooling
from enclave_worker.engine.errors import CheckpointError, InvalidRequestError
from enclave_worker.engine.layers.linear import LinearOptions
from enclave_worker.engine.models.options import BuildOptions
from enclave_worker.engine.models.spec import UnsupportedArchitecture

GOLDEN = json.loads((Path(__file__).parent / "golden" / "minilm_sentence_transformers.json").read_text())
# fp32 against fp32 on the same kind of machine: measured differences are ~2e-7; 1e-5 leaves room for
# another CPU's vector width without letting a wrong pooling or mask through (those move ~1e-1).
FP32_TOLERANCE = 1e-5
# Weight-only int8: cosine similarity to the fp32 vector (measured > 0.999 on the golden texts).
INT8_MIN_COSINE = 0.995


def _embedder(model_dir: Path, kernel: str = "torch", quant: str = "none") -> Embedder:
    options = BuildOptions(LinearOptions(quant=quant, kernel=kernel, in_place=True), 512)
    return Embedder(load_encoder_dir(model_dir), options)


@pytest.fixture(scope="module")
def embedder(minilm_dir: Path) -> Embedder:
    return _embedder(minilm_dir, kernel="panels")


@pytest.mark.parametrize("kernel", ["torch", "panels"])
def test_matches_sentence_transformers_golden(minilm_dir: Path, kernel: str) -> None:
    got = _embedder(minilm_dir, kernel=kernel).embed(GOLDEN["texts"])
    want = torch.tensor(GOLDEN["embeddings"])
    assert got.vectors.shape == want.shape == (8, 384)
    assert (got.vectors - want).abs().max().item() < FP32_TOLERANCE
    assert torch.allclose(got.vectors.norm(dim=-1), torch.ones(8), atol=1e-5)  # the Normalize module


def test_matches_transformers_bert_with_mean_pooling(minilm_dir: Path, embedder: Embedder) -> None:
    from tokenizers import Tokenizer
    from transformers import BertModel

    texts = ["short", "a somewhat longer sentence about attested workers and sealed keys"]
    model = BertModel.from_pretrained(minilm_dir).eval()
    tok = Tokenizer.from_file(str(minilm_dir / "tokenizer.json"))
    tok.enable_padding(pad_id=0)
    enc = tok.encode_batch(texts)
    ids = torch.tensor([e.ids for e in enc])
    mask = torch.tensor([e.attention_mask for e in enc])
    with torch.no_grad():
        hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
    m = mask.unsqueeze(-1).float()
    want = torch.nn.functional.normalize((hidden * m).sum(1) / m.sum(1), dim=-1)
    got = embedder.embed(texts)
    assert (got.vectors - want).abs().max().item() < FP32_TOLERANCE
    assert got.prompt_tokens == int(mask.sum())


def test_batch_independent(embedder: Embedder) -> None:
    """Padding never leaks into a vector: each text alone equals the same text in a mixed batch."""
    texts = GOLDEN["texts"]
    together = embedder.embed(texts).vectors
    for i, text in enumerate(texts):
        assert (embedder.embed([text]).vectors[0] - together[i]).abs().max().item() < 1e-6


def test_small_batches_give_the_same_vectors(minilm_dir: Path) -> None:
    options = BuildOptions(LinearOptions(kernel="torch", in_place=True), 512)
    small = Embedder(load_encoder_dir(minilm_dir), options, max_batch_tokens=1)  # one input a batch
    big = Embedder(load_encoder_dir(minilm_dir), options)
    texts = GOLDEN["texts"]
    assert (small.embed(texts).vectors - big.embed(texts).vectors).abs().max().item() < 1e-6


def test_token_id_inputs_equal_text_inputs(embedder: Embedder) -> None:
    ids = embedder.tokenize(["The capital of France is Paris."])
    assert (embedder.embed(ids).vectors - embedder.embed(["The capital of France is Paris."]).vectors).abs().max() == 0


def test_int8_weights_stay_close(minilm_dir: Path, embedder: Embedder) -> None:
    q = _embedder(minilm_dir, quant="int8").embed(GOLDEN["texts"]).vectors
    ref = embedder.embed(GOLDEN["texts"]).vectors
    assert torch.nn.functional.cosine_similarity(q, ref).min().item() > INT8_MIN_COSINE


@pytest.mark.parametrize(("inputs", "message"), [
    ([], "input must not be empty"),
    ([""], "input[0] is empty"),
    (["ok", ""], "input[1] is empty"),
    ([[]], "input[0] is empty"),
    ([[101, 30522, 102]], "outside the vocabulary"),
    ([[-1]], "outside the vocabulary"),
    (["word " * 300], "this model's maximum is 256"),  # sentence_bert_config.json: max_seq_length 256
])
def test_bad_inputs_are_refused(embedder: Embedder, inputs: list, message: str) -> None:
    with pytest.raises(InvalidRequestError, match=message.replace("[", r"\[").replace("]", r"\]")):
        embedder.embed(inputs)


def _copy(minilm_dir: Path, tmp_path: Path) -> Path:
    out = tmp_path / "model"
    shutil.copytree(minilm_dir, out)
    return out


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: (d / "modules.json").unlink(), "no sentence-transformers modules.json"),
    (lambda d: (d / "1_Pooling" / "config.json").write_text(json.dumps(
        {"pooling_mode_max_tokens": True})), "not exactly one of mean or cls"),
    (lambda d: (d / "1_Pooling" / "config.json").write_text(json.dumps(
        {"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": True})), "not exactly one of mean or cls"),
    (lambda d: (d / "modules.json").write_text(json.dumps(
        [{"type": "sentence_transformers.models.Transformer", "path": ""},
         {"type": "sentence_transformers.models.Pooling", "path": "1_Pooling"},
         {"type": "sentence_transformers.models.Dense", "path": "2_Dense"}])), "unsupported: Dense"),
])
def test_unsupported_pipelines_are_refused(minilm_dir: Path, tmp_path: Path, edit, message: str) -> None:  # type: ignore[no-untyped-def]
    model = _copy(minilm_dir, tmp_path)
    edit(model)
    with pytest.raises(CheckpointError, match=message):
        sentence_pooling(model)


@pytest.mark.parametrize(("change", "message"), [
    ({"position_embedding_type": "relative_key"}, "position_embedding_type"),
    ({"hidden_act": "relu"}, "hidden_act 'relu'"),
    ({"is_decoder": True}, "decoder"),
    ({"num_attention_heads": 7}, "not a multiple"),
])
def test_unsupported_configs_are_refused_before_weights(minilm_dir: Path, tmp_path: Path, change: dict,
                                                        message: str) -> None:
    model = _copy(minilm_dir, tmp_path)
    cfg = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**cfg, **change}))
    with pytest.raises(UnsupportedArchitecture, match=message):
        _embedder(model)


def test_missing_or_extra_tensors_are_refused(minilm_dir: Path) -> None:
    checkpoint = load_encoder_dir(minilm_dir)
    options = BuildOptions(LinearOptions(kernel="torch", in_place=True), 512)
    missing = dict(checkpoint.tensors)
    del missing["encoder.layer.3.output.dense.weight"]
    with pytest.raises(UnsupportedArchitecture, match=r"lacks tensor encoder\.layer\.3\.output\.dense\.weight"):
        Embedder(type(checkpoint)(checkpoint.config, missing, checkpoint.tokenizer_json, None), options)
    extra = {**checkpoint.tensors, "encoder.layer.9.attention.self.query.weight": torch.zeros(1)}
    with pytest.raises(UnsupportedArchitecture, match=r"would ignore: encoder\.layer\.9"):
        Embedder(type(checkpoint)(checkpoint.config, extra, checkpoint.tokenizer_json, None), options)
