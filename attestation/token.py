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
