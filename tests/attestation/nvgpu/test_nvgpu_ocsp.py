"""attestation.ocsp: the offline default, the chain walk (REVOKED fails it), and who may sign an OCSP
response (the issuer, or a responder certificate it delegated OCSPSigning to), on local responses."""

from __future__ import annotations

import datetime as dt

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509 import ocsp
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from attestation.errors import ChainError, RevokedError
from attestation.ocsp import OcspStatus, OfflineOcspChecker, check_chain_ocsp, verify_response_signer
from tests.attestation.nvgpu.static_ocsp import StaticOcspChecker

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


def _response(
    signer: tuple[x509.Certificate, Key] = (CA, CA_KEY), certs: list[x509.Certificate] | None = None
) -> ocsp.OCSPResponse:
    b = (
        ocsp.OCSPResponseBuilder()
        .add_response(cert=LEAF, issuer=CA, algorithm=hashes.SHA384(), cert_status=ocsp.OCSPCertStatus.GOOD,
                      this_update=NOW - dt.timedelta(hours=1), next_update=NOW + dt.timedelta(days=1),
                      revocation_time=None, revocation_reason=None)
        .responder_id(ocsp.OCSPResponderEncoding.HASH, signer[0])
    )
    if certs:
        b = b.certificates(certs)
    return ocsp.load_der_ocsp_response(b.sign(signer[1], hashes.SHA384()).public_bytes(Encoding.DER))


def test_offline_and_static() -> None:
    assert OfflineOcspChecker().status(LEAF, CA, NOW) == OcspStatus.UNKNOWN
    assert check_chain_ocsp([LEAF, CA], OfflineOcspChecker(), NOW) == OcspStatus.UNKNOWN
    static = StaticOcspChecker(good=frozenset({LEAF.serial_number}))
    assert check_chain_ocsp([LEAF, CA], static, NOW) == OcspStatus.GOOD
    with pytest.raises(RevokedError):
        check_chain_ocsp([LEAF, CA], StaticOcspChecker(revoked=frozenset({LEAF.serial_number})), NOW)


def test_the_issuer_or_its_delegated_responder_may_sign() -> None:
    verify_response_signer(_response(), CA, NOW)
    verify_response_signer(_response(signer=(RESPONDER, RESP_KEY), certs=[RESPONDER]), CA, NOW)


@pytest.mark.parametrize(
    "response",
    [
        _response(signer=(PLAIN, RESP_KEY), certs=[PLAIN]),  # no OCSPSigning EKU
        _response(signer=(RESPONDER, RESP_KEY)),  # delegated certificate not included
        _response(signer=(LEAF, LEAF_KEY), certs=[LEAF]),  # a certificate the issuer signed, not a responder
    ],
    ids=["no-eku", "delegate-absent", "not-a-responder"],
)
def test_anyone_else_is_refused(response: ocsp.OCSPResponse) -> None:
    with pytest.raises(ChainError, match="signature"):
        verify_response_signer(response, CA, NOW)
