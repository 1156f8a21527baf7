"""Worker boot: attest, obtain the data key, decrypt the package into memory, build the engine."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import httpx
import torch
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from attestation.attesters import Attester
from attestation.bundle import EvidenceBundle, RuntimeData
from attestation.workload import WorkloadClaims
from enclave_worker.broker_auth import authenticate_broker, check_release
from enclave_worker.cold_start import ColdStart
from enclave_worker.engine import EngineConfig, LLMEngine
from enclave_worker.engine.checkpoint import Checkpoint
from enclave_worker.engine.embedding_engine import EmbeddingEngine
from enclave_worker.engine.errors import InvalidRequestError
from enclave_worker.engine.layers.quantized_weight import unflatten as unflatten_quantized
from enclave_worker.engine_protocol import ServingEngine
from enclave_worker.gpu import check_gpu_confidentiality
from enclave_worker.memory_fit import check_package_fits
from enclave_worker.package import DecryptedModel, decrypt_package
from enclave_worker.package.device_reader import decrypt_package_to_device
from enclave_worker.settings import WorkerSettings
from enclave_worker.tee import make_attester
from policy.policyset import PolicySet
from policy.release import ReleasePolicy
from protocol.broker.client import ReleasedKey, obtain_data_key
from protocol.broker.errors import BrokerNotAuthenticated
from protocol.broker.sealing import raw_public_key
from protocol.package.format import manifest_names
from protocol.tracing import NULL_SPAN, NoTracing, Tracing

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BootedWorker:
    engine: ServingEngine
    released: ReleasedKey
    model_digest: str
    decrypted: DecryptedModel
    gpu_cc_off: bool = False  # serving on a GPU without CC (tenant's unsafe_allow_gpu_cc_off): insecure
    load_s: float = 0.0  # attestation, key release, decryption and engine build
    # The tenant-signed release policy the key came under, as this worker checked it (None: the worker
    # pins no policy-admin key); stated to clients with the receipt key (release_statement.py).
    release_policy: ReleasePolicy | None = None
    # The attester the key was released to: renewals (freshness.py) make their evidence with it. Made
    # once per process: on the simulated TEE it hashes the worker's whole import closure (seconds on a
    # loaded machine), which a second attester would redo while the first requests are served.
    attester: Attester | None = None

    def wipe(self) -> None:
        """Zero every weight the engine holds (on a GPU: in GPU memory), the KV pool and the
        decrypted buffer (on revocation), and wait until the device has done it."""
        self.engine.wipe()
        self.decrypted.wipe()
        if self.decrypted.buffer.is_cuda:
            torch.cuda.synchronize(self.decrypted.buffer.device)


def engine_config(settings: WorkerSettings) -> EngineConfig:
    return EngineConfig(
        device=settings.device,
        dtype=settings.dtype,
        max_num_seqs=settings.max_num_seqs,
        max_num_batched_tokens=settings.step_token_budget,
        max_model_len=settings.max_model_len,
        kv_cache_memory_bytes=settings.kv_cache_memory_bytes,
        gpu_memory_utilization=settings.gpu_memory_utilization if settings.on_gpu else None,
        cpu_memory_utilization=None if settings.on_gpu else settings.cpu_memory_utilization,
        cpu_class=None if settings.on_gpu else settings.cpu_class,
        num_threads=settings.num_threads,
        decode_kernels=settings.decode_kernels,
    )


def _release_unaliased(model: DecryptedModel, engine: ServingEngine) -> DecryptedModel:
    """When the engine converted every weight (another dtype, a fused layout), the decrypted
    buffer is a second plaintext copy: zero it and let it go (on a GPU, that memory is the KV pool's)."""
    buffer = model.buffer.untyped_storage().data_ptr()
    # Packed (opaque-layout) weights have no storage to compare: oneDNN allocated them, so they
    # never alias the buffer.
    if any(not t.is_mkldnn and t.untyped_storage().data_ptr() == buffer for t in engine.held_tensors()):
        return model
    model.wipe()
    return DecryptedModel(model.manifest, model.signer, model.metadata, {},
                          torch.zeros(0, dtype=torch.uint8, device=model.buffer.device))


def build_engine(settings: WorkerSettings, model: DecryptedModel) -> ServingEngine:
    """The engine the measured configuration names, built from the decrypted package; for a package of
    kind "embedding" (signed in its manifest), the encoder (`EmbeddingEngine`) instead of a decoder."""
    if model.manifest.kind == "embedding":
        return build_embedding_engine(settings, model)
    if settings.engine == "vllm":
        # Imported here: vLLM is installed only where a worker serves with it.
        from enclave_worker.vllm_engine.build import build_vllm_engine

        return build_vllm_engine(settings, model)
    checkpoint = Checkpoint(
        config=model.metadata["config"],
        # a package's quantized weights come back as QuantizedWeight views of the buffer, each checked
        tensors=unflatten_quantized(model.tensors, model.metadata.get("quantization")),
        tokenizer_json=model.metadata["tokenizer_json"],
        chat_template=model.metadata.get("chat_template"),
        release=model.release,  # the buffer shrinks as the build converts its tensors (page_release.py)
    )
    return LLMEngine.from_checkpoint(checkpoint, engine_config(settings))


def build_embedding_engine(settings: WorkerSettings, model: DecryptedModel) -> EmbeddingEngine:
    """The encoder, from the decrypted buffer (in memory: nothing of it reaches the disk)."""
    if settings.engine != "sealed":
        raise InvalidRequestError("an embedding model is served by the sealed engine only (not vLLM)")
    checkpoint = Checkpoint(config=model.metadata["config"], tensors=dict(model.tensors),
                            tokenizer_json=model.metadata["tokenizer_json"], chat_template=None)
    return EmbeddingEngine.from_checkpoint(checkpoint, engine_config(settings))


def broker_unauthenticated(settings: WorkerSettings) -> bool:
    if settings.unsafe_unauthenticated_broker:
        log.warning("UNSAFE: the key broker is not authenticated; any answer at %s is trusted", settings.broker_url)
        return True
    if not settings.broker_measurements:
        raise BrokerNotAuthenticated("no key broker measurement is pinned in this worker's measured configuration")
    return False


def boot(settings: WorkerSettings, channel_binding: bytes = b"", hpke_key: X25519PrivateKey | None = None,
         policy_set: PolicySet | None = None, tracing: Tracing | None = None,
         cold: ColdStart | None = None, attester: Attester | None = None) -> BootedWorker:
    """Attest, obtain the data key, decrypt and build the engine; ``cold``: the phases so far (a warm
    worker's boot), else they start at this process's start; ``attester``: this process's (a warm
    worker made it while it waited), else made here."""
    cold = cold or ColdStart()
    cold.trace(tracing or NoTracing())
    try:
        return _boot(settings, channel_binding, hpke_key, policy_set, tracing, cold, attester)
    except BaseException as exc:
        cold.end(error=type(exc).__name__)
        raise


def _boot(settings: WorkerSettings, channel_binding: bytes, hpke_key: X25519PrivateKey | None,
          policy_set: PolicySet | None, tracing: Tracing | None, cold: ColdStart,
          attester: Attester | None) -> BootedWorker:
    started = time.monotonic()
    # Before any key is asked for: a worker that may not serve on its device never gets one.
    gpu_cc_off = check_gpu_confidentiality(settings, policy_set)
    # The attester binds the package's digest as the disk had it when it was made; a package swapped
    # since is refused below (its digest differs from the one the evidence binds).
    attester = attester or make_attester(settings, policy_set.version if policy_set else 0)
    hpke_key = hpke_key or X25519PrivateKey.generate()
    tracing = tracing or NoTracing()
    # A model that cannot fit is refused from its signed manifest before a key is asked for (the signer
    # the key names is checked again when the package is decrypted).
    check_package_fits(settings, None)
    release_started = cold.checks_done()

    def make_bundle(data: RuntimeData) -> EvidenceBundle:
        cold.mark("broker", release_started)  # the broker authenticated itself and sent its nonce
        return cold.timed("attest", lambda: attester.bundle(data))
    span = tracing.start("worker.key_release", kind="client", attributes={
        "sealed.tenant": settings.tenant, "gen_ai.request.model": settings.model}) if tracing.enabled else NULL_SPAN
    try:
        # The span's W3C context rides on the broker requests (key_broker/tracing.py continues it).
        with httpx.Client(base_url=settings.broker_url, timeout=30.0, headers=tracing.headers(span)) as client:
            # Before anything is sent or taken: the broker proves it is the attested broker this worker pins.
            broker = None if broker_unauthenticated(settings) else authenticate_broker(settings, client)
            released = obtain_data_key(client, settings.ref, make_bundle=make_bundle,
                                       channel_binding=channel_binding, hpke_key=hpke_key)
    except BaseException as exc:
        span.end(error=type(exc).__name__)
        raise
    span.end()
    if broker is not None:
        # The token and the receipt under the broker's attested keys; signer and digest from the receipt.
        authentic = check_release(broker, released, settings, raw_public_key(hpke_key))
        signer, digest, release_policy = authentic.signer, authentic.model_digest, authentic.release_policy
    else:
        release_policy = None
        receipt = released.receipt.get("receipt", {})
        signer, digest = receipt.get("signer"), receipt.get("model_digest")
    # The broker appraised CPU and GPU evidence together and released the key: only now do the
    # GPUs accept work (nvtrust's order: attest, verify, then set the ready state).
    attester.accepted()
    cold.mark("release", cold.spans.get("attest", (release_started, release_started))[1])
    if settings.gpu_tee:
        log.info("GPUs ready: the key broker accepted their evidence with the CPU's")
    # The signer the key was registered with (and the release policy checked) must have signed
    # the manifest we decrypt; the control plane cannot swap in another tenant-signed package.
    decrypt_started = time.monotonic()
    if settings.on_gpu:
        # Segment by segment into GPU memory: one segment of plaintext in CPU memory at a time.
        model = decrypt_package_to_device(settings.package_dir, released.data_key, settings.device,
                                          required_signer=signer)
    else:
        # Streamed: tensor by tensor as the build takes them, after the whole payload is authenticated.
        model = decrypt_package(settings.package_dir, released.data_key, required_signer=signer,
                                stream=settings.stream_package and settings.engine == "sealed")
    load_started = cold.mark("decrypt", decrypt_started)
    try:
        manifest = model.manifest
        if not manifest_names(manifest, settings.ref):
            raise ValueError("package is for another tenant, model or version")
        if digest != manifest.plaintext_digest:
            raise ValueError("decrypted model digest differs from the digest the key was released for")
        if WorkloadClaims.decode(attester.workload).model_digest != manifest.plaintext_digest:
            # The evidence told clients this digest: serve nothing else (a package swapped on disk).
            raise ValueError("decrypted model digest differs from the digest the evidence binds")
        try:
            engine = build_engine(settings, model)
        finally:
            model.end_stream()  # a streamed package decrypts nothing after its build
        model = _release_unaliased(model, engine)
    except BaseException:
        model.wipe()
        raise
    cold.mark("load", load_started)
    load_s = time.monotonic() - started
    log.info("model %s/%s loaded on %s as %s (%d tensors) in %.1f s; serving", settings.model, settings.version,
             settings.device, settings.dtype, len(model.manifest.tensors), load_s)
    return BootedWorker(engine=engine, released=released, model_digest=model.manifest.plaintext_digest,
                        decrypted=model, gpu_cc_off=gpu_cc_off, load_s=load_s, release_policy=release_policy,
                        attester=attester)
