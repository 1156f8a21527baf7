"""SEV-SNP report verification: VEK chain to pinned AMD roots, CRLs, TCB binding, report signature.

The steps are numbered as comments; spec references are to the SEV-SNP Firmware ABI spec (#56860
rev 1.57) and the VCEK/KDS spec (#57230). Nothing here reads the wall clock: `now` is a parameter.
"""

from __future__ import annotations

import datetime as dt
import hmac
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from attestation.errors import ChainError, CollateralError, ParseError, SignatureError
from attestation.snp.abi import SIG_ALGO_ECDSA_P384_SHA384, Report, parse_report
from attestation.snp.certs import VekInfo, VekKind, classify_certs, parse_vek
from attestation.snp.tcb import Product, SigningKey, TcbVersion
from attestation.x509chain import check_crl, fingerprint, load_crl, load_pinned_roots, verify_chain


class CollateralFetcher(Protocol):
    """What the verifier needs from AMD KDS (attestation.kds.KdsFetcher implements it)."""

    def vcek(self, product: Product, chip_id: bytes, tcb: TcbVersion) -> bytes: ...

    def crl(self, product: Product, kind: VekKind) -> bytes: ...


@dataclass(frozen=True)
class VerifiedChain:
    """A VEK whose chain to a pinned ARK was checked at `now` (reusable across reports)."""

    vek: VekInfo
    certs: tuple[x509.Certificate, ...]  # VEK, ASK/ASVK, ARK
    crl_checked: bool
    now: dt.datetime


@dataclass(frozen=True)
class VerifiedReport:
    """A report whose signature, chain and TCB binding all verified."""

    report: Report
    chain: VerifiedChain
    product: Product
    reported_tcb: TcbVersion
    tcb_verified: bool = True

    @property
    def signer(self) -> VekKind:
        return self.chain.vek.kind


def _pinned(
    product: Product, kind: VekKind, roots_dir: Path | None
) -> tuple[x509.Certificate, x509.Certificate]:
    """(ASK or ASVK, ARK) from attestation/roots/amd_<product>_<kind>.pem or an injected directory."""
    bundle = load_pinned_roots(f"amd_{product.value.lower()}_{kind.roots_file}.pem", roots_dir)
    arks = [c for c in bundle if c.subject == c.issuer]
    mids = [c for c in bundle if c.subject != c.issuer]
    if len(arks) != 1 or len(mids) != 1:
        raise ChainError(f"pinned {product.value} {kind.value} bundle must hold one ARK and one ASK/ASVK")
    return mids[0], arks[0]


def apply_crls(crls: Sequence[bytes], chain: Sequence[x509.Certificate], now: dt.datetime) -> bool:
    """Check every CRL issued by a CA of `chain` (AMD KDS: ARK-signed, RSA-PSS). True if any applied."""
    applied = False
    for blob in crls:
        crl = load_crl(blob)
        issuers = [c for c in chain[1:] if c.subject == crl.issuer]
        if not issuers:
            continue  # a CRL of another product line; it says nothing about this chain
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # serial 0 on AMD VEKs
            check_crl(crl, issuers[0], chain, now)
        applied = True
    if crls and not applied:
        raise CollateralError("none of the supplied CRLs is issued by a CA of this chain")
    return applied


def verify_vek_chain(
    vek: VekInfo,
    *,
    now: dt.datetime,
    roots_dir: Path | None = None,
    extra_certs: Sequence[bytes] = (),
    crls: Sequence[bytes] = (),
) -> VerifiedChain:
    """VCEK -> ASK -> ARK or VLEK -> ASVK -> ARK, ending at the pinned ARK of the VEK's product."""
    # Step C1 (KDS spec, "Certificate chain"): the pinned bundle for the VEK's product and kind.
    pinned_mid, pinned_ark = _pinned(vek.product, vek.kind, roots_dir)
    supplied = classify_certs(list(extra_certs))
    # Step C2: a supplied ARK is only accepted if it is byte-identical to the pinned one.
    for ark in supplied.arks:
        if fingerprint(ark) != fingerprint(pinned_ark):
            raise ChainError(f"supplied {ark.subject.rfc4514_string()} is not the pinned AMD root")
    # Step C3: a supplied ASK/ASVK naming the VEK's issuer is used (and must chain to the ARK).
    mids = [m for m in supplied.intermediates if m.subject == vek.cert.issuer]
    mid = mids[0] if mids else pinned_mid
    chain = (vek.cert, mid, pinned_ark)
    # Step C4: signatures (RSA-PSS SHA-384 for ASK/ARK, per KDS spec) and validity at `now`.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        verify_chain(chain, [pinned_ark], now)
    # Step C5: revocation, when CRLs are supplied.
    crl_checked = apply_crls(crls, chain, now)
    return VerifiedChain(vek=vek, certs=chain, crl_checked=crl_checked, now=now)


def check_binding(report: Report, vek: VekInfo, product: Product | None = None) -> TcbVersion:
    """Tie the report to its VEK: signer kind, product, hwID = CHIP_ID, cert TCB = REPORTED_TCB."""
    # Step B1 (Table 23 SIGNATURE_ALGO): only ECDSA P-384 with SHA-384 (encoding 1) is defined.
    if report.signature_algo != SIG_ALGO_ECDSA_P384_SHA384:
        raise SignatureError(f"SIGNATURE_ALGO {report.signature_algo} is not ECDSA P-384/SHA-384")
    # Step B2 (Table 23 SIGNING_KEY, MASK_CHIP_KEY): the report says which key signed it.
    signer = report.signer
    if signer.signing_key is SigningKey.NONE:
        raise SignatureError("report is unsigned (SIGNING_KEY = none)")
    if signer.mask_chip_key and signer.signing_key is SigningKey.VCEK:
        raise SignatureError("MASK_CHIP_KEY is set: the VCEK did not sign this report")
    expected = VekKind.VCEK if signer.signing_key is SigningKey.VCEK else VekKind.VLEK
    if vek.kind is not expected:
        raise ChainError(
            f"report is signed by a {expected.value.upper()}, certificate is a {vek.kind.value.upper()}"
        )
    # Step B3: product from the VEK's productName must agree with CPUID (v3+) and the caller.
    cpuid = report.cpuid_product
    if cpuid is not None and cpuid is not vek.product:
        raise ChainError(
            f"report CPUID is {cpuid.value} but the {vek.kind.value.upper()} is {vek.product.value}"
        )
    if product is not None and product is not vek.product:
        raise ChainError(f"expected product {product.value}, {vek.kind.value.upper()} is {vek.product.value}")
    reported = report.tcb("reported", vek.product)
    for which in ("current", "committed", "launch"):
        report.tcb(which, vek.product)  # reserved TCB bytes, now that the layout is known
    # Step B4 (KDS spec, hwID extension): a VCEK is issued per chip; Turin hwID is CHIP_ID[0:8].
    if vek.kind is VekKind.VCEK:
        chip = report.chip_id[:8] if vek.product.fmc_layout else report.chip_id
        if vek.hwid is None or not hmac.compare_digest(vek.hwid, chip):
            raise CollateralError("VCEK hwID does not match the report's CHIP_ID")
    # Step B5 (Table 23 REPORTED_TCB): the VEK is derived for exactly this TCB.
    if vek.tcb != reported:
        raise CollateralError(f"VEK TCB {vek.tcb.as_dict()} != REPORTED_TCB {reported.as_dict()}")
    return reported


def verify_report_signature(report: Report, key: ec.EllipticCurvePublicKey) -> None:
    """Step S1 (Table 137): ECDSA P-384/SHA-384 over bytes [0, 0x2A0), R and S little-endian."""
    try:
        key.verify(report.signature_der(), report.signed_bytes, ec.ECDSA(hashes.SHA384()))
    except InvalidSignature as exc:
        raise SignatureError("SNP report signature does not verify under the VEK") from exc


def verify_with_chain(report: Report, chain: VerifiedChain, product: Product | None = None) -> VerifiedReport:
    """Per-report work once the chain is known good (what a cached verifier repeats)."""
    reported = check_binding(report, chain.vek, product)
    verify_report_signature(report, chain.vek.public_key)
    return VerifiedReport(report=report, chain=chain, product=chain.vek.product, reported_tcb=reported)


def _find_vek(
    report: Report,
    vek: bytes | x509.Certificate | None,
    certs: Sequence[bytes],
    fetcher: CollateralFetcher | None,
    product: Product | None,
) -> VekInfo:
    if vek is not None:
        return parse_vek(vek)
    found = classify_certs(list(certs)).veks
    if len(found) > 1:
        raise ParseError("more than one VCEK/VLEK supplied")
    if found:
        return parse_vek(found[0])
    if fetcher is None:
        raise CollateralError("no VCEK/VLEK supplied and no collateral fetcher configured")
    if report.signer.signing_key is not SigningKey.VCEK:
        raise CollateralError("a VLEK cannot be fetched from the public KDS; supply it")
    prod = product or report.cpuid_product
    if prod is None:
        raise CollateralError("report v2 has no CPUID: pass product= to fetch its VCEK")
    return parse_vek(fetcher.vcek(prod, report.chip_id, report.tcb("reported", prod)))


def verify_report(
    evidence: bytes | Report,
    *,
    now: dt.datetime,
    vek: bytes | x509.Certificate | None = None,
    certs: Sequence[bytes] = (),
    crls: Sequence[bytes] = (),
    roots_dir: Path | None = None,
    fetcher: CollateralFetcher | None = None,
    product: Product | None = None,
    fetch_crl: bool = False,
) -> VerifiedReport:
    """Verify one SNP report end to end; raises a typed AttestationError on the first failure.

    `vek` (or a VEK among `certs`) is used when given; otherwise `fetcher` fetches the VCEK from
    KDS. `certs` may also carry the ASK/ASVK and ARK (the ARK must equal the pinned one). With
    `fetch_crl` the fetcher's CRL is checked in addition to `crls`.
    """
    # Step 1 (Table 23): parse strictly.
    report = evidence if isinstance(evidence, Report) else parse_report(evidence)
    # Step 2: find the VEK (supplied, or fetched from KDS for a VCEK).
    info = _find_vek(report, vek, certs, fetcher, product)
    # Step 3: cheap binding checks before any chain work, so mismatches name their cause.
    check_binding(report, info, product)
    all_crls = list(crls)
    if fetch_crl:
        if fetcher is None:
            raise CollateralError("fetch_crl needs a collateral fetcher")
        all_crls.append(fetcher.crl(info.product, info.kind))
    # Step 4: chain to the pinned roots, with CRLs.
    chain = verify_vek_chain(info, now=now, roots_dir=roots_dir, extra_certs=certs, crls=all_crls)
    # Step 5: the report signature itself.
    return verify_with_chain(report, chain, product)
