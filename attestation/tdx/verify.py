"""Verify a TDX quote: PCK chain, QE report, attestation key binding, quote signature, collateral, TCB.

Steps are numbered after Intel's "TDX DCAP Quote Verification" flow (Intel TDX DCAP Quoting
Library API, Quote Format appendix; DCAP QVL `QuoteVerifier::verify`) and the Intel PCS API v4
for collateral. `now`, the pinned roots and the collateral (or a fetcher for it) are always
injected; nothing here reads the wall clock.

Expensive, quote-independent results (chain and collateral signatures) are cached per verifier
instance by content hash together with the time window in which they hold, so a cached result is
never used at a `now` outside the window it was checked for.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, utils

from attestation import x509chain
from attestation.errors import ChainError, CollateralError, ParseError, RevokedError, SignatureError
from attestation.tdx import abi, tcb
from attestation.tdx import collateral as coll
from attestation.tdx.pck import PckExtensions, pck_extensions

log = logging.getLogger(__name__)

INTEL_ROOT_FILE = "intel_sgx_root_ca_gotdxguest.pem"
_CA_KIND = {"Intel SGX PCK Platform CA": "platform", "Intel SGX PCK Processor CA": "processor"}


@dataclass(frozen=True)
class Collateral:
    """What Intel PCS serves for one FMSPC: the signed JSONs, their signing chain, and the CRLs."""

    tcb_info: bytes  # the full PCS body {"tcbInfo": ..., "signature": ...}
    qe_identity: bytes  # {"enclaveIdentity": ..., "signature": ...}
    signing_chain: bytes  # PEM: Intel SGX TCB Signing, Intel SGX Root CA (TCB-Info-Issuer-Chain)
    pck_crl: bytes | None = None  # issued by the PCK Platform/Processor CA
    root_crl: bytes | None = None  # issued by the Intel SGX Root CA


class CollateralSource(Protocol):
    def tdx_collateral(self, fmspc: bytes, ca: str) -> Collateral: ...


@dataclass(frozen=True)
class VerifyOptions:
    use_collateral: bool = True  # False: signatures and chain only; TCB status is Unknown
    unsafe_skip_crls: bool = False  # accept collateral without PCK/root CRLs (logs a warning)


@dataclass(frozen=True)
class VerifiedQuote:
    quote: abi.Quote
    pck: PckExtensions
    pck_ca: str  # "platform" or "processor"
    tcb: tcb.TcbResult | None  # None when collateral was not used
    crls_checked: bool


@dataclass(frozen=True)
class _Window:
    start: dt.datetime
    end: dt.datetime

    def holds(self, now: dt.datetime) -> bool:
        return self.start <= now <= self.end


def _p256(raw_xy: bytes) -> ec.EllipticCurvePublicKey:
    try:
        return ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), b"\x04" + raw_xy)
    except ValueError as exc:
        raise SignatureError(f"attestation key is not a P-256 point: {exc}") from exc


def _verify_rs(key: ec.EllipticCurvePublicKey, sig: bytes, data: bytes, what: str) -> None:
    der = utils.encode_dss_signature(int.from_bytes(sig[:32], "big"), int.from_bytes(sig[32:], "big"))
    try:
        key.verify(der, data, ec.ECDSA(hashes.SHA256()))
    except InvalidSignature as exc:
        raise SignatureError(f"{what} does not verify") from exc


def _chain_window(certs: Sequence[x509.Certificate]) -> _Window:
    return _Window(max(c.not_valid_before_utc for c in certs), min(c.not_valid_after_utc for c in certs))


def _digest(*parts: bytes) -> bytes:
    h = hashlib.sha256()
    for p in parts:
        h.update(len(p).to_bytes(8, "big") + p)
    return h.digest()


class TdxVerifier:
    """Holds pinned roots, options, an optional collateral fetcher and the verification caches."""

    def __init__(
        self,
        roots: Sequence[x509.Certificate] | None = None,
        *,
        roots_dir: Path | None = None,
        fetcher: CollateralSource | None = None,
        options: VerifyOptions | None = None,
    ) -> None:
        self.roots = (
            list(roots) if roots is not None else x509chain.load_pinned_roots(INTEL_ROOT_FILE, roots_dir)
        )
        self.fetcher = fetcher
        self.options = options or VerifyOptions()
        self._root_prints = {x509chain.fingerprint(r) for r in self.roots}
        self._chains: dict[bytes, _Window] = {}
        self._crls: dict[bytes, tuple[x509.CertificateRevocationList, _Window]] = {}
        self._signed: dict[bytes, tuple[object, _Window]] = {}

    def verify(
        self, evidence: bytes | abi.Quote, now: dt.datetime, collateral: Collateral | None = None
    ) -> VerifiedQuote:
        if now.tzinfo is None:
            raise ValueError("now must be timezone-aware")
        # Step 1 (Quote Format: header): version 4/5, ECDSA-256 key, TEE type TDX, Intel QE vendor;
        # every length field checked (abi.parse_quote).
        quote = evidence if isinstance(evidence, abi.Quote) else abi.parse_quote(evidence)
        sig = quote.signature
        leaf, inter, root = sig.pck_chain
        # Step 2 (PCK Certificate and CRL Profile): the quote's chain ends at the pinned Intel SGX
        # Root CA (compared by certificate hash, not by name), every link signed and valid at `now`.
        self._check_pck_chain(sig, now)
        ca = ca_kind(inter)
        pck = pck_extensions(leaf)
        # Step 3: QE report signed by the PCK leaf key (ECDSA-P256-SHA256 over the 384-byte report).
        leaf_key = leaf.public_key()
        if not isinstance(leaf_key, ec.EllipticCurvePublicKey):
            raise ChainError("PCK leaf key is not ECDSA P-256")
        _verify_rs(leaf_key, sig.qe_report_signature, sig.qe_report.raw, "QE report signature (PCK leaf)")
        # Step 4: the QE certifies the attestation key: REPORTDATA = SHA-256(attestation key ||
        # QE authentication data) || 32 zero bytes.
        expected = hashlib.sha256(sig.attestation_key + sig.qe_auth_data).digest() + bytes(32)
        if sig.qe_report.report_data != expected:
            raise SignatureError("QE report data does not bind the attestation key and QE auth data")
        # Step 5: quote signature by the attestation key over header || body.
        _verify_rs(_p256(sig.attestation_key), sig.quote_signature, quote.signed, "quote signature")
        if not self.options.use_collateral:
            return VerifiedQuote(quote, pck, ca, None, crls_checked=False)
        if collateral is None:
            if self.fetcher is None:
                raise CollateralError("no TDX collateral given and no collateral fetcher configured")
            collateral = self.fetcher.tdx_collateral(pck.fmspc, ca)
        # Step 6 (PCS API: TCB-Info-Issuer-Chain): TCB Signing chain to the pinned root.
        signing = self._signing_chain(collateral.signing_chain, now)
        # Step 7: CRLs. The root CRL covers the PCK CA and the TCB Signing cert; the PCK CRL the leaf.
        crls = self._check_crls(collateral, root, inter, leaf, signing, now)
        # Step 8 (PCS API: TDX TCB Info v3, TD_QE Identity v2): signatures over the served bytes,
        # and issueDate <= now <= nextUpdate.
        info = self._signed_json(collateral.tcb_info, "tcbInfo", signing, now)
        ident = self._signed_json(collateral.qe_identity, "enclaveIdentity", signing, now)
        assert isinstance(info, coll.TcbInfo) and isinstance(ident, coll.QeIdentity)
        # Step 9: TCB status (platform, TDX module, QE) per Intel's algorithm (tcb.py).
        result = tcb.evaluate(info, ident, pck, quote.body, sig.qe_report)
        return VerifiedQuote(quote, pck, ca, result, crls_checked=crls)

    def _check_pck_chain(self, sig: abi.SignatureData, now: dt.datetime) -> None:
        key = hashlib.sha256(sig.pck_chain_pem).digest()
        window = self._chains.get(key)
        if window is not None and window.holds(now):
            return
        if x509chain.fingerprint(sig.pck_chain[-1]) not in self._root_prints:
            raise ChainError("the quote's PCK chain root is not the pinned Intel SGX Root CA")
        x509chain.verify_chain(list(sig.pck_chain), self.roots, now)
        self._chains[key] = _chain_window(sig.pck_chain)

    def _signing_chain(self, pem: bytes, now: dt.datetime) -> list[x509.Certificate]:
        certs = x509chain.load_pem_chain(pem)  # every field decoded: damage is a ParseError here
        key = hashlib.sha256(pem).digest()
        window = self._chains.get(key)
        if window is None or not window.holds(now):
            if x509chain.fingerprint(certs[-1]) not in self._root_prints:
                raise ChainError("collateral signing chain does not end at the pinned Intel SGX Root CA")
            x509chain.verify_chain(certs, self.roots, now)
            self._chains[key] = _chain_window(certs)
        return certs

    def _crl(self, data: bytes, issuer: x509.Certificate, now: dt.datetime) -> x509.CertificateRevocationList:
        key = _digest(data, x509chain.fingerprint(issuer))
        hit = self._crls.get(key)
        if hit is not None and hit[1].holds(now):
            return hit[0]
        try:
            crl = x509chain.load_crl(data)
            x509chain.check_crl(crl, issuer, [], now)
        except (ValueError, TypeError, UnsupportedAlgorithm, x509.InvalidVersion) as exc:
            raise ParseError(f"CRL is malformed: {exc}") from exc
        end = crl.next_update_utc or dt.datetime.max.replace(tzinfo=dt.UTC)
        self._crls[key] = (crl, _Window(crl.last_update_utc, end))
        return crl

    def _check_crls(
        self,
        c: Collateral,
        root: x509.Certificate,
        inter: x509.Certificate,
        leaf: x509.Certificate,
        signing: list[x509.Certificate],
        now: dt.datetime,
    ) -> bool:
        if c.pck_crl is None or c.root_crl is None:
            if not self.options.unsafe_skip_crls:
                raise CollateralError("PCK CRL and root CRL are required (unsafe_skip_crls is off)")
            log.warning("TDX verification without CRLs (unsafe_skip_crls): revoked PCKs are not detected")
            return False
        root_crl = self._crl(c.root_crl, root, now)
        pck_crl = self._crl(c.pck_crl, inter, now)
        for crl, cert in ((root_crl, inter), (pck_crl, leaf), *((root_crl, s) for s in signing[:-1])):
            if crl.get_revoked_certificate_by_serial_number(cert.serial_number) is not None:
                raise RevokedError(f"certificate {cert.subject.rfc4514_string()} is revoked")
        return True

    def _signed_json(
        self, data: bytes, key: str, signing: list[x509.Certificate], now: dt.datetime
    ) -> object:
        cache_key = _digest(data, x509chain.fingerprint(signing[0]))
        hit = self._signed.get(cache_key)
        if hit is not None and hit[1].holds(now):
            return hit[0]
        signed = coll.split_signed_json(data, key)
        parsed = (
            coll.parse_tcb_info(signed.value) if key == "tcbInfo" else coll.parse_qe_identity(signed.value)
        )
        coll.verify_signed_json(signed, signing[0], key)
        coll.check_window(parsed.issue_date, parsed.next_update, now, key)
        self._signed[cache_key] = (parsed, _Window(parsed.issue_date, parsed.next_update))
        return parsed


def _cn(cert: x509.Certificate) -> str:
    try:
        attrs = cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)
    except ValueError as exc:
        raise ParseError(f"certificate subject unreadable: {exc}") from exc
    return str(attrs[0].value) if attrs else ""


def ca_kind(inter: x509.Certificate) -> str:
    """ "platform" or "processor": which PCK CA issued the leaf (selects the PCK CRL)."""
    ca = _CA_KIND.get(_cn(inter))
    if ca is None:
        raise ChainError(f"PCK intermediate {_cn(inter)!r} is not an Intel PCK Platform/Processor CA")
    return ca


def verify_quote(
    evidence: bytes | abi.Quote,
    *,
    now: dt.datetime,
    roots: Sequence[x509.Certificate] | None = None,
    roots_dir: Path | None = None,
    collateral: Collateral | None = None,
    fetcher: CollateralSource | None = None,
    options: VerifyOptions | None = None,
) -> VerifiedQuote:
    """One-shot verification (no cache reuse). Raises AttestationError subclasses."""
    verifier = TdxVerifier(roots, roots_dir=roots_dir, fetcher=fetcher, options=options)
    return verifier.verify(evidence, now, collateral)
