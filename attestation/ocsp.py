"""Pluggable OCSP (RFC 6960) certificate status checking, with an offline default.

Verifiers take an `OcspChecker` instead of reaching the network themselves, so tests and air-gapped
verifiers stay deterministic: the offline checker here, and the imported answers of the collateral
store (attestation/ocsp_imported.py). The offline checker answers UNKNOWN for everything; whether UNKNOWN is
acceptable is a policy decision (appraisal), never the checker's. REVOKED always fails verification.
"""

from __future__ import annotations

import datetime as dt
import enum
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.x509 import ocsp
from cryptography.x509.oid import ExtendedKeyUsageOID

from attestation.errors import ChainError, RevokedError


class OcspStatus(enum.StrEnum):
    GOOD = "good"
    REVOKED = "revoked"
    UNKNOWN = "unknown"  # no answer (offline), or the responder does not know the certificate


class OcspChecker(Protocol):
    def status(self, cert: x509.Certificate, issuer: x509.Certificate, now: dt.datetime) -> OcspStatus: ...


@dataclass(frozen=True)
class OfflineOcspChecker:
    """No network: every status is UNKNOWN, and policy decides whether that is acceptable."""

    def status(self, cert: x509.Certificate, issuer: x509.Certificate, now: dt.datetime) -> OcspStatus:
        return OcspStatus.UNKNOWN


def _verify_signed_by(resp: ocsp.OCSPResponse, key_cert: x509.Certificate) -> None:
    key = key_cert.public_key()
    algo = resp.signature_hash_algorithm
    if algo is None:
        raise ChainError("OCSP response has no signature hash algorithm")
    try:
        if isinstance(key, ec.EllipticCurvePublicKey):
            key.verify(resp.signature, resp.tbs_response_bytes, ec.ECDSA(algo))
        elif isinstance(key, rsa.RSAPublicKey):
            key.verify(resp.signature, resp.tbs_response_bytes, padding.PKCS1v15(), algo)
        else:
            raise ChainError("OCSP responder key type is not supported")
    except InvalidSignature as exc:
        raise ChainError("OCSP response signature does not verify") from exc


def verify_response_signer(resp: ocsp.OCSPResponse, issuer: x509.Certificate, now: dt.datetime) -> None:
    """RFC 6960 section 4.2.2.2: signed by the certificate's issuer itself, or by a responder
    certificate the issuer signed for OCSPSigning (valid at `now`); raises ChainError otherwise."""
    for responder in resp.certificates:
        if responder.issuer != issuer.subject:
            continue
        try:
            responder.verify_directly_issued_by(issuer)
            eku = responder.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        except (InvalidSignature, ValueError, TypeError, x509.ExtensionNotFound):
            continue
        if ExtendedKeyUsageOID.OCSP_SIGNING in eku and (
            responder.not_valid_before_utc <= now <= responder.not_valid_after_utc
        ):
            _verify_signed_by(resp, responder)
            return
    _verify_signed_by(resp, issuer)


def check_chain_ocsp(chain: Sequence[x509.Certificate], checker: OcspChecker, now: dt.datetime) -> OcspStatus:
    """Status of every certificate below the top of `chain` (the root is not OCSP-checked).

    Raises RevokedError on any REVOKED; returns GOOD only when every answer is GOOD.
    """
    answers = []
    for cert, issuer in itertools.pairwise(chain):
        answer = checker.status(cert, issuer, now)
        if answer == OcspStatus.REVOKED:
            raise RevokedError(f"certificate {cert.subject.rfc4514_string()} is revoked (OCSP)")
        answers.append(answer)
    if answers and all(a == OcspStatus.GOOD for a in answers):
        return OcspStatus.GOOD
    return OcspStatus.UNKNOWN
