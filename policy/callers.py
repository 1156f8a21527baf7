"""Who may call a tenant's models: the `callers` section of its signed policy set.

    "callers": {
      "api_keys": ["<hex SHA-256 of an API key the tenant made>", ...],
      "oidc": [{"issuer": "https://idp.example", "audience": "sealed", "jwks": {...},
                "subject": "alice"} | {..., "group": "ml-team"}],
      "unsafe_operator_keys": false
    }

- `api_keys`: the tenant's own API keys, by the digest of the secret (`sealed apikeys digest KEYFILE`), so the
  list names a key without holding it. A key the operator makes with its management login is not in
  the list, so it is refused (plaintext by the gateway, sealed by the worker, which sees the key
  itself inside the sealed envelope).
- `oidc`: principals of the tenant's identity provider. The sealed request carries the caller's ID
  token inside the envelope; the worker checks it offline against the issuer's JWKS from this signed
  section (signature, issuer, audience, expiry) and the subject or group named. Sealed requests only:
  the gateway authenticates plaintext callers by API key.
- `unsafe_operator_keys`: every API key the gateway authenticates for the tenant, the operator's
  included. An explicit, named opt-in; absent means false.

A tenant whose policy set has no `callers` section has not decided: every key the gateway
authenticates for it is accepted, as before caller lists existed (docs/security.md says so). Checks
raise `CallerRefused` (a PolicyError) naming the caller policy.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import jwt

from policy.errors import PolicyError, PolicyInvalid

_DIGEST = re.compile(r"^[0-9a-f]{64}$")
_OIDC_KEYS = {"issuer", "audience", "jwks", "subject", "group"}
MAX_ENTRIES = 4096


class CallerRefused(PolicyError):
    """The caller is not one the tenant's signed caller policy admits."""


def api_key_digest(secret: str) -> str:
    """What `api_keys` lists: hex SHA-256 of the key's secret (the control plane stores the same hash)."""
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True)
class OidcPrincipal:
    issuer: str
    audience: str
    jwks: Mapping[str, Any]
    subject: str | None = None
    group: str | None = None

    @classmethod
    def from_dict(cls, d: Any) -> OidcPrincipal:
        if not isinstance(d, Mapping) or set(d) - _OIDC_KEYS or not {"issuer", "audience", "jwks"} <= set(d):
            raise PolicyInvalid("an oidc caller names issuer, audience, jwks and one of subject or group")
        if not isinstance(d["issuer"], str) or not isinstance(d["audience"], str) or not isinstance(d["jwks"], Mapping):
            raise PolicyInvalid("oidc issuer and audience are strings, jwks a JWKS object")
        if ("subject" in d) == ("group" in d) or not isinstance(d.get("subject", d.get("group")), str):
            raise PolicyInvalid("an oidc caller names exactly one of subject or group (a string)")
        try:
            jwt.PyJWKSet.from_dict(dict(d["jwks"]))
        except (jwt.PyJWTError, ValueError, TypeError, KeyError) as exc:
            raise PolicyInvalid(f"oidc jwks of {d['issuer']!r} is not a usable JWKS") from exc
        return cls(d["issuer"], d["audience"], dict(d["jwks"]), d.get("subject"), d.get("group"))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"issuer": self.issuer, "audience": self.audience, "jwks": dict(self.jwks)}
        out.update({"subject": self.subject} if self.subject is not None else {"group": self.group})
        return out

    def admits(self, token: str) -> bool:
        """Whether `token` is a valid ID token of this issuer for this principal (offline: the JWKS above)."""
        try:
            header = jwt.get_unverified_header(token)
            keys = jwt.PyJWKSet.from_dict(dict(self.jwks))
            key = next(k for k in keys.keys if k.key_id == header.get("kid") or header.get("kid") is None)
            claims = jwt.decode(token, key.key, algorithms=[key.algorithm_name] if key.algorithm_name else None,
                                audience=self.audience, issuer=self.issuer,
                                options={"require": ["exp", "iss", "aud", "sub"]}, leeway=30)
        except (jwt.PyJWTError, StopIteration, ValueError, TypeError, KeyError):
            return False
        if self.subject is not None:
            return bool(claims["sub"] == self.subject)
        groups = claims.get("groups")
        return isinstance(groups, list) and self.group in groups


@dataclass(frozen=True)
class CallerPolicy:
    api_keys: frozenset[str] = frozenset()
    oidc: tuple[OidcPrincipal, ...] = ()
    unsafe_operator_keys: bool = False
    key_ids: frozenset[str] = field(default=frozenset(), compare=False)  # "key_" + digest[:16], the gateway's ids

    @classmethod
    def from_dict(cls, d: Any) -> CallerPolicy:
        if not isinstance(d, Mapping) or set(d) - {"api_keys", "oidc", "unsafe_operator_keys"}:
            raise PolicyInvalid("callers names only api_keys, oidc and unsafe_operator_keys")
        keys, oidc = d.get("api_keys", []), d.get("oidc", [])
        if not isinstance(keys, list) or not all(isinstance(k, str) and _DIGEST.match(k) for k in keys):
            raise PolicyInvalid("callers.api_keys lists hex SHA-256 digests of API keys (64 lowercase hex)")
        if not isinstance(oidc, list) or len(keys) + len(oidc) > MAX_ENTRIES:
            raise PolicyInvalid(f"callers.oidc is a list; at most {MAX_ENTRIES} callers")
        unsafe = d.get("unsafe_operator_keys", False)
        if type(unsafe) is not bool:
            raise PolicyInvalid("callers.unsafe_operator_keys must be true or false")
        return cls(frozenset(keys), tuple(OidcPrincipal.from_dict(o) for o in oidc), unsafe,
                   frozenset("key_" + k[:16] for k in keys))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"api_keys": sorted(self.api_keys), "oidc": [o.to_dict() for o in self.oidc]}
        if self.unsafe_operator_keys:
            out["unsafe_operator_keys"] = True
        return out

    def check_key_id(self, key_id: str) -> None:
        """The gateway's check of a plaintext request's authenticated key (by its id)."""
        if self.unsafe_operator_keys or key_id in self.key_ids:
            return
        raise CallerRefused(f"API key {key_id} is not in the tenant's signed caller policy (callers.api_keys); "
                            "keys the operator makes are refused unless the policy opts in "
                            "(callers.unsafe_operator_keys)")

    def check_sealed(self, api_key: str, oidc_token: str, api_key_id: str) -> str:
        """The worker's check of a sealed request's credential (from inside the envelope); `api_key_id`
        is the id the request was authenticated and bound under. Returns what admitted it."""
        if api_key and "key_" + api_key_digest(api_key)[:16] != api_key_id:
            raise CallerRefused("the sealed caller credential is not the API key the request was sent with")
        if self.unsafe_operator_keys:
            return "unsafe_operator_keys"
        digest = api_key_digest(api_key) if api_key else ""
        if digest and any(hmac.compare_digest(digest, k) for k in self.api_keys):
            return "api_key"
        if oidc_token and any(p.admits(oidc_token) for p in self.oidc):
            return "oidc"
        if not api_key and not oidc_token:
            raise CallerRefused("the sealed request carries no caller credential; the tenant's signed caller "
                                "policy (callers) admits only the callers it lists")
        raise CallerRefused("caller not in the tenant's signed caller policy (callers): neither its API key "
                            "(callers.api_keys) nor an ID token of a listed principal (callers.oidc)")

