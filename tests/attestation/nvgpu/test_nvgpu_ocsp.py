"""attestation.ocsp: offline default, static lists, and a responder checker fed local OCSP responses."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509 import ocsp
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from attestation.errors import ChainError, RevokedError
from attestation.ocsp import (
    OcspStatus,
    OfflineOcspChecker,
    ResponderOcspChecker,
    StaticOcspChecker,
    check_chain_ocsp,
)

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
Key = ec.EllipticCurvePrivateKey


def _cert(cn: str, key: Key, issuer: tuple[x509.Name, Key] | None, eku: bool = False) -> x509.Certificate:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    iname, ikey = issuer or (name, key)
    b = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(iname)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(NOW - dt.timedelta(days=1))
        .not_valid_after(NOW + dt.timedelta(days=365))
    )
    if eku:
        b = b.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.OCSP_SIGNING]), critical=False)
    return b.sign(ikey, hashes.SHA384())


CA_KEY, LEAF_KEY, RESP_KEY = (ec.generate_private_key(ec.SECP384R1()) for _ in range(3))
CA = _cert("Test CA", CA_KEY, None)
LEAF = _cert("Test Leaf", LEAF_KEY, (CA.subject, CA_KEY))
RESPONDER = _cert("Test OCSP Responder", RESP_KEY, (CA.subject, CA_KEY), eku=True)
PLAIN = _cert("Not A Responder", RESP_KEY, (CA.subject, CA_KEY))


def _responder(
    status: ocsp.OCSPCertStatus = ocsp.OCSPCertStatus.GOOD,
    signer: tuple[x509.Certificate, Key] = (CA, CA_KEY),
    certs: list[x509.Certificate] | None = None,
    echo: Callable[[bytes], bytes | None] = lambda n: n,
    next_update: dt.datetime = NOW + dt.timedelta(days=1),
    subject: x509.Certificate = LEAF,
) -> Callable[[str, bytes], bytes]:
    def fetch(url: str, body: bytes) -> bytes:
        req = ocsp.load_der_ocsp_request(body)
        assert url.startswith("https://") and req.serial_number == LEAF.serial_number
        nonce = req.extensions.get_extension_for_class(x509.OCSPNonce).value.nonce
        revoked = status == ocsp.OCSPCertStatus.REVOKED
        b = (
            ocsp.OCSPResponseBuilder()
            .add_response(
                cert=subject,
                issuer=CA,
                algorithm=hashes.SHA384(),
                cert_status=status,
                this_update=NOW - dt.timedelta(hours=1),
                next_update=next_update,
                revocation_time=NOW - dt.timedelta(days=2) if revoked else None,
                revocation_reason=x509.ReasonFlags.key_compromise if revoked else None,
            )
            .responder_id(ocsp.OCSPResponderEncoding.HASH, signer[0])
        )
        if certs:
            b = b.certificates(certs)
        echoed = echo(nonce)
        if echoed is not None:
            b = b.add_extension(x509.OCSPNonce(echoed), critical=False)
        return b.sign(signer[1], hashes.SHA384()).public_bytes(Encoding.DER)

    return fetch


def test_offline_and_static() -> None:
    assert OfflineOcspChecker().status(LEAF, CA, NOW) == OcspStatus.UNKNOWN
    assert check_chain_ocsp([LEAF, CA], OfflineOcspChecker(), NOW) == OcspStatus.UNKNOWN
    static = StaticOcspChecker(good=frozenset({LEAF.serial_number}))
    assert check_chain_ocsp([LEAF, CA], static, NOW) == OcspStatus.GOOD
    with pytest.raises(RevokedError):
        check_chain_ocsp([LEAF, CA], StaticOcspChecker(revoked=frozenset({LEAF.serial_number})), NOW)


@pytest.mark.parametrize(
    ("fetch", "want"),
    [
        (_responder(), OcspStatus.GOOD),
        (_responder(ocsp.OCSPCertStatus.UNKNOWN), OcspStatus.UNKNOWN),
        (_responder(ocsp.OCSPCertStatus.REVOKED), OcspStatus.REVOKED),
        (_responder(signer=(RESPONDER, RESP_KEY), certs=[RESPONDER]), OcspStatus.GOOD),
        (_responder(echo=lambda n: None), OcspStatus.GOOD),  # pre-signed responses carry no nonce
    ],
)
def test_responder_answers(fetch: Callable[[str, bytes], bytes], want: OcspStatus) -> None:
    assert ResponderOcspChecker(fetch).status(LEAF, CA, NOW) == want


def test_responder_revoked_fails_chain() -> None:
    with pytest.raises(RevokedError):
        check_chain_ocsp([LEAF, CA], ResponderOcspChecker(_responder(ocsp.OCSPCertStatus.REVOKED)), NOW)


@pytest.mark.parametrize(
    ("fetch", "match"),
    [
        (_responder(echo=lambda n: b"\x00" * len(n)), "nonce"),
        (_responder(next_update=NOW - dt.timedelta(hours=1)), "stale"),
        (_responder(signer=(PLAIN, RESP_KEY), certs=[PLAIN]), "signature"),  # no OCSPSigning EKU
        (_responder(signer=(RESPONDER, RESP_KEY)), "signature"),  # delegated cert not included
        (_responder(subject=RESPONDER), "different certificate"),
        (lambda url, body: b"\x30\x03\x0a\x01\x01", "malformedRequest|MALFORMED"),
        (lambda url, body: b"not der", "malformed"),
    ],
)
def test_responder_rejects(fetch: Callable[[str, bytes], bytes], match: str) -> None:
    with pytest.raises(ChainError, match=match):
        ResponderOcspChecker(fetch).status(LEAF, CA, NOW)
