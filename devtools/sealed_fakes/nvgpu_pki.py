"""Test-only NVIDIA-format PKI: a test Device Identity CA, a 5-certificate Hopper chain with the FWID
extension, SPDM evidence signed by the leaf, and RIMs signed under a test RIM root.

Nothing here is trusted by default: production code pins the real NVIDIA roots, and these
objects only verify when a test injects `roots=[pki.root]`.
"""

from __future__ import annotations

import datetime as dt
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from cryptography.x509.oid import NameOID
from lxml import etree
from signxml import DigestAlgorithm, SignatureMethod, XMLSigner

from attestation.nvgpu.abi import SHA384_LEN
from attestation.nvgpu.verify import FWID_OID, SHA384_OID_DER

NOT_BEFORE = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
NOT_AFTER = dt.datetime(2034, 1, 1, tzinfo=dt.UTC)
LAYERS = (
    "GH100 A01 GSP FMC LF", "GH100 A01 GSP BROM", "NVIDIA GH100 Provisioner ICA 1",
    "NVIDIA GH100 Identity", "Test NVIDIA Device Identity CA",
)


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "NVIDIA Test"),
                      x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _der(tag: int, value: bytes) -> bytes:
    n = len(value)
    if n < 0x80:
        return bytes([tag, n]) + value
    size = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([tag, 0x80 | len(size)]) + size + value


def fwid_extension(key: ec.EllipticCurvePublicKey, fwid: bytes) -> bytes:
    """NVIDIA's 2.23.133.5.4.1 layout: SEQUENCE {INTEGER 1, SPKI, SEQUENCE {sha384, OCTET STRING}}."""
    spki = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    inner = _der(0x02, b"\x01") + spki + _der(0x30, SHA384_OID_DER + _der(0x04, fwid))
    return _der(0x30, inner)


def make_chain(
    root_cn: str = LAYERS[-1], fwid: bytes | None = b"\x11" * SHA384_LEN, not_after: dt.datetime = NOT_AFTER
) -> tuple[list[x509.Certificate], ec.EllipticCurvePrivateKey]:
    """Return ([leaf, BROM, ICA, Identity, root], leaf key); the leaf carries `fwid` if given."""
    keys = [ec.generate_private_key(ec.SECP384R1()) for _ in LAYERS]
    names = [_name(cn) for cn in (*LAYERS[:-1], root_cn)]
    certs: list[x509.Certificate] = []
    for i in range(len(LAYERS) - 1, -1, -1):
        issuer = min(i + 1, len(LAYERS) - 1)
        builder = (
            x509.CertificateBuilder()
            .subject_name(names[i]).issuer_name(names[issuer])
            .public_key(keys[i].public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(NOT_BEFORE).not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=i > 0, path_length=None), critical=True)
        )
        if i == 0 and fwid is not None:
            ext = x509.UnrecognizedExtension(FWID_OID, fwid_extension(keys[0].public_key(), fwid))
            builder = builder.add_extension(ext, critical=False)
        certs.insert(0, builder.sign(keys[issuer], hashes.SHA384()))
    return certs, keys[0]


def pem(certs: list[x509.Certificate]) -> bytes:
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certs)


@dataclass(frozen=True)
class EvidenceSpec:
    nonce: bytes
    fwid: bytes = b"\x11" * SHA384_LEN
    driver: str = "550.90.07"
    vbios_raw: bytes = bytes.fromhex("009f009601000000")  # "96.00.9F.00.01"
    measurements: Mapping[int, bytes] = field(
        default_factory=lambda: {i: bytes([i]) * SHA384_LEN for i in range(1, 65)}
    )
    extra_opaque: tuple[tuple[int, bytes], ...] = ((34, b"\x01\x00"), (36, b"\x00\x00"))


def spdm_body(spec: EvidenceSpec) -> bytes:
    """Unsigned request || response (without signature) in the Hopper layout."""
    request = bytes([0x11, 0xE0, 0x01, 0xFF]) + spec.nonce + b"\x00"
    record = b"".join(
        bytes([i, 0x01]) + struct.pack("<H", len(v) + 3) + bytes([0x01]) + struct.pack("<H", len(v)) + v
        for i, v in sorted(spec.measurements.items())
    )
    fields = [(3, spec.driver.encode() + b"\x00"), (6, spec.vbios_raw), (17, b"1010\x00"),
              (18, b"0200\x00"), (15, b"882\x00"), (20, spec.fwid), *spec.extra_opaque]
    opaque = b"".join(struct.pack("<HH", t, len(v)) + v for t, v in fields)
    header = bytes([0x11, 0x60, 0x00, 0x00, len(spec.measurements)]) + len(record).to_bytes(3, "little")
    return request + header + record + b"\x5a" * 32 + struct.pack("<H", len(opaque)) + opaque


def sign_body(body: bytes, key: ec.EllipticCurvePrivateKey) -> bytes:
    r, s = decode_dss_signature(key.sign(body, ec.ECDSA(hashes.SHA384())))
    return body + r.to_bytes(48, "big") + s.to_bytes(48, "big")


def make_evidence(spec: EvidenceSpec, key: ec.EllipticCurvePrivateKey) -> bytes:
    return sign_body(spdm_body(spec), key)


def make_rim_chain(
    not_after: dt.datetime = NOT_AFTER,
) -> tuple[list[x509.Certificate], ec.EllipticCurvePrivateKey]:
    """[signer, CA, root] for RIM signing; root plays 'NVIDIA CoRIM signing Root CA'."""
    certs, keys = make_rim_chain_keys(not_after)
    return certs, keys[0]


def make_rim_chain_keys(
    not_after: dt.datetime = NOT_AFTER,
) -> tuple[list[x509.Certificate], tuple[ec.EllipticCurvePrivateKey, ...]]:
    """make_rim_chain, with the key of every certificate (signer, CA, root)."""
    keys = [ec.generate_private_key(ec.SECP384R1()) for _ in range(3)]
    names = [_name("Test HCC RIM Signer"), _name("Test Reference Value CA"), _name("Test CoRIM Root CA")]
    certs: list[x509.Certificate] = []
    for i in (2, 1, 0):
        issuer = min(i + 1, 2)
        cert = (
            x509.CertificateBuilder().subject_name(names[i]).issuer_name(names[issuer])
            .public_key(keys[i].public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(NOT_BEFORE).not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=i > 0, path_length=None), critical=True)
            .sign(keys[issuer], hashes.SHA384())
        )
        certs.insert(0, cert)
    return certs, tuple(keys)


def rim_xml(version: str, golden: Mapping[int, tuple[bytes, ...]], inactive: tuple[int, ...] = ()) -> bytes:
    """Unsigned SWID RIM with `golden` keyed by RIM (0-based) index."""
    swid = "http://standards.iso.org/iso/19770/-2/2015/schema.xsd"
    hns = "http://www.w3.org/2001/04/xmlenc#sha384"
    resources = []
    for index, alts in sorted(golden.items()):
        hashes_attr = " ".join(f'ns2:Hash{i}="{h.hex()}"' for i, h in enumerate(alts))
        active = "False" if index in inactive else "True"
        resources.append(
            f'<Resource type="Measurement" index="{index}" active="{active}" alternatives="{len(alts)}" '
            f'{hashes_attr} name="Measurement_{index}" size="48"/>'
        )
    return (
        f'<SoftwareIdentity xmlns="{swid}" xmlns:ns2="{hns}" name="GH100" tagId="test-{version}" '
        f'version="1.0"><Meta colloquialVersion="{version}" product="GH100"/>'
        f'<Payload>{"".join(resources)}</Payload></SoftwareIdentity>'
    ).encode()


def sign_rim(xml: bytes, certs: list[x509.Certificate], key: ec.EllipticCurvePrivateKey) -> bytes:
    signer = XMLSigner(
        signature_algorithm=SignatureMethod.ECDSA_SHA384, digest_algorithm=DigestAlgorithm.SHA384
    )
    signed = signer.sign(etree.fromstring(xml), key=key, cert=certs)
    return bytes(etree.tostring(signed))
