"""The default model, encrypted, uploaded, released and loaded, answers exactly like the plaintext
model; the package load stays within 1.2x the model size in peak RSS (measured in a subprocess)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fastapi.testclient import TestClient

from api.broker_state import local_broker_keys
from api.cli.upload import upload_package
from api.home import Home
from api.management.uploads import stored_package_dir
from api.tenant_tools import (
    broker_import_public_pem,
    encrypt_checkpoint,
    import_sealed_key,
    seal_for_broker,
)
from enclave_worker.engine import EngineConfig, LLMEngine, SamplingParams
from enclave_worker.engine.checkpoint import Checkpoint, default_gguf_path, load_gguf
from enclave_worker.package import decrypt_package
from key_broker.keystore import DataKeyRegistry, LocalKeyStore
from protocol.model_ref import ModelRef
from protocol.package import PackageError

PROMPTS = ["The capital of France is", "def fibonacci(n):\n    ", "List three prime numbers:",
           "Water boils at a temperature of"]


@pytest.fixture(scope="module")
def plain() -> Checkpoint:
    try:
        return load_gguf(default_gguf_path())
    except Exception as exc:
        pytest.skip(f"default model not installed: {exc}")


@pytest.fixture(scope="module")
def released(plain: Checkpoint, tmp_path_factory: pytest.TempPathFactory, upload_app) -> tuple[Path, bytes]:  # type: ignore[no-untyped-def]
    """Tenant encrypts and uploads; the broker imports the sealed key; the key is then released."""
    root = tmp_path_factory.mktemp("release")
    tenant_dir, broker_dir, store = root / "tenant", root / "broker", root / "store"
    broker_dir.mkdir()
    (root / "broker.pub").write_bytes(broker_import_public_pem(broker_dir))  # the broker's sealed import key
    encrypted = encrypt_checkpoint(plain, tenant_dir / "pkg", tenant="demo", model="smollm2", version="v1",
                                   signing_key=Ed25519PrivateKey.generate())
    (tenant_dir / "key.json").write_text(seal_for_broker(encrypted, root / "broker.pub").to_json())
    app = upload_app(store, lambda: "demo")
    upload_package(tenant_dir / "pkg", TestClient(app), chunk_bytes=32 << 20)
    stored = stored_package_dir(store, "demo", "smollm2", "v1")
    with pytest.raises(PackageError, match="not demo/smollm2/v2"):  # another version than asked for
        import_sealed_key(broker_dir, tenant_dir / "key.json", stored, ModelRef("demo", "smollm2", "v2"))
    assert not (broker_dir / "keystore").exists()  # refused before anything was stored
    import_sealed_key(broker_dir, tenant_dir / "key.json", stored, ModelRef("demo", "smollm2", "v1"))
    keystore = LocalKeyStore(broker_dir / "keystore", local_broker_keys(Home(root)).master_key)
    data_key, record = DataKeyRegistry(broker_dir / "keystore", keystore).data_key(ModelRef("demo", "smollm2", "v1"))
    assert record.model_digest == encrypted.manifest.plaintext_digest
    return stored, data_key


def _greedy(checkpoint: Checkpoint) -> list[list[int]]:
    engine = LLMEngine.from_checkpoint(checkpoint, EngineConfig(max_num_seqs=4, kv_cache_memory_bytes=32 << 20))
    outs: dict[str, list[int]] = {str(i): [] for i in range(len(PROMPTS))}
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(str(i), engine.tokenizer.encode(prompt), params,
                           lambda out, rid=str(i): outs[rid].extend(out.delta_token_ids), b"")
    while engine.has_unfinished_requests():
        engine.step()
    return [outs[str(i)] for i in range(len(PROMPTS))]


def test_decrypted_model_answers_exactly_like_the_plaintext_model(plain: Checkpoint,
                                                                  released: tuple[Path, bytes]) -> None:
    stored, data_key = released
    model = decrypt_package(stored, data_key)
    decrypted = Checkpoint(config=model.metadata["config"], tensors=model.tensors,
                           tokenizer_json=model.metadata["tokenizer_json"],
                           chat_template=model.metadata.get("chat_template"))
    expected = _greedy(dataclasses.replace(plain, tensors=dict(plain.tensors)))
    assert all(len(t) == 16 for t in expected)
    assert _greedy(decrypted) == expected
    model.wipe()


_RSS_PROBE = """
import json, sys
from pathlib import Path
import psutil, torch
from enclave_worker.package import decrypt_package
def hwm():  # this process image's own high-water mark (ru_maxrss would include the forked parent's)
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
before = psutil.Process().memory_info().rss
model = decrypt_package(Path(sys.argv[1]), bytes.fromhex(sys.stdin.read().strip()))
print(json.dumps({"before": before, "peak": hwm(), "model": model.manifest.plaintext_bytes}))
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmHWM from /proc (Linux)")
def test_package_load_peak_rss_is_within_1_2x_the_model(released: tuple[Path, bytes]) -> None:
    stored, data_key = released
    out = subprocess.run([sys.executable, "-c", _RSS_PROBE, str(stored)], input=data_key.hex(),
                         capture_output=True, text=True, check=True, timeout=300)
    m = json.loads(out.stdout.strip().splitlines()[-1])
    growth = m["peak"] - m["before"]
    assert growth <= 1.2 * m["model"], m
