"""The worker authenticates the key broker before it trusts a key, a receipt or a lease answer.

1. Before asking for a key: a fresh nonce to `POST /v1/broker/attestation`; the broker's evidence
   must verify and bind its identity document, and its measurement must be one the worker's MEASURED
   configuration pins (`broker_tee`, `broker_measurements`, and on SNP/TDX `broker_workload_ids`,
   the digest of the broker's init-data its hardware reports, and `broker_instances`, the instance key
   a broker makes at its initialisation, so a re-initialised or second broker is refused): the
   tenant's release policy, which
   admits this worker's measurement, thereby also fixes which brokers it trusts
   (attestation/broker_identity.py).
2. After the release: the attestation token must verify under the broker's attested token key, be
   for this model version and the HPKE key this worker made; the release receipt must verify under
   the attested receipt key and cover exactly the sealed key received, this token, and name the
   signer and model digest the worker then requires of the package (never taken from the answer
   unauthenticated).
3. The release policy: a second copy of the genuine broker, run with the operator's own state,
   passes 1 and 2; the tenant-signed policy it must hand over does not (release_policy_check.py).
4. Lease answers are MACed under a key derived from the data key (protocol/broker/client.py): once
   the data key is the attested broker's, only it can renew or revoke; nothing more is needed.

Any mismatch is `BrokerNotAuthenticated`: no key is used and the worker does not serve.
"""

from __future__ import annotations

import datetime as dt
import logging
import secrets
from dataclasses import dataclass

import httpx
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from attestation.broker_identity import VerifiedBroker, verify_broker_attestation
from attestation.errors import AttestationError
from attestation.token import TokenVerifier
from attestation.verifier import VerifierTrust
from enclave_worker.release_policy_check import check_tenant_release_policy
from enclave_worker.settings import WorkerSettings
from policy.release import ReleasePolicy
from protocol.broker.client import ReleasedKey
from protocol.broker.errors import BrokerClientError, BrokerNotAuthenticated
from protocol.broker.identity import BrokerAttestationRequest
from protocol.broker.receipts import check_release_receipt

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AuthenticatedRelease:
    """What the attested broker vouched for, read from its verified receipt."""

    signer: str | None
    model_digest: str
    release_policy: ReleasePolicy | None = None  # tenant-signed, checked here (None: no policy-admin key pinned)


def sim_platform_public(settings: WorkerSettings) -> bytes | None:
    """The simulated platform's public key (raw), which verifies a simulated broker's reports."""
    if settings.sim_platform_key is None:
        return None
    key = serialization.load_pem_private_key(settings.sim_platform_key.read_bytes(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise BrokerNotAuthenticated("the simulated platform key must be Ed25519")
    raw: bytes = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return raw



def broker_trust(settings: WorkerSettings) -> VerifierTrust:
    """Pinned roots for SNP/TDX (the packaged vendor roots); the simulated platform key only where
    the worker's measured configuration says its broker runs on the simulated TEE."""
    if settings.broker_tee == "sim":
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

        raw = sim_platform_public(settings)
        if raw is None:
            raise BrokerNotAuthenticated("a simulated broker is pinned, but there is no simulated platform key")
        return VerifierTrust(sim_platform_key=Ed25519PublicKey.from_public_bytes(raw))
    return VerifierTrust()


def authenticate_broker(settings: WorkerSettings, client: httpx.Client,
                        now: dt.datetime | None = None) -> VerifiedBroker:
    nonce = secrets.token_bytes(32)
    try:
        response = client.post("/v1/broker/attestation", json=BrokerAttestationRequest(nonce=nonce.hex()).model_dump())
        response.raise_for_status()
        answer = response.json()
        if not isinstance(answer, dict):
            raise ValueError("not an object")
        broker = verify_broker_attestation(answer, nonce=nonce, now=now or dt.datetime.now(dt.UTC),
                                           trust=broker_trust(settings),
                                           allowed_measurements=settings.broker_measurements,
                                           allowed_workload_ids=settings.broker_workload_ids,
                                           allowed_instances=settings.broker_instances)
    except (AttestationError, ValueError) as exc:
        log.error("key broker NOT authenticated (%s): no key is asked for", type(exc).__name__)
        raise BrokerNotAuthenticated(f"the key broker's attestation does not verify: {exc}") from exc
    except httpx.HTTPStatusError as exc:
        log.error("key broker NOT authenticated: its attestation endpoint answered %d", exc.response.status_code)
        raise BrokerNotAuthenticated("the key broker did not attest itself") from exc
    pinned = (broker.workload_id[:16] + "...") if settings.broker_workload_ids else "not pinned"
    log.info("key broker authenticated: %s, measurement %s..., workload id %s", broker.cpu.tee.value,
             broker.measurement[:16], pinned)
    return broker


def check_release(broker: VerifiedBroker, released: ReleasedKey, settings: WorkerSettings, hpke_public_key: bytes,
                  now: dt.datetime | None = None) -> AuthenticatedRelease:
    """The token and the receipt, under the keys the broker's evidence binds."""
    ref = settings.ref
    try:
        claims = TokenVerifier(broker.identity.token_jwks, broker.identity.issuer).verify_claims(
            released.token, now or dt.datetime.now(dt.UTC))
        claims.require_scope(ref)
        if claims.hpke_public_key != hpke_public_key.hex():
            raise BrokerNotAuthenticated("the attestation token is for another HPKE key")
        if claims.token_id != released.token_id:
            raise BrokerNotAuthenticated("the key answer names another token")
        body = check_release_receipt(released.receipt, broker.receipt_key, sealed_key=released.sealed_key,
                                     token_id=claims.token_id, ref=ref.as_dict())
        policy = None
        if settings.policy_admin_key is not None:  # 3. the tenant signed the policy it was released under
            policy = check_tenant_release_policy(released.release_policy, settings.policy_admin_key, ref, body,
                                        min_version=settings.min_release_policy_version)
    except (AttestationError, BrokerClientError) as exc:
        # The cause is one of this module's (or the verifiers') fixed sentences: no key, no content.
        log.error("key release NOT authenticated (%s): the key is not used (%s)", type(exc).__name__,
                  str(exc)[:200])
        if isinstance(exc, BrokerNotAuthenticated):
            raise
        raise BrokerNotAuthenticated(f"the key release does not verify: {exc}") from exc
    signer = body.get("signer")
    return AuthenticatedRelease(signer=str(signer) if signer is not None else None,
                                model_digest=str(body["model_digest"]), release_policy=policy)
