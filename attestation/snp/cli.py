"""Entry points for `sealed attest verify --tee snp` and `sealed attest inspect` (wired by api/cli)."""

from __future__ import annotations

import dataclasses
import string
from typing import Any

from attestation.cli_request import VerifyRequest, check_report_data
from attestation.errors import ParseError
from attestation.snp.abi import REPORT_SIZE, Report, parse_report, report_fields
from attestation.snp.claims import to_claims
from attestation.snp.tcb import Product
from attestation.snp.validate import Policy, validate
from attestation.snp.verify import verify_report
from attestation.x509chain import load_crl


def _evidence(evidence: bytes) -> Report:
    """Raw 1184-byte report, or the same as hex text (as printed by many tools)."""
    if len(evidence) != REPORT_SIZE:
        text = evidence.strip()
        if text and all(chr(b) in string.hexdigits + " \n\r\t" for b in text):
            try:
                evidence = bytes.fromhex(text.decode())
            except ValueError as exc:
                raise ParseError(f"evidence is neither a raw SNP report nor hex: {exc}") from exc
    return parse_report(evidence)


def verify_for_cli(request: VerifyRequest) -> dict[str, Any]:
    """Verify, check the nonce, appraise, and return JSON-able claims; raises AttestationError.

    certs: DER or PEM (a VCEK/VLEK, optionally ASK/ASVK and ARK). collateral: CRLs, recognised by
    content; with use_collateral=False they are parsed but not applied. policy: Policy.from_dict.
    """
    evidence, certs, collateral, roots_dir = request.evidence, request.certs, request.collateral, request.roots_dir
    nonce, at, policy, use_collateral = request.nonce, request.at, request.policy, request.use_collateral
    report = _evidence(evidence)
    appraisal = Policy.from_dict(policy) if policy is not None else None  # fail fast on a bad policy
    for blob in collateral:
        load_crl(blob)  # anything that is not a CRL is refused rather than silently ignored
    crls = list(collateral) if use_collateral else []
    verified = verify_report(report, now=at, certs=list(certs), crls=crls, roots_dir=roots_dir)
    if nonce is not None:
        check_report_data(report.report_data, nonce)
    if appraisal is not None:
        validate(verified, appraisal)
    out = to_claims(verified).to_json()
    out["verified_at"] = at.isoformat()
    return out


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.hex()
    return value


def inspect_for_cli(evidence: bytes) -> dict[str, Any]:
    """Parse only (nothing is verified): every field, with bit fields and TCBs decoded."""
    report = _evidence(evidence)
    out: dict[str, Any] = {"verified": False}
    out.update({k: _jsonable(v) for k, v in report_fields(report).items()})
    for key in ("policy", "platform_info", "signer_info", "signature_r", "signature_s"):
        out[key] = hex(out[key])
    out["guest_policy"] = dataclasses.asdict(report.guest_policy)
    out["platform"] = dataclasses.asdict(report.platform)
    signer = report.signer
    out["signer"] = {
        "author_key_en": signer.author_key_en,
        "mask_chip_key": signer.mask_chip_key,
        "signing_key": signer.signing_key.name.lower(),
    }
    product = report.cpuid_product
    # v2 has no CPUID; the Milan/Genoa TCB layout is then assumed (Turin reports are v3 or later).
    out["product"] = product.value if product else None
    layout = product or Product.MILAN
    for which in ("current", "reported", "committed", "launch"):
        raw = getattr(report, f"{which}_tcb")
        out[f"{which}_tcb"] = {"raw": f"{raw:#018x}", **report.tcb(which, layout).as_dict()}
    out["tcb_layout"] = "turin" if layout.fmc_layout else "milan/genoa"
    out["firmware"] = f"{report.current_major}.{report.current_minor}.{report.current_build}"
    return out
