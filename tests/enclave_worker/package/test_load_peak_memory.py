"""Loading a bf16 package into an fp32 engine gives the decrypted buffer back layer by layer
(page_release.py, models/weights.py): the load's peak stays near the weights as held, not the weights
plus the whole buffer (3x the bf16 bytes before). Measured in a fresh interpreter, like
tests/enclave_worker/engine/test_checkpoint_formats.py measures the checkpoint loads."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

ROOT = Path(__file__).resolve().parents[3]

# hidden 1024 over 8 layers: the layers are ~70% of the weights (the vocabulary is SmolLM2's 49,152),
# the embedding is tied, as in the 1B-8B shapes where the layers are 85-95% of the model.
_SHAPE = {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 8, "num_attention_heads": 16,
          "num_key_value_heads": 4, "tie_word_embeddings": True}

_PROBE = """
import gc, json, sys, ctypes
from pathlib import Path
import torch
def status(key):
    for line in open('/proc/self/status'):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
def reset_hwm():  # Linux >= 4.0: '5' resets the peak resident set size to the current one
    with open('/proc/self/clear_refs', 'w') as f:
        f.write('5')
from enclave_worker.engine.checkpoint import Checkpoint
from enclave_worker.engine.config import EngineConfig
from enclave_worker.engine.model_builder import build_model
from enclave_worker.engine.models import model_tensors
from enclave_worker.package import decrypt_package
libc = ctypes.CDLL("libc.so.6")
pkg, key = Path(sys.argv[1]), bytes.fromhex(sys.argv[2])
config = EngineConfig(device="cpu", dtype="float32", num_threads=1)

def load(release):
    gc.collect(); libc.malloc_trim(0)
    reset_hwm()
    base = status('VmRSS:')
    decrypted = decrypt_package(pkg, key)
    checkpoint = Checkpoint(decrypted.metadata["config"], dict(decrypted.tensors), decrypted.metadata["tokenizer_json"],
                            None, release=decrypted.release if release else None)
    built = build_model(checkpoint, config)
    peak = status('VmHWM:') - base
    held = {id(t): t for t in model_tensors(built.model)}
    aliased = any(t.untyped_storage().data_ptr() == decrypted.buffer.untyped_storage().data_ptr()
                  for t in held.values() if not t.is_mkldnn)
    return built, {"peak": peak, "held": sum(t.nbytes for t in held.values() if not t.is_mkldnn),
                   "plaintext": decrypted.buffer.numel(), "aliased": aliased}

kept, whole = load(False)
released, streamed = load(True)
same = all(torch.equal(a, b) for a, b in zip(model_tensors(kept.model), model_tensors(released.model), strict=True)
           if not a.is_mkldnn)
print(json.dumps({"whole": whole, "streamed": streamed, "same": same}))
"""


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> dict:  # type: ignore[type-arg]
    import torch

    from enclave_worker.package.writer import write_package
    from sealed_bench.gpu_models import arch_config, random_tensors, tokenizer_assets

    cfg = {**arch_config("tiny"), **_SHAPE}
    tensors = random_tensors(cfg, "cpu", torch.bfloat16)
    tensors.pop("lm_head.weight", None)
    key = secrets.token_bytes(32)
    pkg = tmp_path_factory.mktemp("peak") / "pkg"
    write_package(pkg, metadata={"format": "hf-llama", "config": cfg, "tokenizer_json": tokenizer_assets(None)[0]},
                  tensors=list(tensors.items()), data_key=key, key_id="dek", tenant="t1", model="m", version="v1",
                  signing_key=Ed25519PrivateKey.generate())
    del tensors
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'devtools'}", "OMP_NUM_THREADS": "1",
           "MALLOC_MMAP_THRESHOLD_": str(1 << 20)}  # as quant_helpers.peak_loads: big blocks go back at once
    out = subprocess.run([sys.executable, "-c", _PROBE, str(pkg), key.hex()], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=600, check=True)
    result: dict = json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[type-arg]
    return result


def test_the_measurement_sees_the_buffer_beside_the_weights(measured: dict) -> None:  # type: ignore[type-arg]
    whole = measured["whole"]
    assert not whole["aliased"], whole  # bf16 -> fp32: every weight is a converted copy
    assert whole["held"] > 1.9 * whole["plaintext"], whole  # fp32 weights, twice the bf16 payload
    assert whole["peak"] > 1.4 * whole["held"], whole  # the buffer held to the end: ~1.5x


def test_a_converting_load_peaks_near_the_weights_as_held(measured: dict) -> None:  # type: ignore[type-arg]
    streamed = measured["streamed"]
    assert streamed["peak"] <= 1.15 * streamed["held"], streamed


def test_the_released_load_holds_the_same_weights(measured: dict) -> None:  # type: ignore[type-arg]
    assert measured["same"]
