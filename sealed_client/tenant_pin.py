"""The client pins the tenant, not only the build: a worker is accepted only if its key came under a
release policy the tenant's own policy-admin key signed, and that policy names the worker's image.

The worker states, signed with its receipt key (which its evidence binds), the tenant-signed release
policy the broker handed it with its key (protocol/sealed/release_statement.py; the worker checked
the tenant's signature itself before using the key). Here the client checks, itself:

1. the statement verifies under the evidence-bound receipt key and names this worker (tenant, model,
   version, HPKE key) and the digest of the envelope served beside it;
2. the envelope is signed by a tenant key this client pins (not one its revocation list revokes);
3. the policy is for this tenant and model, and names the worker's measurement, TEE and (where the
   policy names any) workload id: the images a tenant accepts are those its own signed policy
   names. A publisher's statement only corroborates (it must also name the measurement, where the
   client pins a publisher); it cannot add an image;
4. the tenant's revocation list revokes neither the policy nor the data key the worker holds.

A second genuine broker with the operator's state (its own policy-admin key registered there, its own
data key and release policy) therefore gets no worker accepted: it cannot produce the tenant's signature.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from attestation.client import PinnedWorker
from policy.documents import check_envelope_signature, envelope_parts
from policy.errors import PolicyError
from policy.release import ReleasePolicy
from policy.release_documents import REFERENCE_KEY, RELEASE_DOMAIN, load_admin_public_key
from policy.revocations import RevocationList, verify_revocation_list
from protocol.sealed.release_statement import ReleaseStatementError, read_release_statement
from sealed_client.errors import TenantPinError, WorkerRevoked


@dataclass(frozen=True)
class TenantRelease:
    """What the tenant signed, as the worker's statement binds it."""

    policy_id: str
    version: int
    sha256: str
    admin_key_id: str
    data_key_id: str


def parse_tenant_keys(doc: Any) -> dict[str, Ed25519PublicKey]:
    """`[{"key_id": "...", "public_key_pem": "-----BEGIN PUBLIC KEY-----..."}, ...]` -> key id -> key."""
    if not isinstance(doc, list) or not doc:
        raise TenantPinError(["tenant_keys must be a non-empty list of {key_id, public_key_pem}"])
    keys: dict[str, Ed25519PublicKey] = {}
    for item in doc:
        if not isinstance(item, Mapping) or set(item) != {"key_id", "public_key_pem"} or not item["key_id"]:
            raise TenantPinError(["each tenant key is {key_id, public_key_pem}"])
        try:
            keys[str(item["key_id"])] = load_admin_public_key(str(item["public_key_pem"]))
        except PolicyError as exc:
            raise TenantPinError([f"tenant key {item['key_id']!r}: {exc}"]) from exc
    return keys


def newest_revocations(lists: list[Mapping[str, Any]], keys: Mapping[str, Ed25519PublicKey],
                       tenant: str) -> tuple[RevocationList | None, Mapping[str, Any] | None]:
    """The newest of `lists` (envelopes) that the pinned tenant keys verify; any that does not is
    refused (TenantPinError): a list the client was given is the tenant's, or a mistake to report."""
    best: tuple[RevocationList | None, Mapping[str, Any] | None] = (None, None)
    for envelope in lists:
        try:
            revocations = verify_revocation_list(envelope, keys)
        except PolicyError as exc:
            raise TenantPinError([f"the revocation list does not verify under the pinned tenant keys: {exc}"]) from exc
        if revocations.tenant != tenant:
            raise TenantPinError([f"the revocation list is for tenant {revocations.tenant!r}, not {tenant!r}"])
        if best[0] is None or revocations.serial > best[0].serial:
            best = (revocations, envelope)
    return best


def check_tenant_release(doc: Mapping[str, Any], worker: PinnedWorker, receipt_key: bytes, worker_key_id: str,
                         keys: Mapping[str, Ed25519PublicKey], revocations: RevocationList | None) -> TenantRelease:
    """The tenant-signed release policy the worker got its key under, checked as the module says."""
    workload = worker.workload
    try:
        statement, envelope = read_release_statement(doc.get("release"), receipt_key)
    except ReleaseStatementError as exc:
        if doc.get("release") is None:
            raise TenantPinError(["the worker does not state under which tenant-signed release policy it got its "
                                  "key (it pins no policy-admin key, or the statement was stripped)"]) from exc
        raise TenantPinError([f"the worker's release statement: {exc}"]) from exc
    named = (statement.tenant, statement.model, statement.version, statement.worker_key_id)
    if named != (workload.tenant, workload.model, workload.version, worker_key_id):
        raise TenantPinError(["the release statement names another tenant, model, version or worker key than the "
                              "worker's evidence binds"])
    revoked = revocations.revoked_admin_keys if revocations else frozenset()
    try:
        payload, key_id = envelope_parts(envelope)
        key = keys.get(key_id)
        if key is None or key_id in revoked:
            why = "is revoked by the tenant" if key_id in revoked else "is not a tenant key this client pins"
            raise TenantPinError([f"the release policy the worker's key came under is signed by {key_id[:64]!r}, "
                                  f"which {why} (a broker with another tenant state, or the operator's own key)"])
        check_envelope_signature(envelope, key, RELEASE_DOMAIN)
        policy = ReleasePolicy.from_dict({k: v for k, v in payload.items() if k != REFERENCE_KEY})
    except PolicyError as exc:
        raise TenantPinError([f"the release policy the worker's key came under is not signed by the pinned tenant "
                              f"key: {exc}"]) from exc
    if (policy.policy_id, policy.version, key_id) != (statement.release_policy_id, statement.release_policy_version,
                                                      statement.admin_key_id):
        raise TenantPinError(["the release statement names another policy id, version or signer than the envelope"])
    if policy.tenant != workload.tenant or policy.model != workload.model or policy.model_version not in (
            None, workload.version):
        raise TenantPinError(["the tenant-signed release policy is for another tenant or model"])
    measurement = worker.measurement.lower()
    reasons = []
    if measurement not in policy.allowed_measurements:
        reasons.append(f"the worker's measurement {measurement[:16]}... is not one the tenant's signed release "
                       f"policy {policy.policy_id} v{policy.version} names (a publisher cannot add an image)")
    if worker.tee not in policy.allowed_tee:
        reasons.append(f"the tenant's signed release policy does not allow the {worker.tee} TEE")
    workload_ids = policy.allowed_workload_ids
    if workload_ids is not None and worker.hardware.workload_id.lower() not in workload_ids:
        reasons.append("the worker's workload id is not one the tenant's signed release policy names")
    if reasons:
        raise TenantPinError(reasons)
    if revocations is not None:
        if (policy.policy_id, policy.version) in revocations.revoked_release_policies:
            raise WorkerRevoked([f"the tenant revoked release policy {policy.policy_id} v{policy.version} "
                                 f"(revocation list serial {revocations.serial})"])
        if statement.data_key_id in revocations.revoked_data_keys:
            raise WorkerRevoked([f"the tenant revoked the data key {statement.data_key_id!r} the worker holds "
                                 f"(revocation list serial {revocations.serial})"])
    return TenantRelease(policy_id=policy.policy_id, version=policy.version, sha256=statement.release_policy_sha256,
                         admin_key_id=key_id, data_key_id=statement.data_key_id)
