"""Published reference values: the measurements a worker may have, as a signed in-toto statement.

The operator publishes an in-toto Statement v1 in a DSSE envelope (the format Sigstore bundles wrap),
signed with its Ed25519 publisher key; a client pins that key (the publisher's identity), not raw
hashes, and accepts a worker only if its measurement is a subject of an unexpired statement that is
not older than the newest it has seen (nor than its policy's floor).

    statement = {"_type": "https://in-toto.io/Statement/v1",
                 "subject": [{"name": "sealed-worker", "digest": {"sha384": "<measurement hex>"}}, ...],
                 "predicateType": PREDICATE_TYPE,
                 "predicate": {"tee": "sim", "serial": 7, "issued_at": "...", "expires_at": "...",
                               "promises": {...}}}

`serial` is the statement's place in the publisher's sequence: a positive integer that grows with
every statement it signs (a statement without one is refused). A verifier refuses a statement whose
serial is below a floor (`min_serial`: the newest it has verified, or what its policy sets), so an
older statement, still unexpired and validly signed, cannot bring back a measurement the publisher
has since withdrawn.
    envelope  = {"payloadType": "application/vnd.in-toto+json", "payload": b64(statement),
                 "signatures": [{"keyid": hex SHA-256 of the raw key, "sig": b64 Ed25519 over PAE}]}

The same statement may instead come as a Sigstore bundle (keyless: a Fulcio certificate for the
publisher's OIDC identity, a Rekor entry, timestamps); `attestation/sigstore_refvalues.py` verifies
that offline against a pinned trusted root and the pinned identity, then hands the statement to
`read_statement` here, the one reader both paths share.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from attestation.errors import AttestationError

PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://sealed.dev/reference-values/v1"


class ReferenceValuesError(AttestationError):
    """The published reference values are unsigned, signed by another key, expired or malformed."""


class StaleReferenceValues(ReferenceValuesError):
    """A validly signed, unexpired statement older (lower serial) than the newest the verifier has seen
    or than the floor its policy sets: a rollback to a set the publisher has replaced."""


class NotReferenceValues(ReferenceValuesError):
    """A validly signed in-toto statement, but not a reference-value statement (another predicate
    type or payload type): a publisher's signature over something else is no list of measurements."""


def _pae(payload_type: str, body: bytes) -> bytes:
    # DSSE v1 pre-authentication encoding (secure-systems-lab/dsse, protocol.md).
    return b"DSSEv1 %d %b %d %b" % (len(payload_type), payload_type.encode(), len(body), body)


def publisher_key_id(public_key: bytes) -> str:
    return hashlib.sha256(public_key).hexdigest()


def _raw(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def sign_reference_values(key: Ed25519PrivateKey, measurements: Iterable[str], *, tee: str, issued_at: dt.datetime,
                          valid_for: dt.timedelta, serial: int,
                          promises: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A signed statement; `serial` must grow with every statement the publisher signs."""
    if type(serial) is not int or serial < 1:
        raise ValueError("a reference-value statement's serial is a positive integer")
    statement = {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": "sealed-worker", "digest": {"sha384": m.lower()}} for m in sorted(set(measurements))],
        "predicateType": PREDICATE_TYPE,
        "predicate": {"tee": tee, "serial": serial, "issued_at": issued_at.isoformat(),
                      "expires_at": (issued_at + valid_for).isoformat(), "promises": dict(promises or {})},
    }
    body = json.dumps(statement, sort_keys=True, separators=(",", ":")).encode()
    return {"payloadType": PAYLOAD_TYPE, "payload": base64.b64encode(body).decode(),
            "signatures": [{"keyid": publisher_key_id(_raw(key.public_key())),
                            "sig": base64.b64encode(key.sign(_pae(PAYLOAD_TYPE, body))).decode()}]}


@dataclass(frozen=True)
class ReferenceValues:
    measurements: frozenset[str]
    tee: str
    expires_at: dt.datetime
    promises: Mapping[str, Any]
    signer: str = ""  # who signed it, as the client pinned it: "ed25519 <key id>" or "sigstore <identity> ..."
    serial: int = 0  # the statement's place in the publisher's sequence


def read_statement(payload_type: str, body: bytes, now: dt.datetime, signer: str,
                   min_serial: int = 0) -> ReferenceValues:
    """A verified DSSE payload -> reference values: an in-toto Statement v1 with our predicate type,
    not expired (and not issued in the future), with a serial of at least `min_serial`. Call only
    with a payload whose signature verified."""
    if payload_type != PAYLOAD_TYPE:
        raise NotReferenceValues(f"signed by {signer}, but the payload is {payload_type!r}, not an in-toto statement")
    try:
        statement = json.loads(body)
        kind, predicate_type = statement["_type"], statement["predicateType"]
    except (KeyError, TypeError, ValueError) as exc:
        raise ReferenceValuesError(f"malformed in-toto statement: {exc}") from exc
    if kind != STATEMENT_TYPE or predicate_type != PREDICATE_TYPE:
        raise NotReferenceValues(f"signed by {signer}, but the statement is {kind} / {predicate_type}, "
                                 f"not {PREDICATE_TYPE}")
    try:
        predicate = statement["predicate"]
        issued = dt.datetime.fromisoformat(predicate["issued_at"])
        expires = dt.datetime.fromisoformat(predicate["expires_at"])
        measurements = frozenset(str(s["digest"]["sha384"]).lower() for s in statement["subject"])
        serial = predicate["serial"]
    except (KeyError, TypeError, ValueError) as exc:
        raise ReferenceValuesError(f"malformed reference values: {exc}") from exc
    if type(serial) is not int or serial < 1:
        raise ReferenceValuesError("reference values carry no serial (a positive integer)")
    if not issued - dt.timedelta(minutes=5) <= now < expires:
        raise ReferenceValuesError("reference values are expired or not yet valid")
    if serial < min_serial:
        raise StaleReferenceValues(f"reference values serial {serial} is older than {min_serial}, the newest "
                                   f"this verifier has seen or its policy's floor (signed by {signer})")
    return ReferenceValues(measurements=measurements, tee=str(predicate.get("tee", "")), expires_at=expires,
                           promises=dict(predicate.get("promises") or {}), signer=signer, serial=serial)


def verify_reference_values(envelope: Mapping[str, Any], publisher_key: bytes, now: dt.datetime,
                            min_serial: int = 0) -> ReferenceValues:
    """1. DSSE signature by the pinned publisher key over PAE(payloadType, payload); 2. an in-toto
    Statement v1 with our predicate type; 3. not expired (and not issued in the future); 4. a
    serial of at least `min_serial`."""
    try:
        body = base64.b64decode(envelope["payload"], validate=True)
        signatures = list(envelope.get("signatures") or [])
        payload_type = str(envelope["payloadType"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ReferenceValuesError("reference values are not a DSSE envelope") from exc
    key = Ed25519PublicKey.from_public_bytes(publisher_key)
    wanted = publisher_key_id(publisher_key)
    signed = False
    for sig in signatures:
        if not isinstance(sig, Mapping) or sig.get("keyid") != wanted:
            continue
        try:
            key.verify(base64.b64decode(str(sig.get("sig", "")), validate=True), _pae(payload_type, body))
            signed = True
        except (InvalidSignature, ValueError):
            continue
    if not signed:
        raise ReferenceValuesError("reference values are not signed by the pinned publisher")
    return read_statement(payload_type, body, now, signer=f"ed25519 {wanted}", min_serial=min_serial)
