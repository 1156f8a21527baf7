"""An OCSP checker for tests: answers from fixed serial lists (GOOD, REVOKED, otherwise UNKNOWN), so a
verification can be driven through every OCSP outcome without a responder."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from cryptography import x509

from attestation.ocsp import OcspStatus


@dataclass(frozen=True)
class StaticOcspChecker:
    revoked: frozenset[int] = frozenset()
    good: frozenset[int] = frozenset()

    def status(self, cert: x509.Certificate, issuer: x509.Certificate, now: dt.datetime) -> OcspStatus:
        if cert.serial_number in self.revoked:
            return OcspStatus.REVOKED
        return OcspStatus.GOOD if cert.serial_number in self.good else OcspStatus.UNKNOWN
