"""The key broker's simulated measurement: its own import closure and its measured configuration.

Like the worker's (`enclave_worker.measurement`), computed with the same walker
(`attestation.sim.closure`) over everything `python -m key_broker` can import, plus the settings
that decide what the broker is (issuer, its TEE, its key store, whether it accepts simulated
workers). Editing a module the broker runs changes it; so does another measured setting. Workers pin
it (`WorkerSettings.broker_measurements`, part of their own measured configuration) and `sealed
verify --broker` checks it; the broker's state is sealed to it (key_broker/sealed_keys.py).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization

from attestation.sim import worker_measurement
from attestation.sim.closure import closure_code
from key_broker.errors import SettingsError
from key_broker.settings import BrokerSettings

ENTRY_POINT = "key_broker.__main__"


def measured_config(settings: BrokerSettings) -> dict[str, Any]:
    """What the broker's measurement covers besides its code (and its identity document shows)."""
    sim_workers = None
    if settings.sim_platform_public_key is not None:
        public = serialization.load_pem_public_key(settings.sim_platform_public_key.read_bytes())
        raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        sim_workers = hashlib.sha256(raw).hexdigest()
    # Roots other than the packaged ones (attestation/roots, pinned by the image digest) decide whose
    # hardware the broker believes: on a hardware TEE their content is measured (so in the broker's
    # init-data), not only their path. On the simulated TEE the operator holds the platform key that
    # makes any measurement, so roots there (the fake-TEE harness's test PKIs) add nothing to it.
    roots = ({"roots_sha256": roots_digest(settings.roots_dir)}
             if settings.roots_dir is not None and settings.tee != "sim" else {})
    return {
        **roots,
        "role": "key-broker",
        "issuer": settings.issuer,
        "tee": settings.tee,
        "keystore": settings.keystore,
        "vault_url": settings.vault_url if settings.keystore == "vault" else None,
        "vault_mount": settings.vault_mount if settings.keystore == "vault" else None,
        "accepts_sim_workers": sim_workers,  # sha256 of the simulated platform key it verifies, or None
    }


def roots_digest(directory: Path) -> str:
    """SHA-256 over every file of a roots directory (name and bytes, in name order); a directory that
    cannot be read is refused rather than measured as empty."""
    h = hashlib.sha256()
    try:
        files = sorted(p for p in directory.iterdir() if p.is_file())
        for path in files:
            data = path.read_bytes()
            h.update(len(path.name).to_bytes(4, "big") + path.name.encode() + len(data).to_bytes(8, "big") + data)
    except OSError as exc:
        raise SettingsError(f"the roots directory {directory} cannot be read: {exc}") from exc
    return h.hexdigest()


def simulated_measurement(settings: BrokerSettings) -> bytes:
    return worker_measurement(closure_code(ENTRY_POINT), measured_config(settings))
