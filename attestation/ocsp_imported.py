"""OCSP answers imported offline (`sealed attest collateral import`), for verifiers with no network.

A broker without internet cannot ask NVIDIA's responder; an operator fetches the signed OCSP
responses elsewhere and imports them, as CRLs are for AMD and Intel. Nothing in an imported
response is trusted until checked here, at the time of each verification (RFC 6960):

* the response is SUCCESSFUL and names this certificate (serial and issuer key hash);
* it is signed by the certificate's issuer, or by a responder certificate the issuer signed for
  OCSPSigning (`attestation.ocsp.verify_response_signer`); a response that names the certificate
  but does not verify is refused (CollateralError): edited collateral is never skipped silently;
* it is not from the future; a GOOD answer counts only until its nextUpdate (after that the
  status is UNKNOWN, and a policy that requires "good" refuses); a REVOKED answer counts whenever
  it was signed, since a revoked certificate never becomes good again.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes
from cryptography.x509 import ocsp

from attestation.errors import ChainError, CollateralError, ParseError
from attestation.ocsp import OcspStatus, verify_response_signer

MAX_RESPONSE_BYTES = 64 << 10  # NVIDIA's responses are ~2 KiB; the cap bounds hostile input
_SKEW = dt.timedelta(minutes=5)


def parse_ocsp_response(data: bytes) -> ocsp.OCSPResponse:
    """A DER OCSPResponse that is SUCCESSFUL (structure only; signatures are checked at use)."""
    if not isinstance(data, bytes) or not data or len(data) > MAX_RESPONSE_BYTES:
        raise ParseError("an OCSP response is 1 byte to 64 KiB of DER")
    try:
        resp = ocsp.load_der_ocsp_response(data)
    except ValueError as exc:
        raise ParseError(f"not a DER OCSP response: {exc}") from exc
    if resp.response_status != ocsp.OCSPResponseStatus.SUCCESSFUL:
        raise ParseError(f"OCSP response status is {resp.response_status.name}, not SUCCESSFUL")
    try:
        if len(list(resp.responses)) != 1:
            raise ParseError("an imported OCSP response must answer for exactly one certificate")
        # Read every field used later once here, so an unsupported hash or odd field is a ParseError
        # at import rather than an untyped error in the middle of a verification.
        _ = (resp.hash_algorithm, resp.signature_hash_algorithm, resp.certificate_status, resp.this_update_utc,
             resp.next_update_utc, resp.serial_number)
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise ParseError(f"OCSP response cannot be read: {exc}") from exc
    return resp


def _issuer_key_hash(cert: x509.Certificate, issuer: x509.Certificate, algorithm: hashes.HashAlgorithm) -> bytes:
    # The CertID's issuerKeyHash, computed the way the responder computed it (its hash algorithm).
    request = ocsp.OCSPRequestBuilder().add_certificate(cert, issuer, algorithm).build()
    return request.issuer_key_hash


@dataclass(frozen=True)
class ImportedOcspChecker:
    """An `attestation.ocsp.OcspChecker` over imported DER responses (one SingleResponse each)."""

    responses: tuple[bytes, ...] = ()

    @classmethod
    def of(cls, blobs: Iterable[bytes]) -> ImportedOcspChecker:
        blobs = tuple(blobs)
        for blob in blobs:
            parse_ocsp_response(blob)  # refuse garbage when the store is opened, not at first use
        return cls(blobs)

    def status(self, cert: x509.Certificate, issuer: x509.Certificate, now: dt.datetime) -> OcspStatus:
        answers: list[OcspStatus] = []
        for blob in self.responses:
            resp = parse_ocsp_response(blob)
            if resp.serial_number != cert.serial_number:
                continue
            if resp.issuer_key_hash != _issuer_key_hash(cert, issuer, resp.hash_algorithm):
                continue
            try:
                verify_response_signer(resp, issuer, now)
            except ChainError as exc:
                raise CollateralError(
                    f"imported OCSP response for {cert.subject.rfc4514_string()} does not verify: {exc}") from exc
            if now + _SKEW < resp.this_update_utc:
                raise CollateralError(f"imported OCSP response for {cert.subject.rfc4514_string()} "
                                      "is from the future")
            if resp.certificate_status == ocsp.OCSPCertStatus.REVOKED:
                return OcspStatus.REVOKED
            fresh = resp.next_update_utc is None or now - _SKEW <= resp.next_update_utc
            if resp.certificate_status == ocsp.OCSPCertStatus.GOOD and fresh:
                answers.append(OcspStatus.GOOD)
        return OcspStatus.GOOD if answers else OcspStatus.UNKNOWN
