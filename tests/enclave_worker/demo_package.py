"""Package any checkpoint as the demo tenant's model, as `sealed up` packages the default one.

The fake-TEE end-to-end tests use a tiny random-weight Llama and the GPU script in tests/gpu a
1B-class one (sealed_bench.gpu_models.random_checkpoint): only the architecture matters there,
not what the model says.
"""

from __future__ import annotations

from pathlib import Path

from api.broker_state import local_broker_keys
from api.home import Home, ed25519_key
from api.stack import DEMO_MODEL, DEMO_TENANT, DEMO_VERSION
from api.tenant_tools import encrypt_checkpoint
from enclave_worker.engine.checkpoint import Checkpoint
from key_broker.keystore import DataKeyRegistry, LocalKeyStore
from key_broker.statefile import local_ledger
from protocol.model_ref import ModelRef


def package_for_demo(home: Home, checkpoint: Checkpoint) -> Path:
    """Encrypt `checkpoint` as the demo tenant's model and register its data key with the broker's
    store, so `prepare_demo` finds a package and keeps it."""
    home.create()
    master = local_broker_keys(home).master_key  # the broker's sealed master key (simulated TEE)
    ledger = local_ledger(home.broker, master)  # as the broker and `sealed up` write: recorded in its ledger
    keystore = LocalKeyStore(home.broker / "keystore", master, ledger)
    if not keystore.has_tenant_key(DEMO_TENANT):
        keystore.create_tenant_key(DEMO_TENANT)
    pkg = home.package(DEMO_TENANT, DEMO_MODEL, DEMO_VERSION)
    encrypted = encrypt_checkpoint(checkpoint, pkg, tenant=DEMO_TENANT, model=DEMO_MODEL, version=DEMO_VERSION,
                                   signing_key=ed25519_key(home.tenant_signing_key(DEMO_TENANT)))
    DataKeyRegistry(home.broker / "keystore", keystore, ledger).register(
        ModelRef(DEMO_TENANT, DEMO_MODEL, DEMO_VERSION), encrypted.data_key, encrypted.manifest.key_id,
        encrypted.manifest.signer, encrypted.manifest.plaintext_digest)
    return pkg
