"""The key broker's release protocol: challenge -> attest (verify + release policy) -> sealed key.

Every refusal, whatever its cause, leaves as ReleaseRefused; the precise reason is written to the
audit log, never to the caller. No key material ever reaches the audit log or an error.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from attestation.bundle import EvidenceBundle
from attestation.errors import AttestationError
from attestation.token import AttestationClaims, TokenIssuer, TokenScope, TokenVerifier
from attestation.verifier import AttestationResult, VerifierTrust, verify_bundle
from key_broker.attested import BrokerSelf
from key_broker.errors import KeyBrokerError, RateLimited, ReleaseRefused
from key_broker.keystore import DataKeyRegistry, KeyStore
from key_broker.limits import BrokerLimiter, RateLimits
from key_broker.names import check_ref
from key_broker.nonces import Challenge, ChallengeStore
from key_broker.policies import PolicyStore, resolve
from key_broker.receipts import ReceiptBook
from key_broker.refvals import ReferenceValuesStore
from key_broker.statefile import StateLedger
from policy.audit import AuditLog
from policy.audit.edge import EdgeRefusals
from policy.decision import Decision
from policy.errors import PolicyError
from policy.release import ReleaseFacts, ReleasePolicy, evaluate_release
from protocol.broker.sealing import release_info, seal
from protocol.model_ref import ModelRef

log = logging.getLogger(__name__)
COMPONENT = "key-broker"

# (bundle, expected nonce, now) -> verified result; the default is attestation.verifier.verify_bundle.
EvidenceVerifier = Callable[[EvidenceBundle, bytes, dt.datetime], AttestationResult]


@dataclass(frozen=True)
class SealedKey:
    sealed: bytes
    token_id: str
    receipt: dict[str, Any]
    release_policy: dict[str, Any] | None = None  # the tenant-signed envelope the release was decided under


def _reason(exc: Exception) -> str:
    decision = getattr(exc, "decision", None)
    reason = getattr(exc, "reason", None) or "; ".join(getattr(decision, "reasons", ())) or str(exc)
    return f"{type(exc).__name__}: {reason}"[:512]


class KeyBrokerService:
    def __init__(
        self, *, keystore: KeyStore, datakeys: DataKeyRegistry, policies: PolicyStore, receipts: ReceiptBook,
        trust: VerifierTrust, issuer: TokenIssuer, audit: AuditLog, clock: Callable[[], dt.datetime],
        challenge_ttl: dt.timedelta = dt.timedelta(seconds=60), refvals: ReferenceValuesStore | None = None,
        limits: RateLimits | None = None, verify: EvidenceVerifier | None = None,
        state: StateLedger | None = None, attested: BrokerSelf | None = None,
        import_key: X25519PrivateKey | None = None,
    ) -> None:
        self.state = state  # the state ledger the stores read through (None: unit tests of the service)
        # The broker's attested identity (POST /v1/broker/attestation) and its sealed import key;
        # None only in unit tests of the release logic.
        self.attested = attested
        self.import_key = import_key or X25519PrivateKey.generate()
        self.keystore = keystore
        self.datakeys = datakeys
        self.policies = policies
        self.receipts = receipts
        self.refvals = refvals or ReferenceValuesStore(policies.root)
        self._trust = trust
        self.issuer = issuer
        self.audit = audit
        self.edge = EdgeRefusals(audit)  # schema refusals at the HTTP edge, aggregated
        self.clock = clock
        self._challenges = ChallengeStore(clock, challenge_ttl)
        self._limiter = BrokerLimiter(limits or RateLimits())
        self._verify = verify or (lambda b, nonce, now: verify_bundle(b, expected_nonce=nonce, now=now,
                                                                      trust=trust))
        self._verifier = TokenVerifier(issuer.jwks(), issuer.issuer)
        self._compiled: dict[str, ReleasePolicy] = {}
        # Tokens are single use for release. Released ids come back from the receipts on restart,
        # so a token cannot be replayed across a restart either.
        self._used_lock = threading.Lock()
        horizon = clock() + issuer.ttl
        self._used: dict[str, dt.datetime] = {  # token id -> when it can no longer verify anyway
            jti: horizon for jti in receipts.token_ids_since(clock() - issuer.ttl - dt.timedelta(minutes=1))}

    def _deny(self, tenant: str, action: str, reason: str, meta: dict[str, Any]) -> ReleaseRefused:
        # The audit layer bounds every attacker-controlled value, so this cannot fail on input; a
        # broken log (AuditIntegrityError) propagates and the edge answers 503, never a release.
        self.audit.append(tenant=tenant or "-", action=action, decision="deny", reason=reason, metadata=meta)
        log.info("refused %s for tenant %s", action, tenant or "-")
        return ReleaseRefused(reason)

    def check_rate(self, action: str, client: str) -> None:
        """Per-caller rate limit of a public route (RateLimited: the edge answers 429)."""
        self._limiter.check(action, client)

    def refuse(self, tenant: str, action: str, reason: str, meta: dict[str, Any]) -> None:
        """Audit a refusal decided at the edge (a malformed evidence bundle)."""
        self._deny(tenant, action, reason, meta)

    def close(self) -> None:
        self.receipts.close()
        self.edge.flush()  # the open window's summaries, before the log closes
        self.audit.close()

    def _policy(self, policy: ReleasePolicy) -> ReleasePolicy:
        # Compiling Cedar costs more than evaluating it; effective policies are rebuilt per
        # request (reference values may change), so reuse the compiled twin of an equal policy.
        key = json.dumps(policy.to_dict(), sort_keys=True)
        cached = self._compiled.get(key)
        if cached is None:
            if len(self._compiled) > 256:
                self._compiled.clear()
            self._compiled[key] = cached = policy
        return cached

    def _mark_used(self, jti: str, now: dt.datetime) -> None:
        with self._used_lock:
            if jti in self._used:
                raise ReleaseRefused("token already used for a release")
            if len(self._used) > 10_000:  # forget ids whose tokens have expired (they fail anyway)
                self._used = {j: t for j, t in self._used.items() if t > now}
            self._used[jti] = now + self.issuer.ttl + dt.timedelta(minutes=1)

    def challenge(self, client: str = "-") -> Challenge:
        self._limiter.check("challenge", client)
        return self._challenges.issue()

    def attest(self, *, session_id: str, bundle: EvidenceBundle, ref: ModelRef, client: str = "-") -> str:
        """Verify evidence and appraise it under the tenant's release policy; returns a scoped token."""
        self._limiter.check("attest", client)
        tenant, model, version = ref.tenant, ref.model, ref.version
        # One appraisal covers the CPU report and every GPU report of the bundle (evidence_digest
        # hashes them all); `gpus` says how many GPUs were in it.
        meta: dict[str, Any] = {"model": model, "version": version, "evidence_digest": bundle.digest(),
                                "tee": bundle.tee, "gpus": len(bundle.gpus)}
        try:
            check_ref(ref)
            # 1. The challenge is single use and short-lived: replays and stale bundles stop here.
            challenge = self._challenges.consume(session_id)
            now = self.clock()
            result, decision = self.appraise(bundle, challenge.nonce, ref, now, meta)
        except (AttestationError, KeyBrokerError, PolicyError, ValueError) as exc:
            raise self._deny(tenant, "attest", _reason(exc), meta) from exc
        claims = result.token_claims()
        claims["sealed"] = {**ref.as_dict(),
                            "policy_id": decision.policy_id, "policy_version": decision.policy_version,
                            "chip_id": result.cpu.extra.get("chip_id", "")}
        token = self.issuer.issue(claims, now)
        self.audit.append(tenant=tenant, action="attest", decision="allow", reason=decision.rule,
                          metadata=meta)
        return token

    def appraise(self, bundle: EvidenceBundle, nonce: bytes, ref: ModelRef, now: dt.datetime,
                 meta: dict[str, Any]) -> tuple[AttestationResult, Decision]:
        """Verify `bundle` as of `now` (under the collateral held now: CRLs, TCB info) and decide
        under the tenant's CURRENT release policy. Used at attestation and again at every lease
        renewal (key_broker/lease_appraisal.py). Raises on any failure; `meta` gathers the audit fields."""
        # Evidence: signatures, chains, revocation, binding of nonce + HPKE key + GPU evidence.
        result = self._verify(bundle, nonce, now)
        meta["measurement"] = result.cpu.measurement.hex()
        if result.workload_id:
            meta["workload_id"] = result.workload_id
        meta["gpu_cc"] = bool(result.gpus) and all(g.cc_enabled for g in result.gpus)
        # What the imported NVIDIA collateral said of every GPU (a RIM match, OCSP "good").
        rim_matched = bool(result.gpus) and all(g.rim_matched for g in result.gpus)
        ocsp_good = bool(result.gpus) and all(g.ocsp_status == "good" for g in result.gpus)
        if result.gpus:
            meta.update(gpu_rim_matched=rim_matched, gpu_ocsp_good=ocsp_good)
        # The tenant's release policy for this model version, default deny.
        policy, values = resolve(self.policies, self.refvals, ref)
        if values is not None:
            meta.update(reference_values=values.id, reference_values_version=values.version)
        record = self.datakeys.get(ref)
        if self.keystore.is_revoked(ref.tenant):
            raise ReleaseRefused("tenant key is revoked")
        facts = ReleaseFacts(
            tenant=ref.tenant, model=ref.model, model_version=ref.version, tee=result.cpu.tee.value,
            measurement=result.cpu.measurement.hex(), debug=result.cpu.debug, tcb=result.cpu.tcb,
            gpu_cc=bool(result.gpus) and all(g.cc_enabled for g in result.gpus),
            insecure=result.insecure, signer=record.signer, tcb_status=result.cpu.tcb_status.value,
            workload_id=result.workload_id, vmpl=result.vmpl, migration_agent=result.migration_agent,
            rtmrs=result.rtmrs, gpu_rim_matched=rim_matched, gpu_ocsp_good=ocsp_good, gpu_count=len(result.gpus),
        )
        decision = evaluate_release(self._policy(policy), facts)
        meta.update(policy_id=decision.policy_id, policy_version=decision.policy_version, rule=decision.rule)
        decision.require()
        return result, decision

    def _scoped_claims(self, claims: AttestationClaims, ref: ModelRef, meta: dict[str, Any]) -> TokenScope:
        scope = claims.require_scope(ref)
        meta.update(measurement=claims.measurement, tee=claims.tee, token_id=claims.token_id,
                    evidence_digest=claims.evidence_digest, policy_id=scope.policy_id,
                    policy_version=scope.policy_version)
        return scope

    def release(self, *, token: str, ref: ModelRef) -> SealedKey:
        """Seal the model version's data key to the HPKE key bound in the attestation token."""
        tenant = ref.tenant
        meta: dict[str, Any] = {"model": ref.model, "version": ref.version}
        try:
            now = self.clock()
            claims = self._verifier.verify_claims(token, now)
            scope = self._scoped_claims(claims, ref, meta)
            with self._used_lock:  # a used (public) token must not drain the bucket of fresh ones
                if claims.token_id in self._used:
                    raise ReleaseRefused("token already used for a release")
            self._limiter.check("release", f"{claims.measurement}|{scope.chip_id}")
            if self.keystore.is_revoked(tenant):
                raise ReleaseRefused("tenant key is revoked")
            stored = self.policies.lookup(ref)
            current = stored.policy
            if (current.policy_id, current.version) != (scope.policy_id, scope.policy_version):
                raise ReleaseRefused("the release policy changed since attestation; attest again")
            self._mark_used(claims.token_id, now)
            data_key, record = self.datakeys.data_key(ref)
            recipient = bytes.fromhex(claims.hpke_public_key)
            sealed = seal(data_key, recipient, release_info(ref, claims.token_id))
        except RateLimited:
            raise
        except (AttestationError, KeyBrokerError, PolicyError, KeyError, ValueError) as exc:
            raise self._deny(tenant, "release", _reason(exc), meta) from exc
        receipt = self.receipts.issue({
            **ref.as_dict(), "key_id": record.key_id,
            "model_digest": record.model_digest, "signer": record.signer,
            "measurement": claims.measurement, "tee": claims.tee,
            "insecure": claims.insecure, "time": now.isoformat(),
            "policy_id": scope.policy_id, "policy_version": scope.policy_version,
            "token_id": claims.token_id, "evidence_digest": claims.evidence_digest,
            # The worker checks the receipt covers exactly the sealed key it got (protocol/broker/client.py).
            "sealed_key_sha256": hashlib.sha256(sealed).hexdigest(),
        })
        self.audit.append(tenant=tenant, action="release", decision="allow", reason="sealed-to-attested-key",
                          metadata=meta)
        envelope = dict(stored.envelope) if stored.envelope is not None else None
        return SealedKey(sealed=sealed, token_id=claims.token_id, receipt=receipt, release_policy=envelope)

    def key_status(self, *, token: str, ref: ModelRef, client: str = "-") -> str:
        """What a running worker polls: "active", or "revoked" (drop the key now). The token's
        signature and scope are checked, but not its expiry: a worker keeps polling long after its
        attestation token expired, and learning "revoked" late would be worse."""
        tenant = ref.tenant
        meta: dict[str, Any] = {"model": ref.model, "version": ref.version}
        try:
            # Verify "as of" the token's own issue time; the signature is still fully checked.
            claims = self._verifier.verify_as_issued(token)
            self._scoped_claims(claims, ref, meta)
            # Per caller, not per measurement: the token is public, so keying by what it names let
            # anyone drain the bucket of every worker of that build.
            self._limiter.check("status", client)
        except RateLimited:
            raise
        except (AttestationError, jwt.PyJWTError, KeyError, TypeError, ValueError, ReleaseRefused) as exc:
            raise self._deny(tenant, "key-status", _reason(exc), meta) from exc
        try:
            revoked = self.keystore.is_revoked(tenant) or not self.datakeys.exists(ref)
        except KeyBrokerError:
            revoked = True
        return "revoked" if revoked else "active"
