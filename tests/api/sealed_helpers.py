"""Client-side trust for a `sealed up` stack in tests: its broker JWKS and its worker's measurement."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from api.home import Home
from api.stack import DEMO_ADMIN_KEY_ID, DEMO_TENANT, worker_settings
from enclave_worker.measurement import simulated_measurement


def demo_client_policy(home: Path) -> dict[str, Any]:
    """The stack's own client policy if `sealed up` wrote one, else the same computed here."""
    written = home / "demo" / "client-policy.json"
    if written.exists():
        doc = json.loads(written.read_text())
        if doc.get("state_file"):  # relative to the policy's folder, which a dict no longer knows
            doc["state_file"] = str(written.parent / doc["state_file"])
        return dict(doc)
    measurement = simulated_measurement(worker_settings(Home(home), "", 0).measured_config()).hex()
    sim_public = ed25519(Home(home).sim_key).public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    admin = Home(home).tenant_policy_admin_public(DEMO_TENANT).read_text()
    return {"tenant": DEMO_TENANT, "tenant_keys": [{"key_id": DEMO_ADMIN_KEY_ID, "public_key_pem": admin}],
            "evidence": {"sim_platform_key": sim_public.hex()},
            "appraisal": {"allowed_tee": ["sim"], "allowed_measurements": [measurement],
                          "unsafe_allow_simulated_tee": True},
            "broker_jwks": json.loads((home / "broker" / "jwks.json").read_text()),
            "require_promises": {"prompts_logged": False, "prefix_cache_isolation": "per-tenant-salt"}}


def ed25519(path: Path) -> Any:
    from cryptography.hazmat.primitives import serialization

    return serialization.load_pem_private_key(path.read_bytes(), password=None)
