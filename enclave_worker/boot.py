"""Worker boot: attest, obtain the data key, decrypt the package into memory, build the engine."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import httpx
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from enclave_worker.engine import EngineConfig, LLMEngine
from enclave_worker.engine.checkpoint import Checkpoint
from enclave_worker.package import DecryptedModel, decrypt_package
from enclave_worker.settings import WorkerSettings
from enclave_worker.tee import make_attester
from protocol.broker.client import ReleasedKey, obtain_data_key

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BootedWorker:
    engine: LLMEngine
    released: ReleasedKey
    model_digest: str
    decrypted: DecryptedModel

    def wipe(self) -> None:
        """Zero every weight the engine holds and the decrypted buffer (on revocation)."""
        self.engine.wipe()
        self.decrypted.wipe()


def engine_config(settings: WorkerSettings) -> EngineConfig:
    return EngineConfig(
        dtype=settings.engine_dtype,
        max_num_seqs=settings.max_num_seqs,
        max_model_len=settings.max_model_len,
        kv_cache_memory_bytes=settings.kv_cache_memory_bytes,
    )


def boot(settings: WorkerSettings, channel_binding: bytes = b"", hpke_key: X25519PrivateKey | None = None
         ) -> BootedWorker:
    attester = make_attester(settings)
    with httpx.Client(base_url=settings.broker_url, timeout=30.0) as client:
        released = obtain_data_key(client, tenant=settings.tenant, model=settings.model,
                                   version=settings.version, make_bundle=attester.bundle,
                                   channel_binding=channel_binding, hpke_key=hpke_key)
    # The broker appraised CPU and GPU evidence together and released the key: only now do the
    # GPUs accept work (nvtrust's order: attest, verify, then set the ready state).
    attester.accepted()
    if settings.gpu_tee:
        log.info("GPUs ready: the key broker accepted their evidence with the CPU's")
    receipt = released.receipt.get("receipt", {})
    # The signer the key was registered with (and the release policy checked) must have signed
    # the manifest we decrypt; the control plane cannot swap in another tenant-signed package.
    model = decrypt_package(settings.package_dir, released.data_key, required_signer=receipt.get("signer"))
    try:
        manifest = model.manifest
        if (manifest.tenant, manifest.model, manifest.version) != (settings.tenant, settings.model, settings.version):
            raise ValueError("package is for another tenant, model or version")
        if receipt.get("model_digest") != manifest.plaintext_digest:
            raise ValueError("decrypted model digest differs from the digest the key was released for")
        checkpoint = Checkpoint(
            config=model.metadata["config"],
            tensors=model.tensors,
            tokenizer_json=model.metadata["tokenizer_json"],
            chat_template=model.metadata.get("chat_template"),
        )
        engine = LLMEngine(checkpoint, engine_config(settings))
    except BaseException:
        model.wipe()
        raise
    log.info("model %s/%s loaded (%d tensors); serving", settings.model, settings.version, len(model.tensors))
    return BootedWorker(engine=engine, released=released, model_digest=model.manifest.plaintext_digest,
                        decrypted=model)
