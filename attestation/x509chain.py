"""Certificate-chain walking for vendor PKIs (AMD KDS, Intel PCS, NVIDIA), with `now` injected.

cryptography's `x509.verification` enforces the Web PKI profile, which vendor chains do not meet
(AMD VCEKs have serial 0 and RSA-PSS issuers), so the walk is done here with the primitive checks.
"""

from __future__ import annotations

import datetime as dt
import warnings
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes

from attestation.errors import ChainError, ParseError, RevokedError

ROOTS_DIR = Path(__file__).with_name("roots")
# cryptography raises these (some lazily) for malformed DER; all mean "not a valid certificate".
BAD_DER = (ValueError, TypeError, UnsupportedAlgorithm, x509.InvalidVersion, x509.DuplicateExtension)


def parsed_in_full(cert: x509.Certificate) -> x509.Certificate:
    """`cert`, once every field that cryptography decodes lazily has been decoded; raises ParseError.

    Names, extensions and the public key are decoded on first access, so a certificate that loads
    can still raise ValueError later (an invalid EC point, a wrong ASN.1 tag inside the issuer),
    deep inside a chain walk. Decoding them here keeps every malformed certificate at the boundary.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # AMD KDS certificates carry serial 0
        try:
            _ = (cert.version, cert.issuer.rfc4514_string(), cert.subject.rfc4514_string(), list(cert.extensions),
                 cert.public_key(), cert.signature_hash_algorithm, cert.not_valid_before_utc,
                 cert.not_valid_after_utc, cert.serial_number)
        except BAD_DER as exc:
            raise ParseError(f"malformed certificate: {exc}") from exc
    return cert


def load_der_or_pem(data: bytes) -> x509.Certificate:
    """Load one certificate, every field decoded (see parsed_in_full)."""
    pem = data.lstrip().startswith(b"-----BEGIN")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # AMD KDS certificates carry serial 0
        try:
            cert = x509.load_pem_x509_certificate(data) if pem else x509.load_der_x509_certificate(data)
        except BAD_DER as exc:
            raise ParseError(f"not a certificate: {exc}") from exc
    return parsed_in_full(cert)


def load_pem_chain(data: bytes) -> list[x509.Certificate]:
    """Load every certificate of a PEM bundle, in file order, every field decoded."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            certs = x509.load_pem_x509_certificates(data)
        except BAD_DER as exc:
            raise ParseError(f"not a PEM certificate bundle: {exc}") from exc
    if not certs:
        raise ParseError("empty certificate bundle")
    return [parsed_in_full(c) for c in certs]


def load_pinned_roots(name: str, roots_dir: Path | None = None) -> list[x509.Certificate]:
    """Certificates of a pinned bundle shipped in attestation/roots (or an injected directory)."""
    path = (roots_dir or ROOTS_DIR) / name
    try:
        return load_pem_chain(path.read_bytes())
    except OSError as exc:
        raise ChainError(f"pinned roots {name!r} not found in {path.parent}") from exc


def fingerprint(cert: x509.Certificate) -> bytes:
    return cert.fingerprint(hashes.SHA256())


def check_validity(cert: x509.Certificate, now: dt.datetime, what: str) -> None:
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    if now < cert.not_valid_before_utc:
        raise ChainError(f"{what}: current time {now.isoformat()} is before {cert.not_valid_before_utc}")
    if now > cert.not_valid_after_utc:
        raise ChainError(f"{what}: current time {now.isoformat()} is after {cert.not_valid_after_utc}")


def check_is_ca(cert: x509.Certificate, what: str) -> None:
    """An issuer must be a CA: otherwise a leaf's key could sign a forged certificate below it."""
    try:
        constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound as exc:
        raise ChainError(f"{what}: issuer has no BasicConstraints, so it is not a CA") from exc
    if not constraints.ca:
        raise ChainError(f"{what}: issuer is not a CA")


def check_issued_by(child: x509.Certificate, issuer: x509.Certificate, what: str) -> None:
    """Signature and name link from `child` to `issuer` (which must be a CA); raises ChainError."""
    check_is_ca(issuer, what)
    if child.issuer != issuer.subject:
        raise ChainError(f"{what}: issuer name does not match {issuer.subject.rfc4514_string()}")
    try:
        child.verify_directly_issued_by(issuer)
    except (InvalidSignature, UnsupportedAlgorithm, ValueError, TypeError) as exc:
        raise ChainError(f"{what}: signature does not verify under its issuer: {exc}") from exc


def verify_chain(
    chain: Sequence[x509.Certificate],
    trusted_roots: Sequence[x509.Certificate],
    now: dt.datetime,
) -> None:
    """Verify `chain` = [leaf, intermediate..., root-or-last-intermediate] up to a pinned root.

    The chain's last certificate must either be byte-identical to a pinned root, or be issued by
    one. Every link's signature and every certificate's validity at `now` is checked.
    """
    if not chain:
        raise ChainError("empty certificate chain")
    if not trusted_roots:
        raise ChainError("no pinned roots")
    pinned = {fingerprint(r): r for r in trusted_roots}
    for i, cert in enumerate(chain):
        check_validity(cert, now, f"certificate {i} ({cert.subject.rfc4514_string()})")
    for i in range(len(chain) - 1):
        check_issued_by(chain[i], chain[i + 1], f"certificate {i} ({chain[i].subject.rfc4514_string()})")
    top = chain[-1]
    if fingerprint(top) in pinned:
        check_issued_by(top, top, "root (self-signature)")
        return
    for root in trusted_roots:
        if top.issuer == root.subject:
            check_validity(root, now, f"pinned root ({root.subject.rfc4514_string()})")
            check_issued_by(top, root, f"top of chain ({top.subject.rfc4514_string()})")
            return
    raise ChainError(f"chain does not end at a pinned root (top: {top.subject.rfc4514_string()})")


def load_crl(data: bytes) -> x509.CertificateRevocationList:
    """Load a CRL with every lazily decoded field decoded, so later reads cannot raise."""
    pem = data.lstrip().startswith(b"-----BEGIN")
    try:
        crl = x509.load_pem_x509_crl(data) if pem else x509.load_der_x509_crl(data)
        _ = (crl.issuer.rfc4514_string(), list(crl.extensions), crl.signature_hash_algorithm,
             crl.last_update_utc, crl.next_update_utc)
        for entry in crl:
            _ = (entry.serial_number, entry.revocation_date_utc, list(entry.extensions))
    except BAD_DER as exc:
        raise ParseError(f"not a CRL: {exc}") from exc
    return crl


def check_crl(
    crl: x509.CertificateRevocationList,
    issuer: x509.Certificate,
    certs: Sequence[x509.Certificate],
    now: dt.datetime,
) -> None:
    """CRL signed by `issuer`, current at `now`, and listing none of `certs` that `issuer` issued."""
    if crl.issuer != issuer.subject:
        raise ChainError(f"CRL issuer {crl.issuer.rfc4514_string()} is not {issuer.subject.rfc4514_string()}")
    if not crl.is_signature_valid(issuer.public_key()):  # type: ignore[arg-type]
        raise ChainError("CRL signature does not verify under its issuer")
    if now < crl.last_update_utc:
        raise ChainError(f"CRL not yet valid at {now.isoformat()}")
    if crl.next_update_utc is not None and now > crl.next_update_utc:
        raise ChainError(f"CRL expired at {crl.next_update_utc.isoformat()} (now {now.isoformat()})")
    for cert in certs:
        if cert.issuer == issuer.subject and crl.get_revoked_certificate_by_serial_number(cert.serial_number):
            raise RevokedError(f"certificate {cert.subject.rfc4514_string()} is revoked")

