"""How one worker's attestation document becomes a pinned sealing key, under what the client trusts
(`ClientTrust`, sealed_client/trust.py)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from attestation.appraisal import AppraisalPolicy
from attestation.bundle import EvidenceBundle, channel_binding
from attestation.client import PinnedWorker, verify_worker_document
from attestation.errors import FreshnessError, PolicyViolation, UnboundClaim
from attestation.refvalues import ReferenceValues, ReferenceValuesError, verify_reference_values
from attestation.sigstore_refvalues import is_sigstore_bundle, verify_sigstore_reference_values
from attestation.token import TokenVerifier
from attestation.workload import WorkloadClaims
from attestation.x509chain import BAD_DER
from policy.revocations import RevocationList
from protocol.sealed import key_id
from sealed_client.memory import ClientMemory
from sealed_client.tenant_pin import TenantRelease, check_tenant_release, newest_revocations
from sealed_client.trust import ClientTrust as ClientTrust  # its home before the split; many import it from here


@dataclass(frozen=True)
class PinnedKey:
    """One verified worker: the key requests are sealed to, and the key its receipts are signed with.
    Tenant, model, version, model digest, policy version and promises are the ones the hardware
    evidence binds; a pin is for exactly that (tenant, model, version, model digest). It lasts as long
    as what it was verified with (`expires_at`): the token that corroborated the evidence, and the
    reference-value statement the measurement was found in; after that, fresh evidence is verified."""

    tenant: str
    model: str
    version: str
    worker_key_id: str
    hpke_public_key: bytes
    receipt_key: bytes  # raw Ed25519: the worker's usage-signing key, bound by its evidence
    worker: PinnedWorker
    promises: Mapping[str, Any]
    token_expires_at: int
    model_digest: str = ""
    policy_version: int = 0  # the tenant's signed policy set the worker enforces (bound by its evidence)
    evidence_sha256: str = ""  # EvidenceBundle.digest() of the evidence verified
    channel_spki: bytes = b""  # DER: the worker's TLS key, the channel binding's other half
    expires_at: float = 0.0  # min(token expiry, reference values' expiry); 0: the token's
    # The tenant-signed release policy the worker's key came under (tenant_pin.py); None: no tenant key pinned.
    release: TenantRelease | None = None

    def expired(self, now: dt.datetime) -> bool:
        return now.timestamp() >= (self.expires_at or self.token_expires_at)


def _spki(cert_pem: str | None) -> bytes:
    if not cert_pem:
        return b""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem.encode())
        return cert.public_key().public_bytes(serialization.Encoding.DER,
                                              serialization.PublicFormat.SubjectPublicKeyInfo)
    except BAD_DER as exc:  # the gateway's document is hostile: a typed refusal, never cryptography's own error
        raise FreshnessError(f"the worker's TLS certificate cannot be read ({type(exc).__name__})") from None


def effective_appraisal(trust: ClientTrust, published: ReferenceValues | None) -> AppraisalPolicy:
    """The client's appraisal policy, its allowed measurements widened by the publisher's signed set."""
    if not trust.pins_publisher:
        return trust.appraisal
    if published is None:
        raise ReferenceValuesError("the client pins a reference-value publisher but none were published")
    return dataclasses.replace(trust.appraisal,
                               allowed_measurements=trust.appraisal.allowed_measurements | published.measurements)


def open_client_state(trust: ClientTrust) -> tuple[ClientMemory, RevocationList | None]:
    """The client's memory (its state file; ClientStateError if named and missing or unreadable) and the
    newest tenant-signed revocation list of those it holds: its policy's `revocations` file and the
    one its state remembers (kept there if the file's is newer). A list that does not verify is refused."""
    memory = ClientMemory(trust.state_file)
    lists: list[Mapping[str, Any]] = [memory.revocations] if memory.revocations is not None else []
    if trust.revocations_file is not None:
        try:
            lists.append(json.loads(trust.revocations_file.read_text()))
        except (OSError, ValueError) as exc:
            raise PolicyViolation([f"the tenant's revocation list {trust.revocations_file} cannot be read "
                                   f"({type(exc).__name__}): nothing is accepted"]) from None
    if lists and not trust.tenant_keys:
        raise PolicyViolation(["a revocation list needs the tenant's key pinned (tenant_keys) to verify it"])
    revocations, envelope = newest_revocations(lists, trust.tenant_keys, trust.tenant)
    if envelope is not None:
        memory.record_revocations(envelope)
    return memory, revocations


def verify_sealed_document(doc: Mapping[str, Any], verifier: TokenVerifier, trust: ClientTrust,
                           now: dt.datetime, published: ReferenceValues | None = None,
                           model: str | None = None, *, memory: ClientMemory | None = None,
                           revocations: RevocationList | None = None) -> PinnedKey:
    """One entry of /.well-known/attestation: hardware evidence, appraisal and the token's
    corroboration (attestation.client), then what sealed mode relies on, each from the evidence:
    the tenant is the client's and the model the one asked for, the HPKE key is the one REPORT_DATA
    binds, the receipt key is bound by its channel binding, the policy version is at least the
    client's floor, and the promises the client requires are among the ones REPORT_DATA binds (and
    the publisher's statement, when it states promises). A claim served beside the evidence that
    differs from the bound one (edited promises, another version or digest) is refused: the client
    relies on the evidence alone and does not accept a document that contradicts it.

    With tenant keys pinned, the worker's key must have come under a release policy the tenant signed
    that names the worker's image, and is not revoked (tenant_pin.py); with `memory`, neither that
    policy nor the data policy the evidence binds may be older than the newest seen (PolicyDowngrade)."""
    worker = verify_worker_document(doc, verifier, effective_appraisal(trust, published), now,
                                    evidence_trust=trust.evidence_trust)
    workload = worker.workload
    check_served_claims(doc, workload)
    if workload.tenant != trust.tenant:
        raise PolicyViolation([f"the worker serves tenant {workload.tenant!r}; this client's policy is for "
                               f"tenant {trust.tenant!r}"])
    if model is not None and workload.model != model:
        raise PolicyViolation([f"the worker serves model {workload.model!r}, not {model!r}"])
    bundle = EvidenceBundle.from_json(doc["evidence"])
    if str(doc.get("sealed_key_id", "")) != key_id(worker.hpke_public_key):
        raise FreshnessError("the worker announces a sealing key its evidence does not bind (key change "
                             "without re-attestation)")
    try:
        receipt_key = bytes.fromhex(str(doc["usage_public_key"]))
        channel_spki = _spki(doc.get("grpc_tls_cert"))
        binding = channel_binding(channel_spki, receipt_key)
    except (KeyError, ValueError) as exc:
        raise FreshnessError("the worker's receipt key is missing or malformed") from exc
    if binding != bundle.runtime_data.channel_binding:
        raise FreshnessError("the worker's receipt key is not the one its evidence binds")
    if workload.policy_version < trust.min_policy_version:
        raise PolicyViolation([f"the worker enforces tenant policy version {workload.policy_version}, older than "
                               f"this client's floor {trust.min_policy_version}"])
    promises = workload.promises
    unmet = [k for k, v in trust.require_promises.items() if promises.get(k) != v]
    if unmet:
        raise PolicyViolation([f"the worker's evidence does not bind the promise {k}={trust.require_promises[k]!r}"
                               for k in unmet])
    if published is not None:
        differ = [k for k, v in published.promises.items() if promises.get(k) != v]
        if differ:
            raise PolicyViolation([f"the worker's evidence binds {k}={promises.get(k)!r}, the publisher's "
                                   f"statement says {published.promises[k]!r}" for k in differ])
    release = None
    if trust.tenant_keys:
        release = check_tenant_release(doc, worker, receipt_key, key_id(worker.hpke_public_key), trust.tenant_keys,
                                       revocations)
    if memory is not None:
        memory.check(workload.tenant, workload.model, release.version if release else None, workload.policy_version)
    expires = float(worker.attestation.expires_at)
    if published is not None:
        expires = min(expires, published.expires_at.timestamp())
    return PinnedKey(tenant=workload.tenant, model=workload.model, version=workload.version,
                     worker_key_id=key_id(worker.hpke_public_key), hpke_public_key=worker.hpke_public_key,
                     receipt_key=receipt_key, worker=worker, promises=promises,
                     token_expires_at=worker.attestation.expires_at, model_digest=workload.model_digest,
                     policy_version=workload.policy_version, evidence_sha256=bundle.digest(),
                     channel_spki=channel_spki, expires_at=expires, release=release)


_SERVED_CLAIMS = ("tenant", "model", "version", "model_digest", "promises")


def check_served_claims(doc: Mapping[str, Any], workload: WorkloadClaims) -> None:
    """Fields the gateway serves beside the evidence must say what the evidence binds, or be absent."""
    bound = {"tenant": workload.tenant, "model": workload.model, "version": workload.version,
             "model_digest": workload.model_digest, "promises": dict(workload.promises)}
    edited = [k for k in _SERVED_CLAIMS if k in doc and doc[k] != bound[k]]
    if edited:
        raise UnboundClaim([f"the served {k!r} is not what the worker's evidence binds (edited beside the "
                            "evidence; only the evidence is relied on)" for k in edited])


def verify_published(trust: ClientTrust, published: Mapping[str, Any] | None, now: dt.datetime,
                     newest_seen: int = 0) -> ReferenceValues | None:
    """The published reference values, verified as the client pinned their publisher: a Sigstore
    bundle for a Sigstore identity, a DSSE envelope for a key; the other form is refused. A statement
    older than the policy's floor or than `newest_seen` (the newest this client verified) is refused
    (`StaleReferenceValues`): a publisher's older, unexpired statement cannot roll the set back."""
    if not trust.pins_publisher:
        return None
    if published is None:
        raise ReferenceValuesError("no reference values published")
    floor = max(trust.min_reference_values_serial, newest_seen)
    if trust.reference_values_sigstore is not None:
        if not is_sigstore_bundle(published):
            raise ReferenceValuesError("the client pins a Sigstore publisher but the reference values are "
                                       "not a Sigstore bundle")
        return verify_sigstore_reference_values(published, trust.reference_values_sigstore, now, min_serial=floor)
    if is_sigstore_bundle(published):
        raise ReferenceValuesError("the client pins a publisher key but the reference values are a Sigstore bundle")
    assert trust.reference_values_key is not None
    return verify_reference_values(published, trust.reference_values_key, now, min_serial=floor)
