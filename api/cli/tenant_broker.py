"""The tenant's check of the key broker before it sends anything (issue #46, no trust on first use).

A tenant's file, `<home>/tenants/<tenant>/broker-pin.json`, says which broker the tenant trusts: its
TEE, measurement(s) (and workload ids), the evidence trust (simulated platform key or roots), the
broker *instance* (the instance key its attested identity named when the tenant answered its
invitation) and the tenant's own policy-admin public key. It is written when the tenant answers the
invitation (`sealed keys admin-key --invitation FILE --broker-policy POLICY`), from the broker's
evidence, never from what the operator says.

Before every data key, release policy or key statement it sends, the CLI (`require_own_governing_key`):
1. verifies the broker's evidence to a fresh nonce against the pin: measurement, and this instance
   (a re-initialised broker, or a second copy of the build, has another instance key: refused);
2. asks which policy-admin key governs the tenant there, with another fresh nonce, and checks the
   answer is signed by the attested instance key, names that nonce, and names the tenant's own key.
Otherwise it refuses (`TenantBrokerRefused`, exit 1) and sends nothing.
"""

from __future__ import annotations

import datetime as dt
import json
import secrets
from pathlib import Path
from typing import Any

import httpx
import typer
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from api.cli.broker_verify import broker_trust
from api.errors import SealedApiError
from api.tenant_tools import pin_path, write_pin
from attestation.broker_identity import VerifiedBroker, verify_broker_attestation
from attestation.errors import AttestationError
from policy.release_documents import invitation_acceptance, public_pem
from protocol.broker.tenancy import TenancyRefused, check_governing_key, check_invitation


class TenantBrokerRefused(SealedApiError):
    """The broker is not the one the tenant pinned, or the key governing the tenant there is not its own."""


def attest(url: str, pin: dict[str, Any], base: Path | None = None,
           now: dt.datetime | None = None) -> VerifiedBroker:
    """The broker at ``url``, verified to a fresh nonce against ``pin`` (a client policy's shape)."""
    broker = pin.get("broker") or {}
    nonce = secrets.token_bytes(32)
    try:
        answer = httpx.post(f"{url.rstrip('/')}/v1/broker/attestation", json={"nonce": nonce.hex()}, timeout=30.0)
        answer.raise_for_status()
        return verify_broker_attestation(
            answer.json(), nonce=nonce, now=now or dt.datetime.now(dt.UTC),
            trust=broker_trust(pin, allow_simulated=False, base=base),
            allowed_measurements=list(broker.get("measurements") or []),
            allowed_workload_ids=list(broker.get("workload_ids") or []),
            allowed_instances=list(broker.get("instances") or []))
    except (AttestationError, httpx.HTTPError, ValueError) as exc:
        raise TenantBrokerRefused(f"the key broker at {url} is not the one pinned: "
                                  f"{type(exc).__name__}: {exc}") from exc


def answer_invitation(url: str, tenant: str, invitation: Any, broker_policy: dict[str, Any], key: Ed25519PrivateKey,
                      key_id: str, home: Path, base: Path | None = None,
                      now: dt.datetime | None = None) -> dict[str, Any]:
    """Verify the broker and its invitation, pin that broker instance and this key (the tenant's
    file), and return the signed acceptance to send."""
    verified = attest(url, broker_policy, base, now)
    try:
        payload = check_invitation(invitation, instance_key=verified.identity.instance_key, tenant=tenant,
                                   now=now or dt.datetime.now(dt.UTC))
    except TenancyRefused as exc:
        raise TenantBrokerRefused(f"invitation refused: {exc}") from exc
    broker = {k: v for k, v in (broker_policy.get("broker") or {}).items()
              if k in ("tee", "measurements", "workload_ids")}
    write_pin(home, tenant, {
        "tenant": tenant, "url": url.rstrip("/"),
        "broker": {**broker, "instances": [verified.identity.instance_id]},
        "evidence": {k: v for k, v in (broker_policy.get("evidence") or {}).items()
                     if k in ("sim_platform_key", "unsafe_roots_dir")},
        "appraisal": {"unsafe_allow_simulated_tee": bool((broker_policy.get("appraisal") or {})
                                                         .get("unsafe_allow_simulated_tee"))},
        "policy_admin_public_key_pem": public_pem(key.public_key())})
    return invitation_acceptance(tenant, key, key_id, payload)


def load_pin(home: Path, tenant: str) -> dict[str, Any]:
    path = pin_path(home, tenant)
    try:
        return dict(json.loads(path.read_text()))
    except FileNotFoundError:
        raise TenantBrokerRefused(
            f"no key broker is pinned for tenant {tenant} ({path}): answer the broker's invitation first "
            "(`sealed keys admin-key --tenant T --invitation FILE --broker-policy POLICY`)") from None
    except (OSError, ValueError) as exc:
        raise TenantBrokerRefused(f"{path} unreadable: {type(exc).__name__}") from exc


def require_own_governing_key(url: str, tenant: str, home: Path, now: dt.datetime | None = None) -> str:
    """The key id of the tenant's own policy-admin key, if the pinned broker instance at ``url``
    says (attested, to a fresh nonce) that it governs ``tenant``; TenantBrokerRefused otherwise."""
    pin = load_pin(home, tenant)
    verified = attest(url, pin, None, now)
    nonce = secrets.token_hex(32)
    try:
        answer = httpx.post(f"{url.rstrip('/')}/v1/broker/tenants/{tenant}/governing-key", json={"nonce": nonce},
                            timeout=30.0)
        answer.raise_for_status()
        return check_governing_key(answer.json(), instance_key=verified.identity.instance_key, tenant=tenant,
                                   nonce=nonce, own_public_pem=str(pin["policy_admin_public_key_pem"]))
    except (TenancyRefused, httpx.HTTPError, ValueError, KeyError) as exc:
        raise TenantBrokerRefused(f"refusing to send anything for {tenant}: {exc}") from exc


def guard(url: str, tenant: str, home: Path) -> str:
    """`require_own_governing_key` for a CLI command: prints the refusal and exits 1."""
    try:
        return require_own_governing_key(url, tenant, home)
    except TenantBrokerRefused as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc


def repin_key(home: Path, tenant: str, key: Ed25519PrivateKey) -> None:
    """After a rotation the broker confirmed: the tenant's pin names its new key."""
    pin = load_pin(home, tenant)
    write_pin(home, tenant, {**pin, "policy_admin_public_key_pem": public_pem(key.public_key())})
