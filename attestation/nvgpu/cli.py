"""Entry points for `sealed attest verify|inspect --tee nvgpu` (wired by api/cli)."""

from __future__ import annotations

import base64
import binascii
import json
import string
from typing import Any

from cryptography import x509

from attestation.claims import GpuClaims
from attestation.cli_request import VerifyRequest
from attestation.errors import ParseError
from attestation.nvgpu.abi import GpuEvidence, parse_evidence
from attestation.nvgpu.rim import parse_rim
from attestation.nvgpu.validate import Policy, to_claims, validate
from attestation.nvgpu.verify import GpuVerifyOptions, VerifiedGpu, verify_gpu_list
from attestation.x509chain import load_pem_chain

_HEX = frozenset(string.hexdigits.encode() + b" \t\r\n")


def _b64(text: Any, what: str) -> bytes:
    if not isinstance(text, str):
        raise ParseError(f"{what} must be a base64 string")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ParseError(f"{what} is not base64") from exc


def _unhex(text: bytes) -> bytes:
    try:
        return bytes.fromhex(text.decode())
    except ValueError as exc:  # odd length, or whitespace inside a byte
        raise ParseError(f"evidence is hex text but does not decode: {exc}") from exc


Item = tuple[GpuEvidence, list[x509.Certificate], str | None]


SUPPORTED_ARCHS = ("HOPPER",)


def _entries(text: bytes) -> tuple[list[dict[str, Any]], str | None]:
    """The entries of NVIDIA's JSON evidence forms, and the nonce the document claims, if any:
    * a bare list of {evidence, certificate[, nonce]} (nvtrust's gpu_evidence.json);
    * the NRAS request / multi-GPU object {"arch", "nonce", "evidence_list": [...]} (NRAS v3/v4,
      claims_version optional), whose top-level nonce applies to every entry."""
    try:
        doc = json.loads(text)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ParseError(f"evidence is not JSON: {exc}") from exc
    claimed: str | None = None
    if isinstance(doc, dict):
        arch = doc.get("arch")
        if not isinstance(arch, str) or arch.upper() not in SUPPORTED_ARCHS:
            raise ParseError(f"evidence object arch {arch!r:.40} is not one of {', '.join(SUPPORTED_ARCHS)}")
        nonce = doc.get("nonce")
        if nonce is not None and not isinstance(nonce, str):
            raise ParseError("evidence object nonce must be a hex string")
        claimed, doc = nonce, doc.get("evidence_list")
    if not isinstance(doc, list) or not doc or not all(isinstance(e, dict) for e in doc):
        raise ParseError("evidence JSON must be a non-empty list of objects (or an object with evidence_list)")
    return doc, claimed


def _split(evidence: bytes, certs: list[bytes]) -> list[Item]:
    """Evidence as raw bytes, hex text, or NVIDIA's JSON forms (see _entries)."""
    text = evidence.strip()
    if text.startswith((b"[", b"{")):
        entries, top_nonce = _entries(text)
        out = []
        for i, e in enumerate(entries):
            ev = parse_evidence(_b64(e.get("evidence"), f"entry {i} evidence"))
            chain = load_pem_chain(_b64(e.get("certificate"), f"entry {i} certificate"))
            claimed = e.get("nonce", top_nonce)
            out.append((ev, chain, claimed if isinstance(claimed, str) else None))
        return out
    raw = _unhex(text) if text and all(c in _HEX for c in text) else evidence
    if len(certs) != 1:
        raise ParseError(f"one PEM certificate chain is needed for a single report, got {len(certs)}")
    return [(parse_evidence(raw), load_pem_chain(certs[0]), None)]


def _claims_json(c: GpuClaims, v: VerifiedGpu) -> dict[str, Any]:
    return {
        "index": c.index, "arch": c.arch, "cc_enabled": c.cc_enabled, "nonce": c.nonce.hex(),
        "driver_version": c.driver_version, "vbios_version": c.vbios_version, "fwid": c.fwid.hex(),
        "ueid": c.ueid, "rim_matched": c.rim_matched,
        "rim_mismatches": {r.rim_version: list(r.mismatched) for r in v.rim_results},
        "ocsp_status": str(v.ocsp_status), "feature_flag": v.evidence.feature_flag,
        "measurements": {str(k): m.hex() for k, m in sorted(c.measurements.items())},
    }


def verify_for_cli(request: VerifyRequest) -> dict[str, Any]:
    """Verify (and with `policy`, appraise) GPU evidence; returns JSON-able claims.

    Without `nonce`, each report's own nonce is used (and any nonce the JSON list claims must
    agree), so the result says `"fresh": false`: only a relying party's nonce proves freshness.
    """
    nonce, at = request.nonce, request.at
    items = _split(request.evidence, list(request.certs))
    rims: list[bytes] = []
    for blob in request.collateral:
        if b"SoftwareIdentity" not in blob[:4096]:
            raise ParseError("unrecognised collateral: only SWID RIMs (.swidtag) are used for nvgpu")
        parse_rim(blob)
        if request.use_collateral:
            rims.append(blob)
    expected = nonce if nonce is not None else items[0][0].nonce
    for i, (ev, _, claimed) in enumerate(items):
        if claimed is not None and claimed.lower() != ev.nonce.hex():
            raise ParseError(f"entry {i}: listed nonce {claimed} differs from the report's nonce")
    policy_obj = Policy.from_dict(request.policy) if request.policy is not None else None
    verified = verify_gpu_list(
        [(ev, chain) for ev, chain, _ in items], nonce=expected, now=at,
        options=GpuVerifyOptions(roots_dir=request.roots_dir, rims=tuple(rims)),
    )
    claims = validate(verified, policy_obj) if policy_obj is not None else [
        to_claims(v, i) for i, v in enumerate(verified)
    ]
    return {
        "tee": "nvgpu", "verified_at": at.isoformat(), "fresh": nonce is not None,
        "appraised": policy_obj is not None,
        "gpus": [_claims_json(c, v) for c, v in zip(claims, verified, strict=True)],
    }


def inspect_for_cli(evidence: bytes) -> dict[str, Any]:
    """Decode without verifying anything (for humans; never for decisions)."""
    text = evidence.strip()
    if text.startswith((b"[", b"{")):
        entries, _ = _entries(text)
        reports = [parse_evidence(_b64(e.get("evidence"), f"entry {i}")) for i, e in enumerate(entries)]
    elif text and all(c in _HEX for c in text):
        reports = [parse_evidence(_unhex(text))]
    else:
        reports = [parse_evidence(evidence)]
    return {"tee": "nvgpu", "verified": False, "gpus": [_inspect(i, r) for i, r in enumerate(reports)]}


def _inspect(index: int, ev: GpuEvidence) -> dict[str, Any]:
    return {
        "index": index, "nonce": ev.nonce.hex(), "slot": ev.request.slot,
        "responder_nonce": ev.responder_nonce.hex(), "driver_version": ev.driver_version,
        "vbios_version": ev.vbios_version, "fwid": ev.fwid.hex(), "feature_flag": ev.feature_flag,
        "opaque": ev.info(), "trailing_bytes": ev.trailing, "signature": ev.signature.hex(),
        "measurements": {str(b.index): b.value.hex() for b in ev.blocks},
    }

