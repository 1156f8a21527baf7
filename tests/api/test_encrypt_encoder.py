"""`sealed encrypt` packs a sentence-embedding model like any model: kind "embedding" in the signed
manifest (the upload check records it), the pooling in the encrypted config; an encoder the engine
cannot run is refused in one line before anything is written."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fastapi import Header
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from api.cli.main import build
from api.cli.upload import upload_package
from api.tenant_tools import encrypt_model
from enclave_worker.engine.checkpoint import Checkpoint
from enclave_worker.engine.config import EngineConfig
from enclave_worker.engine.embedding_engine import EmbeddingEngine
from enclave_worker.package import decrypt_package
from protocol.package import read_manifest
from protocol.package.errors import PackageFormatError
from protocol.package.format import Manifest

GOLDEN = json.loads((Path(__file__).parents[1] / "enclave_worker" / "engine" / "golden"
                     / "minilm_sentence_transformers.json").read_text())
FP32_TOLERANCE = 1e-5  # as tests/enclave_worker/engine/test_embedder.py states it


@pytest.fixture(scope="module")
def encoder_pkg(minilm_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes]:
    out = tmp_path_factory.mktemp("encoder") / "pkg"
    encrypted = encrypt_model(minilm_dir, out, tenant="t1", model="minilm", version="v1",
                              signing_key=Ed25519PrivateKey.generate())
    return out, encrypted.data_key


def test_an_encoder_package_says_embedding_and_carries_its_pooling(encoder_pkg: tuple[Path, bytes]) -> None:
    path, data_key = encoder_pkg
    manifest, raw, _ = read_manifest(path)
    assert manifest.kind == "embedding" and b'"kind":"embedding"' in raw
    model = decrypt_package(path, data_key)
    assert model.metadata["format"] == "hf-bert"
    assert model.metadata["config"]["_pooling"] == {"mode": "mean", "normalize": True, "max_tokens": 256}
    # What a worker builds from the decrypted package embeds as sentence-transformers does.
    checkpoint = Checkpoint(model.metadata["config"], dict(model.tensors), model.metadata["tokenizer_json"], None)
    engine = EmbeddingEngine.from_checkpoint(checkpoint, EngineConfig(device="cpu", dtype="float32"))
    got = engine.embedder.embed(GOLDEN["texts"]).vectors
    asyncio.run(engine.shutdown())
    assert (got - torch.tensor(GOLDEN["embeddings"])).abs().max().item() < FP32_TOLERANCE


def test_the_upload_check_records_the_kind(encoder_pkg: tuple[Path, bytes], upload_app, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    def auth(authorization: str = Header("")) -> str:
        return "t1"

    client = TestClient(upload_app(tmp_path / "store", auth), headers={"authorization": "Bearer t1"})
    record = upload_package(encoder_pkg[0], client)
    assert record["kind"] == "embedding" and record["model"] == "minilm"


def test_a_chat_manifest_has_no_kind_and_an_unknown_kind_is_refused(encoder_pkg: tuple[Path, bytes]) -> None:
    manifest, raw, _ = read_manifest(encoder_pkg[0])
    chat = Manifest(**{**manifest.__dict__, "kind": "chat"})
    assert b'"kind"' not in chat.to_bytes()  # packages made before kinds read back unchanged
    assert Manifest.from_bytes(chat.to_bytes()).kind == "chat"
    for bad in (raw.replace(b'"kind":"embedding"', b'"kind":"reranker"'),
                raw.replace(b'"kind":"embedding"', b'"kind":"chat"')):  # "chat" is never written: not canonical
        with pytest.raises(PackageFormatError):
            Manifest.from_bytes(bad)


def _modules(*kinds: str) -> str:
    paths = {"Transformer": "", "Pooling": "1_Pooling", "Normalize": "2_Normalize", "Dense": "2_Dense"}
    return json.dumps([{"type": f"sentence_transformers.models.{k}", "path": paths[k]} for k in kinds])


REFUSED = [  # (edit of the model directory, what the one line names)
    (lambda d: (d / "modules.json").write_text(_modules("Transformer", "Pooling", "Dense")), "Dense"),
    (lambda d: (d / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_max_tokens": True})),
     "mean or cls"),
    (lambda d: (d / "modules.json").unlink(), "modules.json"),
    (lambda d: _config(d, position_embedding_type="relative_key"), "position_embedding_type"),
    (lambda d: _config(d, hidden_act="relu"), "hidden_act"),
]


def _config(d: Path, **change: object) -> None:
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, **change}))


@pytest.mark.parametrize(("edit", "named"), REFUSED, ids=[r[1] for r in REFUSED])
def test_an_unsupported_encoder_is_refused_in_one_line(minilm_dir: Path, tmp_path: Path, edit, named: str,  # type: ignore[no-untyped-def]
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SEALED_MASTER_KEY", raising=False)
    src = tmp_path / "src"
    shutil.copytree(minilm_dir, src)
    edit(src)
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
    assert "\n" not in line and named in line, line
    assert "Traceback" not in res.output
    assert not pkg.exists() and not (tmp_path / "pkg.datakey.json").exists()


def test_the_cli_packs_the_encoder(minilm_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SEALED_MASTER_KEY", raising=False)
    runner, app = CliRunner(), build()
    res = runner.invoke(app, ["keys", "import-pubkey", "--home", str(tmp_path / "home")])
    (tmp_path / "broker.pub").write_text(res.stdout)
    res = runner.invoke(app, ["encrypt", str(minilm_dir), "--tenant", "acme", "--out", str(tmp_path / "pkg"),
                              "--model", "minilm", "--signing-key", str(tmp_path / "signing.pem"),
                              "--broker-import-key", str(tmp_path / "broker.pub")])
    assert res.exit_code == 0, res.output
    assert "serves: embedding" in res.stdout
    assert read_manifest(tmp_path / "pkg")[0].kind == "embedding"
