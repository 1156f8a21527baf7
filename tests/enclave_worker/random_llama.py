"""A Llama-architecture checkpoint with random weights and the default model's real tokenizer and
chat template, packaged for the demo tenant like `sealed up` packages the default model.

Used by the fake-TEE end-to-end tests (a tiny one, fast on two CPUs) and by the GPU script in
tests/gpu (a 1B-class one). Only the architecture matters there, not what the model says.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from api.home import Home, ed25519_key
from api.stack import DEMO_MODEL, DEMO_TENANT, DEMO_VERSION
from api.tenant_tools import encrypt_checkpoint
from enclave_worker.engine.checkpoint import (
    Checkpoint,
    _field,
    _gguf_config,
    default_gguf_path,
    tensor_specs,
)
from enclave_worker.engine.gguf_tokenizer import gguf_tokenizer_json
from key_broker.keystore import DataKeyRegistry, LocalKeyStore, load_master_key

TINY: dict[str, Any] = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}
# Llama-3.2-1B's shape (hidden 2048, 16 layers, 32 heads, 8 KV heads, MLP 8192) with the default
# model's 49152-token vocabulary: 1.07 B parameters, tied embeddings.
LLAMA_1B: dict[str, Any] = {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
                            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
                            "rope_theta": 500000.0, "max_position_embeddings": 8192, "tie_word_embeddings": True}


def random_llama(shape: dict[str, Any], *, seed: int = 0, dtype: torch.dtype = torch.float32) -> Checkpoint:
    import gguf

    reader = gguf.GGUFReader(str(default_gguf_path()))
    config, _ = _gguf_config(reader)
    config.update(shape, torch_dtype=str(dtype).removeprefix("torch."))
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for spec in tensor_specs(config, dtype):
        if spec.name.endswith("norm.weight"):
            tensors[spec.name] = torch.ones(spec.shape, dtype=dtype)
        else:
            tensors[spec.name] = (torch.randn(spec.shape, generator=gen) * 0.02).to(dtype)
    tok_json = gguf_tokenizer_json(lambda k, d=None: _field(reader, k, d))
    return Checkpoint(config=config, tensors=tensors, tokenizer_json=tok_json,
                      chat_template=_field(reader, "tokenizer.chat_template"))


def package_for_demo(home: Home, checkpoint: Checkpoint) -> Path:
    """Encrypt `checkpoint` as the demo tenant's model and register its data key with the broker's
    store, so `prepare_demo` finds a package and keeps it."""
    home.create()
    keystore = LocalKeyStore(home.broker / "keystore", load_master_key(home.broker / "master.key"))
    if not keystore.has_tenant_key(DEMO_TENANT):
        keystore.create_tenant_key(DEMO_TENANT)
    pkg = home.package(DEMO_TENANT, DEMO_MODEL, DEMO_VERSION)
    encrypted = encrypt_checkpoint(checkpoint, pkg, tenant=DEMO_TENANT, model=DEMO_MODEL, version=DEMO_VERSION,
                                   signing_key=ed25519_key(home.tenant_signing_key(DEMO_TENANT)))
    DataKeyRegistry(home.broker / "keystore", keystore).register(
        DEMO_TENANT, DEMO_MODEL, DEMO_VERSION, encrypted.data_key, encrypted.manifest.key_id,
        encrypted.manifest.signer, encrypted.manifest.plaintext_digest)
    return pkg
