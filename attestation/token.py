"""Attestation results as EAT (RFC 9711) claims in a JWT, signed ES256; JWKS for relying parties."""

from __future__ import annotations

import datetime as dt
import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jwt
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from attestation.errors import TokenError
from protocol.model_ref import ModelRef

EAT_PROFILE = "tag:sealed.dev,2026:attestation-result-v1"


def key_id(public_key: ec.EllipticCurvePublicKey) -> str:
    der = public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    digest = hashes.Hash(hashes.SHA256())
    digest.update(der)
    return digest.finalize()[:16].hex()


@dataclass(frozen=True)
class TokenIssuer:
    signing_key: ec.EllipticCurvePrivateKey
    issuer: str
    ttl: dt.timedelta = dt.timedelta(minutes=5)

    @property
    def kid(self) -> str:
        return key_id(self.signing_key.public_key())

    def issue(self, claims: Mapping[str, Any], now: dt.datetime) -> str:
        body = dict(claims)
        body.update(
            {
                "iss": self.issuer,
                "iat": int(now.timestamp()),
                "nbf": int(now.timestamp()),
                "exp": int((now + self.ttl).timestamp()),
                "jti": secrets.token_hex(16),
                "eat_profile": EAT_PROFILE,
            }
        )
        return jwt.encode(body, self.signing_key, algorithm="ES256", headers={"kid": self.kid})

    def jwks(self) -> dict[str, Any]:
        jwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(self.signing_key.public_key()))
        jwk.update({"kid": self.kid, "use": "sig", "alg": "ES256"})
        return {"keys": [jwk]}


@dataclass(frozen=True)
class GpuClaim:
    """One GPU of an attestation result (AttestationResult.token_claims()["gpus"])."""

    index: int
    arch: str
    cc_enabled: bool
    rim_matched: bool | None
    ocsp_status: str = "unknown"  # "good" only when every certificate of its chains was answered good


@dataclass(frozen=True)
class ResultClaims:
    """The attestation result a relying party appraises (`attestation.appraisal.appraise`), parsed
    once from a claim set: a verified token's, or `AttestationResult.token_claims()`."""

    tee: str
    measurement: str  # lower-case hex
    insecure: bool  # a simulated TEE, or a GPU outside confidential computing
    tcb_status: str | None
    tcb: Mapping[str, int]
    debug: bool
    gpus: tuple[GpuClaim, ...]
    workload_id: str = ""  # the init-data digest (SNP HOST_DATA, TDX MRCONFIGID), lower-case hex
    vmpl: int = 0
    migration_agent: bool = False
    rtmrs: tuple[str, ...] = ()  # TDX RTMR0..3, lower-case hex; () for other TEEs

    @classmethod
    def from_claims(cls, claims: Mapping[str, Any]) -> ResultClaims:
        try:
            status = claims.get("tcb_status")
            return cls(
                tee=str(claims.get("tee") or ""), measurement=str(claims.get("measurement", "")).lower(),
                insecure=bool(claims.get("insecure")), tcb_status=None if status is None else str(status),
                tcb={str(k): int(v) for k, v in (claims.get("tcb") or {}).items()}, debug=bool(claims.get("debug")),
                gpus=tuple(GpuClaim(index=int(g.get("index", i)), arch=str(g.get("arch", "")),
                                    cc_enabled=bool(g.get("cc_enabled")),
                                    rim_matched=None if g.get("rim_matched") is None else bool(g["rim_matched"]),
                                    ocsp_status=str(g.get("ocsp_status") or "unknown"))
                           for i, g in enumerate(claims.get("gpus") or [])),
                workload_id=str(claims.get("workload_id") or "").lower(), vmpl=int(claims.get("vmpl") or 0),
                migration_agent=bool(claims.get("migration_agent")),
                rtmrs=tuple(str(r).lower() for r in claims.get("rtmrs") or ()),
            )
        except (TypeError, ValueError, AttributeError) as exc:
            raise TokenError(f"attestation result claims are malformed: {exc}") from exc


@dataclass(frozen=True)
class TokenScope:
    """What a key broker's token is for: one tenant's model version under one release policy."""

    tenant: str
    model: str
    version: str
    policy_id: str
    policy_version: int
    chip_id: str = ""

    @property
    def ref(self) -> ModelRef:
        return ModelRef(self.tenant, self.model, self.version)


@dataclass(frozen=True)
class AttestationClaims:
    """A verified token's claims, parsed once. `raw` keeps the whole claim set for appraisal
    (`attestation.appraisal.appraise`), which reads the per-TEE parts (TCB, GPUs)."""

    token_id: str
    issued_at: int
    expires_at: int
    tee: str
    measurement: str
    insecure: bool
    evidence_digest: str
    hpke_public_key: str  # hex, the worker's ephemeral HPKE key the evidence binds
    channel_binding: str  # hex, the worker's TLS and usage keys the evidence binds
    scope: TokenScope | None
    result: ResultClaims  # what a relying party's policy appraises (tee, TCB, debug, GPUs)
    issuer: str
    raw: Mapping[str, Any]

    @classmethod
    def from_claims(cls, claims: Mapping[str, Any]) -> AttestationClaims:
        try:
            runtime = claims.get("runtime_data") or {}
            scope = claims.get("sealed")
            return cls(
                token_id=str(claims["jti"]), issued_at=int(claims["iat"]), expires_at=int(claims["exp"]),
                tee=str(claims.get("tee", "")), measurement=str(claims.get("measurement", "")),
                insecure=bool(claims.get("insecure")), evidence_digest=str(claims.get("evidence_digest", "")),
                hpke_public_key=str(runtime.get("hpke_public_key", "")),
                channel_binding=str(runtime.get("channel_binding", "")),
                scope=None if scope is None else TokenScope(
                    tenant=str(scope["tenant"]), model=str(scope["model"]), version=str(scope["version"]),
                    policy_id=str(scope.get("policy_id", "")), policy_version=int(scope.get("policy_version", 0)),
                    chip_id=str(scope.get("chip_id", ""))),
                result=ResultClaims.from_claims(claims), issuer=str(claims.get("iss", "")),
                raw=claims,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise TokenError(f"token claims are malformed: {exc}") from exc

    def require_scope(self, ref: ModelRef) -> TokenScope:
        """The one check that a token was issued for this tenant, model and version."""
        if self.scope is None or (self.scope.tenant, self.scope.model, self.scope.version) != (
                ref.tenant, ref.model, ref.version):
            raise TokenError("token was issued for another tenant, model or version")
        return self.scope


@dataclass(frozen=True)
class TokenVerifier:
    """Checks tokens against a pinned JWKS and issuer; the clock is injected."""

    jwks: Mapping[str, Any]
    issuer: str

    def verify(self, token: str, now: dt.datetime) -> dict[str, Any]:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            raise TokenError(f"malformed token: {exc}") from exc
        if header.get("alg") != "ES256":
            raise TokenError("token algorithm must be ES256")
        keys = [k for k in self.jwks.get("keys", []) if k.get("kid") == header.get("kid")]
        if not keys:
            raise TokenError("token signed by an unknown key")
        key = jwt.PyJWK(keys[0]).key
        try:
            claims = jwt.decode(
                token,
                key,
                algorithms=["ES256"],
                issuer=self.issuer,
                options={"verify_exp": False, "verify_iat": False, "verify_nbf": False,
                         "require": ["exp", "iat", "iss", "jti"]},
            )
        except jwt.PyJWTError as exc:
            raise TokenError(f"token rejected: {exc}") from exc
        ts = int(now.timestamp())
        if not claims["iat"] - 60 <= ts < claims["exp"]:
            raise TokenError("token is expired or not yet valid")
        if claims.get("eat_profile") != EAT_PROFILE:
            raise TokenError("token has an unexpected EAT profile")
        return claims

    def verify_claims(self, token: str, now: dt.datetime) -> AttestationClaims:
        return AttestationClaims.from_claims(self.verify(token, now))

    def verify_as_issued(self, token: str) -> AttestationClaims:
        """Signature, issuer and profile checked in full, at the token's own issue time: for a
        worker that outlives its token (revocation polls, the gateway's routing check)."""
        try:
            issued = int(jwt.decode(token, options={"verify_signature": False})["iat"])
        except (jwt.PyJWTError, KeyError, TypeError, ValueError) as exc:
            raise TokenError("not a valid attestation token") from exc
        return self.verify_claims(token, dt.datetime.fromtimestamp(issued, dt.UTC))
