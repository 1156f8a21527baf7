"""Who is calling, as the client seals it to the worker (docs/sealed-mode.md, "Caller credential").

The first field of a sealed request's padded plaintext (protocol/sealed/hpke.py): canonical JSON
`{"api_key": "<the API key the request is sent with>"}`, optionally with `"oidc_token": "<an ID token
of the tenant's identity provider>"`. Only the attested worker opens it; it checks it against the
tenant's signed caller policy (policy/callers.py). The gateway, which relays the ciphertext, cannot
put another caller's credential there.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from protocol.sealed.errors import SealedFormatError

MAX_CALLER_BYTES = 16 * 1024


@dataclass(frozen=True)
class CallerCredential:
    api_key: str = ""
    oidc_token: str = ""

    def encode(self) -> bytes:
        doc = {k: v for k, v in (("api_key", self.api_key), ("oidc_token", self.oidc_token)) if v}
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode() if doc else b""


def read_caller(raw: bytes) -> CallerCredential:
    """The credential of an opened request (b"": none); SealedFormatError if it is not one."""
    if not raw:
        return CallerCredential()
    if len(raw) > MAX_CALLER_BYTES:
        raise SealedFormatError("caller credential too long")
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise SealedFormatError("caller credential is not JSON") from exc
    if not isinstance(doc, dict) or set(doc) - {"api_key", "oidc_token"} or \
            not all(isinstance(v, str) for v in doc.values()):
        raise SealedFormatError("caller credential must be an object of api_key and oidc_token strings")
    return CallerCredential(api_key=doc.get("api_key", ""), oidc_token=doc.get("oidc_token", ""))
