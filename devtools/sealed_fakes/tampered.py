"""Tampered copies of real certificates: the damage an attacker or a bad disk can do to evidence.

Each function takes real bytes (from tests/vectors) and returns them with one precise defect, so
the tests can show every verifier refuses it with a typed error (never a crash). The DER is
located by content, not by fixed offsets, so the same damage works on any vector.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from attestation import der
from attestation.errors import AttestationError, ParseError

Damage = Callable[[bytes], bytes]  # certificate DER in, damaged DER out
_PEM_BLOCK = re.compile(rb"-----BEGIN CERTIFICATE-----\n(.*?)-----END CERTIFICATE-----\n?", re.S)


def _load(cert_der: bytes) -> x509.Certificate:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # AMD KDS certificates carry serial 0
        return x509.load_der_x509_certificate(cert_der)


def invalid_ec_point(cert_der: bytes) -> bytes:
    """The certificate with the last bytes of its EC public key's Y coordinate flipped: the point
    is then off the curve (cryptography raises `ValueError: Invalid key` when the key is read)."""
    spki = _load(cert_der).public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    at = cert_der.index(spki) + len(spki)  # the uncompressed point ends the SubjectPublicKeyInfo
    out = bytearray(cert_der)
    for i in (at - 3, at - 2, at - 1):
        out[i] ^= 0xFF
    return bytes(out)


def wrong_issuer_tag(cert_der: bytes, tag: int = 0x0D) -> bytes:
    """The certificate with the ASN.1 tag of its issuer's first attribute value replaced (a
    RELATIVE-OID where a string must be): the certificate loads, the issuer fails when read."""
    issuer = _load(cert_der).issuer.public_bytes()
    at = cert_der.index(issuer)
    # Name = SEQUENCE { SET { SEQUENCE { OID, value } } ...}: step into the first attribute.
    _, rdn, _ = der.read_tlv(cert_der, at, "issuer")
    _, attr, _ = der.read_tlv(cert_der, rdn, "issuer RDN")
    _, oid_start, _ = der.read_tlv(cert_der, attr, "issuer attribute")
    _, _, oid_end = der.read_tlv(cert_der, oid_start, "issuer attribute type")
    out = bytearray(cert_der)
    out[oid_end] = tag
    return bytes(out)


def flip_byte(cert_der: bytes, offset: int = 100) -> bytes:
    """The certificate with one byte (inside its TBS at offset 100) XORed with 0x01."""
    out = bytearray(cert_der)
    out[offset] ^= 0x01
    return bytes(out)


def pem(cert_der: bytes) -> bytes:
    body = base64.b64encode(cert_der)
    lines = b"\n".join(body[i : i + 64] for i in range(0, len(body), 64))
    return b"-----BEGIN CERTIFICATE-----\n" + lines + b"\n-----END CERTIFICATE-----\n"


def pem_chain_with_leaf(chain_pem: bytes, damage: Damage) -> bytes:
    """A PEM chain whose first certificate went through `damage` (DER -> DER); the rest as they were."""
    blocks = _PEM_BLOCK.findall(chain_pem)
    if not blocks:
        raise ValueError("no PEM certificate in the chain")
    leaf = damage(base64.b64decode(b"".join(blocks[0].split())))
    return pem(leaf) + b"".join(pem(base64.b64decode(b"".join(b.split()))) for b in blocks[1:])


def gpu_evidence_json_with_leaf(document: bytes, damage: Damage, entry: int = 0) -> bytes:
    """NVIDIA's JSON evidence list (one entry per GPU, base64 PEM chains) with one entry's leaf damaged."""
    entries = json.loads(document)
    chain = base64.b64decode(entries[entry]["certificate"])
    entries[entry]["certificate"] = base64.b64encode(pem_chain_with_leaf(chain, damage)).decode()
    return json.dumps(entries).encode()


def quote_with_pck_leaf(quote: bytes, damage: Damage) -> bytes:
    """A TDX quote whose embedded PCK leaf certificate went through `damage` (same length), with the
    PEM kept canonical, so the quote's own size fields stay right and parsing reaches the certificate."""
    match = _PEM_BLOCK.search(quote)
    if match is None:
        raise ValueError("no PEM certificate in the quote")
    original = base64.b64decode(b"".join(match.group(1).split()))
    damaged = damage(original)
    if len(damaged) != len(original):
        raise ValueError("damage must keep the certificate's length")
    return quote[: match.start()] + pem(damaged) + quote[match.end() :]


@dataclass(frozen=True)
class TamperedCase:
    """One damaged input for `sealed attest verify` / a TEE's `verify_for_cli`, and the refusal due."""

    name: str
    tee: str
    evidence: bytes
    certs: tuple[bytes, ...]
    at: dt.datetime
    refusal: type[AttestationError]


def tampered_cases(vectors: Path) -> list[TamperedCase]:
    """The crash inputs found against `sealed attest verify`, built from the real vectors in `vectors`
    (tests/vectors/attestation): each must be refused with a typed error, never a traceback."""
    snp_report = (vectors / "snp" / "gosevguest_milan_attestation.bin").read_bytes()
    vcek = (vectors / "snp" / "gosevguest_milan_vcek.der").read_bytes()
    snp_at = dt.datetime(2022, 9, 24, 1, tzinfo=dt.UTC)
    quote = (vectors / "tdx" / "trustee_tdx_quote_4.dat").read_bytes()
    tdx_at = dt.datetime(2023, 7, 1, 1, tzinfo=dt.UTC)
    gpu_report = (vectors / "nvgpu" / "nvtrust_hopperAttestationReport.bin").read_bytes()
    gpu_chain = (vectors / "nvgpu" / "nvtrust_hopperCertChain.pem").read_bytes()
    eight = (vectors / "nvgpu" / "nvtrust_ppcie_gpu_evidence_8gpu.json").read_bytes()
    gpu_at = dt.datetime(2025, 6, 1, tzinfo=dt.UTC)
    return [
        TamperedCase("snp-vcek-invalid-ec-point", "snp", snp_report, (invalid_ec_point(vcek),), snp_at, ParseError),
        TamperedCase("snp-vcek-issuer-wrong-tag", "snp", snp_report, (wrong_issuer_tag(vcek),), snp_at, ParseError),
        TamperedCase("tdx-pck-leaf-invalid-ec-point", "tdx", quote_with_pck_leaf(quote, invalid_ec_point), (),
                     tdx_at, ParseError),
        TamperedCase("tdx-pck-leaf-issuer-wrong-tag", "tdx", quote_with_pck_leaf(quote, wrong_issuer_tag), (),
                     tdx_at, ParseError),
        TamperedCase("nvgpu-leaf-byte-100", "nvgpu", gpu_report, (pem_chain_with_leaf(gpu_chain, flip_byte),),
                     gpu_at, ParseError),
        TamperedCase("nvgpu-8gpu-json-leaf-byte-100", "nvgpu", gpu_evidence_json_with_leaf(eight, flip_byte, 3),
                     (), gpu_at, ParseError),
        TamperedCase("nvgpu-leaf-invalid-ec-point", "nvgpu", gpu_report,
                     (pem_chain_with_leaf(gpu_chain, invalid_ec_point),), gpu_at, ParseError),
    ]
