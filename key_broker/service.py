"""The key broker's decisions: challenge -> attest (verify + release policy) -> sealed key release.

Every refusal, whatever its cause, leaves as ReleaseRefused; the precise reason is written to the
audit log, never to the caller. No key material ever reaches the audit log or an error.
"""

from __future__ import annotations

import base64
import datetime as dt
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from attestation.bundle import EvidenceBundle
from attestation.errors import AttestationError
from attestation.token import TokenIssuer, TokenVerifier
from attestation.verifier import VerifierTrust, verify_bundle
from key_broker.errors import KeyBrokerError, ReleaseRefused
from key_broker.keystore import DataKeyRegistry, KeyStore
from key_broker.names import check_name
from key_broker.nonces import Challenge, ChallengeStore
from key_broker.policies import PolicyStore
from key_broker.receipts import ReceiptBook
from key_broker.sealing import release_info, seal
from policy.audit import AuditLog
from policy.errors import PolicyError
from policy.release import ReleaseFacts, evaluate_release

log = logging.getLogger(__name__)
COMPONENT = "key-broker"


@dataclass(frozen=True)
class SealedKey:
    sealed: bytes
    token_id: str
    receipt: dict[str, Any]


class KeyBrokerService:
    def __init__(
        self,
        *,
        keystore: KeyStore,
        datakeys: DataKeyRegistry,
        policies: PolicyStore,
        receipts: ReceiptBook,
        trust: VerifierTrust,
        issuer: TokenIssuer,
        audit: AuditLog,
        clock: Callable[[], dt.datetime],
        challenge_ttl: dt.timedelta = dt.timedelta(seconds=60),
    ) -> None:
        self.keystore = keystore
        self.datakeys = datakeys
        self.policies = policies
        self.receipts = receipts
        self._trust = trust
        self.issuer = issuer
        self._audit = audit
        self._clock = clock
        self._challenges = ChallengeStore(clock, challenge_ttl)

    def _deny(self, tenant: str, action: str, reason: str, **metadata: Any) -> ReleaseRefused:
        self._audit.append(tenant=tenant or "-", action=action, decision="deny", reason=reason, metadata=metadata)
        log.info("refused %s for tenant %s", action, tenant or "-")
        return ReleaseRefused(reason)

    def close(self) -> None:
        self._audit.close()

    def challenge(self) -> Challenge:
        return self._challenges.issue()

    def attest(self, *, session_id: str, bundle: EvidenceBundle, tenant: str, model: str, version: str) -> str:
        """Verify evidence and appraise it under the tenant's release policy; returns a scoped token."""
        meta: dict[str, Any] = {"model": model, "version": version, "evidence_digest": bundle.digest(),
                                "tee": bundle.tee}
        try:
            check_name(tenant, "tenant"), check_name(model, "model"), check_name(version, "version")
            # 1. The challenge is single use and short-lived: replays and stale bundles stop here.
            challenge = self._challenges.consume(session_id)
            now = self._clock()
            # 2. Evidence: signatures, chains, binding of nonce + HPKE key + GPU evidence.
            result = verify_bundle(bundle, expected_nonce=challenge.nonce, now=now, trust=self._trust)
            meta["measurement"] = result.cpu.measurement.hex()
            # 3. The tenant's release policy for this model, default deny.
            policy = self.policies.get(tenant, model)
            record = self.datakeys.get(tenant, model, version)
            if self.keystore.is_revoked(tenant):
                raise ReleaseRefused("tenant key is revoked")
            facts = ReleaseFacts(
                tenant=tenant, model=model, model_version=version, tee=result.cpu.tee.value,
                measurement=result.cpu.measurement.hex(), debug=result.cpu.debug, tcb=result.cpu.tcb,
                gpu_cc=bool(result.gpus) and all(g.cc_enabled for g in result.gpus),
                insecure=result.insecure, signer=record.signer,
            )
            decision = evaluate_release(policy, facts)
            meta.update(policy_id=decision.policy_id, policy_version=decision.policy_version, rule=decision.rule)
            decision.require()
        except (AttestationError, KeyBrokerError, PolicyError, ValueError) as exc:
            reason = getattr(exc, "reason", None) or "; ".join(getattr(getattr(exc, "decision", None),
                                                                      "reasons", ())) or str(exc)
            raise self._deny(tenant, "attest", f"{type(exc).__name__}: {reason}", **meta) from exc
        claims = result.token_claims()
        claims["sealed"] = {"tenant": tenant, "model": model, "version": version,
                            "policy_id": decision.policy_id, "policy_version": decision.policy_version}
        token = self.issuer.issue(claims, now)
        self._audit.append(tenant=tenant, action="attest", decision="allow", reason=decision.rule, metadata=meta)
        return token

    def release(self, *, token: str, tenant: str, model: str, version: str) -> SealedKey:
        """Seal the model version's data key to the HPKE key bound in the attestation token."""
        meta: dict[str, Any] = {"model": model, "version": version}
        try:
            now = self._clock()
            claims = TokenVerifier(self.issuer.jwks(), self.issuer.issuer).verify(token, now)
            scope = claims.get("sealed") or {}
            if (scope.get("tenant"), scope.get("model"), scope.get("version")) != (tenant, model, version):
                raise ReleaseRefused("token was issued for another tenant, model or version")
            meta.update(measurement=claims["measurement"], tee=claims["tee"], token_id=claims["jti"])
            data_key, record = self.datakeys.data_key(tenant, model, version)
            recipient = bytes.fromhex(claims["runtime_data"]["hpke_public_key"])
            sealed = seal(data_key, recipient, release_info(tenant, model, version, claims["jti"]))
        except (AttestationError, KeyBrokerError, KeyError, ValueError) as exc:
            raise self._deny(tenant, "release", f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}",
                             **meta) from exc
        receipt = self.receipts.issue({
            "tenant": tenant, "model": model, "version": version, "key_id": record.key_id,
            "model_digest": record.model_digest, "signer": record.signer,
            "measurement": claims["measurement"], "tee": claims["tee"], "insecure": bool(claims.get("insecure")),
            "time": now.isoformat(), "policy_id": scope["policy_id"], "policy_version": scope["policy_version"],
            "token_id": claims["jti"],
        })
        self._audit.append(tenant=tenant, action="release", decision="allow", reason="sealed-to-attested-key",
                           metadata=meta)
        return SealedKey(sealed=sealed, token_id=claims["jti"], receipt=receipt)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
